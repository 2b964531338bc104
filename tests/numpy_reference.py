"""The statistics of docs/FORMAT.md recomputed with plain numpy in float64, independently of the reductions.

One reference for the summary, plugin and tab tests. Every value is a Python float: the stored statistics
(`metadata.STAT_FIELDS`) and the two derived ones the tab shows (`zero_frac`, `rms`, as docs/HTTP_API.md
defines them). Moments are over the finite elements and NaN when there is none; `norm` is then 0.

Plain numpy sums (pairwise, float64), not an overflow-safe or exactly rounded sum: the tab's and the
summary tests' tolerances are stated against this. `reference_checks.reference` is the
overflow-safe one, for inputs near the float range's ends.
"""

from __future__ import annotations

from typing import Dict

import numpy as np


def numpy_stats(x: np.ndarray) -> Dict[str, float]:
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    fin = flat[np.isfinite(flat)]
    n, has = flat.size, fin.size > 0
    out = {
        "elements": float(n),
        "nan": float(np.isnan(flat).sum()),
        "pos_inf": float(np.isposinf(flat).sum()),
        "neg_inf": float(np.isneginf(flat).sum()),
        "zeros": float((flat == 0).sum()),
        "min": float(fin.min()) if has else np.nan,
        "max": float(fin.max()) if has else np.nan,
        "mean": float(fin.mean()) if has else np.nan,
        "std": float(fin.std()) if has else np.nan,
        "norm": float(np.sqrt((fin * fin).sum())),
        "mean_abs": float(np.abs(fin).mean()) if has else np.nan,
        "no_gradient": 0.0,
    }
    out["zero_frac"] = out["zeros"] / n if n else np.nan
    out["rms"] = float(out["norm"] / np.sqrt(fin.size)) if has else np.nan
    return out
