"""The reductions' numbers checked against an exact reference: float64, overflow-safe (scaled by a power of two)
and exactly rounded sums (`math.fsum`), with bounds derived from the dtype and the reduction length
(tests/tolerances.py). Used by the tests of every path that computes them: TensorFlow's ops, the fused
kernel, its TensorFlow-free host build, the summary ops and the plugin's answers. It takes TensorFlow tensors or
numpy arrays, and needs TensorFlow only for the former (the host build's tests run where it is not installed)."""

from __future__ import annotations

import math
from typing import Any, Dict

import numpy as np
from tolerances import TWO_SIDES, gamma, unit_roundoff

from tb_layergrad import metadata

# The smallest normal number of the compute dtype: TensorFlow flushes anything smaller to zero.
TINY = {np.float32: float(np.finfo(np.float32).tiny), np.float64: float(np.finfo(np.float64).tiny)}
# A moment whose true value is subnormal in float64 may be written as 0 (flushed, like its inputs).
FLUSH = float(np.finfo(np.float64).tiny)


def _numpy(x: Any) -> np.ndarray:
    """A TensorFlow tensor's values (its numpy dtype kept), or a numpy array as it is."""
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def compute_dtype(x: Any) -> type:
    """The reductions' compute dtype (statistics/reductions.compute_dtype): float64 for float64, integer and
    boolean data, float32 for the other floats."""
    dt = _numpy(x).dtype
    return np.float64 if dt == np.float64 or dt.kind in "biu" else np.float32


def held_values(x: Any) -> np.ndarray:
    """The values as the reductions see them: in the compute dtype, subnormals flushed to zero."""
    cdt = compute_dtype(x)
    v = _numpy(x).astype(np.float64).reshape(-1)
    if cdt == np.float32:
        v = v.astype(np.float32).astype(np.float64)  # exact: every input dtype fits in float32
    v[np.isfinite(v) & (np.abs(v) < TINY[cdt])] = 0.0
    return v


def edge_counts(x: Any, buckets: int) -> np.ndarray:
    """int64 [buckets]: the finite held values counted against the written edges (`metadata.histogram_edges`),
    [left_i, left_i+1), the last closed: the counts of a path that buckets exactly.

    The edges are taken on min / s and max / s (s a power of two, so the same edges wherever max - min fits
    float64) and scaled back, as the reductions' general path does, so that float64 data near its largest
    values have finite edges too."""
    fin = held_values(x)
    fin = fin[np.isfinite(fin)]
    if not fin.size:
        return np.zeros(buckets, np.int64)
    s = _pow2_at_most(float(np.abs(fin).max()))
    left, _ = metadata.histogram_edges(float(fin.min()) / s, float(fin.max()) / s, buckets)
    left = np.asarray(left) * s
    left[0] = fin.min()
    index = np.searchsorted(left, fin, side="right") - 1
    return np.bincount(np.clip(index, 0, buckets - 1), minlength=buckets)


def _pow2_at_most(m: float) -> float:
    return 1.0 if m == 0 else math.ldexp(1.0, math.frexp(m)[1] - 1)


def reference(v: np.ndarray) -> Dict[str, float]:
    """The statistics of FORMAT.md, in float64, overflow-safe (scaled by a power of two)."""
    fin = v[np.isfinite(v)]
    n = fin.size
    out = {
        "elements": float(v.size),
        "nan": float(np.isnan(v).sum()),
        "pos_inf": float(np.isposinf(v).sum()),
        "neg_inf": float(np.isneginf(v).sum()),
        "zeros": float((v == 0).sum()),
        "norm": float(math.hypot(*fin.tolist())) if n else 0.0,
        "no_gradient": 0.0,
    }
    if not n:
        out.update(min=math.nan, max=math.nan, mean=math.nan, std=math.nan, mean_abs=math.nan)
        return out
    s = _pow2_at_most(float(np.abs(fin).max()))
    xs = fin / s  # exact: a power of two
    mean_s = math.fsum(xs) / n
    out.update(
        min=float(fin.min()),
        max=float(fin.max()),
        mean=mean_s * s,
        std=math.sqrt(math.fsum((xs - mean_s) ** 2) / n) * s,
        mean_abs=math.fsum(np.abs(xs)) / n * s,
    )
    return out


def check_stats(stats: np.ndarray, x: Any, where: str) -> None:
    v = held_values(x)
    want = reference(v)
    got = {name: float(stats[i]) for i, name in enumerate(metadata.STAT_FIELDS)}
    msg = f"{where}: dtype {_numpy(x).dtype.name}, {v.size} elements, got {got}, want {want}"
    assert stats.shape == (len(metadata.STAT_FIELDS),), msg
    for name in ("elements", "nan", "pos_inf", "neg_inf", "zeros", "no_gradient"):
        assert got[name] == want[name], f"{name} -- {msg}"
    for name in ("min", "max"):
        assert got[name] == want[name] or (math.isnan(got[name]) and math.isnan(want[name])), f"{name} -- {msg}"
    fin = v[np.isfinite(v)]
    n = fin.size
    if not n:
        for name in ("mean", "std", "mean_abs"):
            assert math.isnan(got[name]), f"{name} -- {msg}"
        assert got["norm"] == 0.0, msg
        return
    cdt = compute_dtype(x)
    # An n-term sum in the compute dtype, any order (the kernel's float32 blocks and float64 across
    # are within it; tests/tolerances.py): n - 1 roundings, the division 1 more, relative to the
    # sum of |terms|; the norm's squares 1 more and its sqrt halves the sum's. The reference (fsum,
    # exactly rounded, then a division) rounds twice in float64.
    tol = gamma(n + 1, cdt) + 2 * unit_roundoff(np.float64)
    s = _pow2_at_most(float(np.abs(fin).max()))
    for name in ("norm", "mean_abs"):
        assert not math.isnan(got[name]), f"{name} -- {msg}"
        if math.isinf(want[name]):  # the true value does not fit in float64
            assert got[name] == want[name], f"{name} -- {msg}"
        else:
            assert math.isfinite(got[name]), f"{name} overflowed -- {msg}"
            assert abs(got[name] - want[name]) <= tol * want[name] + FLUSH, f"{name} -- {msg}"
    # The mean may cancel to ~0: its error is relative to the mean of |x|.
    assert math.isfinite(got["mean"]), f"mean -- {msg}"
    assert abs(got["mean"] - want["mean"]) <= tol * want["mean_abs"] + FLUSH, f"mean -- {msg}"
    # The variance (scaled, to stay finite), relative to the mean square ms = var + mean^2. The fast
    # path's one-pass sum(x^2)/n - mean^2: the first term within tol * ms, mean^2 within
    # 2 |mean| tol mean_abs + (tol mean_abs)^2 + u mean^2 <= (2 tol + tol^2 + u) ms (|mean| mean_abs
    # and mean_abs^2 <= ms, Cauchy-Schwarz), the subtraction 1 u and the sqrt 2 u more (std^2):
    # 3 tol + tol^2 + 3 u of the compute dtype, plus the reference's 3 float64 roundings (its centred
    # fsum, the division, the sqrt). The two-pass paths (float64 in the kernel) are within it.
    assert math.isfinite(got["std"]) and got["std"] >= 0, f"std -- {msg}"
    ms = float(np.mean((fin / s) ** 2))
    var_err = abs((got["std"] / s) ** 2 - (want["std"] / s) ** 2)
    var_tol = (3 * tol + tol**2 + 3 * unit_roundoff(cdt) + 3 * unit_roundoff(np.float64)) * ms
    assert var_err <= var_tol or abs(got["std"] - want["std"]) <= FLUSH, (
        f"std (var error {var_err:.3g}, mean square {ms:.3g}) -- {msg}"
    )


def check_histogram(hist: np.ndarray, x: Any, buckets: int, where: str) -> None:
    v = held_values(x)
    fin = v[np.isfinite(v)]
    msg = f"{where}: dtype {_numpy(x).dtype.name}, {v.size} elements, {buckets} buckets\n{hist}"
    assert hist.shape == (buckets, 3), msg
    assert np.all(np.isfinite(hist)), msg
    counts = hist[:, 2]
    assert np.all(counts >= 0) and np.all(counts == np.round(counts)), msg
    assert counts.sum() == fin.size, msg
    if not fin.size:
        assert np.all(hist == 0), msg
        return
    left, right = hist[:, 0], hist[:, 1]
    assert left[0] == fin.min() and right[-1] == fin.max(), msg
    assert np.all(np.diff(left) >= 0) and np.all(right >= left), msg
    assert np.array_equal(right[:-1], left[1:]), msg
    if fin.min() == fin.max():
        assert counts[-1] == fin.size, msg
        return
    edges = np.append(left, right[-1])
    want = np.zeros(buckets)
    index = np.clip(np.searchsorted(edges, fin, side="right") - 1, 0, buckets - 1)
    np.add.at(want, index, 1)
    # An element within the compute dtype's rounding of an interior edge may land on either side:
    # x - lo, hi - lo, / k and the quotient round 4 times, on magnitudes <= 2 max|x| (|x - lo| <=
    # hi - lo <= 2 max|x|), for either of the two edges compared (TWO_SIDES).
    cdt = compute_dtype(x)
    slack = TWO_SIDES * gamma(4, cdt) * 2 * max(abs(fin.min()), abs(fin.max()))
    with np.errstate(over="ignore"):
        near = sum(int(np.sum(np.abs(fin - e) <= slack)) for e in left[1:])
    assert np.abs(counts - want).sum() <= 2 * near, f"differs from numpy {want} ({near} near an edge) -- {msg}"
