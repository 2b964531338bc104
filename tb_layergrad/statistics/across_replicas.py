"""Stats-only merging across replicas: the global-batch histogram and statistics without moving tensors.

Why: gathering every layer-output gradient to every replica moves the whole
activation-sized tensors each step. The records need much less: counts, sums,
min/max and histogram counts merge exactly if every replica buckets with the
SAME edges. So, per step and for all tensors at once:

1. one `all_gather` of 6 numbers per tensor (finite min, finite max, element and
   non-finite counts, float32 sum and sum of squares): every replica knows the
   global [min, max], hence the edges `reductions` would use on the whole batch,
   and which of `reductions`' two paths (fast / general) the whole batch takes;
2. each replica buckets its shard with those edges and that path's rule
   (`tf.histogram_fixed_width` or `reductions._histogram`, both elementwise given
   the edges), and sums its moments in float64 on x / 2**e (the same scaling);
3. one SUM `all_reduce` of the counts and sums.

Exact (equal to a single-device run on the global batch): element, NaN, +Inf,
-Inf and zero counts, min, max, the histogram edges and counts. Within float
rounding: mean, std, norm, mean |g| (different summation order; std comes from
the sum of squares, relative error about 1e-16 * mean**2 / std**2).
The path choice (`reductions._fast_path_applies`) uses the float32 sums of the
shards' sums, which can differ from a single device's sums by rounding: near
float32's maximum, or at its |mean| >> std threshold.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.statistics import reductions
from tb_layergrad.statistics.reductions import (
    _FAST_MIN_MAGNITUDE,
    _SMALLEST_NORMAL,
    _flush_subnormal,
    _histogram,
    _pow2_scale,
    _with_edges,
)

__all__ = ["merged_histograms_and_stats"]

_ROUND1 = 6  # lo, hi, elements, non-finite, float32 sum, float32 sum of squares
_MOMENTS = 8  # n_finite, nan, +inf, -inf, zeros, sum xs, sum xs^2, sum |xs|


def _flat(t: tf.Tensor) -> tf.Tensor:
    t = tf.convert_to_tensor(t)
    return tf.reshape(tf.cast(t, reductions.compute_dtype(t.dtype)), [-1])


def _round1(x: tf.Tensor) -> tf.Tensor:
    dt = x.dtype
    finite = tf.math.is_finite(x)
    lo = tf.reduce_min(tf.where(finite, x, tf.fill(tf.shape(x), tf.constant(float("inf"), dt))))
    hi = tf.reduce_max(tf.where(finite, x, tf.fill(tf.shape(x), tf.constant(float("-inf"), dt))))
    n = tf.cast(tf.size(x, out_type=tf.int64), tf.float64)
    nonfinite = tf.reduce_sum(tf.cast(~finite, tf.float64))
    total = tf.reduce_sum(tf.where(finite, x, tf.zeros_like(x)))
    sumsq = 2 * tf.nn.l2_loss(tf.where(finite, x, tf.zeros_like(x)))
    return tf.cast(
        tf.stack(
            [
                -tf.cast(lo, tf.float64),
                tf.cast(hi, tf.float64),
                n,
                nonfinite,
                tf.cast(total, tf.float64),
                tf.cast(sumsq, tf.float64),
            ]
        ),
        tf.float64,
    )


def _local_partials(x: tf.Tensor, g: tf.Tensor, k: int, xla_safe: bool) -> Tuple[tf.Tensor, Tuple]:
    """This shard's moments and bucket counts, given the gathered round-1 numbers `g` [replicas, 6]."""
    dt = x.dtype
    lo64 = -tf.reduce_max(g[:, 0])
    hi64 = tf.reduce_max(g[:, 1])
    n = tf.reduce_sum(g[:, 2])
    nonfinite = tf.reduce_sum(g[:, 3])
    has_finite = tf.math.is_finite(lo64)
    lo = _flush_subnormal(tf.where(has_finite, tf.cast(lo64, dt), tf.zeros([], dt)))
    hi = _flush_subnormal(tf.where(has_finite, tf.cast(hi64, dt), tf.zeros([], dt)))
    top = tf.maximum(tf.abs(lo), tf.abs(hi))
    scale = _pow2_scale(top)
    # reductions._fast_or_general's choice, made on the whole batch.
    total = tf.cast(tf.reduce_sum(g[:, 4]), dt)
    sumsq = tf.cast(tf.reduce_sum(g[:, 5]), dt)
    big_enough = (top >= tf.constant(_FAST_MIN_MAGNITUDE[dt], dt)) | tf.equal(top, tf.zeros([], dt))
    n_dt = tf.maximum(tf.cast(n, dt), tf.ones([], dt))
    mean = total / n_dt
    exact_enough = mean * mean <= 1e3 * tf.maximum(sumsq / n_dt - mean * mean, 0)  # reductions._fast_path_applies
    fast = (
        tf.equal(nonfinite, 0)
        & (n > 0)
        & tf.math.is_finite(total)
        & tf.math.is_finite(sumsq)
        & big_enough
        & exact_enough
    )
    if xla_safe:
        fast = tf.constant(False)

    finite = tf.math.is_finite(x)
    zero = tf.abs(x) < tf.constant(_SMALLEST_NORMAL[dt], dt)
    xs = tf.where(finite & ~zero, x / scale, tf.zeros_like(x))
    xs64 = tf.cast(xs, tf.float64)

    def count(mask: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.cast(mask, tf.float64))

    moments = tf.stack(
        [
            count(finite),
            count(tf.math.is_nan(x)),
            count(tf.equal(x, tf.constant(float("inf"), dt))),
            count(tf.equal(x, tf.constant(float("-inf"), dt))),
            count(zero),
            tf.reduce_sum(xs64),
            tf.reduce_sum(xs64 * xs64),
            tf.reduce_sum(tf.abs(xs64)),
        ]
    )

    def fast_counts() -> tf.Tensor:
        n_local = tf.cast(tf.size(x, out_type=tf.int64), tf.float64)
        return tf.cond(
            hi > lo,
            lambda: tf.cast(tf.histogram_fixed_width(x, tf.stack([lo, hi]), nbins=k), tf.float64),
            lambda: tf.concat([tf.zeros([k - 1], tf.float64), n_local[tf.newaxis]], 0),
        )

    def general_counts() -> tf.Tensor:
        return _histogram(x, xs, finite, lo, hi, scale, k)[:, 2]

    counts = general_counts() if xla_safe else tf.cond(fast, fast_counts, general_counts)
    return tf.concat([moments, counts], 0), (lo, hi, scale, has_finite, n)


def _finish(summed: tf.Tensor, local: Tuple, k: int) -> Tuple[tf.Tensor, tf.Tensor]:
    lo, hi, scale, has_finite, n = local
    n_finite, nan, pos_inf, neg_inf, zeros, s1, s2, sa = (summed[i] for i in range(_MOMENTS))
    counts = summed[_MOMENTS:]
    scale64 = tf.cast(scale, tf.float64)
    n_div = tf.maximum(n_finite, 1.0)
    mean = s1 / n_div
    var = tf.maximum(s2 / n_div - mean * mean, 0.0)
    nan64 = tf.constant(float("nan"), tf.float64)

    def defined(v: tf.Tensor) -> tf.Tensor:
        return tf.where(has_finite, v, nan64)

    stats = tf.stack(
        metadata.stat_values(
            elements=n,
            nan=nan,
            pos_inf=pos_inf,
            neg_inf=neg_inf,
            zeros=zeros,
            min=defined(tf.cast(lo, tf.float64)),
            max=defined(tf.cast(hi, tf.float64)),
            mean=defined(mean * scale64),
            std=defined(tf.sqrt(var) * scale64),
            norm=tf.sqrt(s2) * scale64,
            mean_abs=defined(sa / n_div * scale64),
            no_gradient=tf.zeros([], tf.float64),
        )
    )
    return _with_edges(counts, lo, hi, k, scale), stats


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def merged_histograms_and_stats(
    tensors: Sequence[tf.Tensor], buckets: int = 30, ctx: Any = None, xla_safe: bool = False
) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """[(histogram [k, 3], stats)] of each tensor over ALL replicas, like `reductions.histogram_and_stats`.

    To be called in replica context (inside `strategy.run`) by every replica,
    unconditionally (collectives cannot run inside a `tf.cond`). `ctx` is the
    replica context (default: the current one); with one replica this is plain
    `reductions.histogram_and_stats`. Two collective calls in all, whatever the
    number of tensors. Every replica returns the same records.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    ctx = ctx if ctx is not None else tf.distribute.get_replica_context()
    flats = [_flat(t) for t in tensors]
    if not flats:
        return []
    if ctx is None or ctx.num_replicas_in_sync <= 1:
        return [reductions.histogram_and_stats(x, buckets, xla_safe=xla_safe) for x in flats]
    replicas = ctx.num_replicas_in_sync
    first = tf.stack([_round1(x) for x in flats])  # [m, 6]
    gathered = tf.reshape(ctx.all_gather(first[tf.newaxis], axis=0), [replicas, len(flats), _ROUND1])
    partials, locals_ = [], []
    for i, x in enumerate(flats):
        p, local = _local_partials(x, gathered[:, i, :], buckets, xla_safe)
        partials.append(p)
        locals_.append(local)
    summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.concat(partials, 0))
    width = _MOMENTS + buckets
    return [_finish(summed[i * width : (i + 1) * width], local, buckets) for i, local in enumerate(locals_)]
