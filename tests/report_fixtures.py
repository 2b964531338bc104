"""Planted logdirs for the anomaly route and report tests, and an independent numpy evaluation.

`reference_*` re-state the rules of docs/ANOMALIES.md cell by cell, the slow obvious way (this was
the rules' first Python statement), without `tb_layergrad.reader.anomalies`: the tests compare the module,
the route and the report with them. `write_planted_logdir` writes, with the real summary ops, a run
where each rule fires on a known layer, and returns the arrays it wrote.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zlib
from typing import Dict, List, Optional, Tuple

import numpy as np

VANISH_REL, EXPLODE_ABS, EXPLODE_GROWTH, BASELINE_STEPS, DEAD_ZERO_FRAC = 1e-3, 1e3, 1e2, 5, 0.99
NONFINITE, VANISHING, EXPLODING, DEAD = 1, 2, 4, 8
KINDS = {"nonfinite": NONFINITE, "vanishing": VANISHING, "exploding": EXPLODING, "dead": DEAD}
TREND_WINDOW = 20


def reference_detect(rms, norm, nonfinite, zero_frac):
    """[layers, steps] float arrays, NaN where missing -> uint8 flags [layers, steps]."""
    flags = np.zeros(rms.shape, np.uint8)
    pos = np.where(rms > 0, rms, np.nan)

    def exploding(i, j):
        first = np.flatnonzero(pos[i] > 0)[:BASELINE_STEPS]
        base = np.median(pos[i, first]) if first.size == BASELINE_STEPS else np.nan
        base_end = first[-1] if first.size else -1
        return rms[i, j] > EXPLODE_ABS or (j > base_end and rms[i, j] > EXPLODE_GROWTH * base)

    def live(k, j):
        return not nonfinite[k, j] > 0 and not (norm[k, j] == 0 or zero_frac[k, j] >= DEAD_ZERO_FRAC)

    for i in range(rms.shape[0]):
        for j in range(rms.shape[1]):
            if np.all(np.isnan([rms[i, j], norm[i, j], nonfinite[i, j], zero_frac[i, j]])):
                continue
            if nonfinite[i, j] > 0:
                flags[i, j] = NONFINITE
            elif norm[i, j] == 0 or zero_frac[i, j] >= DEAD_ZERO_FRAC:
                flags[i, j] = DEAD
            elif rms[i, j] > 0:  # exploding first: it excludes vanishing (docs/ANOMALIES.md)
                if exploding(i, j):
                    flags[i, j] = EXPLODING
                    continue
                # Vanishing against the layers (rms > 0) that are not exploding at that step; live or not.
                calm = [
                    pos[k, j] for k in range(rms.shape[0]) if pos[k, j] > 0 and not (live(k, j) and exploding(k, j))
                ]
                if len(calm) >= 2 and rms[i, j] < VANISH_REL * max(calm):
                    flags[i, j] = VANISHING
    return flags


def _trend_points(steps, norm_row, nonfinite_row):
    ok = [j for j in range(len(steps)) if np.isfinite(norm_row[j]) and norm_row[j] > 0 and not nonfinite_row[j] > 0]
    ok = ok[-TREND_WINDOW:]
    x = np.asarray([steps[j] for j in ok], float)
    if len(ok) < 3 or x[-1] == x[0]:
        return None
    return x, np.log10([norm_row[j] for j in ok])


def reference_trend(steps, norm_row, nonfinite_row) -> Optional[float]:
    """np.polyfit of log10(norm) on the last TREND_WINDOW usable steps, times their span."""
    points = _trend_points(steps, norm_row, nonfinite_row)
    if points is None:
        return None
    x, y = points
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * (x[-1] - x[0]))


def reference_trend_atol(steps, norm_row, nonfinite_row, norm_rel: float = 0.0) -> float:
    """How far two float64 evaluations of reference_trend may lie apart (tests/tolerances.py).

    trend = span * sum_j c_j y_j with c_j = (x_j - mean x) / sum (x - mean x)^2 and y_j = log10(norm_j):
    a linear form in y. Each side's longest chain of roundings is the mean (w terms), the centring,
    the product, the sum (w terms), the division, the product with the span: 2w + 4 roundings of
    magnitudes at most span * sum_j |c_j| * (|y_j| + max |y|) (the centred y_j). Norms read back
    with relative error norm_rel move y_j by norm_rel / ln 10 (d log10 v = dv / (v ln 10)).
    """
    from tolerances import TWO_SIDES, gamma

    points = _trend_points(steps, norm_row, nonfinite_row)
    if points is None:
        return 0.0
    x, y = points
    xc = x - x.mean()
    c = np.abs(xc) / np.sum(xc * xc) * (x[-1] - x[0])
    rounding = TWO_SIDES * gamma(2 * len(x) + 4, np.float64) * float(np.sum(c * (np.abs(y) + np.abs(y).max())))
    return rounding + float(np.sum(c)) * norm_rel / math.log(10)


def reference_decay(vectors) -> Optional[float]:
    vals = []
    for v in list(vectors)[-TREND_WINDOW:]:
        v = np.asarray(v, float)
        if v.size >= 2 and np.isfinite(v[-1]) and v[-1] > 0 and np.isfinite(v[0]):
            vals.append(math.log10(max(v[0], 1.401298464324817e-45) / v[-1]))
    return float(np.median(vals)) if vals else None


def reference_decay_atol(vectors) -> float:
    """Two float64 evaluations of reference_decay: log10 of each end or of their ratio (1 rounding
    each, relative to the logs' magnitudes; a rounded ratio moves its log by at most u / ln 10 < u,
    hence the + 1), the difference (1 more); the median picks one value or averages two (1 more)."""
    from tolerances import TWO_SIDES, gamma

    worst = 0.0
    for v in list(vectors)[-TREND_WINDOW:]:
        v = np.asarray(v, float)
        if v.size >= 2 and np.isfinite(v[-1]) and v[-1] > 0 and np.isfinite(v[0]):
            worst = max(worst, abs(math.log10(max(v[0], 1.401298464324817e-45))) + abs(math.log10(v[-1])) + 1)
    return TWO_SIDES * gamma(3, np.float64) * worst


def reference_summaries(layers, steps, m, timesteps=None, norm_rel: float = 0.0) -> List[dict]:
    """What the route says per layer, recomputed from the matrices with the reference rules.

    Each entry's "atol" holds the bounds of its float keys (tests/tolerances.py); `norm_rel` is the
    relative error of the norms the compared side read (0: the same matrices).
    """
    flags = reference_detect(m["rms"], m["norm"], m["nonfinite"], m["zero_frac"])
    out = []
    for i, layer in enumerate(layers):
        rec = [
            j
            for j in range(len(steps))
            if not all(np.isnan(m[k][i, j]) for k in ("rms", "norm", "nonfinite", "zero_frac"))
        ]
        last = rec[-1] if rec else None
        nf = [steps[j] for j in rec if flags[i, j] & NONFINITE]

        def at(name):
            if last is None:
                return None
            v = m[name][i, last]
            return float(v) if np.isfinite(v) else None

        trend_args = ([steps[j] for j in rec], [m["norm"][i, j] for j in rec], [m["nonfinite"][i, j] for j in rec])
        entry = {
            "layer": layer,
            "flags": "".join((("%x" % flags[i, j]) if j in rec else ".") for j in range(len(steps))),
            "recorded": len(rec),
            "last_step": steps[last] if last is not None else None,
            "last_norm": at("norm"),
            "last_rms": at("rms"),
            "last_zero_frac": at("zero_frac"),
            "trend": reference_trend(*trend_args),
            "first_nonfinite": nf[0] if nf else None,
            "counts": {k: int(sum(1 for j in rec if flags[i, j] & bit)) for k, bit in KINDS.items()},
            "now": [k for k, bit in KINDS.items() if last is not None and flags[i, last] & bit],
        }
        if timesteps and layer in timesteps:
            entry["timestep_decay"] = reference_decay(timesteps[layer])
        entry["atol"] = {
            "trend": reference_trend_atol(*trend_args, norm_rel=norm_rel),
            "timestep_decay": reference_decay_atol(timesteps[layer]) if timesteps and layer in timesteps else 0.0,
        }
        out.append(entry)
    return out


def numpy_cell(x: np.ndarray) -> Dict[str, float]:
    """norm, rms, nonfinite, zero_frac of one written array, with numpy in float64."""
    flat = np.asarray(x, np.float64).reshape(-1)
    fin = flat[np.isfinite(flat)]
    norm = float(np.sqrt((fin * fin).sum()))
    return {
        "norm": norm,
        "rms": norm / math.sqrt(fin.size) if fin.size else np.nan,
        "nonfinite": float(flat.size - fin.size),
        "zero_frac": float((flat == 0).sum() / flat.size) if flat.size else np.nan,
    }


# -- the planted logdir --------------------------------------------------------------------------

RUN = "train"
STEPS = list(range(30))
LAYERS = ["net/embed", "net/dense", "net/grow", "net/dead", "net/head"]  # model order (dict order)
SPARSE = "net/sparse"  # logged on even steps only, with the low-level op (index 5)
SPARSE_STEPS = list(range(0, 30, 2))
NAN_LAYER, NAN_STEPS = "net/dense", (12, 20, 21)
RNN_LAYER = "net/dense"  # also gets per-timestep norms
TIMESTEPS = 7
SCALES = {"net/embed": 1e-7, "net/dense": 1e-1, "net/grow": 1e-2, "net/dead": 0.0, "net/head": 1.0, SPARSE: 0.3}


def planted_array(layer: str, step: int) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{layer}|{step}".encode()))
    x = rng.normal(scale=1.0, size=(5, 7)).astype(np.float32) * np.float32(SCALES[layer])
    if layer == "net/grow":
        x = x * np.float32(1.5 ** min(step, 20))  # > 100x its first steps from step ~14 on: exploding
    x.reshape(-1)[3] = 0.0
    if layer == NAN_LAYER and step in NAN_STEPS:
        flat = x.reshape(-1)
        flat[0], flat[1], flat[9] = np.nan, np.inf, np.nan
    return x


TIMESTEP_NOISE = 0.1  # decades, uniform, on each planted timestep norm
# log10(norm[0] / norm[T-1]) is -(T-1) plus the difference of two noises, so each record's decay, and
# their median, lies within 2 * TIMESTEP_NOISE of -(T-1) (float64 rounding of ~10 u is far below).
DECAY_SPREAD = 2 * TIMESTEP_NOISE


def planted_timesteps(step: int) -> np.ndarray:
    """Norms decaying 10x per timestep back from the last one (decay -(T-1) decades), noisy."""
    rng = np.random.default_rng(500 + step)
    return 10.0 ** (np.arange(TIMESTEPS) - (TIMESTEPS - 1) + rng.uniform(-TIMESTEP_NOISE, TIMESTEP_NOISE, TIMESTEPS))


@dataclasses.dataclass
class Planted:
    logdir: str
    arrays: Dict[Tuple[str, int], np.ndarray]  # (layer, step) -> array written
    timesteps: Dict[int, np.ndarray]

    def matrices(self, layers: List[str], steps: List[int]) -> Dict[str, np.ndarray]:
        m = {k: np.full((len(layers), len(steps)), np.nan) for k in ("norm", "rms", "nonfinite", "zero_frac")}
        for i, layer in enumerate(layers):
            for j, step in enumerate(steps):
                a = self.arrays.get((layer, step))
                if a is not None:
                    for k, v in numpy_cell(a).items():
                        m[k][i, j] = v
        return m


def write_planted_logdir(logdir: str) -> Planted:
    import tensorflow as tf

    from tb_layergrad import summary

    arrays: Dict[Tuple[str, int], np.ndarray] = {}
    ts: Dict[int, np.ndarray] = {}
    writer = tf.summary.create_file_writer(os.path.join(logdir, RUN))
    with writer.as_default():
        for step in STEPS:
            grads = {}
            for layer in LAYERS:
                arrays[(layer, step)] = planted_array(layer, step)
                grads[layer] = tf.constant(arrays[(layer, step)])
            summary.gradients(grads, step=step)
            if step in SPARSE_STEPS:
                arrays[(SPARSE, step)] = planted_array(SPARSE, step)
                summary.ops.write_tensor(SPARSE, tf.constant(arrays[(SPARSE, step)]), step=step, index=5)
            ts[step] = planted_timesteps(step)
            summary.ops.write_timesteps(RNN_LAYER, tf.constant(ts[step]), step=step, index=1)
            summary.ops.write_tensor(
                "net/dense/kernel",
                tf.constant(planted_array("net/head", step)),
                step=step,
                source="weight",
                index=1,
            )
    writer.close()
    # Layer paths longer than any terminal column.
    writer = tf.summary.create_file_writer(os.path.join(logdir, LONG_RUN))
    with writer.as_default():
        for step in range(3):
            summary.gradients({name: tf.fill([3], float(i + 1)) for i, name in enumerate(LONG_LAYERS)}, step=step)
    writer.close()
    return Planted(logdir, arrays, ts)


LONG_RUN = "long_names"
LONG_LAYERS = [
    "model/" + "encoder_block_with_a_very_long_name/" * 3 + "attention_output_projection",
    "model/" + "encoder_block_with_a_very_long_name/" * 3 + "feed_forward_output",
]

SAMPLED_STEPS = 60
SAMPLED_NAN_STEP = 7  # layer "m/a" holds a NaN at this step only


def write_sampled_logdir(logdir: str) -> None:
    """Two runs of 60 steps, a NaN at step 7 only in m/a: `tracked` by summary.gradients (writes the
    first_nonfinite records), `plain` by the low-level summary.gradient (does not)."""
    import tensorflow as tf

    from tb_layergrad import summary

    for run in ("tracked", "plain"):
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        with writer.as_default():
            for step in range(SAMPLED_STEPS):
                a = np.full([4], 0.5 + step, np.float32)
                if step == SAMPLED_NAN_STEP:
                    a[2] = np.nan
                b = np.full([4], 1.0, np.float32)
                if run == "tracked":
                    summary.gradients({"m/a": tf.constant(a), "m/b": tf.constant(b)}, step=step)
                else:
                    summary.ops.write_tensor("m/a", tf.constant(a), step=step, index=0)
                    summary.ops.write_tensor("m/b", tf.constant(b), step=step, index=1)
        writer.close()


# -- fixtures (import them into a test module to use them) --------------------------------------

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def planted(tmp_path_factory) -> Planted:
    return write_planted_logdir(str(tmp_path_factory.mktemp("layergrad_planted")))


@pytest.fixture(scope="session")
def sampled_logdir(tmp_path_factory) -> str:
    logdir = str(tmp_path_factory.mktemp("layergrad_sampled"))
    write_sampled_logdir(logdir)
    return logdir


def in_process(logdir: str, keep: int = 0):
    """The plugin in process; TensorBoard keeps `keep` records per series (0: all)."""
    from plugin_fixtures import InProcess

    return InProcess(logdir, keep=keep)
