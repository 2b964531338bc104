"""GradientLogger inside model.fit(): the logged gradients are those of the real step.

At every logged step the records must equal an independent reproduction of
that very step: the weights saved just before it, the same batch, a forward
pass written by hand with `tape.watch` on each exposed output (the same float32
math in other orders: within the derived bound, `fit_helpers.assert_close`),
in the three execution modes. Read back with TensorBoard's own
EventMultiplexer + MultiplexerDataProvider.

Runs under Keras 3 and, with TF_USE_LEGACY_KERAS=1, under tf_keras.
"""

from __future__ import annotations

import os
import types
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad import metadata

keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise, as in fit_helpers


def _data(n=24, features=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype("float32"), rng.integers(0, classes, size=(n,)).astype("int32")


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.mark.slow
def test_functional_bn_residual_matches_reproduction(tmp_path, fit_mode, fit_helpers):
    """Functional model with BatchNorm (batch statistics) and a residual Add; validation adds nothing."""
    keras.utils.set_random_seed(7)
    model, manual = fit_helpers.bn_residual_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=_loss(), **fit_helpers.compile_kwargs(fit_mode))
    x, y = _data()
    saver = fit_helpers.WeightsBeforeStep()
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), update_freq=2, weights=True, max_elements=fit_helpers.MAX
    )
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        shuffle=False,
        verbose=0,
        validation_data=(x[:8], y[:8]),
        callbacks=[saver, logger],
    )

    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series) == [2, 4, 6]  # every 2nd of 6 updates; evaluation wrote nothing
    infos = {info.layer for info, _ in series.values() if info.source == "output"}
    assert infos == {f"bnres/{n}" for n in ("d1", "bn", "d2", "add", "out")}
    for step in (2, 4, 6):
        batch = (step - 1) % 3
        xb, yb = x[batch * 8 : (batch + 1) * 8], y[batch * 8 : (batch + 1) * 8]
        fit_helpers.check_step(series, step, model, manual, saver.before[step], xb, yb, _loss())
    # The metadata of a record says what it is.
    info, _ = series["loss/output/bnres/d1/stats"]
    assert (info.kind, info.target, info.source, info.dtype) == ("stats", "loss", "output", "float32")
    assert info.index > 0


@pytest.mark.parametrize("mode", ["graph", "xla"])
@pytest.mark.slow
def test_sequential_matches_reproduction(tmp_path, mode, fit_helpers):
    keras.utils.set_random_seed(3)
    model, manual = fit_helpers.mlp_sequential()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=_loss(), **fit_helpers.compile_kwargs(mode))
    x, y = _data(n=16)
    saver = fit_helpers.WeightsBeforeStep()
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), max_elements=fit_helpers.MAX, weights=True)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[saver, logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series) == [1, 2, 3, 4]
    for step in (1, 4):
        batch = (step - 1) % 2
        fit_helpers.check_step(
            series,
            step,
            model,
            manual,
            saver.before[step],
            x[batch * 8 : (batch + 1) * 8],
            y[batch * 8 : (batch + 1) * 8],
            _loss(),
        )


@pytest.mark.slow
def test_subclassed_seed_model_matches_reproduction(tmp_path, fit_mode, fit_helpers):
    """The seed question: the gradient w.r.t. the subclassed model's RNN output, inside fit()."""
    keras.utils.set_random_seed(5)
    model, manual = fit_helpers.seed_model()
    model.compile(optimizer="sgd", loss="mse", **fit_helpers.compile_kwargs(fit_mode))
    x = (
        np.array([[[3.0], [0.0], [1.0], [2.0], [3.0]]] * 4, np.float32)
        + np.arange(4, dtype=np.float32)[:, None, None] * 0.1
    )
    y = np.array([[0.0, 1.0, 2.0, 3.0]] * 4, np.float32)
    saver = fit_helpers.WeightsBeforeStep()
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), layers=["minimalrnn", "out"], max_elements=fit_helpers.MAX
    )
    model.fit(x, y, epochs=3, batch_size=2, shuffle=False, verbose=0, callbacks=[saver, logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series) == [1, 2, 3, 4, 5, 6]
    for step in (1, 6):
        batch = (step - 1) % 2
        fit_helpers.check_step(
            series,
            step,
            model,
            manual,
            saver.before[step],
            x[batch * 2 : (batch + 1) * 2],
            y[batch * 2 : (batch + 1) * 2],
            keras.losses.MeanSquaredError(),
            with_weights=False,
        )


@pytest.mark.slow
def test_without_the_fused_kernel_the_records_match_too(tmp_path, fit_helpers, tensorflow_ops):
    """Where the kernel cannot be built, fit()'s step reduces with TensorFlow's ops, one call per tensor (read
    while fit() traces its step: `tensorflow_ops` holds for the whole test)."""
    keras.utils.set_random_seed(3)
    model, manual = fit_helpers.mlp_sequential()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=_loss(), **fit_helpers.compile_kwargs("graph"))
    x, y = _data(n=16)
    saver = fit_helpers.WeightsBeforeStep()
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), max_elements=fit_helpers.MAX, weights=True)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[saver, logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series) == [1, 2]
    for step in (1, 2):
        fit_helpers.check_step(
            series,
            step,
            model,
            manual,
            saver.before[step],
            x[(step - 1) * 8 : step * 8],
            y[(step - 1) * 8 : step * 8],
            _loss(),
        )


def test_steps_continue_across_fits_with_a_new_logger(tmp_path, fit_helpers):
    """A new logger on a model trained by Keras' own step starts from its optimizer's update count:
    the steps continue across fit() calls, and no batch runs unlogged for it."""
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    x, y = _data(n=16)
    for _ in range(2):  # 2 x (2 epochs x 2 batches) = 8 updates
        logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[logger])
        assert not any("runs unlogged" in str(w.message) for w in caught)
    assert int(model.optimizer.iterations.numpy()) == 8
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == [3, 6]


def test_a_second_fit_reuses_the_compiled_step(tmp_path, fit_helpers):
    """One callback over several fit() calls compiles its capturing step once, until compile() resets the model."""
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    x, y = _data(n=16)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=3)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[logger])
    built = logger._built
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[logger])
    assert logger._built is built
    model.compile(optimizer="sgd", loss=_loss())  # a new optimizer: its iterations start again at 0
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    assert logger._built is not built
    # 8 batches, then 2 more: the logger's count goes on (9, 10) where the new optimizer's restarted.
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == [3, 6, 9]


def test_steps_per_execution_logs_the_last_step_of_an_execution(tmp_path, fit_helpers):
    """With steps_per_execution=2 Keras returns the last step of each execution: update_freq=4 logs 4 and 8."""
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss(), steps_per_execution=2)
    x, y = _data(n=16)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=4)
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    assert int(model.optimizer.iterations.numpy()) == 8
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == [4, 8]


@pytest.mark.parametrize("mode", ["graph", "xla"])
def test_steps_per_execution_not_a_multiple(tmp_path, mode, fit_helpers):
    """update_freq=3, steps_per_execution=2: a step that writes itself (graph) logs 3 and 6, silently;
    under XLA only the last step of an execution comes back (6), and the callback warns before training."""
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss(), steps_per_execution=2, jit_compile=(mode == "xla"))
    x, y = _data(n=16)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    warned = [w for w in caught if "steps_per_execution=2" in str(w.message)]
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == (
        [3, 6] if mode == "graph" else [6]
    )
    assert len(warned) == (0 if mode == "graph" else 1)


def test_model_is_restored_after_fit(tmp_path, fit_helpers):
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    x, y = _data(n=16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    keras_function = model.train_function
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    assert "train_step" not in model.__dict__
    assert not getattr(model.train_function, "_tb_layergrad_wrapper", False)
    # A later fit() without the callback writes nothing more.
    before = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert (
        fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path)))
        == fit_helpers.layergrad_steps(before)
        == [3, 4]
    )
    del keras_function


class _Boom(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            raise RuntimeError("boom")


def test_interrupted_fit_leaves_no_stale_train_function(tmp_path, fit_helpers):
    """An exception outside the step (another callback) skips on_train_end: the next fit() heals."""
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    x, y = _data(n=32)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[logger, _Boom()])
    steps_after_crash = fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path)))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)  # no callback: must not log
    assert "train_step" not in model.__dict__
    assert not getattr(model.train_function, "_tb_layergrad_wrapper", False)
    assert (
        fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path)))
        == steps_after_crash
        == [1, 2]
    )


def test_error_inside_the_step_restores_the_model(tmp_path, fit_helpers):
    """A target that is not one value per example fails when the step is traced: nothing trained, model restored."""
    model, _ = fit_helpers.seed_model()  # subclassed: y_pred's shape is only known when the step runs
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((4, 5, 1), np.float32)
    y = np.ones((4, 4), np.float32)
    before = model.get_weights()
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), targets={"all": lambda p: p})
    with pytest.raises(ValueError, match="one value per example"):
        model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[logger])
    assert "train_step" not in model.__dict__
    assert not getattr(model.train_function, "_tb_layergrad_wrapper", False)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)  # trains normally afterwards


def test_next_to_keras_tensorboard(tmp_path, fit_helpers):
    """Keras' TensorBoard and GradientLogger share log_dir: run 'train' holds both, at the same steps."""
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    x, y = _data(n=16)
    tb = keras.callbacks.TensorBoard(fit_helpers.log_dir(tmp_path), update_freq=1)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, validation_data=(x, y), callbacks=[tb, logger])

    from tensorboard.backend.event_processing import plugin_event_multiplexer

    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: 0})
    mux.AddRunsFromDirectory(fit_helpers.log_dir(tmp_path))
    mux.Reload()
    runs = mux.Runs()
    assert {"train", "validation"} <= set(runs)
    train_tags = runs["train"]["tensors"]
    assert "epoch_loss" in train_tags  # Keras' own scalars
    assert any(t.startswith("loss/output/") for t in train_tags)  # ours
    layergrad = mux.PluginRunToTagToContent(metadata.PLUGIN_NAME)
    assert set(layergrad) == {"train"}  # no gradients from evaluation
    (stats_tag,) = [t for t in layergrad["train"] if t.startswith("loss/output/layers-") and "/stats/" in t]
    ours = sorted({e.step for e in mux.Tensors("train", stats_tag)})
    assert ours == [1, 2, 3, 4]
    if "batch_loss" in train_tags:
        keras_steps = sorted({e.step for e in mux.Tensors("train", "batch_loss")})
        # Where Keras' callback counts its batch steps (Keras 3.3's writes every batch at step 0), they are ours.
        if len(keras_steps) > 1:
            assert keras_steps == ours


# -- bad input: clear errors before training starts ------------------------------------------
@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_update_freq_must_be_a_positive_int_batch_or_epoch(tmp_path, n, fit_helpers):
    with pytest.raises(ValueError, match="update_freq"):
        tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=n)


def _fit_must_fail(model, logger, exc, match):
    x, y = _data(n=8)
    before = model.get_weights()
    with pytest.raises(exc, match=match):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[logger])
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert "train_step" not in model.__dict__
    assert int(model.optimizer.iterations.numpy()) == 0


def test_unknown_layer_fails_before_training(tmp_path, fit_helpers):
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    _fit_must_fail(
        model,
        tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), layers=["h1", "nope"]),
        ValueError,
        "no layer matches 'nope'",
    )


def test_target_not_scalar_per_example_fails_before_training(tmp_path, fit_helpers):
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), targets={"two": lambda p: p[:, :2]})
    _fit_must_fail(model, logger, ValueError, "one value per example")


def test_bad_target_spec_fails_in_constructor(tmp_path, fit_helpers):
    with pytest.raises(TypeError):
        tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), targets=[lambda p: p])
    with pytest.raises(ValueError, match="reserved"):
        tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), targets={"loss": lambda p: p[:, 0]})
    with pytest.raises(TypeError, match="function"):
        tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), targets={"a": 3})


def test_unwritable_log_dir_fails_before_training(tmp_path, fit_helpers):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    _fit_must_fail(model, tb_layergrad.GradientLogger(str(blocker / "logs")), OSError, "cannot write to log_dir")


def test_timesteps_without_rnn_fails_before_training(tmp_path, fit_helpers):
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss=_loss())
    _fit_must_fail(
        model, tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), timesteps=True), ValueError, "no RNN layer"
    )


# -- the run it writes to -----------------------------------------------------------------------
def _steps_in(fit_helpers, logdir) -> list:
    return fit_helpers.layergrad_steps(fit_helpers.read_series(logdir))


def test_a_tensorboard_log_dir_is_followed_at_each_fit(tmp_path, fit_helpers):
    """log_dir=<TensorBoard callback>: each fit() writes to the callback's log_dir of that moment (a tuner moves it
    between trials), in a new event file; nothing is warned, each run holding one training's steps."""
    x, y = _data(n=16)
    first, second = os.fspath(tmp_path / "a"), os.fspath(tmp_path / "b")
    tb = keras.callbacks.TensorBoard(first)
    logger = tb_layergrad.GradientLogger(tb)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for log in (first, second):
            tb.log_dir = log
            model, _ = fit_helpers.mlp_sequential()
            model.compile(optimizer="sgd", loss=_loss())
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[tb, logger])
            assert logger.log_dir == log and logger.run_dir == os.path.join(log, "train")
    assert _steps_in(fit_helpers, first) == _steps_in(fit_helpers, second) == [1, 2]
    logger.close()


@pytest.mark.slow
def test_a_second_model_in_one_run_is_warned_and_a_later_fit_of_the_same_is_not(tmp_path, fit_helpers):
    x, y = _data(n=16)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))
    first, _ = fit_helpers.mlp_sequential()
    first.compile(optimizer="sgd", loss=_loss())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        first.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
        first.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[logger])  # steps 3, 4
        resumed = tb_layergrad.GradientLogger(
            fit_helpers.log_dir(tmp_path)
        )  # a new logger: the optimizer's count, steps 5, 6
        first.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[resumed])
    second, _ = fit_helpers.mlp_sequential()
    second.compile(optimizer="sgd", loss=_loss())
    with pytest.warns(UserWarning, match=r"already holds steps up to 6 .* writes from step 1 on") as caught:
        second.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    assert "Give each training its own log_dir" in str(caught[0].message)
    assert _steps_in(fit_helpers, fit_helpers.log_dir(tmp_path)) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "value, exc, match",
    [
        (42, TypeError, "log_dir must be a path, or the keras.callbacks.TensorBoard callback"),
        ("", ValueError, "got an empty one"),
        (
            types.SimpleNamespace(log_dir=None),
            TypeError,
            "log_dir follows SimpleNamespace.log_dir, which must be a path",
        ),
    ],
)
def test_log_dir_is_a_path_or_a_callback_with_one(value, exc, match):
    with pytest.raises(exc, match=match):
        tb_layergrad.GradientLogger(value)
