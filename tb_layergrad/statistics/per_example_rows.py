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
    return exact_rows(tf.reshape(norms, [1, -1]))[0]


def exact_rows(norms: Any) -> tf.Tensor:
    """float64 [L, WIDTH]: the rows of L layers of one batch, from their [L, B] per-example norms.

    Why all at once: a group's rows share the batch, and one sort and one top_k over [L, B] are a few ops
    where a row each would be a few dozen per layer, run at every logged step.
    """
    n = tf.cast(norms, tf.float64)
    rows = tf.shape(n)[0]
    count = tf.shape(n)[1]
    some = count > 0
    nan = tf.constant(_NAN, tf.float64)
    # Sorted ascending, padded with a column so that an empty batch gathers nothing out of range (its values
    # are replaced by NaN below). The median: the mean of the middle two for an even count.
    padded = tf.concat([tf.sort(n, axis=1), tf.zeros([rows, 1], tf.float64)], 1)
    last = tf.maximum(count - 1, 0)
    picked = tf.gather(padded, tf.stack([0, last // 2, count // 2, last]), axis=1)  # [L, 4]
    smallest = tf.where(some, picked[:, 0], nan)
    median = tf.where(some, (picked[:, 1] + picked[:, 2]) / 2.0, nan)
    largest = tf.where(some, picked[:, 3], nan)
    sum_sq = tf.reduce_sum(tf.square(n), axis=1)
    positive = sum_sq > 0
    top_share = tf.where(positive, tf.square(largest) / tf.where(positive, sum_sq, 1.0), nan)
    # top_k: the lower index first among equal values (TensorFlow's documented tie rule), which is the contract's.
    k = tf.minimum(count, K)
    top = tf.math.top_k(n, k=k, sorted=True)
    indexes = tf.pad(tf.cast(top.indices, tf.float64), [[0, 0], [0, K - k]], constant_values=-1.0)
    values = tf.pad(top.values, [[0, 0], [0, K - k]], constant_values=_NAN)
    head = tf.stack([tf.fill([rows], tf.cast(count, tf.float64)), tf.fill([rows], tf.constant(float(metadata.EXAMPLE_EXACT), tf.float64)),
                     smallest, median, largest, sum_sq, top_share], axis=1)
    return tf.reshape(tf.concat([head, tf.reshape(indexes, [rows, K]), tf.reshape(values, [rows, K])], 1), [rows, WIDTH])


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


__all__ = ["WIDTH", "exact_row", "exact_rows", "status_row"]
