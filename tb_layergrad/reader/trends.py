"""How a layer's gradient moves: over the last logged steps (`trend`), over the whole run (`step_decay`, against
the target's own value: `target_fall`) and back through time (`timestep_decay`).

Summaries, not flags: `anomalies.evaluate` puts them in each layer's summary, and `anomalies.layer_verdicts` calls a
layer "vanishing over steps" from the first two (`collapsed`) and "vanishing through time" from the last.
`anomalies` offers these names too.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

# The trend fit and the timestep decay use the last TREND_WINDOW logged steps.
TREND_WINDOW = 20
# Vanishing over steps (docs/ANOMALIES.md, "Vanishing over steps"): the median of a layer's last EDGE_STEPS logged
# norms at least STEP_DECAY_DECADES below the median of its first EDGE_STEPS, while the target's own value (the
# loss) fell by less than TARGET_FALL of its early size. A converging run's gradient falls too, but its loss falls
# with it (a regression to zero loss, a classifier: by 97 % or more where their gradient fell 100-fold); a
# saturated loss, a discriminator that wins, stall or rise.
EDGE_STEPS = 5
STEP_DECAY_DECADES = 2.0
TARGET_FALL = 0.5


def trend(
    steps: np.ndarray, norm_row: np.ndarray, nonfinite_row: Optional[np.ndarray] = None, window: int = TREND_WINDOW
) -> Optional[float]:
    """How the layer's norm moved lately, in decades (log10 units).

    The least-squares line of log10(norm) against the step, over the layer's last
    `window` logged steps whose norm is finite and > 0 and that hold no non-finite
    element, evaluated as (slope x the window's span in steps): -2.0 means the
    fitted norm fell 100-fold over that window. None with fewer than 3 such steps
    or a span of 0.
    """
    steps = np.asarray(steps, dtype=np.float64)
    norm_row = np.asarray(norm_row, dtype=np.float64)
    ok = np.isfinite(norm_row) & (norm_row > 0)
    if nonfinite_row is not None:
        with np.errstate(invalid="ignore"):
            ok &= ~(np.asarray(nonfinite_row, dtype=np.float64) > 0)
    idx = np.flatnonzero(ok)[-window:]
    if idx.size < 3:
        return None
    x = steps[idx]
    span = x[-1] - x[0]
    if span <= 0:
        return None
    y = np.log10(norm_row[idx])
    xc = x - x.mean()
    slope = float((xc * (y - y.mean())).sum() / (xc * xc).sum())
    return slope * float(span)


# The smallest float32 subnormal: a timestep norm of exactly 0 counts as this (a fully underflowed gradient).
TINY = 1.401298464324817e-45


def timestep_decay(norm_vectors: Sequence[np.ndarray], window: int = TREND_WINDOW) -> Optional[float]:
    """How much the per-timestep gradient shrinks from the last timestep back to the first, in decades.

    For each of the last `window` logged records of an RNN layer's per-timestep norms
    (docs/FORMAT.md, kind `timesteps`): log10(norm[0] / norm[T-1]), with a norm[0] of 0
    counted as TINY; the median over those records. -3.0: the gradient reaching the first
    timestep is 1000 times smaller than at the last one. None without a usable record
    (T < 2, or norm[T-1] not finite and > 0, or norm[0] not finite).
    """
    values = []
    for v in list(norm_vectors)[-window:]:
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if v.size < 2 or not (np.isfinite(v[-1]) and v[-1] > 0) or not np.isfinite(v[0]) or v[0] < 0:
            continue
        values.append(math.log10(max(v[0], TINY)) - math.log10(v[-1]))  # no overflow of the ratio
    return float(np.median(values)) if values else None


def _edges(row: np.ndarray, usable: np.ndarray) -> Optional[tuple]:
    """(median of the first EDGE_STEPS usable values, of the last EDGE_STEPS); None with fewer than
    2 x EDGE_STEPS usable values (the two ends would overlap)."""
    idx = np.flatnonzero(usable)
    if idx.size < 2 * EDGE_STEPS:
        return None
    return float(np.median(row[idx[:EDGE_STEPS]])), float(np.median(row[idx[-EDGE_STEPS:]]))


def usable(norm_row: np.ndarray, nonfinite_row: Optional[np.ndarray]) -> np.ndarray:
    """bool: the steps whose norm is finite and > 0 and that hold no NaN/Inf (what the two ends are made of)."""
    with np.errstate(invalid="ignore"):
        usable = np.isfinite(norm_row) & (norm_row > 0)
        if nonfinite_row is not None:
            usable &= ~(np.asarray(nonfinite_row, dtype=np.float64) > 0)
    return usable


def step_decay(norm_row: np.ndarray, nonfinite_row: Optional[np.ndarray] = None) -> Optional[float]:
    """How far a layer's gradient fell over the run, in decades.

    Args:
      norm_row: the layer's norm at each logged step (NaN where not recorded).
      nonfinite_row: its NaN/Inf count at each step; steps holding any are left out.

    Returns:
      log10(late / early): `early` is the median norm of the layer's first EDGE_STEPS logged steps whose norm
      is finite and > 0 and that hold no NaN/Inf, `late` that of its last EDGE_STEPS such steps. -3.0: the
      gradient ends 1000 times smaller than it began. None with fewer than 2 x EDGE_STEPS such steps.

    Example:

        step_decay(np.r_[np.ones(6), np.full(6, 1e-3)])  # -3.0
    """
    norm_row = np.asarray(norm_row, dtype=np.float64)
    edges = _edges(norm_row, usable(norm_row, nonfinite_row))
    return None if edges is None else math.log10(edges[1]) - math.log10(edges[0])


def target_edges(values: np.ndarray) -> Optional[tuple]:
    """(early, late) of the target's own value (the loss): the medians of its first and last EDGE_STEPS finite
    values; None with fewer than 2 x EDGE_STEPS of them."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    edges = _edges(values, np.isfinite(values))
    return None if edges is None else edges[:2]


def target_fall(edges: Optional[tuple]) -> Optional[float]:
    """How much of its early size the target's value lost: (early - late) / |early|, from `target_edges`.

    1.0: it fell to 0 (a loss that converged); 0: it did not move; negative: it rose (a loss minimized from
    -0.45 towards 0 that ends at -1e-5 gives -1.0). None without edges or with an early value of 0.
    """
    if edges is None or edges[0] == 0:
        return None
    return (edges[0] - edges[1]) / abs(edges[0])


def collapsed(decay: Optional[float], fall: Optional[float]) -> bool:
    """The rule of "vanishing over steps": the layer's gradient fell STEP_DECAY_DECADES or more over the run
    (`step_decay`) while its target's value fell by less than TARGET_FALL (`target_fall`). False when either is
    unknown: without the target's value a collapse cannot be told from convergence."""
    return decay is not None and fall is not None and decay <= -STEP_DECAY_DECADES and fall < TARGET_FALL


def collapse_step(steps: np.ndarray, norm_row: np.ndarray, nonfinite_row: Optional[np.ndarray] = None) -> Optional[int]:
    """The first logged step whose norm is at most 10^-STEP_DECAY_DECADES x the layer's early level (that of
    `step_decay`, same arguments with the steps): where its collapse is first seen. None if none is (or the row
    has no early level)."""
    norm_row = np.asarray(norm_row, dtype=np.float64)
    ok = usable(norm_row, nonfinite_row)
    edges = _edges(norm_row, ok)
    if edges is None:
        return None
    with np.errstate(invalid="ignore"):
        low = np.flatnonzero(ok & (norm_row <= edges[0] * 10.0**-STEP_DECAY_DECADES))
    return int(np.asarray(steps)[low[0]]) if low.size else None
