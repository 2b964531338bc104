"""The anomaly rules of docs/ANOMALIES.md: the one implementation.

Pure numpy (no TensorFlow, no TensorBoard): the plugin's `anomalies` route
(what the tab's overview draws), `tb-layergrad report` and notebooks all call
`evaluate`, so they flag exactly the same cells with the same thresholds.

Input: one run, one target, one source; the layers in model order (rows) and
the sorted union of their logged steps (columns), with four statistics per
cell (docs/HTTP_API.md), NaN where a layer has no record at a step:

    norm       L2 norm of the finite elements (0 for a "no gradient" record)
    rms        norm / sqrt(number of finite elements); NaN without a finite element
    nonfinite  nan + pos_inf + neg_inf
    zero_frac  zeros / elements

    from tb_layergrad.reader import anomalies
    flags = anomalies.detect(rms, norm, nonfinite, zero_frac)   # uint8 [layers, steps]
    run = anomalies.evaluate(layers, steps, {"rms": rms, "norm": norm, ...})
    run.summaries[0].first_nonfinite_step, run.summaries[0].now, run.summary_json()
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tb_layergrad.reader import trends
from tb_layergrad.reader.dominance import (  # noqa: F401 - the rule of one example dominating, part of this module
    DOMINANT_MIN_EXAMPLES,
    DOMINANT_OUTLIER,
    DOMINANT_SHARE,
    EXAMPLE_THRESHOLDS,
    Dominance,
    dominance,
    dominated,
    usual_top_norm,
)
from tb_layergrad.reader.trends import TINY, TREND_WINDOW, timestep_decay, trend  # noqa: F401 - summaries, part of this module

# -- thresholds (docs/ANOMALIES.md, "Thresholds") ------------------------------------------------
VANISH_REL = 1e-3  # vanishing: rms < VANISH_REL x (largest rms of any layer at that step)
EXPLODE_ABS = 1e3  # exploding: rms > EXPLODE_ABS ...
EXPLODE_GROWTH = 1e2  # ... or rms > EXPLODE_GROWTH x the layer's baseline, after the baseline
BASELINE_STEPS = 5  # baseline: median of the layer's first BASELINE_STEPS rms values > 0
DEAD_ZERO_FRAC = 0.99  # dead: norm == 0, or zero_frac >= DEAD_ZERO_FRAC
# Vanishing through time (`reader.verdict`): dL/dh at the first timestep 1000x below the last one, the same three
# orders of magnitude that make a layer vanishing against the others (VANISH_REL), through time instead of depth.
TIME_DECAY_DECADES = 3.0


THRESHOLDS = {
    "VANISH_REL": VANISH_REL,
    "EXPLODE_ABS": EXPLODE_ABS,
    "EXPLODE_GROWTH": EXPLODE_GROWTH,
    "BASELINE_STEPS": BASELINE_STEPS,
    "DEAD_ZERO_FRAC": DEAD_ZERO_FRAC,
    "TIME_DECAY_DECADES": TIME_DECAY_DECADES,
    "STEP_DECAY_DECADES": trends.STEP_DECAY_DECADES,  # vanishing over steps (`trends.collapsed`)
    "TARGET_FALL": trends.TARGET_FALL,
    "EDGE_STEPS": trends.EDGE_STEPS,
}

# -- flags: one bit each -----------------------------------------------------------------------------
NONFINITE, VANISHING, EXPLODING, DEAD = 1, 2, 4, 8
FLAG_BITS = {"nonfinite": NONFINITE, "vanishing": VANISHING, "exploding": EXPLODING, "dead": DEAD}
KINDS = tuple(FLAG_BITS)  # order of seriousness used everywhere (chips, columns)

# The four statistics the rules read (names of the `matrix` route's `stat`).
REQUIRED_STATS = ("rms", "norm", "nonfinite", "zero_frac")

# `flags` strings: one character per step, the hex digit of the bits, NOT_RECORDED where there is no record.
NOT_RECORDED = "."
_HEX = "0123456789abcdef"


def flag_names(bits: int) -> List[str]:
    """Names of the flags set in `bits`, in KINDS order."""
    return [name for name, bit in FLAG_BITS.items() if bits & bit]


def _as_matrix(a, shape=None) -> np.ndarray:
    m = np.asarray(a, dtype=np.float64)
    if m.ndim == 1 and shape is not None and len(shape) == 2 and shape[0] == 1:
        m = m.reshape(1, -1)
    if m.ndim != 2:
        raise ValueError(f"expected a [layers, steps] matrix, got shape {m.shape}")
    if shape is not None and m.shape != tuple(shape):
        raise ValueError(f"matrices differ in shape: {m.shape} vs {tuple(shape)}")
    return m


def recorded(rms, norm, nonfinite, zero_frac) -> np.ndarray:
    """bool [layers, steps]: the cell has a record (any of the four statistics is present)."""
    r = _as_matrix(rms)
    return ~(
        np.isnan(r)
        & np.isnan(_as_matrix(norm, r.shape))
        & np.isnan(_as_matrix(nonfinite, r.shape))
        & np.isnan(_as_matrix(zero_frac, r.shape))
    )


def max_rms(rms) -> np.ndarray:
    """float [steps]: the largest rms > 0 of any layer at each step; NaN where none. The vanishing rule's
    reference is this of the layers not exploding at that step (`reference_rms`)."""
    r = _as_matrix(rms)
    pos = r > 0
    out = np.full(r.shape[1], np.nan)
    if r.shape[0]:
        with np.errstate(invalid="ignore"):
            best = np.where(pos, r, -np.inf).max(axis=0)
        out[pos.any(axis=0)] = best[pos.any(axis=0)]
    return out


def reference_rms(rms, flags) -> np.ndarray:
    """float [steps]: what the vanishing rule compares with, the largest rms > 0 of the layers that are not
    exploding at each step (`detect`'s `flags`); NaN where none."""
    r = _as_matrix(rms)
    return max_rms(np.where((np.asarray(flags) & EXPLODING) > 0, np.nan, r))


def baselines(rms) -> Tuple[np.ndarray, np.ndarray]:
    """Per layer: the median of its first BASELINE_STEPS rms values > 0 (NaN if it has fewer),
    and the column of the last of them (-1 if none)."""
    r = _as_matrix(rms)
    base = np.full(r.shape[0], np.nan)
    end = np.full(r.shape[0], -1, dtype=np.int64)
    pos = r > 0
    for i in range(r.shape[0]):
        first = np.flatnonzero(pos[i])[:BASELINE_STEPS]
        if first.size:
            end[i] = first[-1]
        if first.size == BASELINE_STEPS:
            base[i] = float(np.median(r[i, first]))
    return base, end


def detect(rms, norm, nonfinite, zero_frac) -> np.ndarray:
    """The flags of every cell: uint8 [layers, steps], bits NONFINITE | VANISHING | EXPLODING | DEAD.

    Arguments are [layers, steps] arrays (NaN where missing). The rules, in order
    (docs/ANOMALIES.md): non-finite excludes the others; dead excludes vanishing and
    exploding; exploding excludes vanishing. So a cell has at most one flag: its state.
    """
    r = _as_matrix(rms)
    shape = r.shape
    n = _as_matrix(norm, shape)
    nf = _as_matrix(nonfinite, shape)
    z = _as_matrix(zero_frac, shape)
    rec = recorded(r, n, nf, z)
    with np.errstate(all="ignore"):  # NaN compares False; 100 x 1e308 is inf, which is right
        is_nonfinite = rec & (nf > 0)
        is_dead = rec & ~is_nonfinite & ((n == 0) | (z >= DEAD_ZERO_FRAC))
        live = rec & ~is_nonfinite & ~is_dead & (r > 0)
        base, base_end = baselines(r)
        after = np.arange(shape[1])[None, :] > base_end[:, None]
        growth = after & (r > EXPLODE_GROWTH * base[:, None])  # NaN baseline: never
        exploding = live & ((r > EXPLODE_ABS) | growth)
        # Vanishing is against the layers that are not exploding: one layer blowing up does not make the
        # others vanish, and an exploding cell is not vanishing (exploding excludes vanishing).
        calm = np.where(exploding, np.nan, r)
        counted = (calm > 0).sum(axis=0)
        top = max_rms(calm)
        vanishing = live & ~exploding & (counted >= 2)[None, :] & (calm < VANISH_REL * top[None, :])
    flags = (is_nonfinite * NONFINITE) | (vanishing * VANISHING) | (exploding * EXPLODING) | (is_dead * DEAD)
    return flags.astype(np.uint8)


_ASCII = np.frombuffer((_HEX + NOT_RECORDED).encode("ascii"), dtype=np.uint8)


def encode_flags(flags_row: np.ndarray, recorded_row: np.ndarray) -> str:
    """One layer's flags as text: a hex digit per step, NOT_RECORDED where there is no record.

    A table lookup over the whole row, not a Python loop: a long run has a character per step and layer."""
    codes = np.where(np.asarray(recorded_row, bool), np.asarray(flags_row, np.int64) & 15, len(_HEX))
    return _ASCII[codes].tobytes().decode("ascii")


def decode_flags(text: str) -> np.ndarray:
    """Inverse of `encode_flags`: int array, -1 where not recorded."""
    return np.asarray([-1 if c == NOT_RECORDED else int(c, 16) for c in text], dtype=np.int64)


@dataclasses.dataclass
class LayerSummary:
    """One layer of one evaluated run (docs/ANOMALIES.md, "Summaries")."""

    layer: str
    index: int
    recorded: int  # logged steps with a record
    last_step: Optional[int]  # the layer's last logged step
    last_norm: Optional[float]  # statistics at last_step (None: NaN/Inf or missing)
    last_rms: Optional[float]
    last_zero_frac: Optional[float]
    last_nonfinite: Optional[float]  # NaN/Inf elements at last_step: the norm of a gradient holding one is NaN
    trend: Optional[float]  # decades over the last TREND_WINDOW logged steps, see `trend`
    first_nonfinite_step: Optional[int]  # the layer's first step with a NaN/Inf (sent as `first_nonfinite`)
    counts: Dict[str, int]  # logged steps flagged with each kind
    now: int  # flags at last_step
    timestep_decay: Optional[float] = None  # RNN layers with per-timestep records, see `timestep_decay`
    has_timesteps: bool = False
    step_decay: Optional[float] = None  # decades from the first to the last logged steps, see `trends.step_decay`
    decay_step: Optional[int] = None  # the first step 10^STEP_DECAY_DECADES below its early level (`collapse_step`)

    @property
    def now_names(self) -> List[str]:
        return flag_names(self.now)

    def to_json(self) -> dict:
        out = {
            "layer": self.layer,
            "index": self.index,
            "recorded": self.recorded,
            "last_step": self.last_step,
            "last_norm": self.last_norm,
            "last_rms": self.last_rms,
            "last_zero_frac": self.last_zero_frac,
            "last_nonfinite": self.last_nonfinite,
            "trend": self.trend,
            "first_nonfinite": self.first_nonfinite_step,
            "counts": dict(self.counts),
            "now": self.now_names,
            "step_decay": self.step_decay,
        }
        if self.has_timesteps:
            out["timestep_decay"] = self.timestep_decay
        return out


@dataclasses.dataclass
class RunAnomalies:
    """The rules applied to one run, target and source."""

    run: str
    target: str
    source: str
    layers: List[str]
    steps: np.ndarray  # int64 [steps]
    flags: np.ndarray  # uint8 [layers, steps]
    recorded: np.ndarray  # bool [layers, steps]
    max_rms: np.ndarray  # float [steps]
    summaries: List[LayerSummary]
    # Per layer, the steps where one example dominated it (`dominance`); None: the run has no per-example
    # records for this (target, source), set by the reader.
    dominated: Optional[List["Dominance"]] = None
    # Where the run first went non-finite for its target (docs/ANOMALIES.md, "Where it broke"), set by
    # the reader (`reader.origin`; any source of the target counts, activations too); None: never, or not asked.
    origin: Optional[Any] = None  # a tb_layergrad.nonfinite_origin.Origin
    vanish_reference: Optional[np.ndarray] = None  # float [steps]: what vanishing compares with (`reference_rms`)
    target_edges: Optional[Tuple[float, float]] = None  # the target's value early and late (`trends.target_edges`)

    @property
    def last_step(self) -> Optional[int]:
        return int(self.steps[-1]) if self.steps.size else None

    @property
    def earliest_nonfinite(self) -> Optional[dict]:
        """{"step": s, "layers": [...]}: the earliest of the layers' first non-finite steps, and the layers
        non-finite there; None if none ever was. Not where it was born: that is `origin`."""
        firsts = [s.first_nonfinite_step for s in self.summaries if s.first_nonfinite_step is not None]
        if not firsts:
            return None
        step = min(firsts)
        return {"step": step, "layers": [s.layer for s in self.summaries if s.first_nonfinite_step == step]}

    @property
    def latest(self) -> Dict[str, int]:
        """How many layers are flagged with each kind at the run's last logged step, and how many vanish
        over steps and through time (`reader.verdict`)."""
        from tb_layergrad.reader import verdict  # decides from this object: imported when asked

        counts = {k: 0 for k in KINDS}
        last = self.last_step
        for s in self.summaries:
            if last is None or s.last_step != last:
                continue
            for k in flag_names(s.now):
                counts[k] += 1
        for state in (verdict.VANISHING_OVER_STEPS, verdict.VANISHING_THROUGH_TIME):
            counts[state] = sum(v.state == state or any(a["state"] == state for a in v.also) for v in self.verdicts())
        return counts

    def verdicts(self) -> list:
        """Each layer's `reader.verdict.Verdict`, in model order: the one state every reader shows."""
        from tb_layergrad.reader import verdict

        key = (id(self.origin), id(self.dominated))  # the reader sets both after `evaluate`
        if getattr(self, "_verdicts", (None,))[0] != key:
            self._verdicts = (key, verdict.layer_verdicts(self))
        return self._verdicts[1]

    def layer_json(self, i: int) -> dict:
        """Layer `i`'s summary with its `verdict` (the `anomalies` route's and the report's `layers[]`)."""
        return {**self.summaries[i].to_json(), "verdict": self.verdicts()[i].to_json()}

    def flag_strings(self) -> List[str]:
        return [encode_flags(self.flags[i], self.recorded[i]) for i in range(len(self.layers))]

    def summary_json(self) -> dict:
        """The run's summary. Its `first_nonfinite` is `earliest_nonfinite`, to which an `origin` adds its
        `pass`, `origin` and `line` (those of `origin.step`, which may be earlier); `origin` is the whole origin;
        `findings` the banner lines (`reader.verdict.findings`)."""
        from tb_layergrad.reader import verdict

        first = self.earliest_nonfinite
        where = self.origin.to_json() if self.origin is not None else None
        if first is not None and where is not None:
            first = {**first, "pass": where["pass"], "origin": where["origin"], "line": where["line"]}
        return {
            "layers": len(self.layers),
            "steps": int(self.steps.size),
            "first_step": int(self.steps[0]) if self.steps.size else None,
            "last_step": self.last_step,
            "first_nonfinite": first,
            "origin": where,
            "latest": self.latest,
            "findings": verdict.findings(self),
        }


def _num(v) -> Optional[float]:
    v = float(v)
    return v if math.isfinite(v) else None


def evaluate(
    layers: Sequence[str],
    steps: Iterable[int],
    stats: Mapping[str, np.ndarray],
    *,
    run: str = "",
    target: str = "loss",
    source: str = "output",
    indices: Optional[Sequence[int]] = None,
    running_first_steps: Optional[Sequence[Optional[int]]] = None,
    timesteps: Optional[Mapping[str, Sequence[np.ndarray]]] = None,
    target_values: Optional[np.ndarray] = None,
) -> RunAnomalies:
    """Apply the rules to one run and summarise every layer.

    Args:
      layers: layer paths in model order (rows).
      steps: the ascending logged steps (columns).
      stats: {"rms", "norm", "nonfinite", "zero_frac"} -> [layers, steps] float arrays, NaN where missing.
      indices: each layer's model index (-1 if unknown), for the summaries.
      running_first_steps: per layer, the first non-finite step its running records name (kind
        `first_nonfinite`, docs/FORMAT.md: they survive TensorBoard's sampling), or None. A layer's
        `first_nonfinite_step` is the earlier of that and its first flagged step.
      timesteps: {layer: [per-timestep norm vectors in step order]} for RNN layers.
      target_values: the target's own value (the loss) at each step, NaN where not recorded; without it no
        layer vanishes over steps (`trends.collapsed`).
    """
    layers = list(layers)
    steps = np.asarray(list(steps), dtype=np.int64).reshape(-1)
    shape = (len(layers), steps.size)
    m = {name: _as_matrix(stats[name], shape) if shape[0] else np.zeros(shape) for name in REQUIRED_STATS}
    flags = detect(m["rms"], m["norm"], m["nonfinite"], m["zero_frac"]) if shape[0] else np.zeros(shape, np.uint8)
    rec = recorded(m["rms"], m["norm"], m["nonfinite"], m["zero_frac"]) if shape[0] else np.zeros(shape, bool)
    top = max_rms(m["rms"]) if shape[0] else np.full(shape[1], np.nan)
    reference = reference_rms(m["rms"], flags) if shape[0] else np.full(shape[1], np.nan)
    summaries = []
    for i, layer in enumerate(layers):
        cols = np.flatnonzero(rec[i])
        row = flags[i]
        first = None
        nonfinite_cols = np.flatnonzero(row & NONFINITE)
        if nonfinite_cols.size:
            first = int(steps[nonfinite_cols[0]])
        named = running_first_steps[i] if running_first_steps is not None else None
        if named is not None and (first is None or named < first):
            first = int(named)
        last = int(cols[-1]) if cols.size else None
        ts = (timesteps or {}).get(layer)
        summaries.append(
            LayerSummary(
                layer=layer,
                index=int(indices[i]) if indices is not None else -1,
                recorded=int(cols.size),
                last_step=int(steps[last]) if last is not None else None,
                last_norm=_num(m["norm"][i, last]) if last is not None else None,
                last_rms=_num(m["rms"][i, last]) if last is not None else None,
                last_zero_frac=_num(m["zero_frac"][i, last]) if last is not None else None,
                last_nonfinite=_num(m["nonfinite"][i, last]) if last is not None else None,
                trend=trend(steps[cols], m["norm"][i, cols], m["nonfinite"][i, cols]),
                first_nonfinite_step=first,
                counts={k: int(((row[cols] & bit) > 0).sum()) for k, bit in FLAG_BITS.items()},
                now=int(row[last]) if last is not None else 0,
                timestep_decay=timestep_decay(ts) if ts else None,
                has_timesteps=ts is not None,
                step_decay=trends.step_decay(m["norm"][i, cols], m["nonfinite"][i, cols]),
                decay_step=trends.collapse_step(steps[cols], m["norm"][i, cols], m["nonfinite"][i, cols]),
            )
        )
    edges = trends.target_edges(target_values) if target_values is not None else None
    return RunAnomalies(
        run, target, source, layers, steps, flags, rec, top, summaries, vanish_reference=reference, target_edges=edges
    )
