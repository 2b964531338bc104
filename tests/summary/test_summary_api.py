"""The public summary ops: their signatures are pinned here (changing one is a deliberate act), and an option
with no effect in the given combination says so, once."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad import metadata
from tb_layergrad.summary import ops

# name -> (positional-or-keyword parameters, keyword-only parameters)
PUBLIC = {
    "gradients": (
        ["grads", "step", "buckets"],
        ["max_elements", "target", "strategy", "histograms", "per_example"],
    ),
    "histogram_and_stats": (
        ["name", "data", "step", "buckets"],
        ["target", "source", "max_elements", "description"],
    ),
    "activations": (["values", "step", "buckets"], ["max_elements", "description"]),
    "timesteps": (["name", "norms", "step"], ["target"]),
}


def test_the_public_ops_and_their_parameters():
    assert sorted(tb_layergrad.summary.__all__) == sorted(PUBLIC)
    for name, (positional, keyword) in PUBLIC.items():
        params = inspect.signature(getattr(tb_layergrad.summary, name)).parameters.values()
        got = (
            [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD],
            [p.name for p in params if p.kind == p.KEYWORD_ONLY],
        )
        assert got == (positional, keyword), name
        doc = inspect.getdoc(getattr(tb_layergrad.summary, name))
        for section in ("Args:", "Returns:", "Raises:", "Example:"):
            assert section in doc, (name, section)


def test_each_docstring_example_runs(tmp_path, monkeypatch, tb_reading):
    """The one example of each op, run as written (its logdir moved into tmp_path)."""
    for name in PUBLIC:
        doc = inspect.getdoc(getattr(tb_layergrad.summary, name))
        code = doc.split("```python\n", 1)[1].split("```", 1)[0].replace("/tmp/layergrad_example", str(tmp_path))
        exec(compile(code, f"summary.{name} example", "exec"), {})  # noqa: S102 - our own docstring
    written = tb_reading.read_all(str(tmp_path))["."]
    assert {info.layer for info, _ in written.values()} >= {"model/dense", "model/lstm"}


@pytest.mark.parametrize(
    "documented",
    [
        tb_layergrad.distribute.merge,
        tb_layergrad.distribute.create_file_writer,
        tb_layergrad.distribute.is_chief,
        tb_layergrad.GradientMap,
    ],
    ids=lambda f: f.__name__,
)
def test_the_other_public_examples_run(tmp_path, documented, capsys):
    doc = inspect.getdoc(documented)
    for section in ("Args:", "Raises:", "Example:"):
        assert section in doc, section
    code = doc.split("```python\n", 1)[1].split("```", 1)[0].replace("/tmp/layergrad_example", str(tmp_path))
    exec(compile(code, f"{documented.__name__} example", "exec"), {})  # noqa: S102 - our own docstring
    assert capsys.readouterr().out or list(tmp_path.iterdir())  # it printed, or it wrote


def _per_example_step(weights: bool):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    x = tf.constant(np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32))
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, weights=weights, per_example=True) as cap:
            loss = tf.reduce_mean(tf.square(model(x)))
    return cap.gradients(tape, loss)


def test_per_example_without_weights_warns_once_that_no_noise_scale_is_written(tmp_path, monkeypatch, tb_reading):
    monkeypatch.setattr(ops, "_WARNED", set())
    grads = _per_example_step(weights=False)
    writer = tf.summary.create_file_writer(str(tmp_path / "run"))
    with writer.as_default(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            tb_layergrad.summary.gradients(grads, step=step)
    writer.close()
    said = [w for w in caught if "noise scale" in str(w.message)]
    assert len(said) == 1 and "weights=True" in str(said[0].message)
    assert not tb_reading.scalars(str(tmp_path)).get("run")  # indeed none written
    kinds = {info.kind for info, _ in tb_reading.read_all(str(tmp_path), split_groups=False)["run"].values()}
    assert metadata.KIND_EXAMPLES in kinds  # the per-example records themselves are written


def test_with_weights_there_is_nothing_to_warn_about(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "_WARNED", set())
    with tf.summary.create_file_writer(str(tmp_path)).as_default(), warnings.catch_warnings():
        warnings.simplefilter("error")
        tb_layergrad.summary.gradients(_per_example_step(weights=True), step=0)


def test_a_strategy_for_gradients_that_are_not_per_replica_warns_once(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "_WARNED", set())
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        with pytest.warns(UserWarning, match=r"strategy=\.\.\.\) has no effect") as caught:
            for step in range(2):
                tb_layergrad.summary.gradients({"m/a": tf.ones([2])}, step=step, strategy=tf.distribute.get_strategy())
    (warning,) = [w for w in caught if "strategy" in str(w.message)]
    assert warning.filename == __file__  # it names the line that called the op


@pytest.mark.parametrize("removed", ["replicas", "format_version", "layer_index", "elements"])
def test_removed_and_internal_arguments_are_not_public(removed):
    with pytest.raises(TypeError, match=removed):
        tb_layergrad.summary.histogram_and_stats("m/a", tf.ones([2]), step=0, **{removed: 1})
    assert not hasattr(tb_layergrad.summary, "gradient")  # renamed: histogram_and_stats
