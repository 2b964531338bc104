"""One row of an `examples` record (docs/FORMAT.md, "Per-example records"): a layer's per-example norms, summarised.

Why here and nowhere else: the custom loop, the `fit()` step and the tests'
expectations all need the same columns in the same order, with the same
undefined values (NaN, positions -1); `metadata.EXAMPLE_FIELDS` names them and
this module is the one place that fills them. Pure TensorFlow, eager or traced.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from tb_layergrad import metadata

K = metadata.EXAMPLE_TOP_K
WIDTH = len(metadata.EXAMPLE_FIELDS)
_NAN = float("nan")


def exact_row(norms: Any) -> tf.Tensor:
    """float64 [WIDTH]: the row of a layer whose [B] per-example norms are known (status EXAMPLE_EXACT)."""
    n = tf.reshape(tf.cast(norms, tf.float64), [-1])
    count = tf.size(n)
    some = count > 0
    nan = tf.constant(_NAN, tf.float64)
    ascending = tf.sort(n)
    # The median: mean of the middle two for an even count, read from a padded copy so that an empty batch
    # gathers nothing out of range (its values are replaced by NaN below).
    padded = tf.concat([ascending, tf.zeros([1], tf.float64)], 0)
    low = tf.gather(padded, tf.maximum(count - 1, 0) // 2)
    high = tf.gather(padded, count // 2)
    median = tf.where(some, (low + high) / 2.0, nan)
    smallest = tf.where(some, tf.gather(padded, 0), nan)
    largest = tf.where(some, tf.gather(padded, tf.maximum(count - 1, 0)), nan)
    sum_sq = tf.reduce_sum(tf.square(n))
    top_share = tf.where(sum_sq > 0, tf.square(largest) / tf.where(sum_sq > 0, sum_sq, 1.0), nan)
    # top_k: the lower index first among equal values (TensorFlow's documented tie rule), which is the contract's.
    k = tf.minimum(count, K)
    top = tf.math.top_k(n, k=k, sorted=True)
    indexes = tf.pad(tf.cast(top.indices, tf.float64), [[0, K - k]], constant_values=-1.0)
    values = tf.pad(top.values, [[0, K - k]], constant_values=_NAN)
    head = tf.stack([tf.cast(count, tf.float64), tf.constant(float(metadata.EXAMPLE_EXACT), tf.float64),
                     smallest, median, largest, sum_sq, top_share])
    return tf.reshape(tf.concat([head, tf.reshape(indexes, [K]), tf.reshape(values, [K])], 0), [WIDTH])


def status_row(examples: Any, status: int) -> tf.Tensor:
    """float64 [WIDTH]: a layer without numbers (EXAMPLE_UNSUPPORTED, EXAMPLE_COUPLED): NaN, positions -1.

    `examples`: the batch's example count (a scalar; NaN when not known).
    """
    if status == metadata.EXAMPLE_EXACT:
        raise ValueError("a row with status EXAMPLE_EXACT has numbers: use exact_row")
    nan = tf.fill([5], tf.constant(_NAN, tf.float64))
    return tf.concat([
        tf.reshape(tf.cast(examples, tf.float64), [1]), tf.constant([float(status)], tf.float64), nan,
        tf.fill([K], tf.constant(-1.0, tf.float64)), tf.fill([K], tf.constant(_NAN, tf.float64)),
    ], 0)


__all__ = ["WIDTH", "exact_row", "status_row"]
