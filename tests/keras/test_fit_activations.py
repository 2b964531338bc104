"""Forward beside backward: activations and the target's value from the same capture, and where a NaN was born.

The activation records of step s are checked against the layer outputs of an independent forward pass
(a by-hand twin of the model, with the weights saved before that step), the target record against the
loss that twin computes; the origin of a NaN against the demo's three kinds, in fit() and a custom loop.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad import metadata

keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise, as in fit_helpers
layers = keras.layers
STATS = ("elements", "min", "max", "mean", "std", "norm", "mean_abs")


def forward(model, manual, weights, x, y, loss_fn):
    """(layer outputs by path, loss) of an independent forward pass with `weights`."""
    saved = model.get_weights()
    model.set_weights(weights)
    try:
        with tf.GradientTape() as tape:
            pred, outs = manual(tf.convert_to_tensor(x), tape)
            loss = loss_fn(y, pred)
    finally:
        model.set_weights(saved)
    return {k: v.numpy() for k, v in outs.items()}, float(loss)


def check_forward(fit_helpers, series, step, model, manual, weights, x, y, loss_fn):
    outs, loss = forward(model, manual, weights, x, y, loss_fn)
    length = fit_helpers.path_length(model, x, target_terms=1)
    for path, a in outs.items():
        st = fit_helpers.one(series, f"forward/activation/{path}/stats", step)
        exp = fit_helpers.expected_stats(a)
        for name in STATS:
            fit_helpers.assert_close(
                fit_helpers.stat(st, name),
                exp[name],
                f"activation {path} {name} at {step}",
                length + a.size,
                scale=float(np.max(np.abs(a))),
            )
        assert (
            fit_helpers.stat(st, "nan") + fit_helpers.stat(st, "pos_inf") + fit_helpers.stat(st, "neg_inf") == 0
            and fit_helpers.stat(st, "no_gradient") == 0
        )
        hist = fit_helpers.one(series, f"forward/activation/{path}/histogram", step)
        assert hist.shape == (30, 3) and hist[:, 2].sum() == a.size
    st = fit_helpers.one(series, "loss/target/loss/stats", step)
    assert fit_helpers.stat(st, "elements") == 1
    fit_helpers.assert_close(fit_helpers.stat(st, "mean"), loss, f"loss value at {step}", length, scale=abs(loss))
    assert "loss/target/loss/histogram" not in series  # a scalar's histogram says nothing


def _classification(n=24, features=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype("float32"), rng.integers(0, classes, size=(n,)).astype("int32")


KINDS = ("functional", "sequential", "subclassed")  # the models' kinds, one test each (`models` holds them)


@pytest.fixture(scope="module")
def models(fit_helpers) -> dict:
    """kind -> (build, loss maker, data): fit_helpers' models of each kind."""
    return {
        "functional": (
            fit_helpers.bn_residual_mlp,
            lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            _classification,
        ),
        "sequential": (
            fit_helpers.mlp_sequential,
            lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            _classification,
        ),
        "subclassed": (
            fit_helpers.seed_model,
            keras.losses.MeanSquaredError,
            lambda: (
                np.array([[[3.0], [0.0], [1.0], [2.0], [3.0]]] * 4, np.float32)
                + np.arange(4, dtype=np.float32)[:, None, None] * 0.1,
                np.array([[0.0, 1.0, 2.0, 3.0]] * 4, np.float32),
            ),
        ),
    }


@pytest.fixture(params=KINDS)
def model_kind(request) -> str:
    """Each kind of model, one test each: a fixture, so that its tests are named kind first, then mode."""
    return request.param


@pytest.mark.slow
def test_fit_activations_equal_an_independent_forward_pass(tmp_path, model_kind, fit_mode, fit_helpers, models):
    build, loss_fn, data = models[model_kind]
    keras.utils.set_random_seed(11)
    model, manual = build()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss_fn(), **fit_helpers.compile_kwargs(fit_mode))
    x, y = data()
    batch = 8 if len(x) > 8 else 2
    saver = fit_helpers.WeightsBeforeStep()
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=2, activations=True)
    model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[saver, logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    per_epoch = len(x) // batch
    steps = sorted({s for tag, (info, by_step) in series.items() if info.source == "activation" for s in by_step})
    assert steps == list(range(2, 2 * per_epoch + 1, 2))
    for step in (steps[0], steps[-1]):
        b = (step - 1) % per_epoch
        check_forward(
            fit_helpers,
            series,
            step,
            model,
            manual,
            saver.before[step],
            x[b * batch : (b + 1) * batch],
            y[b * batch : (b + 1) * batch],
            loss_fn(),
        )
    info, _ = series[
        f"forward/activation/{next(iter(forward(model, manual, model.get_weights(), x[:batch], y[:batch], loss_fn())[0]))}/stats"
    ]
    assert (info.source, info.target, info.kind) == ("activation", "forward", "stats") and info.index > 0
    assert logger.nonfinite is None  # nothing was non-finite


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_custom_loop_activations_and_target(tmp_path, kind, compiled, fit_helpers, models):
    build, make_loss, data = models[kind]
    keras.utils.set_random_seed(4)
    model, manual = build()
    x, y = data()
    x, y = x[:8], y[:8]
    loss_fn = make_loss()
    weights = model.get_weights()

    def step(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape, activations=True) as cap:
                loss = loss_fn(y, model(x, training=True))
        grads = cap.gradients(tape, loss)
        tb_layergrad.summary.gradients(grads)
        return grads, cap.activations()

    run = tf.function(step) if compiled else step
    writer = tf.summary.create_file_writer(fit_helpers.log_dir(tmp_path) + "/train")
    with writer.as_default(step=3):
        grads, acts = run(tf.constant(x), tf.constant(y))
    writer.flush()
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    check_forward(fit_helpers, series, 3, model, manual, weights, x, y, loss_fn)
    outs, _ = forward(model, manual, weights, x, y, loss_fn)
    assert list(grads.activations) == list(acts) and set(outs) <= set(acts)
    for path in acts:  # the map's activations are the pass's own layer outputs
        np.testing.assert_array_equal(grads.activations[path].numpy(), acts[path].numpy())
    assert grads.nonfinite_origin() is None


def test_summary_activations_alone(tmp_path, fit_helpers):
    """`summary.activations(cap.activations())`: the layer outputs keep their model positions."""
    keras.utils.set_random_seed(2)
    model, _ = fit_helpers.mlp_sequential()
    x, _ = _classification(n=4)
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            model(x)
    writer = tf.summary.create_file_writer(fit_helpers.log_dir(tmp_path) + "/train")
    with writer.as_default(step=0):
        tb_layergrad.summary.activations(cap.activations())
    writer.flush()
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    acts = cap.activations()
    for path, value in acts.items():
        info, _ = series[f"forward/activation/{path}/stats"]
        assert info.index == acts.indexes[path] > 0
        assert fit_helpers.stat(fit_helpers.one(series, f"forward/activation/{path}/stats", 0), "max") == pytest.approx(
            float(np.max(value))
        )


# -- where it broke -----------------------------------------------------------------
def _log_model():
    """A large input drives `shift` below 0 and log is NaN there: born in the forward pass of `log_features`."""
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((16,)),
            layers.Dense(16, name="dense_0"),
            layers.Dense(8, bias_initializer=keras.initializers.Constant(2.0), name="shift"),
            layers.Lambda(tf.math.log, name="log_features"),
            layers.Dense(1, name="head"),
        ],
        name="lg",
    )


def _fit(fit_helpers, tmp_path, model, x, y, mode="graph", **logger_kwargs):
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", **fit_helpers.compile_kwargs(mode))
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), **logger_kwargs)
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    return logger, fit_helpers.read_series(fit_helpers.log_dir(tmp_path))


def _nonfinite(fit_helpers, series, tag, step) -> bool:
    st = fit_helpers.one(series, tag, step)
    return fit_helpers.stat(st, "nan") + fit_helpers.stat(st, "pos_inf") + fit_helpers.stat(st, "neg_inf") > 0


@pytest.mark.slow
def test_backward_nan_off_schedule_is_written_and_placed(tmp_path, fit_mode, fit_helpers, demo_plan):
    x, y = demo_plan.inputs_with_one_bad_batch(12, 7, -50.0, seed=6)
    logger, series = _fit(
        fit_helpers, tmp_path, fit_helpers.sqrt_model(), x, y, fit_mode, update_freq=10, activations=True
    )
    steps = sorted({s for _, (info, by) in series.items() if info.source == "output" for s in by})
    assert steps == [7, 10]  # step 7 (not a multiple of 10) is the first non-finite one: written anyway
    assert _nonfinite(fit_helpers, series, "loss/output/sq/dense_0/stats", 7)
    assert not _nonfinite(fit_helpers, series, "loss/output/sq/sqrt_features/stats", 7)
    assert not _nonfinite(fit_helpers, series, "loss/target/loss/stats", 7)
    origin = logger.nonfinite
    assert (origin.step, origin.pass_, origin.origin) == (7, "backward", "sq/sqrt_features")


@pytest.mark.parametrize("mode", ["graph", "xla"])
@pytest.mark.slow
def test_forward_nan_is_placed_in_its_layer(tmp_path, mode, fit_helpers, demo_plan):
    x, y = demo_plan.inputs_with_one_bad_batch(12, 5, 50.0, seed=5)
    logger, series = _fit(fit_helpers, tmp_path, _log_model(), x, y, mode, update_freq=10, activations=True)
    assert _nonfinite(fit_helpers, series, "forward/activation/lg/log_features/stats", 5)
    assert not _nonfinite(fit_helpers, series, "forward/activation/lg/shift/stats", 5)
    assert (logger.nonfinite.step, logger.nonfinite.pass_, logger.nonfinite.origin) == (5, "forward", "lg/log_features")


def test_loss_nan_without_activations_cannot_be_placed(tmp_path, fit_helpers, demo_plan):
    """No activations: a non-finite loss is the forward pass or the loss; the records say which they can."""
    x, y = demo_plan.inputs_with_one_bad_batch(8, 3, 50.0, seed=5)
    logger, series = _fit(fit_helpers, tmp_path, _log_model(), x, y, update_freq=10)
    assert (logger.nonfinite.step, logger.nonfinite.pass_, logger.nonfinite.origin) == (3, "forward_or_loss", None)
    assert _nonfinite(fit_helpers, series, "loss/target/loss/stats", 3)


def test_on_nonfinite_stop_ends_training_at_that_step(tmp_path, capsys, fit_helpers, demo_plan):
    x, y = demo_plan.inputs_with_one_bad_batch(12, 7, -50.0, seed=6)
    model = fit_helpers.sqrt_model()
    logger, series = _fit(fit_helpers, tmp_path, model, x, y, update_freq=5, activations=True, on_nonfinite="stop")
    assert int(model.optimizer.iterations.numpy()) == 7  # the step of the first NaN/Inf is the last one trained
    steps = sorted({s for _, (info, by) in series.items() if info.source == "output" for s in by})
    assert steps == [5, 7]
    out = capsys.readouterr().out
    assert "step 7" in out and "backward" in out and "sq/sqrt_features" in out


def test_on_nonfinite_raise(tmp_path, fit_helpers, demo_plan):
    x, y = demo_plan.inputs_with_one_bad_batch(12, 4, -50.0, seed=6)
    model = fit_helpers.sqrt_model()
    with pytest.raises(FloatingPointError, match="step 4: backward pass.*sq/sqrt_features") as raised:
        _fit(fit_helpers, tmp_path, model, x, y, update_freq=5, on_nonfinite="raise")
    assert raised.value.origin.pass_ == "backward"
    assert "train_step" not in model.__dict__  # the model is restored
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert _nonfinite(fit_helpers, series, "loss/output/sq/dense_0/stats", 4)


@pytest.mark.parametrize("bad", ["ignored", None, True, "STOP"])
def test_on_nonfinite_must_be_one_of_four(tmp_path, bad, fit_helpers):
    with pytest.raises(ValueError, match="on_nonfinite must be one of"):
        tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), on_nonfinite=bad)


def test_custom_loop_says_where_it_broke(tmp_path, fit_helpers, demo_plan):
    x, y = demo_plan.inputs_with_one_bad_batch(2, 1, -50.0, seed=6)
    model = fit_helpers.sqrt_model()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, activations=True) as cap:
            loss = tf.reduce_mean(tf.square(model(x[:64]) - y[:64]))
    origin = cap.gradients(tape, loss).nonfinite_origin(step=1)
    assert (origin.pass_, origin.origin) == ("backward", "sq/sqrt_features")
    assert "backward pass of sq/sqrt_features" in origin.line

    model = _log_model()
    x, y = demo_plan.inputs_with_one_bad_batch(2, 1, 50.0, seed=5)
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, activations=True) as cap:
            loss = tf.reduce_mean(tf.square(model(x[:64]) - y[:64]))
    grads = cap.gradients(tape, loss)
    assert (grads.nonfinite_origin().pass_, grads.nonfinite_origin().origin) == ("forward", "lg/log_features")
    with tf.GradientTape() as tape:  # finite outputs, a NaN loss: born in the loss
        with tb_layergrad.capture(model, tape=tape, activations=True) as cap:
            loss = tf.reduce_mean(tf.math.log(model(x[64:]) * 0.0 - 1.0))
    origin = cap.gradients(tape, loss).nonfinite_origin()
    assert (origin.pass_, origin.origin) == ("loss", metadata.DEFAULT_TARGET)


@pytest.mark.slow
def test_a_nan_only_in_the_loss_value_writes_the_step_in_full(tmp_path, fit_mode, fit_helpers, demo_plan):
    """The loss is NaN, its gradients are not (a term under stop_gradient): still the first non-finite step,
    written in full (the fused op writes because the loss series, written by TensorFlow's ops, says so)."""
    x, y = demo_plan.inputs_with_one_bad_batch(12, 7, 1.0, seed=6)
    y[6 * 64] = -1000.0  # batch 7: log(y + 100) is NaN, and nothing is differentiated through it

    def loss(y_true, y_pred):
        return tf.reduce_mean(tf.square(y_pred - y_true)) + tf.stop_gradient(tf.math.log(tf.reduce_min(y_true) + 100.0))

    model = fit_helpers.sqrt_model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss, **fit_helpers.compile_kwargs(fit_mode))
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=10, activations=True)
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    for source in ("output", "activation", "target"):
        steps = sorted({s for _, (info, by) in series.items() if info.source == source for s in by})
        assert steps == [7, 10], (source, steps)
    assert _nonfinite(fit_helpers, series, "loss/target/loss/stats", 7)
    assert not _nonfinite(fit_helpers, series, "loss/output/sq/dense_0/stats", 7)
    assert (logger.nonfinite.step, logger.nonfinite.pass_, logger.nonfinite.origin) == (7, "loss", "loss")
