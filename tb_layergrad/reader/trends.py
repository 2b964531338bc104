"""How a layer's gradient moves: over the last logged steps (`trend`) and back through time (`timestep_decay`).

Summaries, not flags: `anomalies.evaluate` puts them in each layer's summary, and `reader.verdict` calls a
layer "vanishing through time" from the decay. `anomalies` offers these names too.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

# The trend fit and the timestep decay use the last TREND_WINDOW logged steps.
TREND_WINDOW = 20


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
