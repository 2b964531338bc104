"""The per-tensor reductions written to disk: the histogram and the statistics.

All of it is plain TensorFlow with static output shapes, so it runs on the
tensor's own device and inside `tf.function`; with `xla_safe=True` also under
XLA (`jit_compile=True`). The histogram is O(N) (`histogram_fixed_width`, or
one bucket index per element and a segment sum), instead of the O(N*k)
one-hot matrix `tf.summary.histogram` builds. These are the reference the
fused C++ kernel (`tb_layergrad.kernel`) is tested against; which of the two
computes a step's records is decided in one place, `tb_layergrad.summary.write`.

Numerical rules (see docs/FORMAT.md):
- non-finite elements are counted (NaN, +Inf, -Inf) and excluded from buckets
  and from every moment, never dropped silently;
- buckets span [min, max] of the finite elements in k equal widths, the first
  k-1 half-open, the last closed (TensorBoard's layout); one unique value puts
  every count in the last bucket with all edges equal; no finite element gives
  an all-zero histogram;
- float16/bfloat16 are computed in float32, float64 in float64, integers in
  float64;
- magnitudes near the dtype's max or min do not overflow or underflow: the
  general path works on x / 2**e (exact), so a moment is Inf only if its true
  value exceeds float64; subnormal numbers count as zero, as TensorFlow's CPU
  kernels flush them.
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import metadata

NUM_STATS = len(metadata.STAT_FIELDS)

# The fast path needs max|x| at least this large (or 0): below it squares
# underflow (the norm would read 0) and histogram_fixed_width's bucket width
# can flush to 0 (a NaN bucket index, which crashes its CPU kernel).
_FAST_MIN_MAGNITUDE = {tf.float32: 2.0**-60, tf.float64: 2.0**-500}
_SMALLEST_NORMAL = {tf.float32: 2.0**-126, tf.float64: 2.0**-1022}


def compute_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype reductions of `dtype` are computed in."""
    if dtype == tf.float64 or dtype.is_integer or dtype == tf.bool:
        return tf.float64
    if dtype.is_floating:
        return tf.float32
    raise TypeError(f"cannot summarize a tensor of dtype {dtype.name}")


def _count(mask: tf.Tensor) -> tf.Tensor:
    """Number of True elements, exact, as float64.

    Summed in int32 when the size is known to fit (int64 otherwise): XLA's CPU
    code sums casts to float64 much more slowly (docs/DESIGN.md, "Reductions").
    """
    size = mask.shape.num_elements()
    acc = tf.int32 if size is not None and size < 2**31 else tf.int64
    return tf.cast(tf.reduce_sum(tf.cast(mask, acc)), tf.float64)


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def histogram_and_stats(data: tf.Tensor, buckets: int = 30, xla_safe: bool = False) -> Tuple[tf.Tensor, tf.Tensor]:
    """Returns (histogram float64 [buckets, 3], stats float64 [NUM_STATS]).

    The common case (every element finite) takes a fast path of single-kernel
    reductions and `tf.histogram_fixed_width`: about 6 passes over memory. A
    tensor with NaN/Inf takes the general, masked path. `xla_safe=True` always
    uses the general path, which compiles under XLA (histogram_fixed_width
    does not).
    """
    return histograms_and_stats([data], buckets, xla_safe)[0]


def histograms_and_stats(
    tensors: Sequence[tf.Tensor], buckets: int = 30, xla_safe: bool = False, edges: bool = True
) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """`histogram_and_stats` of several tensors at once; the same numbers, fewer ops.

    Why: a training step may log hundreds of tensors, and per tensor the
    reductions are a handful of kernels but the scalar work around them (the
    path choice, subnormal flushing, edges, the stats vector) is dozens of tiny
    ops, each with its own dispatch cost. So the per-tensor kernels stay per
    tensor and all the scalar work is done once on [T] vectors, with one path
    choice for all: the fast path when every tensor qualifies, else each
    tensor on its own path. `xla_safe`: the general path of each tensor, as
    one call of a function traced once per dtype (`_one_tensor_function`).
    `edges=False`: each histogram is its [buckets] counts alone, what a record
    holds (docs/FORMAT.md: readers put the edges back from min and max); the
    all-finite path then computes no edges.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    given = [tf.convert_to_tensor(data) for data in tensors]
    out: List[Optional[Tuple[tf.Tensor, tf.Tensor]]] = [None] * len(given)
    # Not flattened: every reduction here takes any shape (a reshape is one more op per tensor).
    flat = {i: tf.cast(x, compute_dtype(x.dtype)) for i, x in enumerate(given)}
    if xla_safe:
        for i, x in flat.items():
            hist, stats = _one_tensor_function(x.dtype, buckets, xla_safe=True)(tf.reshape(x, [-1]))
            hist = tf.ensure_shape(hist, [buckets, 3])
            out[i] = (hist if edges else hist[:, 2], tf.ensure_shape(stats, [NUM_STATS]))
        return out  # type: ignore[return-value]
    for dt in dict.fromkeys(x.dtype for x in flat.values()):  # one batch per compute dtype, in order of appearance
        index = [i for i, x in flat.items() if x.dtype == dt]
        for i, result in zip(index, _fast_or_general([flat[i] for i in index], buckets, edges)):
            out[i] = result
    return out  # type: ignore[return-value]


class _Moments(NamedTuple):
    """The reductions every path choice needs, per tensor, stacked to [T]."""

    n: tf.Tensor  # element counts, compute dtype
    n64: tf.Tensor  # element counts, float64 (exact past 2**24)
    total: tf.Tensor
    sumsq: tf.Tensor
    lo: tf.Tensor
    hi: tf.Tensor


def _element_counts(xs: List[tf.Tensor]) -> tf.Tensor:
    """[T] float64 element counts: a constant when every shape is static (no op per tensor)."""
    sizes = [x.shape.num_elements() for x in xs]
    if all(n is not None for n in sizes):
        return tf.constant(sizes, tf.float64)
    return tf.stack([tf.cast(tf.size(x, out_type=tf.int64), tf.float64) for x in xs])


def _fast_or_general(xs: List[tf.Tensor], k: int, edges: bool = True) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """Why stacked: each branch returns [T, k, 3] (or [T, k] without `edges`) and [T, NUM_STATS], so the
    condition merges 2 tensors, not 2 per tensor (each merge is an op the
    executor runs), and one unstack hands them out."""
    dt = xs[0].dtype
    n64 = _element_counts(xs)
    # A reduction may hand back a subnormal element as it is: flush like every other kernel.
    m = _Moments(
        n=tf.cast(n64, dt),
        n64=n64,
        total=tf.stack([tf.reduce_sum(x) for x in xs]),
        sumsq=2 * tf.stack([tf.nn.l2_loss(x) for x in xs]),
        lo=_flush_subnormal(tf.stack([tf.reduce_min(x) for x in xs])),
        hi=_flush_subnormal(tf.stack([tf.reduce_max(x) for x in xs])),
    )
    fast = _fast_path_applies(m)

    def all_fast() -> Tuple[tf.Tensor, tf.Tensor]:
        return _fast(xs, m, k, edges)

    def general(x: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        hist, stats = _general(x, k)
        return (hist if edges else hist[:, 2]), stats

    def each_on_its_own() -> Tuple[tf.Tensor, tf.Tensor]:
        if len(xs) == 1:
            x = xs[0]
            hist, stats = tf.cond(fast[0], lambda: tuple(t[0] for t in _fast([x], m, k, edges)), lambda: general(x))
            return hist[tf.newaxis], stats[tf.newaxis]
        each = [_one_tensor_function(dt, k, xla_safe=False)(tf.reshape(x, [-1])) for x in xs]
        hists = tf.stack([h for h, _ in each])
        return (hists if edges else hists[:, :, 2]), tf.stack([s for _, s in each])

    if len(xs) == 1:
        hist, stats = each_on_its_own()
    elif tf.executing_eagerly():
        hist, stats = all_fast() if bool(tf.reduce_all(fast)) else each_on_its_own()
    else:
        hist, stats = tf.cond(tf.reduce_all(fast), all_fast, each_on_its_own)
    return list(zip(tf.unstack(hist, len(xs)), tf.unstack(stats, len(xs))))


_ONE_TENSOR_FUNCTIONS: Dict[Tuple[str, int, bool], Callable] = {}


def _one_tensor_function(dtype: tf.DType, k: int, xla_safe: bool) -> Callable:
    """`histogram_and_stats` of one flat tensor, as a function traced once per (dtype, buckets, xla_safe).

    Why: when some tensor of a batch is not all-finite (or under XLA, where only
    the general path compiles), each tensor takes its own path. Traced inline,
    that is hundreds of ops per tensor: tracing and graph optimization of a
    large model's step grow by minutes, and the executor visits them (as dead)
    at every step that takes the batched fast path. As calls of one cached
    function it is T ops.
    """
    key = (dtype.name, k, xla_safe)
    fn = _ONE_TENSOR_FUNCTIONS.get(key)
    if fn is None:
        fn = tf.function(
            (lambda x: _general(x, k)) if xla_safe else (lambda x: _fast_or_general([x], k)[0]),
            input_signature=[tf.TensorSpec([None], dtype)],
            autograph=False,
            experimental_attributes={"_noinline": True},
        )
        _ONE_TENSOR_FUNCTIONS[key] = fn
    return fn


def _fast_path_applies(m: _Moments) -> tf.Tensor:
    """[T] bool: may this tensor take the fast path?

    A NaN or an Inf anywhere makes one of the moments non-finite (an
    overflowing sum of squares also lands here; the general path handles it
    exactly). An empty tensor has lo=+max, hi=-max. Tiny magnitudes (see
    _FAST_MIN_MAGNITUDE) and a one-pass variance that would lose digits
    (|mean| >> std) also take the general path; one unique value does not
    (its mean is min, its std 0: nothing to lose), so that a step's scalar
    target value, batched with its gradients, does not send all of them
    down the per-tensor path.
    """
    dt = m.lo.dtype
    top = tf.maximum(tf.abs(m.lo), tf.abs(m.hi))
    big_enough = (top >= tf.constant(_FAST_MIN_MAGNITUDE[dt], dt)) | tf.equal(top, tf.zeros([], dt))
    mean, var = _one_pass_moments(m)
    exact_enough = (mean * mean <= 1e3 * var) | tf.equal(m.lo, m.hi)
    finite = tf.reduce_all(tf.math.is_finite(tf.stack([m.total, m.sumsq, m.lo, m.hi])), axis=0)
    return finite & (m.n > 0) & big_enough & exact_enough


def _one_pass_moments(m: _Moments) -> Tuple[tf.Tensor, tf.Tensor]:
    """(mean, variance) from the sums; one unique value (min == max) is its own mean, with variance 0."""
    mean = m.total / tf.maximum(m.n, 1)
    var = tf.maximum(m.sumsq / tf.maximum(m.n, 1) - mean * mean, 0)
    unique = tf.equal(m.lo, m.hi)
    return tf.where(unique, m.lo, mean), tf.where(unique, tf.zeros_like(var), var)


def _fast(xs: List[tf.Tensor], m: _Moments, k: int, edges: bool = True) -> Tuple[tf.Tensor, tf.Tensor]:
    """Histograms [T, k, 3] (counts [T, k] without `edges`) and stats [T, NUM_STATS] of all-finite tensors.

    No conditional in here: each costs a branch dispatch. One unique value
    (lo == hi) is bucketed against the stand-in range [0, 1] (a zero-width
    range would crash histogram_fixed_width) and its count then put in the
    last bucket.
    """
    dt = m.lo.dtype
    magnitudes = [tf.abs(x) for x in xs]
    sum_abs = tf.stack([tf.reduce_sum(a) for a in magnitudes])
    nonzero = _count_nonzero(magnitudes)
    spread = m.hi > m.lo
    ranges = tf.where(spread[:, tf.newaxis], tf.stack([m.lo, m.hi], axis=1), tf.constant([[0, 1]], dt))
    ranges = tf.unstack(ranges, len(xs)) if len(xs) > 1 else [ranges[0]]
    counts = tf.cast(tf.stack([tf.histogram_fixed_width(x, r, nbins=k) for x, r in zip(xs, ranges)]), tf.float64)
    last_only = tf.concat([tf.zeros([len(xs), k - 1], tf.float64), m.n64[:, tf.newaxis]], axis=1)
    counts = tf.where(spread[:, tf.newaxis], counts, last_only)
    mean, var = _one_pass_moments(m)
    zero = tf.zeros_like(m.n64)
    f64 = lambda v: tf.cast(v, tf.float64)  # noqa: E731
    stats = tf.stack(
        metadata.stat_values(
            elements=m.n64,
            nan=zero,
            pos_inf=zero,
            neg_inf=zero,
            zeros=m.n64 - nonzero,
            min=f64(m.lo),
            max=f64(m.hi),
            mean=f64(mean),
            std=f64(tf.sqrt(var)),
            norm=f64(tf.sqrt(m.sumsq)),
            mean_abs=f64(sum_abs / m.n),
            no_gradient=zero,
        ),
        axis=1,
    )
    if not edges:
        return counts, stats
    top = tf.maximum(tf.abs(m.lo), tf.abs(m.hi))
    return _with_edges(counts, m.lo, m.hi, k, _pow2_scale(top)), stats


def _count_nonzero(magnitudes: List[tf.Tensor]) -> tf.Tensor:
    """[T] numbers of non-zero elements of each |x| (float64), as the sums of sign(|x|).

    Why not `tf.math.count_nonzero`: its compare-with-a-scalar kernel is not
    vectorized on CPU (docs/DESIGN.md, "Reductions"). A sum of ones is exact in float32 below 2**24
    elements; larger tensors are summed in float64.
    """
    sums = []
    for magnitude in magnitudes:
        ones = tf.sign(magnitude)
        size = magnitude.shape.num_elements()
        if ones.dtype != tf.float64 and (size is None or size >= 2**24):
            ones = tf.cast(ones, tf.float64)
        sums.append(tf.reduce_sum(ones))
    if len({t.dtype for t in sums}) == 1:
        return tf.cast(tf.stack(sums), tf.float64)  # one cast for all
    return tf.stack([tf.cast(t, tf.float64) for t in sums])


def _general(x: tf.Tensor, buckets: int) -> Tuple[tf.Tensor, tf.Tensor]:
    """Masked reductions: correct for any mix of NaN/Inf, empty tensors; XLA-compilable."""
    dt = x.dtype
    finite = tf.math.is_finite(x)
    # Subnormals count as zero on every path: TensorFlow's CPU kernels flush
    # them to zero, XLA's do not, so they are flushed here explicitly.
    zero = tf.abs(x) < tf.constant(_SMALLEST_NORMAL[dt], dt)
    elements = tf.cast(tf.size(x, out_type=tf.int64), tf.float64)
    n_finite = _count(finite)
    nan = _count(tf.math.is_nan(x))
    pos_inf = _count(tf.equal(x, tf.constant(float("inf"), dt)))
    neg_inf = _count(tf.equal(x, tf.constant(float("-inf"), dt)))
    zeros = _count(zero)

    lo = tf.reduce_min(tf.where(finite, x, tf.fill(tf.shape(x), tf.constant(float("inf"), dt))))
    hi = tf.reduce_max(tf.where(finite, x, tf.fill(tf.shape(x), tf.constant(float("-inf"), dt))))
    has_finite = n_finite > 0
    lo = _flush_subnormal(tf.where(has_finite, lo, tf.zeros([], dt)))
    hi = _flush_subnormal(tf.where(has_finite, hi, tf.zeros([], dt)))
    # Moments of xs = x / scale (|xs| < 2): sums of squares neither overflow
    # nor underflow; scaled back in float64, exactly (scale is a power of two).
    scale = _pow2_scale(tf.maximum(tf.abs(lo), tf.abs(hi)))
    scale64 = tf.cast(scale, tf.float64)
    xs = tf.where(finite & ~zero, x / scale, tf.zeros_like(x))
    n_div = tf.maximum(tf.cast(n_finite, dt), tf.ones([], dt))
    mean = tf.reduce_sum(xs) / n_div
    centered = tf.where(finite, xs - mean, tf.zeros_like(x))
    var = tf.reduce_sum(centered * centered) / n_div
    # One unique finite value is its own mean, with variance 0 (as on the fast path), not a rounded sum's.
    unique = tf.equal(lo, hi)
    mean = tf.where(unique, lo / scale, mean)
    var = tf.where(unique, tf.zeros([], dt), var)
    norm = tf.cast(tf.sqrt(tf.reduce_sum(xs * xs)), tf.float64) * scale64
    mean_abs = tf.reduce_sum(tf.abs(xs)) / n_div

    nan64 = tf.constant(float("nan"), tf.float64)

    def defined(v: tf.Tensor, scaled: bool = False) -> tf.Tensor:
        v = tf.cast(v, tf.float64) * scale64 if scaled else tf.cast(v, tf.float64)
        return tf.where(has_finite, v, nan64)

    stats = tf.stack(
        metadata.stat_values(
            elements=elements,
            nan=nan,
            pos_inf=pos_inf,
            neg_inf=neg_inf,
            zeros=zeros,
            min=defined(lo),
            max=defined(hi),
            mean=defined(mean, scaled=True),
            std=defined(tf.sqrt(var), scaled=True),
            norm=norm,
            mean_abs=defined(mean_abs, scaled=True),
            no_gradient=tf.zeros([], tf.float64),
        )
    )
    hist = _histogram(x, xs, finite, lo, hi, scale, buckets)
    return hist, stats


def _flush_subnormal(x: tf.Tensor) -> tf.Tensor:
    return tf.where(tf.abs(x) < tf.constant(_SMALLEST_NORMAL[x.dtype], x.dtype), tf.zeros_like(x), x)


def _pow2_scale(top: tf.Tensor) -> tf.Tensor:
    """The largest power of two <= `top` (finite, >= 0), read off its exponent bits; 1 if none."""
    bits, mask = (tf.int64, 0x7FF0000000000000) if top.dtype == tf.float64 else (tf.int32, 0x7F800000)
    scale = tf.bitcast(tf.bitwise.bitwise_and(tf.bitcast(top, bits), tf.constant(mask, bits)), top.dtype)
    return tf.where(scale > 0, scale, tf.ones([], top.dtype))


def _histogram(x, xs, finite, lo, hi, scale, k: int) -> tf.Tensor:
    """Buckets of the finite elements; `xs` = x / scale (masked), lo/hi = 0 if nothing is finite."""
    dt = x.dtype
    lo_s = lo / scale
    span = hi / scale - lo_s  # scaled: cannot overflow (hi - lo can) or flush to 0
    width = span / k
    # Equal edges (one unique value): every element lands in the last bucket.
    scaled = tf.where(
        span > 0, (xs - lo_s) / tf.where(span > 0, width, tf.ones([], dt)), tf.fill(tf.shape(x), tf.constant(k - 1, dt))
    )
    scaled = tf.where(finite, scaled, tf.zeros_like(scaled))
    index = tf.clip_by_value(tf.cast(tf.floor(scaled), tf.int32), 0, k - 1)
    # The division above may round across an edge (and graph optimizers may
    # rewrite it): settle elements next to an edge against the float64 edges
    # that are written, so both paths bucket exactly like those edges say.
    left = _left_edges(lo, hi, k, scale)
    xd = tf.cast(tf.where(finite, x, tf.zeros_like(x)), tf.float64)
    below = (index > 0) & (xd < tf.gather(left, index))
    above = (index < k - 1) & (xd >= tf.gather(left, tf.minimum(index + 1, k - 1)))
    index = index - tf.cast(below, tf.int32) + tf.cast(above, tf.int32)
    index = tf.where(finite, index, tf.fill(tf.shape(index), k))  # bucket k is discarded
    counts = tf.math.unsorted_segment_sum(tf.ones_like(index, tf.float64), index, k + 1)[:k]
    return _with_edges(counts, lo, hi, k, scale)


def _left_edges(lo: tf.Tensor, hi: tf.Tensor, k: int, scale: tf.Tensor) -> tf.Tensor:
    """lo + i * (hi - lo) / k, computed on lo / scale and hi / scale (exact, |.| < 2) and scaled back.

    Unscaled, hi - lo overflows for float64 data near the max and the width
    flushes to 0 for float64 data near the min; scaled, neither can happen.
    Scalars give [k]; vectors [T] (one tensor each) give [T, k].
    """
    s = tf.cast(scale, tf.float64)[..., tf.newaxis]
    lo64 = tf.cast(lo, tf.float64)[..., tf.newaxis]
    hi64 = tf.cast(hi, tf.float64)[..., tf.newaxis]
    i = tf.range(k, dtype=tf.float64)
    offset = i * ((hi64 / s - lo64 / s) / k)
    # Every writer rounds the product, then the sum. XLA fuses a product and the sum it feeds into one
    # multiply-add (one rounding), which moves an edge by a hair: for min = -max the middle edge misses 0.0 and
    # the elements that are 0.0 change bucket. A select between the two is not fused (NaN for NaN: the product).
    offset = tf.where(tf.math.is_nan(offset), tf.constant(float("nan"), tf.float64), offset)
    left = (lo64 / s + offset) * s
    left = tf.where(i > 0, left, lo64)  # lo / s may underflow when hi >> lo: the first edge is lo itself
    return left if lo.shape.rank else tf.reshape(left, [k])


def _with_edges(counts: tf.Tensor, lo: tf.Tensor, hi: tf.Tensor, k: int, scale: tf.Tensor) -> tf.Tensor:
    """TensorBoard's [k, 3] layout: (left, right, count), k equal widths over [lo, hi] ([T, k, 3] for vectors)."""
    left = _left_edges(lo, hi, k, scale)
    right = tf.concat([left[..., 1:], tf.cast(hi, tf.float64)[..., tf.newaxis]], axis=-1)
    return tf.stack([left, right, counts], axis=-1)
