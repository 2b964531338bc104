"""The histogram and statistics of a tensor in JAX (compiled by XLA): the definitions of `statistics/reductions.py`.

Why a second implementation: TensorFlow is not there, and XLA's compiled reductions take half the time of the
same definitions in numpy (docs/PERFORMANCE.md). It is the general (masked) path of the
TensorFlow reference, operation for operation: counts exact, non-finite elements counted and never bucketed,
moments of x / 2**e (no overflow or underflow), subnormals counted as zero, each element's bucket found against
the float64 edges every writer computes (`metadata.histogram_edges`), so the counts are the reference's. The sums of
the moments accumulate in float64 (each term rounded in the tensor's dtype, as the reference's): within the
reference's float32 bound, and one variadic reduce per pass over the tensor. Float64
is switched on for these operations only (`jax.enable_x64`), never for the model's.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from tb_layergrad import metadata

NUM_STATS = len(metadata.STAT_FIELDS)
_SMALLEST_NORMAL = {np.dtype(np.float32): 2.0**-126, np.dtype(np.float64): 2.0**-1022}


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """float32 for 16- and 32-bit floats, float64 for float64 and integers (as TensorFlow's reference)."""
    dtype = np.dtype(dtype)
    if dtype == np.float64 or np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        return np.dtype(np.float64)
    if jnp.issubdtype(dtype, jnp.floating):
        return np.dtype(np.float32)
    raise TypeError(f"cannot summarize a tensor of dtype {dtype.name}")


def records(tensors: Sequence[jax.Array], buckets: int = 30) -> Tuple[jax.Array, jax.Array]:
    """(stats float64 [T, NUM_STATS], histogram counts int32 [T, buckets]) of each tensor, traced in float64.

    Call it inside `jax.enable_x64(True)` when its results are used further (returned by the step): outside
    it, JAX would hand the float64 results on as float32.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    with jax.enable_x64(True):
        each = [_one(jnp.asarray(x), buckets) for x in tensors]
        return jnp.stack([s for s, _ in each]), jnp.stack([c for _, c in each])


def _one(x: jax.Array, k: int) -> Tuple[jax.Array, jax.Array]:
    dt = compute_dtype(x.dtype)
    x = x.astype(dt).reshape(-1)
    tiny = jnp.asarray(_SMALLEST_NORMAL[dt], dt)
    acc = jnp.int32 if x.size < 2**31 else jnp.int64
    inf, zero = jnp.asarray(jnp.inf, dt), jnp.zeros([], dt)
    finite = jnp.isfinite(x)
    zero_mask = jnp.abs(x) < tiny
    # Each pass is ONE variadic reduce: XLA's CPU backend gives separate sibling reductions a loop each, each
    # reading the tensor again, which costs more than the arithmetic.
    n_finite, nan, pos_inf, neg_inf, zeros, lo, hi = jax.lax.reduce(
        (finite.astype(acc), jnp.isnan(x).astype(acc), (x == inf).astype(acc), (x == -inf).astype(acc),
         zero_mask.astype(acc), jnp.where(finite, x, inf), jnp.where(finite, x, -inf)),
        (acc(0), acc(0), acc(0), acc(0), acc(0), inf, -inf),
        lambda a, b: (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4],
                      jnp.minimum(a[5], b[5]), jnp.maximum(a[6], b[6])),
        (0,),
    )  # fmt: skip
    n_finite = n_finite.astype(jnp.float64)
    has_finite = n_finite > 0
    lo = _flush(jnp.where(has_finite, lo, zero), tiny)
    hi = _flush(jnp.where(has_finite, hi, zero), tiny)
    scale = _pow2_scale(jnp.maximum(jnp.abs(lo), jnp.abs(hi)))
    scale64 = scale.astype(jnp.float64)
    xs = jnp.where(finite & ~zero_mask, x / scale, zero)
    # Accumulated in float64: a variadic reduce adds in one sequential order per thread, where float32 would lose
    # digits that a single reduction's tree order keeps; each square is still rounded in the tensor's dtype.
    w, z64 = xs.astype(jnp.float64), jnp.zeros([], jnp.float64)
    total, squares, absolute = jax.lax.reduce(
        (w, (xs * xs).astype(jnp.float64), jnp.abs(w)), (z64, z64, z64),
        lambda a, b: (a[0] + b[0], a[1] + b[1], a[2] + b[2]), (0,),
    )  # fmt: skip
    n_div = jnp.maximum(n_finite.astype(dt), jnp.ones([], dt))
    mean = total.astype(dt) / n_div
    centered = jnp.where(finite, xs - mean, zero)
    var = jnp.sum(centered * centered) / n_div
    norm = jnp.sqrt(squares.astype(dt)).astype(jnp.float64) * scale64
    mean_abs = absolute.astype(dt) / n_div

    def defined(v: jax.Array, scaled: bool = False) -> jax.Array:
        v = v.astype(jnp.float64) * scale64 if scaled else v.astype(jnp.float64)
        return jnp.where(has_finite, v, jnp.nan)

    stats = jnp.stack(
        metadata.stat_values(
            elements=jnp.asarray(float(x.size), jnp.float64),
            nan=nan.astype(jnp.float64),
            pos_inf=pos_inf.astype(jnp.float64),
            neg_inf=neg_inf.astype(jnp.float64),
            zeros=zeros.astype(jnp.float64),
            min=defined(lo),
            max=defined(hi),
            mean=defined(mean, scaled=True),
            std=defined(jnp.sqrt(var), scaled=True),
            norm=norm,
            mean_abs=defined(mean_abs, scaled=True),
            no_gradient=jnp.zeros([], jnp.float64),
        )
    )
    return stats, _histogram(x, finite, lo, hi, scale, k)


def _flush(v: jax.Array, tiny: jax.Array) -> jax.Array:
    return jnp.where(jnp.abs(v) < tiny, jnp.zeros_like(v), v)


def _pow2_scale(top: jax.Array) -> jax.Array:
    """The largest power of two <= `top` (finite, >= 0), read off its exponent bits; 1 if none."""
    bits, mask = (jnp.int64, 0x7FF0000000000000) if top.dtype == jnp.float64 else (jnp.int32, 0x7F800000)
    exponent = jax.lax.bitcast_convert_type(top, bits) & jnp.asarray(mask, bits)
    scale = jax.lax.bitcast_convert_type(exponent, top.dtype)
    return jnp.where(scale > 0, scale, jnp.ones([], top.dtype))


def left_edges(lo: jax.Array, hi: jax.Array, k: int, scale: jax.Array) -> jax.Array:
    """float64 [k]: lo + i * (hi - lo) / k on lo / scale and hi / scale, scaled back (as the reference)."""
    s = scale.astype(jnp.float64)
    lo64, hi64 = lo.astype(jnp.float64), hi.astype(jnp.float64)
    i = jnp.arange(k, dtype=jnp.float64)
    offset = i * ((hi64 / s - lo64 / s) / k)
    # Every writer rounds the product, then the sum. XLA's code generators fuse a product and the sum it feeds into
    # one multiply-add (one rounding), which moves an edge by a hair: for min = -max the middle edge misses 0.0,
    # and the elements that are 0.0 change bucket. A select between the two is not fused (and, NaN for NaN, is
    # the product itself); an optimization barrier or a precision round trip is simplified away.
    offset = jnp.where(jnp.isnan(offset), jnp.nan, offset)
    left = (lo64 / s + offset) * s
    return jnp.where(i > 0, left, lo64)


def _histogram(x, finite, lo, hi, scale, k: int) -> jax.Array:
    """int32 [k]: buckets of the finite elements against the float64 edges that are written.

    An element's bucket is the number of edges after the first that are <= it, as the reference's search
    (the last bucket closed). Each edge is compared in the tensor's dtype, rounded up to it: for x in that
    dtype, x >= e exactly when x >= (the smallest value of the dtype >= e), so the counts are those of the
    float64 edges, with no float64 pass over the tensor and no gather.
    """
    dt = x.dtype
    left = left_edges(lo, hi, k, scale)
    edges = left.astype(dt)
    edges = jnp.where(edges.astype(jnp.float64) < left, jnp.nextafter(edges, jnp.asarray(jnp.inf, dt)), edges)
    # "compare_all": k - 1 comparisons per element in one loop, where a binary search would branch.
    index = jnp.searchsorted(edges[1:], x, side="right", method="compare_all").astype(jnp.int32)
    index = jnp.where(finite, index, k)  # bucket k is discarded
    # Counted in pairs of elements, (k + 1)**2 bins: XLA's CPU scatter-add into a few bins makes each update wait
    # for the one before to the same bin; spread over more bins, fewer wait.
    if index.size % 2:
        index = jnp.append(index, k)
    pairs = jnp.bincount(index[0::2] * (k + 1) + index[1::2], length=(k + 1) ** 2).reshape(k + 1, k + 1)
    return (pairs.sum(axis=0) + pairs.sum(axis=1))[:k].astype(jnp.int32)
