"""The per-tensor reductions written to disk: histogram, statistics, bounded tensor.

All of it is plain TensorFlow with static output shapes, so it runs on the
tensor's own device, inside `tf.function` and under XLA (`jit_compile=True`).
The histogram is O(N): one bucket index per element and one segment sum,
instead of the O(N*k) one-hot matrix `tf.summary.histogram` builds.

Numerical rules (see docs/FORMAT.md):
- non-finite elements are counted (NaN, +Inf, -Inf) and excluded from buckets
  and from every moment, never dropped silently;
- buckets span [min, max] of the finite elements in k equal widths, the first
  k-1 half-open, the last closed (TensorBoard's layout); one unique value puts
  every count in the last bucket with all edges equal; no finite element gives
  an all-zero histogram;
- float16/bfloat16 are computed in float32, float64 in float64, integers in
  float64.
"""
from __future__ import annotations

from typing import Tuple

import tensorflow as tf

from tb_layergrad import metadata

NUM_STATS = len(metadata.STAT_FIELDS)


def compute_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype reductions of `dtype` are computed in."""
    if dtype == tf.float64 or dtype.is_integer or dtype == tf.bool:
        return tf.float64
    if dtype.is_floating:
        return tf.float32
    raise TypeError(f"cannot summarize a tensor of dtype {dtype.name}")


def _count(mask: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.cast(mask, tf.float64))


def histogram_and_stats(data: tf.Tensor, buckets: int = 30) -> Tuple[tf.Tensor, tf.Tensor]:
    """Returns (histogram float64 [buckets, 3], stats float64 [NUM_STATS])."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    data = tf.convert_to_tensor(data)
    x = tf.reshape(tf.cast(data, compute_dtype(data.dtype)), [-1])
    dt = x.dtype
    finite = tf.math.is_finite(x)
    elements = tf.cast(tf.size(x), tf.float64)
    n_finite = _count(finite)
    nan = _count(tf.math.is_nan(x))
    pos_inf = _count(tf.equal(x, tf.constant(float("inf"), dt)))
    neg_inf = _count(tf.equal(x, tf.constant(float("-inf"), dt)))
    zeros = _count(tf.equal(x, tf.zeros([], dt)))

    xf = tf.where(finite, x, tf.zeros_like(x))
    lo = tf.reduce_min(tf.where(finite, x, tf.fill(tf.shape(x), tf.constant(float("inf"), dt))))
    hi = tf.reduce_max(tf.where(finite, x, tf.fill(tf.shape(x), tf.constant(float("-inf"), dt))))
    n_div = tf.maximum(tf.cast(n_finite, dt), tf.ones([], dt))
    mean = tf.reduce_sum(xf) / n_div
    centered = tf.where(finite, x - mean, tf.zeros_like(x))
    var = tf.reduce_sum(centered * centered) / n_div
    norm = tf.sqrt(tf.reduce_sum(xf * xf))
    mean_abs = tf.reduce_sum(tf.abs(xf)) / n_div

    has_finite = n_finite > 0
    nan64 = tf.constant(float("nan"), tf.float64)

    def defined(v: tf.Tensor) -> tf.Tensor:
        return tf.where(has_finite, tf.cast(v, tf.float64), nan64)

    stats = tf.stack(
        [
            elements,
            nan,
            pos_inf,
            neg_inf,
            zeros,
            defined(lo),
            defined(hi),
            defined(mean),
            defined(tf.sqrt(var)),
            tf.cast(norm, tf.float64),
            defined(mean_abs),
            tf.zeros([], tf.float64),
        ]
    )
    hist = _histogram(x, finite, lo, hi, has_finite, buckets)
    return hist, stats


def _histogram(x, finite, lo, hi, has_finite, k: int) -> tf.Tensor:
    dt = x.dtype
    lo_safe = tf.where(has_finite, lo, tf.zeros([], dt))
    hi_safe = tf.where(has_finite, hi, tf.zeros([], dt))
    span = hi_safe - lo_safe
    width = span / k
    # Equal edges (one unique value): every element lands in the last bucket.
    scaled = tf.where(span > 0, (x - lo_safe) / tf.where(span > 0, width, tf.ones([], dt)), tf.fill(tf.shape(x), tf.constant(k - 1, dt)))
    scaled = tf.where(finite, scaled, tf.zeros_like(scaled))
    index = tf.clip_by_value(tf.cast(tf.floor(scaled), tf.int32), 0, k - 1)
    index = tf.where(finite, index, tf.fill(tf.shape(index), k))  # bucket k is discarded
    counts = tf.math.unsorted_segment_sum(tf.ones_like(index, tf.float64), index, k + 1)[:k]
    lo64 = tf.cast(lo_safe, tf.float64)
    hi64 = tf.cast(hi_safe, tf.float64)
    width64 = (hi64 - lo64) / k
    steps = tf.range(k, dtype=tf.float64)
    left = lo64 + steps * width64
    right = tf.concat([left[1:], hi64[tf.newaxis]], axis=0)
    return tf.stack([left, right, counts], axis=1)


def no_gradient_records(shape_elements: int, buckets: int = 30) -> Tuple[tf.Tensor, tf.Tensor]:
    """Records for a tensor the target does not depend on: empty histogram, NaN moments."""
    nan = float("nan")
    stats = [float(shape_elements), 0.0, 0.0, 0.0, 0.0, nan, nan, nan, nan, 0.0, nan, 1.0]
    return tf.zeros([buckets, 3], tf.float64), tf.constant(stats, tf.float64)


def bounded_tensor(data: tf.Tensor, max_elements: int) -> tf.Tensor:
    """A deterministic, bounded 2-D view of `data` for the raw-tensor record.

    The tensor is seen as [rows, cols] = [shape[0], prod(shape[1:])] (a scalar
    or vector as one row). Whole rows are kept from the top while they fit; if
    one row alone exceeds `max_elements`, its columns are taken with the
    smallest stride s that fits (columns 0, s, 2s, ...). Values are float32.
    """
    if max_elements < 1:
        raise ValueError(f"max_elements must be >= 1, got {max_elements}")
    data = tf.convert_to_tensor(data)
    x = tf.cast(data, tf.float32)
    if x.shape.rank is not None and x.shape.rank <= 1:
        x = tf.reshape(x, [1, -1])
    else:
        x = tf.reshape(x, [tf.shape(x)[0], -1])
    rows = tf.shape(x)[0]
    cols = tf.shape(x)[1]
    stride = tf.maximum(1, (cols + max_elements - 1) // max_elements)
    x = x[:, ::stride]
    kept_cols = tf.shape(x)[1]
    keep_rows = tf.minimum(rows, tf.maximum(1, max_elements // tf.maximum(kept_cols, 1)))
    return x[:keep_rows]
