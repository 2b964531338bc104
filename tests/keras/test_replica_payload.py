"""keras.replica_payload: a step's records cross Keras' cross-replica means (MirroredStrategy, MultiWorker) bit
for bit, encoded so that a mean of equal copies is exact."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tb_layergrad.keras import replica_payload as _replica_payload


def _awkward() -> np.ndarray:
    """Values whose float mean over 3 equal copies is NOT the value (x+x+x rounds), and specials."""
    rng = np.random.default_rng(0)
    v = rng.normal(size=(30, 3)) * 10.0 ** rng.integers(-300, 300, size=(30, 3))
    v[0, 0], v[0, 1], v[0, 2] = np.nan, np.inf, -np.inf
    v[1, 0], v[1, 1] = np.finfo(np.float64).max, 5e-324
    with np.errstate(over="ignore"):
        three = (v + v + v) / 3
    assert not np.array_equal(three[np.isfinite(v)], v[np.isfinite(v)])  # the problem being solved
    return v


@pytest.mark.parametrize("replicas", [2, 3, 8])
def test_records_survive_keras_cross_replica_means_bit_for_bit(replicas):
    v = _awkward()
    enc = _replica_payload.encode_tensor(tf.constant(v))
    # MirroredStrategy: Keras' tf.reduce_mean over the stacked local results (integer mean).
    mirrored = tf.reduce_mean(tf.stack([enc] * replicas), axis=0)
    # MultiWorker: strategy.reduce("MEAN", v, axis=0) = sum over replicas and axis 0 / count (true division).
    multi = tf.math.truediv(tf.reduce_sum(tf.concat([enc] * replicas, axis=0), axis=0), replicas)
    for reduced in (mirrored, multi):
        out = _replica_payload.decode_tensor(reduced.numpy(), rank=2, dtype=np.float64)
        assert out.tobytes() == v.tobytes()


def test_float32_tensor_records_decode_to_float32():
    v = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    out = _replica_payload.decode_tensor(_replica_payload.encode_tensor(tf.constant(v)).numpy(), 2, np.float32)
    assert out.dtype == np.float32 and out.tobytes() == v.tobytes()
