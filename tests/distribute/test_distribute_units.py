"""In-process pieces of the distributed support: payload encoding, who is the chief, the non-chief writer."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tb_layergrad import distribute
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


@pytest.mark.parametrize(
    "cluster, task, chief",
    [
        ({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 0}, True),
        ({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 1}, False),
        ({"chief": ["c:1"], "worker": ["a:1"]}, {"type": "worker", "index": 0}, False),
        ({"chief": ["c:1"], "worker": ["a:1"]}, {"type": "chief", "index": 0}, True),
    ],
)
def test_chief_from_tf_config_without_a_strategy(monkeypatch, cluster, task, chief):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    assert distribute.is_chief() is chief


def test_single_process_is_chief(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert distribute.is_chief()


def test_non_chief_writer_writes_nothing_but_keeps_the_step(monkeypatch, tmp_path):
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})
    )
    writer = distribute.create_file_writer(str(tmp_path / "run"))
    from tb_layergrad import summary

    with writer.as_default(step=7):
        assert tf.summary.experimental.get_step() == 7
        assert not bool(summary.gradients({"layer": tf.ones([4, 2])}))
    writer.flush()
    assert not os.path.exists(tmp_path / "run")


def test_removed_arguments_are_refused_by_python():
    """No replicas="stats" mode and no format_version: only the newest format is written, always gathered."""
    import tb_layergrad

    with pytest.raises(TypeError, match="replicas"):
        tb_layergrad.summary.gradients({"layer": tf.ones([4, 2])}, step=0, replicas="stats")
    with pytest.raises(TypeError, match="format_version"):
        tb_layergrad.summary.activations({"layer": tf.ones([4, 2])}, step=0, format_version=1)
    assert not hasattr(distribute, "check_mode")
    with pytest.raises(TypeError, match="replicas"):
        tb_layergrad.GradientLogger("logs", replicas="stats")
