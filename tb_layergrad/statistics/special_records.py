"""The records that are not reductions of a tensor: the bounded raw tensor, and "no gradient".

Written beside the histogram and statistics (docs/FORMAT.md, kinds `tensor` and `stats`); in TensorFlow's ops,
with static shapes where the reductions have them.
"""

from __future__ import annotations

from typing import Tuple

import tensorflow as tf

from tb_layergrad import metadata


def no_gradient_records(shape_elements: int, buckets: int = 30) -> Tuple[tf.Tensor, tf.Tensor]:
    """Records for a tensor the target does not depend on: empty histogram, NaN moments."""
    nan = float("nan")
    stats = metadata.stat_values(
        elements=float(shape_elements),
        nan=0.0,
        pos_inf=0.0,
        neg_inf=0.0,
        zeros=0.0,
        min=nan,
        max=nan,
        mean=nan,
        std=nan,
        norm=0.0,
        mean_abs=nan,
        no_gradient=1.0,
    )
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
    out = x[:keep_rows]
    # Always [rows, cols]; said statically, since a tensor all-gathered across replicas may arrive with no known
    # rank, and a step's payload is decoded by the rank its tensors have when traced.
    return out if out.shape.rank == 2 else tf.ensure_shape(out, [None, None])
