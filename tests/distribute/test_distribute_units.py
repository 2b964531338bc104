"""In-process pieces of the distributed support: who is the chief, the non-chief writer (the payload encoding:
tests/keras/test_replica_payload.py)."""

from __future__ import annotations

import json
import os

import pytest
import tensorflow as tf

from tb_layergrad import distribute


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
