"""The anomaly rules of docs/ANOMALIES.md and the one verdict per layer they give: the one implementation.

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

One verdict per layer and one line per finding: what the overview, its banners, the layer view,
`tb-layergrad report` and `tb_layergrad.load()` all show. Why one place: the rules flag cells and `origin`
says where a NaN was born, but each reader used to pick its own words from them, and they disagreed (the
origin of a NaN unmarked while the layers it reached were red; a layer tagged two ways).

A layer's state is the first of these that holds; STATES is that order (most serious first), for readers that
count or sort verdicts (docs/ANOMALIES.md, "One verdict"):

    nan_origin              the run's first NaN/Inf was born in this layer (`RunAnomalies.origin`)
    nonfinite               a NaN/Inf reached the layer's gradient at some logged step
    exploding, dead, vanishing   the layer's cell state at its last logged step (`now`); else the most
                            serious one of an earlier step (`now` False), in this order
    vanishing_over_steps    its gradient fell STEP_DECAY_DECADES over the run while the target's value did not
                            fall by TARGET_FALL (`trends.collapsed`)
    vanishing_through_time  its per-timestep gradients shrink by at least TIME_DECAY_DECADES
    dominated               one example dominated the layer's gradient at some steps (`dominance.Dominance`)
    ok

Findings of the layer below its state are not dropped: they are the verdict's `also` and follow its text
("vanishing · one example dominated 3 steps"), and a state that no longer holds at the last step says so
("ok now – one example dominated 14 steps").

    [v.state for v in run.verdicts()], [f["line"] for f in run.summary_json()["findings"]]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tb_layergrad import nonfinite_origin
from tb_layergrad.reader import trends
from tb_layergrad.reader.dominance import Dominance

# -- thresholds (docs/ANOMALIES.md, "Thresholds") ------------------------------------------------
VANISH_REL = 1e-3  # vanishing: rms < VANISH_REL x (largest rms of any layer at that step)
EXPLODE_ABS = 1e3  # exploding: rms > EXPLODE_ABS ...
EXPLODE_GROWTH = 1e2  # ... or rms > EXPLODE_GROWTH x the layer's baseline, after the baseline
BASELINE_STEPS = 5  # baseline: median of the layer's first BASELINE_STEPS rms values > 0
DEAD_ZERO_FRAC = 0.99  # dead: norm == 0, or zero_frac >= DEAD_ZERO_FRAC
# Vanishing through time (`layer_verdicts`): dL/dh at the first timestep 1000x below the last one, the same three
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


def detect(rms, norm, nonfinite, zero_frac, base_of=None, first_column: int = 0) -> np.ndarray:
    """The flags of every cell: uint8 [layers, steps], bits NONFINITE | VANISHING | EXPLODING | DEAD.

    Arguments are [layers, steps] arrays (NaN where missing). The rules, in order
    (docs/ANOMALIES.md): non-finite excludes the others; dead excludes vanishing and
    exploding; exploding excludes vanishing. So a cell has at most one flag: its state.
    `base_of`: the layers' `baselines` over the whole run when the arrays are its columns from
    `first_column` on (`rule_fold`: a cell's flags depend on its column and those baselines only).
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
        base, base_end = baselines(r) if base_of is None else base_of
        after = first_column + np.arange(shape[1])[None, :] > base_end[:, None]
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
    trend: Optional[float]  # decades over the last TREND_WINDOW logged steps, see `trends.trend`
    first_nonfinite_step: Optional[int]  # the layer's first step with a NaN/Inf (sent as `first_nonfinite`)
    counts: Dict[str, int]  # logged steps flagged with each kind
    # The first logged step flagged with each kind (absent: never): what a verdict names, kept by the rules'
    # fold as it extends a run (`rule_fold`), so that a verdict does not look through every step of a long run.
    firsts: Dict[str, int]
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
    dominated: Optional[List[Dominance]] = None
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
        over steps and through time (`layer_verdicts`)."""
        counts = {k: 0 for k in KINDS}
        last = self.last_step
        for s in self.summaries:
            if last is None or s.last_step != last:
                continue
            for k in flag_names(s.now):
                counts[k] += 1
        for state in (VANISHING_OVER_STEPS, VANISHING_THROUGH_TIME):
            counts[state] = sum(v.state == state or any(a["state"] == state for a in v.also) for v in self.verdicts())
        return counts

    def verdicts(self) -> list:
        """Each layer's `Verdict`, in model order: the one state every reader shows."""
        key = (id(self.origin), id(self.dominated))  # the reader sets both after `evaluate`
        if getattr(self, "_verdicts", (None,))[0] != key:
            self._verdicts = (key, layer_verdicts(self))
        return self._verdicts[1]

    def layer_json(self, i: int) -> dict:
        """Layer `i`'s summary with its `verdict` (the `anomalies` route's and the report's `layers[]`)."""
        return {**self.summaries[i].to_json(), "verdict": self.verdicts()[i].to_json()}

    def flag_strings(self) -> List[str]:
        return [encode_flags(self.flags[i], self.recorded[i]) for i in range(len(self.layers))]

    def summary_json(self) -> dict:
        """The run's summary. Its `first_nonfinite` is `earliest_nonfinite`, to which an `origin` adds its
        `pass`, `origin` and `line` (those of `origin.step`, which may be earlier); `origin` is the whole origin;
        `findings` the banner lines (`findings`)."""
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
            "findings": findings(self),
        }


def _num(v) -> Optional[float]:
    v = float(v)
    return v if math.isfinite(v) else None


def first_flagged(flags: np.ndarray, steps: np.ndarray) -> Dict[str, int]:
    """{kind: the first of `steps` whose `flags` (the layer's flags at those steps) hold it}, kinds never flagged
    left out (`LayerSummary.firsts`)."""
    out = {}
    for kind, bit in FLAG_BITS.items():
        hits = np.flatnonzero(flags & bit)
        if hits.size:
            out[kind] = int(steps[hits[0]])
    return out


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
                trend=trends.trend(steps[cols], m["norm"][i, cols], m["nonfinite"][i, cols]),
                first_nonfinite_step=first,
                counts={k: int(((row[cols] & bit) > 0).sum()) for k, bit in FLAG_BITS.items()},
                firsts=first_flagged(row[cols], steps[cols]),
                now=int(row[last]) if last is not None else 0,
                timestep_decay=trends.timestep_decay(ts) if ts else None,
                has_timesteps=ts is not None,
                step_decay=trends.step_decay(m["norm"][i, cols], m["nonfinite"][i, cols]),
                decay_step=trends.collapse_step(steps[cols], m["norm"][i, cols], m["nonfinite"][i, cols]),
            )
        )
    edges = trends.target_edges(target_values) if target_values is not None else None
    return RunAnomalies(
        run, target, source, layers, steps, flags, rec, top, summaries, vanish_reference=reference, target_edges=edges
    )


# -- one verdict per layer, one line per finding (docs/ANOMALIES.md, "One verdict") ----------------
NAN_ORIGIN, NONFINITE_STATE, OK = "nan_origin", "nonfinite", "ok"
VANISHING_OVER_STEPS, VANISHING_THROUGH_TIME = "vanishing_over_steps", "vanishing_through_time"
DOMINATED = "dominated"
# Cell states after non-finite, most serious first (a cell holds at most one: `detect`).
CELL_STATES = (("exploding", EXPLODING), ("dead", DEAD), ("vanishing", VANISHING))
STATES = (
    NAN_ORIGIN,
    NONFINITE_STATE,
    *(k for k, _ in CELL_STATES),
    VANISHING_OVER_STEPS,
    VANISHING_THROUGH_TIME,
    DOMINATED,
    OK,
)
LABELS = {
    NAN_ORIGIN: "NaN/Inf born here",
    NONFINITE_STATE: "NaN/Inf",
    "exploding": "exploding",
    "dead": "dead",
    "vanishing": "vanishing",
    VANISHING_OVER_STEPS: "vanishing over steps",
    VANISHING_THROUGH_TIME: "vanishing through time",
    DOMINATED: "one example dominates",
    OK: "ok",
}
SEPARATOR = " · "  # between a verdict's text and the findings it also carries
MAX_NAMED = 3  # layers a finding names before "and N more"
# How serious a state is, for ordering runs (the sweep's `severity`): a NaN/Inf first, wherever it was born,
# then a gradient out of range, one that is gone, one that fades; 0 for a healthy layer.
SEVERITY = {
    NAN_ORIGIN: 4,
    NONFINITE_STATE: 4,
    "exploding": 3,
    "dead": 2,
    "vanishing": 1,
    VANISHING_OVER_STEPS: 1,
    VANISHING_THROUGH_TIME: 1,
    DOMINATED: 1,
    OK: 0,
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One layer's state.

    `now`: it holds at the layer's last logged step (the NaN states: from their step on). `step`: where to
    look (the origin's step, the first non-finite step, the first step flagged so, the worst dominated step, or
    the last step). `text`: the words of the overview's chip and the report's `verdict` column, the findings of
    `also` included. `also`: the layer's other findings, states below `state` that hold too (`state`, `step`,
    `text` each), in the order of STATES.
    """

    state: str
    now: bool
    step: Optional[int]
    text: str
    also: Tuple[dict, ...] = ()

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "also": [dict(a) for a in self.also]}


def origin_layer(run: RunAnomalies) -> Optional[str]:
    """The row where the run's first NaN/Inf was born.

    Args:
      run: an evaluated run whose `origin` the reader set (`run_anomalies.read_run`).

    Returns:
      The layer path, or None: nothing broke, the pass was the loss or cannot be told, or the layer is not
      one of the run's rows (e.g. asked for weights).
    """
    o = run.origin
    if o is None or o.pass_ not in (nonfinite_origin.PASS_FORWARD, nonfinite_origin.PASS_BACKWARD):
        return None
    return o.origin if o.origin in run.layers else None


def layer_verdicts(run: RunAnomalies) -> List[Verdict]:
    """Each layer's state, decided once (the precedence of the module docstring).

    Args:
      run: an evaluated run (`anomalies.evaluate`), its `origin` set by the reader when known.

    Returns:
      A `Verdict` per layer, in model order (`run.layers`).

    Example:

        import numpy as np
        from tb_layergrad.reader import anomalies
        one = np.ones((2, 6))
        run = anomalies.evaluate(["m/a", "m/b"], range(6), {"rms": one * [[1e-6], [1.0]], "norm": one,
                                 "nonfinite": 0 * one, "zero_frac": 0 * one})
        [v.state for v in layer_verdicts(run)]  # ['vanishing', 'ok']
    """
    born = origin_layer(run)
    fall = trends.target_fall(run.target_edges)
    by_layer = {d.layer: d for d in run.dominated or ()}
    out = []
    for s in run.summaries:
        found: List[Verdict] = []  # every state of the layer, most serious first
        if s.layer == born:
            found.append(Verdict(NAN_ORIGIN, True, run.origin.step, f"{LABELS[NAN_ORIGIN]} @{run.origin.step}"))
        elif s.first_nonfinite_step is not None:
            step = s.first_nonfinite_step
            found.append(Verdict(NONFINITE_STATE, True, step, f"{LABELS[NONFINITE_STATE]} @{step}"))
        else:
            cell = None
            for kind, bit in CELL_STATES:
                if s.now & bit:
                    cell = Verdict(kind, True, s.firsts[kind], kind)
                    break
            for kind, _ in CELL_STATES if cell is None else ():
                if s.counts[kind]:
                    cell = Verdict(kind, False, s.firsts[kind], f"{kind} {s.counts[kind]}/{s.recorded}")
                    break
            if cell is not None:
                found.append(cell)
        if trends.collapsed(s.step_decay, fall):
            step = s.decay_step if s.decay_step is not None else s.last_step
            found.append(Verdict(VANISHING_OVER_STEPS, True, step, f"{LABELS[VANISHING_OVER_STEPS]} @{step}"))
        if s.timestep_decay is not None and s.timestep_decay <= -TIME_DECAY_DECADES:
            found.append(Verdict(VANISHING_THROUGH_TIME, True, s.last_step, LABELS[VANISHING_THROUGH_TIME]))
        d = by_layer.get(s.layer)
        if d is not None:
            found.append(_dominated_verdict(d, s.last_step))
        if not found:
            out.append(Verdict(OK, True, s.last_step, OK))
            continue
        head, rest = found[0], found[1:]
        also = tuple({"state": v.state, "step": v.step, "text": v.text} for v in rest)
        text = head.text if head.now else f"{OK} now – {head.text}" if head.state == DOMINATED else head.text
        out.append(Verdict(head.state, head.now, head.step, SEPARATOR.join([text, *(v.text for v in rest)]), also))
    return out


def _dominated_verdict(d, last_step: Optional[int]) -> Verdict:
    """A layer's dominated steps as a verdict: "now" when its last logged step is one of them."""
    now = last_step is not None and last_step in d.at
    return Verdict(DOMINATED, now, d.worst_step, _dominated_text(d.at, last_step))


def worst(verdicts: Sequence[Verdict]) -> Optional[Verdict]:
    """The run's worst layer verdict: the first state of STATES any layer holds (None without layers).

    Args:
      verdicts: the layers' verdicts (`layer_verdicts`).

    Returns:
      That layer's `Verdict` (the first layer in model order among equals), or None.

    Example:

        worst([Verdict("dead", True, 3, "dead"), Verdict("nonfinite", True, 5, "NaN/Inf @5")]).state  # 'nonfinite'
    """
    rank = {state: i for i, state in enumerate(STATES)}
    return min(verdicts, key=lambda v: rank[v.state], default=None)


def run_text(run: RunAnomalies) -> Optional[str]:
    """The run's verdict in words: its worst layer's text, then every other kind of finding of the run
    (`findings`), so that one example dominating 14 steps of a run that is otherwise fine reads
    "ok now – one example dominated 14 steps", not "ok". None without layers.

    Args:
      run: an evaluated run, its `origin` and `dominated` as the reader set them.
    """
    head = worst(run.verdicts())
    if head is None:
        return None
    found = findings(run)
    union = sorted({s for d in run.dominated or () for s in d.at})
    dominated = _dominated_text(union, run.last_step) if union else None
    if head.state == DOMINATED:
        return dominated if run.last_step in union else f"{OK} now – {dominated}"
    parts = [head.text.split(SEPARATOR)[0]]
    for f in found:
        kind = f["kind"]
        if kind == head.state or (kind == NONFINITE_STATE and head.state == NAN_ORIGIN):
            continue
        parts.append(dominated if kind == DOMINATED else LABELS.get(kind, kind))
    return SEPARATOR.join(dict.fromkeys(parts))


def _dominated_text(steps: Sequence[int], last_step: Optional[int]) -> str:
    """ "one example dominates: 14 steps" when the last step is one of them, else "... dominated 14 steps"."""
    n = len(steps)
    many = f"{n} step{'' if n == 1 else 's'}"
    return f"one example dominates: {many}" if last_step in steps else f"one example dominated {many}"


def _names(layers: Sequence[str], source: str = "output") -> str:
    """At most MAX_NAMED names, then "and N more layers" ("weights" when the rows are weights: a kernel, a bias)."""
    shown = ", ".join(layers[:MAX_NAMED])
    more = len(layers) - MAX_NAMED
    noun = "weight" if source == "weight" else "layer"
    return shown + (f" and {more} more {noun}{'s' if more > 1 else ''}" if more > 0 else "")


def _finding(kind: str, layers: Sequence[str], layer: Optional[str], step: Optional[int], line: str) -> dict:
    return {"kind": kind, "layers": list(layers), "layer": layer, "step": step, "line": line}


def findings(run: RunAnomalies) -> List[dict]:
    """One line per finding, however many layers it spans (the overview's banners, the report's lines).

    Args:
      run: an evaluated run; its `origin` and `dominated` as the reader set them.

    Returns:
      A list of dicts: `kind` (a state, or `dominated`), `layers` (model order), `layer` and `step` (where
      to look first) and `line`, in the order of STATES, `dominated` last; empty for a healthy run.
    """
    verdicts = run.verdicts()
    out: List[dict] = []
    first = run.earliest_nonfinite
    if run.origin is not None:
        o = run.origin
        layers = [o.origin] if origin_layer(run) else list(first["layers"] if first else o.layers)
        out.append(_finding(NONFINITE_STATE, layers, layers[0] if layers else None, o.step, o.line))
    elif first is not None:
        layers = first["layers"]
        line = f"first non-finite gradient: step {first['step']} in {_names(layers, run.source)}"
        out.append(_finding(NONFINITE_STATE, layers, layers[0], first["step"], line))
    by_state: Dict[str, List[int]] = {}
    for i, v in enumerate(verdicts):
        for state, now in ((v.state, v.now), *((a["state"], True) for a in v.also)):
            if now and state != DOMINATED:  # one example dominating: its own finding below, from `run.dominated`
                by_state.setdefault(state, []).append(i)
    for kind, _ in CELL_STATES:
        rows = by_state.get(kind, [])
        if rows:
            names = [run.layers[i] for i in rows]
            line = f"{kind} at the latest step ({run.last_step}): {_names(names, run.source)}"
            # Opens the first layer at the step the line names (its last logged step), not where it began.
            out.append(_finding(kind, names, names[0], run.summaries[rows[0]].last_step, line))
    rows = by_state.get(VANISHING_OVER_STEPS, [])
    if rows:
        out.append(_over_steps(run, rows))
    rows = by_state.get(VANISHING_THROUGH_TIME, [])
    if rows:
        names = [run.layers[i] for i in rows]
        worst = min(run.summaries[i].timestep_decay for i in rows)
        line = (
            f"vanishing through time in {_names(names, run.source)}: the gradient reaching the first timestep is "
            f"10^{-worst:.1f} times smaller than at the last (threshold 10^{TIME_DECAY_DECADES:g})"
        )
        out.append(_finding(VANISHING_THROUGH_TIME, names, names[0], run.last_step, line))
    if run.dominated:
        out.append(dominated_finding(run.dominated))
    return out


def _over_steps(run: RunAnomalies, rows: List[int]) -> dict:
    """The layers vanishing over steps as one finding: how far the worst fell, and what the target's value did."""
    names = [run.layers[i] for i in rows]
    first = run.summaries[rows[0]]
    worst = min(run.summaries[i].step_decay for i in rows)
    line = (
        f"vanishing over steps in {_names(names, run.source)}: the gradient fell 10^{-worst:.1f} times from the first logged "
        f"steps to the last (threshold 10^{trends.STEP_DECAY_DECADES:g}) while {target_moved(run.target, run.target_edges)}"
    )
    return _finding(
        VANISHING_OVER_STEPS,
        names,
        names[0],
        first.decay_step if first.decay_step is not None else first.last_step,
        line,
    )


ARROW = "\u00a0→\u00a0"  # between two values: non-breaking spaces, so that a wrapped line never splits the pair


def target_moved(target: str, edges: Tuple[float, float]) -> str:
    """What the target's value did over the run, in words that match its numbers (`trends.target_fall`).

    The target is what training minimizes: "fell" is a decrease of the signed value, measured against its early
    size. A value that went up, however close to 0 it ends (a minimax generator's loss, -0.45 to -3e-6: its size
    shrank 10^5-fold, the value rose), rose; a fall by less than TARGET_FALL is said with its share.

    Example:

        target_moved("g", (-0.4504, -3.026e-06))  # 'the value of g rose (-0.4504 → -3.026e-06), where a converging run's falls by 50% or more'
    """
    early, late = edges
    fall = trends.target_fall(edges)
    if fall is None or fall == 0:
        moved = "did not move"
    elif fall < 0:
        moved = "rose"
    else:
        moved = f"fell by only {fall:.0%}"
    return (
        f"the value of {target} {moved} ({early:.4g}{ARROW}{late:.4g}), where a converging run's falls by "
        f"{trends.TARGET_FALL:.0%} or more"
    )


def dominated_finding(found: Sequence) -> dict:
    """The layers where one example dominates (`dominance.Dominance`, model order) as one finding: a
    layer's own sentence when it is alone, else the union of their steps and the worst of them."""
    names = [d.layer for d in found]
    worst = max(found, key=lambda d: d.worst_share)
    if len(found) == 1:
        line = worst.line
    else:
        steps = sorted({s for d in found for s in d.at})
        n = len(steps)
        where = f" from batch position {worst.worst_position}" if worst.worst_position is not None else ""
        batch = f" of {worst.examples}" if worst.examples is not None else ""
        line = (
            f"one example dominates {_names(names)} at {n} step{'' if n == 1 else 's'}: first step {steps[0]}; "
            f"worst step {worst.worst_step} in {worst.layer}, {worst.worst_share:.0%} of its gradient{where}{batch}"
        )
    return _finding("dominated", names, worst.layer, worst.worst_step, line)


def cell_states(run: RunAnomalies) -> np.ndarray:
    """Each cell's state, for `tb_layergrad.load()`'s `state` column.

    Args:
      run: an evaluated run, its `origin` set by the reader when known.

    Returns:
      str [layers, steps]: `ok`, `nonfinite`, `exploding`, `dead` or `vanishing` (a cell has at most one
      flag), `vanishing_over_steps` on the cells that would be `ok` from the step a layer vanishing over steps
      collapsed, `dominated` on the cells that would be `ok` at the steps where one example dominated the layer
      (`run.dominated`), "" where unrecorded, `nan_origin` at the origin's own cell (`origin_layer`, the
      origin's step).
    """
    out = np.full(run.flags.shape, OK, dtype=object)
    for d in run.dominated or ():
        out[run.layers.index(d.layer), np.isin(run.steps, d.at)] = DOMINATED
    for i, v in enumerate(run.verdicts()):
        also = (a["step"] for a in v.also if a["state"] == VANISHING_OVER_STEPS)
        step = v.step if v.state == VANISHING_OVER_STEPS else next(also, None)
        if step is not None:
            out[i, run.steps >= step] = VANISHING_OVER_STEPS
    out[(run.flags & NONFINITE) > 0] = NONFINITE_STATE
    for kind, bit in CELL_STATES:
        out[(run.flags & bit) > 0] = kind
    out[~run.recorded] = ""
    born = origin_layer(run)
    if born is not None:
        col = np.flatnonzero(run.steps == run.origin.step)
        if col.size:
            out[run.layers.index(born), col[0]] = NAN_ORIGIN
    return out
