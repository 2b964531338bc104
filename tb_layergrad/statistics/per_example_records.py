"""The numbers of the per-example records (docs/FORMAT.md, "Per-example records"): the one place they are computed.

A row of an `examples` record: a layer's per-example norms, summarised. The custom loop, the `fit()` step and
the tests' expectations all need the same columns in the same order, with the same undefined values (NaN,
positions -1); `metadata.EXAMPLE_FIELDS` names them and this module fills them.

The gradient noise scale (McCandlish et al. 2018) from per-example and batch gradient norms: with B examples,
S = mean_i Σ_v ‖g_{i,v}‖² over the covered trainable variables v (those with an exact per-example rule) and
|G_B|² the batch gradient's squared norm over the same variables:

    signal |G|² ≈ (B |G_B|² − S) / (B − 1)
    trace tr(Σ) ≈ (S − |G_B|²) · B / (B − 1)
    B_simple    = tr(Σ) / |G|²

Both estimates are unbiased for a batch-mean loss whose examples are drawn independently; B_simple is only
meaningful where the signal estimate is positive (the writer writes nothing otherwise). float64 throughout: S
and B·|G_B|² are close when the noise dominates, and their difference is the point.

Pure TensorFlow, eager or traced.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tb_layergrad import metadata

K = metadata.EXAMPLE_TOP_K
WIDTH = len(metadata.EXAMPLE_FIELDS)
_NAN = float("nan")


def exact_row(norms: Any) -> tf.Tensor:
    """float64 [WIDTH]: the row of a layer whose [B] per-example norms are known (status EXAMPLE_EXACT)."""
    return exact_rows(tf.reshape(norms, [1, -1]))[0]


def exact_rows(norms: Any) -> tf.Tensor:
    """float64 [L, WIDTH]: the rows of L layers of one batch, from their [L, B] per-example norms."""
    n = tf.cast(norms, tf.float64)
    return exact_rows_from_squares(n * n)  # a float32 norm squared in float64 is exact: sqrt gives it back


def exact_rows_from_squares(squares: Any) -> tf.Tensor:
    """float64 [L, WIDTH]: the rows of L layers of one batch, from their [L, B] squared per-example norms.

    Why all at once: a group's rows share the batch, and one sort and one top_k over [L, B] are a few ops
    where a row each would be a few dozen per layer, run at every logged step. Why squares: `sum_sq` is
    their sum, and the order, hence the picked examples, is the norms'; only the picked values need a root.
    """
    sq = tf.cast(squares, tf.float64)
    # The sizes as Python ints where the shape has them: no shape ops, no guards for an empty batch to run.
    rows = sq.shape[0] if sq.shape[0] is not None else tf.shape(sq)[0]
    count = sq.shape[1] if sq.shape[1] is not None else tf.shape(sq)[1]
    nan = tf.constant(_NAN, tf.float64)
    # ONE full top_k: the examples in descending order, the lower index first among equal values (TensorFlow's
    # documented tie rule, which is the contract's); the first K are the top ones, and the order statistics are
    # read from the same ranking (a column of zeros appended so that an empty batch gathers nothing out of
    # range; its values are replaced by NaN below). The median: the mean of the middle two for an even count.
    ranked = tf.math.top_k(sq, k=count, sorted=True)
    if isinstance(count, int) and count > 0:
        picked = tf.gather(ranked.values, [count - 1, (count - 1) // 2, count // 2, 0], axis=1)  # [L, 4] squares
        roots = tf.sqrt(picked)
        smallest, median, largest = roots[:, 0], (roots[:, 1] + roots[:, 2]) / 2.0, roots[:, 3]
    else:
        some = count > 0
        padded = tf.concat([ranked.values, tf.zeros([rows, 1], tf.float64)], 1)
        last = tf.maximum(count - 1, 0)
        picked = tf.gather(padded, tf.stack([last, last // 2, count // 2, 0]), axis=1)  # [L, 4] squares
        roots = tf.sqrt(picked)
        smallest = tf.where(some, roots[:, 0], nan)
        median = tf.where(some, (roots[:, 1] + roots[:, 2]) / 2.0, nan)
        largest = tf.where(some, roots[:, 3], nan)
    sum_sq = tf.reduce_sum(sq, axis=1)
    positive = sum_sq > 0
    top_share = tf.where(positive, picked[:, 3] / tf.where(positive, sum_sq, 1.0), nan)
    k = min(count, K) if isinstance(count, int) else tf.minimum(count, K)
    indexes, values = tf.cast(ranked.indices[:, :k], tf.float64), tf.sqrt(ranked.values[:, :k])
    if not isinstance(k, int) or k < K:
        indexes = tf.pad(indexes, [[0, 0], [0, K - k]], constant_values=-1.0)
        values = tf.pad(values, [[0, 0], [0, K - k]], constant_values=_NAN)
    head = tf.stack(
        [
            tf.fill([rows], tf.cast(count, tf.float64)),
            tf.fill([rows], tf.constant(float(metadata.EXAMPLE_EXACT), tf.float64)),
            smallest,
            median,
            largest,
            sum_sq,
            top_share,
        ],
        axis=1,
    )
    return tf.reshape(
        tf.concat([head, tf.reshape(indexes, [rows, K]), tf.reshape(values, [rows, K])], 1), [rows, WIDTH]
    )


def status_row(examples: Any, status: int) -> tf.Tensor:
    """float64 [WIDTH]: a layer without numbers (EXAMPLE_UNSUPPORTED, EXAMPLE_COUPLED): NaN, positions -1.

    `examples`: the batch's example count (a scalar; NaN when not known).
    """
    if status == metadata.EXAMPLE_EXACT:
        raise ValueError("a row with status EXAMPLE_EXACT has numbers: use exact_row")
    nan = tf.fill([5], tf.constant(_NAN, tf.float64))
    return tf.concat(
        [
            tf.reshape(tf.cast(examples, tf.float64), [1]),
            tf.constant([float(status)], tf.float64),
            nan,
            tf.fill([K], tf.constant(-1.0, tf.float64)),
            tf.fill([K], tf.constant(_NAN, tf.float64)),
        ],
        0,
    )


__all__ = ["WIDTH", "exact_row", "exact_rows", "exact_rows_from_squares", "status_row"]


# -- the gradient noise scale ------------------------------------------------------------------------
class NoiseScale(NamedTuple):
    trace: tf.Tensor  # tr(Σ) estimate, float64 scalar
    signal: tf.Tensor  # |G|² estimate, float64 scalar
    b_simple: tf.Tensor  # trace / signal (any value; the writer checks signal > 0 and finiteness)


def noise_scale(per_example_sum_sq: Any, batch_sq: Any, examples: Any) -> NoiseScale:
    """The noise scale's estimates from Σ_i ‖g_{i,v}‖² per variable ([k]), ‖G_B,v‖² per variable ([k]) and B (a scalar)."""
    b = tf.cast(examples, tf.float64)
    s = tf.reduce_sum(tf.cast(per_example_sum_sq, tf.float64)) / b
    g2 = tf.reduce_sum(tf.cast(batch_sq, tf.float64))
    signal = (b * g2 - s) / (b - 1.0)
    trace = (s - g2) * b / (b - 1.0)
    return NoiseScale(trace, signal, trace / signal)
