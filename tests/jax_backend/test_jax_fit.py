"""`GradientLogger` in Keras' own fit() on JAX: every value equal to a pure-JAX reference, training bitwise
unchanged, the step the count of batches across fit() calls, and what is not yet on JAX refused."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import tb_layergrad
from tb_layergrad.jax import step_outputs

BATCH, FEATURES, HIDDEN = 8, 5, 16


def _data(n: int = 4 * BATCH):
    rng = np.random.RandomState(3)
    return rng.randn(n, FEATURES).astype(np.float32), rng.randn(n, 2).astype(np.float32)


def _model(jit_compile=True, steps_per_execution=1, seed=11, remat=None):
    """The MLP; `remat`: a `keras.RematScope` its layers are built in (the model itself outside it)."""
    keras.utils.set_random_seed(seed)
    with remat or contextlib.nullcontext():
        layers = [
            keras.layers.Dense(HIDDEN, activation="tanh", name="h1"),
            keras.layers.Dense(HIDDEN, activation="relu", name="h2"),
            keras.layers.Dense(2, name="out"),
        ]
    model = keras.Sequential([keras.Input((FEATURES,)), *layers], name="mlp")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )  # fmt: skip
    return model


def _weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def _reference(weights, x, y, of_output=None):
    """dL/d(each layer output) and dL/d(each weight) of the MLP written out in JAX: a zero added to each
    output is differentiated (the total derivative through everything after it). L is the mse loss, or
    `of_output(out)` summed over the batch (a target)."""
    w1, b1, w2, b2, w3, b3 = [jnp.asarray(w) for w in weights]

    def loss(params, eps):
        w1, b1, w2, b2, w3, b3 = params
        h1 = jnp.tanh(x @ w1 + b1) + eps[0]
        h2 = jax.nn.relu(h1 @ w2 + b2) + eps[1]
        out = h2 @ w3 + b3 + eps[2]
        if of_output is not None:
            return jnp.sum(of_output(out))
        return jnp.mean(jnp.mean((out - y) ** 2, axis=-1))

    eps = [jnp.zeros((len(x), HIDDEN)), jnp.zeros((len(x), HIDDEN)), jnp.zeros((len(x), 2))]
    value, (g_params, g_eps) = jax.value_and_grad(loss, argnums=(0, 1))((w1, b1, w2, b2, w3, b3), eps)
    outputs = dict(zip(["mlp/h1", "mlp/h2", "mlp/out"], g_eps))
    names = ["h1/kernel", "h1/bias", "h2/kernel", "h2/bias", "out/kernel", "out/bias"]
    return float(value), outputs, {f"mlp/{n}": g for n, g in zip(names, g_params)}


def _rows(logdir):
    frame = tb_layergrad.load(logdir)
    return {(r.source, r.layer, int(r.step)): r for r in frame.itertuples()}


def _loss_rtol(tolerances) -> float:
    """The bound of a value of the mse loss's step against `_reference`: the longest chain of reductions to a
    gradient is the forward pass (FEATURES, HIDDEN, HIDDEN), the loss's mean (BATCH * 2), back through HIDDEN,
    HIDDEN, and a weight gradient's sum over the batch."""
    return tolerances.TWO_SIDES * tolerances.chain_rtol(
        np.float32, [FEATURES, HIDDEN, HIDDEN, BATCH * 2, HIDDEN, HIDDEN, BATCH]
    )


def _assert_first_step_norms(rows, before, x, y, tolerances) -> None:
    """Step 1's norm of every output and weight gradient, read back by `load()`, against `_reference` from the
    weights `before` the first batch."""
    _, outputs, weights = _reference(before, x[:BATCH], y[:BATCH])
    rtol = _loss_rtol(tolerances)
    for source, want in (("output", outputs), ("weight", weights)):
        for layer, g in want.items():
            g = np.asarray(g, np.float64)
            assert abs(rows[(source, layer, 1)].norm - np.sqrt((g * g).sum())) <= rtol * np.abs(g).max() * np.sqrt(
                g.size
            ), (source, layer)


@pytest.fixture(params=["C++ loops", "XLA"])
def reduced_by(request, monkeypatch):
    """What computes a written step's records inside it (`step_outputs.reduced_by_the_loops`): the fused kernel's
    loops as an XLA FFI call (a CPU step's way, where they are built) or XLA's own definitions (an accelerator's
    way, and a CPU's where the loops are not built: here switched off)."""
    if request.param == "XLA":
        monkeypatch.setenv("TB_LAYERGRAD_FUSED", "0")
    assert step_outputs.reduced_by_the_loops() == (request.param == "C++ loops"), "the loops did not build here"
    return request.param


def test_every_value_is_the_pure_jax_reference(logdir, tolerances, reduced_by):
    x, y = _data()
    model = _model()
    before = _weights(model)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[tb_layergrad.GradientLogger(logdir, weights=True, activations=True)])  # fmt: skip
    rows = _rows(logdir)
    loss, outputs, weights = _reference(before, x[:BATCH], y[:BATCH])
    rtol = _loss_rtol(tolerances)
    for source, want in (("output", outputs), ("weight", weights)):
        for layer, g in want.items():
            g = np.asarray(g, np.float64)
            got = rows[(source, layer, 1)]
            scale = float(np.abs(g).max())
            assert got.elements == g.size and got.nan == 0 and got.no_gradient == 0
            for field, value in (("min", g.min()), ("max", g.max()), ("mean", g.mean())):
                assert abs(getattr(got, field) - value) <= rtol * scale, (source, layer, field)
            assert abs(got.norm - np.sqrt((g * g).sum())) <= rtol * scale * np.sqrt(g.size), (source, layer)
    target = rows[("target", "loss", 1)]
    assert abs(target.mean - loss) <= rtol * abs(loss)
    act = rows[("activation", "mlp/h1", 1)]
    h1 = np.tanh(x[:BATCH].astype(np.float64) @ before[0] + before[1])
    assert abs(act.max - h1.max()) <= rtol and act.elements == h1.size
    assert sorted({k[2] for k in rows}) == [1, 2, 3, 4]


@pytest.mark.parametrize("jit_compile, steps_per_execution", [(True, 1), (False, 1), (True, 3)])
def test_training_is_bitwise_unchanged(logdir, jit_compile, steps_per_execution, reduced_by):
    x, y = _data(6 * BATCH)
    trained = []
    for callbacks in ([], [tb_layergrad.GradientLogger(logdir, weights=True, activations=True, update_freq=2)]):
        model = _model(jit_compile, steps_per_execution)
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        trained.append((_weights(model), history.history["loss"]))
    for a, b in zip(trained[0][0], trained[1][0]):
        np.testing.assert_array_equal(a, b)
    assert trained[0][1] == trained[1][1]
    assert sorted({k[2] for k in _rows(logdir)}) == [2, 4, 6, 8, 10, 12]
    assert list(history.history) == ["loss"]  # the records the step handed out beside its logs taken out


def test_a_step_holds_no_host_callback(logdir, monkeypatch):
    """Every kind of record (outputs, weights, activations, raw views, per-example rows, a target's pass, the
    loss) leaves the step as its outputs: no host callback is traced, which would make JAX's CPU step run
    synchronously (docs/DESIGN.md, "The cost of a step that is not written on JAX")."""

    def refused(*args, **kwargs):
        raise AssertionError("a host callback was traced")

    for name in ("jax.debug.callback", "jax.pure_callback", "jax.experimental.io_callback"):
        monkeypatch.setattr(name, refused)
    x, y = _data()
    logger = tb_layergrad.GradientLogger(
        logdir, weights=True, activations=True, max_elements=8, per_example=True, targets={"first": lambda p: p[:, 0]}
    )
    _model().fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    rows = _rows(logdir)
    assert {k[0] for k in rows} >= {"output", "weight", "activation", "target"}
    assert sorted({k[2] for k in rows}) == [1, 2, 3, 4]


def test_with_ignore_the_steps_off_the_schedule_run_keras_own_step(logdir, tolerances):
    """on_nonfinite="ignore": the steps off the schedule run Keras' own train function, chosen per batch on the
    host (inside an execution of two batches too): training bitwise unchanged, the written steps the
    reference's."""
    x, y = _data(6 * BATCH)
    trained = []
    logger = tb_layergrad.GradientLogger(logdir, weights=True, update_freq=2, on_nonfinite="ignore")
    for callbacks in ([], [logger]):
        model = _model(steps_per_execution=2)
        history = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        trained.append((_weights(model), history.history["loss"]))
    for a, b in zip(trained[0][0], trained[1][0]):
        np.testing.assert_array_equal(a, b)
    assert trained[0][1] == trained[1][1]
    rows = _rows(logdir)
    assert sorted({k[2] for k in rows}) == [2, 4, 6]
    model = _model()
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    _, outputs, weights = _reference(_weights(model), x[BATCH : 2 * BATCH], y[BATCH : 2 * BATCH])
    rtol = _loss_rtol(tolerances)
    for source, want in (("output", outputs), ("weight", weights)):
        for layer, g in want.items():
            g = np.asarray(g, np.float64)
            bound = rtol * np.abs(g).max() * np.sqrt(g.size)
            assert abs(rows[(source, layer, 2)].norm - np.sqrt((g * g).sum())) <= bound, (source, layer)


@pytest.mark.skipif(not hasattr(keras, "RematScope"), reason="this Keras has no RematScope (rematerialisation)")
def test_rematerialised_layers_train_bitwise_unchanged_and_are_observed(logdir, tolerances):
    """Keras' `RematScope(mode="full")`: each layer's call under `jax.checkpoint`, whose backward pass re-runs
    the forward pass: the observing identity runs in both, and training is unchanged."""
    x, y = _data()
    trained = []
    for callbacks in ([], [tb_layergrad.GradientLogger(logdir, weights=True, activations=True)]):
        model = _model(remat=keras.RematScope(mode="full"))
        before = _weights(model)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        trained.append(_weights(model))
    for a, b in zip(*trained):
        np.testing.assert_array_equal(a, b)
    rows = _rows(logdir)
    _assert_first_step_norms(rows, before, x, y, tolerances)
    assert sorted({k[2] for k in rows}) == [1, 2, 3, 4]


@pytest.mark.skipif(not hasattr(keras, "RematScope"), reason="this Keras has no RematScope (rematerialisation)")
def test_a_model_rematerialised_as_a_whole_is_refused_saying_what_works(logdir):
    with keras.RematScope(mode="full"):
        model = _model()
    x, y = _data()
    with pytest.raises(NotImplementedError, match="rematerialised as a whole.*layers inside it"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[tb_layergrad.GradientLogger(logdir)])
    assert type(model.layers[0]) is keras.layers.Dense and "train_step" not in model.__dict__


def test_the_step_is_the_batch_count_across_fits_and_the_model_is_restored(logdir):
    x, y = _data()
    model = _model()
    logger = tb_layergrad.GradientLogger(logdir, update_freq=3)
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[logger])  # 8 batches
    assert type(model.layers[0]) is keras.layers.Dense and "train_step" not in model.__dict__
    assert "stateless_apply" not in model.optimizer.__dict__
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[logger])  # batches 9 to 12
    logger.close()
    steps = sorted({k[2] for k in _rows(logdir) if k[0] == "output"})
    assert steps == [3, 6, 9, 12]
    model.evaluate(x, y, verbose=0)  # untouched by the logger
    # No module of ours that ran holds TensorFlow (Keras' set_random_seed imports it where it is installed).
    loaded = [m for name, m in list(sys.modules.items()) if name.startswith("tb_layergrad")]
    assert "tb_layergrad.jax.gradient_logger" in sys.modules
    assert not [m.__name__ for m in loaded if any(getattr(v, "__name__", "") == "tensorflow" for v in vars(m).values())]
    assert "tb_layergrad.keras.gradient_logger" not in sys.modules and "tb_layergrad.summary" not in sys.modules


def _nan_at_batch_3():
    x, y = _data()
    x[2 * BATCH + 1, 0] = np.nan
    return x, y


@pytest.mark.parametrize("activations, born", [(False, "forward_or_loss"), (True, "forward")])
def test_the_first_nonfinite_step_is_written_off_schedule_and_located(logdir, activations, born):
    x, y = _nan_at_batch_3()
    logger = tb_layergrad.GradientLogger(logdir, update_freq=100, activations=activations)
    _model().fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    assert (logger.nonfinite.step, logger.nonfinite.pass_) == (3, born)
    if activations:
        assert logger.nonfinite.origin == "mlp/h1"
    rows = _rows(logdir)
    assert sorted({k[2] for k in rows}) == [3]
    assert rows[("output", "mlp/out", 3)].nan > 0


def test_raise_and_stop_act_after_the_first_nonfinite_step(logdir):
    x, y = _nan_at_batch_3()
    model = _model()
    with pytest.raises(tb_layergrad.NonFiniteError, match="step 3") as raised:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[tb_layergrad.GradientLogger(logdir, on_nonfinite="raise")])  # fmt: skip
    assert raised.value.origin.step == 3 and "train_step" not in model.__dict__
    model = _model()
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[tb_layergrad.GradientLogger(logdir + "_stop", on_nonfinite="stop")])  # fmt: skip
    assert int(model.optimizer.iterations.numpy()) == 3


@pytest.mark.parametrize(
    "kwargs, why",
    [({"timesteps": True}, "lax.scan"), ({"targets": {"penalty": "inputs"}}, "GradientTape")],
)
def test_what_is_not_yet_on_jax_is_refused_before_training_saying_why(logdir, kwargs, why):
    with pytest.raises(NotImplementedError, match=f"does not support .*{why}.*KERAS_BACKEND=tensorflow"):
        tb_layergrad.GradientLogger(logdir, **kwargs)


def test_loss_scaling_is_refused_before_training_saying_why(logdir):
    """The step number is the optimizer's update count on JAX, which a skipped (overflowed) step leaves behind."""
    x, y = _data()
    model = _model()
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), loss="mse")
    with pytest.raises(NotImplementedError, match="loss scaling.*overflow.*KERAS_BACKEND=tensorflow"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[tb_layergrad.GradientLogger(logdir)])
    assert int(model.optimizer.iterations.numpy()) == 0


def test_targets_are_the_pure_jax_reference_and_training_is_bitwise_unchanged(logdir, tolerances):
    x, y = _data()
    trained = []
    for callbacks in ([], [tb_layergrad.GradientLogger(logdir, weights=True, update_freq=2,
                                                       targets={"first": lambda y_pred: y_pred[:, 0]})]):  # fmt: skip
        model = _model()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        trained.append(_weights(model))
    for a, b in zip(*trained):
        np.testing.assert_array_equal(a, b)
    # Step 2: the weights after one Adam update, as the model held them before its second batch.
    model = _model()
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    value, outputs, weights = _reference(_weights(model), x[BATCH : 2 * BATCH], None, of_output=lambda o: o[:, 0])
    rtol = tolerances.TWO_SIDES * tolerances.chain_rtol(
        np.float32, [FEATURES, HIDDEN, HIDDEN, BATCH, HIDDEN, HIDDEN, BATCH]
    )
    frame = tb_layergrad.load(logdir)
    first = {(r.source, r.layer, int(r.step)): r for r in frame[frame["target"] == "first"].itertuples()}
    assert sorted({k[2] for k in first}) == [2, 4]
    assert abs(first[("target", "first", 2)].mean - value) <= rtol * np.abs(value) + 1e-6
    for source, want in (("output", outputs), ("weight", weights)):
        for layer, g in want.items():
            g = np.asarray(g, np.float64)
            got, scale = first[(source, layer, 2)], float(np.abs(g).max())
            assert got.elements == g.size, (source, layer)
            for field, v in (("min", g.min()), ("max", g.max()), ("mean", g.mean())):
                assert abs(getattr(got, field) - v) <= rtol * scale, (source, layer, field)
    loss = frame[(frame["target"] == "loss") & (frame["source"] == "output") & (frame["layer"] == "mlp/out")]
    assert sorted(loss["step"]) == [2, 4] and float(loss["norm"].iloc[0]) != first[("output", "mlp/out", 2)].norm

    with pytest.raises(ValueError, match="one value per example"):
        _model().fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                     callbacks=[tb_layergrad.GradientLogger(logdir + "_bad", targets={"t": lambda y_pred: y_pred})])  # fmt: skip


def test_update_freq_epoch_writes_the_last_batch_of_each_epoch_across_fits(logdir):
    x, y = _data()  # 4 batches an epoch
    model = _model()
    logger = tb_layergrad.GradientLogger(logdir, update_freq="epoch")
    model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[logger])
    model.fit(x[: 3 * BATCH], y[: 3 * BATCH], batch_size=BATCH, epochs=2, verbose=0, callbacks=[logger])
    logger.close()
    assert sorted({k[2] for k in _rows(logdir)}) == [4, 8, 12, 15, 18]

    def batches():
        while True:
            yield x[:BATCH], y[:BATCH]

    with pytest.raises(ValueError, match="steps per epoch"):
        _model().fit(
            batches(), epochs=1, verbose=0, callbacks=[tb_layergrad.GradientLogger(logdir, update_freq="epoch")]
        )


def _bounded(g, max_elements):
    """docs/FORMAT.md's `tensor` view, written out in numpy."""
    g = np.asarray(g, np.float32)
    g = g.reshape(1, -1) if g.ndim <= 1 else g.reshape(g.shape[0], -1)
    stride = max(1, -(-g.shape[1] // max_elements))
    g = g[:, ::stride]
    return g[: min(g.shape[0], max(1, max_elements // g.shape[1]))]


@pytest.mark.parametrize("max_elements", [3, 40])
def test_max_elements_writes_the_bounded_raw_tensors(logdir, tolerances, max_elements):
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    from tb_layergrad import metadata

    x, y = _data()
    model = _model()
    before = _weights(model)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[tb_layergrad.GradientLogger(logdir, weights=True, activations=True, max_elements=max_elements)])  # fmt: skip
    acc = event_accumulator.EventAccumulator(os.path.join(logdir, "train"), size_guidance={"tensors": 0})
    acc.Reload()
    _, outputs, weights = _reference(before, x[:BATCH], y[:BATCH])
    rtol = _loss_rtol(tolerances)
    h1 = np.tanh(x[:BATCH].astype(np.float64) @ before[0] + before[1])
    wanted = [("loss", "output", k, g) for k, g in outputs.items()] + [
        ("loss", "weight", k, g) for k, g in weights.items()
    ]
    wanted.append(("forward", "activation", "mlp/h1", h1))
    for target, source, layer, g in wanted:
        events = acc.Tensors(metadata.make_tag(target, source, layer, metadata.KIND_TENSOR))
        assert [e.step for e in events] == [1, 2, 3, 4], (source, layer)
        got, want = tensor_util.make_ndarray(events[0].tensor_proto), _bounded(g, max_elements)
        assert got.dtype == np.float32 and got.shape == want.shape and got.size <= max(max_elements, want.shape[1])
        np.testing.assert_allclose(got, want, rtol=0, atol=rtol * float(np.abs(g).max()) + 1e-7 * np.abs(want).max())
    assert not [t for t in acc.Tags()["tensors"] if t.startswith("loss/target/") and t.endswith("/tensor")]


def test_another_backend_is_refused_saying_what_works():
    """Keras' numpy backend stands for any backend without an observer (torch alike): refused before training."""
    code = "import tb_layergrad\ntry:\n    tb_layergrad.GradientLogger\nexcept RuntimeError as e:\n    print(e)\n"
    env = dict(os.environ, KERAS_BACKEND="numpy")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "'numpy'" in out and "KERAS_BACKEND=jax" in out and "KERAS_BACKEND=tensorflow" in out
    assert "tb-layergrad report" in out


class _GuideStep(keras.Sequential):
    """The Keras guide's JAX `train_step(self, state, data)`: its own loss function, `jax.value_and_grad`,
    `self.optimizer.stateless_apply`."""

    def compute_loss_and_updates(self, trainable_variables, non_trainable_variables, x, y):
        y_pred, non_trainable_variables = self.stateless_call(trainable_variables, non_trainable_variables, x)
        return self.compute_loss(x, y, y_pred), (y_pred, non_trainable_variables)

    def train_step(self, state, data):
        trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables = state
        x, y = data
        grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
        (loss, (y_pred, non_trainable_variables)), grads = grad_fn(trainable_variables, non_trainable_variables, x, y)
        trainable_variables, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable_variables
        )
        return {"loss": loss}, (trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables)


def test_a_users_jax_train_step_is_observed_too(logdir, tolerances):
    x, y = _data()
    keras.utils.set_random_seed(11)
    model = _GuideStep(
        [keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh", name="h1"),
         keras.layers.Dense(HIDDEN, activation="relu", name="h2"), keras.layers.Dense(2, name="out")],
        name="mlp",
    )  # fmt: skip
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    before = _weights(model)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[tb_layergrad.GradientLogger(logdir, weights=True)])  # fmt: skip
    rows = _rows(logdir)
    _assert_first_step_norms(rows, before, x, y, tolerances)
    assert sorted({k[2] for k in rows}) == [1, 2, 3, 4]
