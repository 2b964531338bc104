"""mixed_float16: recorded gradients are divided by the loss scale; overflow steps are counted, never bucketed."""

from __future__ import annotations

import numpy as np
import pytest

import tb_layergrad
from tb_layergrad import metadata


@pytest.fixture
def mixed_float16(fit_helpers):
    fit_helpers.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        fit_helpers.keras.mixed_precision.set_global_policy("float32")


def _mlp(fit_helpers, name="mp"):
    return fit_helpers.keras.Sequential(
        [
            fit_helpers.keras.Input((6,)),
            fit_helpers.layers.Dense(16, activation="relu", name="h"),
            fit_helpers.layers.Dense(3, name="logits"),
            fit_helpers.layers.Activation("linear", dtype="float32", name="f32"),
        ],
        name=name,
    )


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(16, 6)).astype("float32"), rng.integers(0, 3, size=(16,)).astype("int32")


def _float32_reference(fit_helpers, weights, x, y):
    """The same step in float32: what the unscaled float16 records must approximate."""
    import tensorflow as tf

    policy = fit_helpers.keras.mixed_precision.global_policy()
    fit_helpers.keras.mixed_precision.set_global_policy("float32")
    try:
        model = _mlp(fit_helpers, "ref")
    finally:
        fit_helpers.keras.mixed_precision.set_global_policy(policy)
    model.set_weights(weights)
    loss_fn = fit_helpers.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        h = model.get_layer("h")(tf.constant(x))
        tape.watch(h)
        logits = model.get_layer("logits")(h)
        tape.watch(logits)
        loss = loss_fn(y, logits)
    gh, gl = tape.gradient(loss, [h, logits])
    return model, {"h": gh.numpy(), "logits": gl.numpy()}


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
@pytest.mark.slow
def test_records_are_unscaled(tmp_path, mixed_float16, mode, fit_helpers, tolerances):
    fit_helpers.keras.utils.set_random_seed(2)
    model = _mlp(fit_helpers)
    model.compile(
        optimizer=fit_helpers.keras.optimizers.SGD(0.1),
        loss=fit_helpers.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        **fit_helpers.compile_kwargs(mode),
    )
    assert "LossScaleOptimizer" in type(model.optimizer).__name__
    x, y = _data()
    saver = fit_helpers.WeightsBeforeStep()
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[saver, tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), max_elements=1000)],
    )
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    reference, ref = _float32_reference(fit_helpers, saver.before[1], x[:8], y[:8])
    # The logged step runs the forward and backward pass in float16 (any order of its sums on any CPU), the
    # reference in float32: the float16 chain's bound dominates. A forgotten loss scale would be off by 2**15.
    length = fit_helpers.path_length(reference, x[:8], target_terms=8 * 3)
    rtol = tolerances.chain_rtol(np.float16, [length]) + tolerances.chain_rtol(np.float32, [length])
    for name, g in ref.items():
        info, by_step = series[f"loss/output/mp/{name}/tensor"]
        assert info.dtype == "float16"
        assert len(by_step[1]) == 1, f"{name}: {len(by_step[1])} records at step 1 (steps {sorted(by_step)})"
        got = by_step[1][0]
        np.testing.assert_allclose(got, g, rtol=rtol, atol=rtol * np.abs(g).max())
        st = series[f"loss/output/mp/{name}/stats"][1][1][0]
        np.testing.assert_allclose(fit_helpers.stat(st, "norm"), np.linalg.norm(g), rtol=rtol)


def test_overflow_steps_are_counted_not_bucketed(tmp_path, mixed_float16, fit_helpers):
    """A huge loss scale makes every float16 gradient overflow: Keras skips the updates; we count inf/nan."""
    fit_helpers.keras.utils.set_random_seed(2)
    model = _mlp(fit_helpers)
    optimizer = fit_helpers.keras.mixed_precision.LossScaleOptimizer(
        fit_helpers.keras.optimizers.SGD(0.1), initial_scale=2.0**100
    )
    model.compile(optimizer=optimizer, loss=fit_helpers.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data()
    before = model.get_weights()
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))],
    )
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)  # both steps overflowed: no update
    iterations = int(fit_helpers.update_count(model.optimizer).numpy())
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    info, by_step = series["loss/output/mp/logits/stats"]
    # Keras 3 does not count a skipped update (tf_keras does); the step is the batch count either way.
    assert iterations in (0, 2)
    assert sorted(by_step) == [1, 2] and all(len(v) == 1 for v in by_step.values())
    stats = [v for step in sorted(by_step) for v in by_step[step]]
    hists_by_step = series["loss/output/mp/logits/histogram"][1]
    hists = [v for step in sorted(hists_by_step) for v in hists_by_step[step]]
    for st, hist in zip(stats, hists):
        non_finite = fit_helpers.stat(st, "nan") + fit_helpers.stat(st, "pos_inf") + fit_helpers.stat(st, "neg_inf")
        assert non_finite > 0
        assert hist[:, 2].sum() == fit_helpers.stat(st, "elements") - non_finite  # never bucketed
        assert np.all(np.isfinite(hist))
    assert metadata.STAT_FIELDS[1:4] == ("nan", "pos_inf", "neg_inf")
    first_info, first = series["loss/output/mp/logits/first_nonfinite"]
    assert first_info.kind == "first_nonfinite"
    assert [int(v[0]) for step in sorted(first) for v in first[step]] == [1, 1]
