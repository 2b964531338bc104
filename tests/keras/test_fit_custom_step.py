"""A model with its OWN train_step: GradientLogger observes it, so its real gradients are logged.

Seed question 004: "nobody can get the gradients that fit() computes without
rewriting Keras' training engine". The callback never runs a step of its own:
whatever `train_step` the model has runs unmodified, and the gradient of the
loss it differentiates (here a hand-written loss with an L2 penalty that no
Keras loss object knows about) is what is logged. Checked against an
independent reproduction of each logged step (`fit_helpers.assert_close`), and training is
bitwise what it is without the callback. Runs under Keras 3 and tf_keras.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad

keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise, as in fit_helpers
layers = keras.layers
PENALTY = 0.01


def _own_loss(model, y, y_pred):
    """A loss only this model's train_step knows: MSE plus an L2 penalty on the first kernel."""
    return tf.reduce_mean(tf.square(y_pred - y)) + PENALTY * tf.reduce_sum(tf.square(model.get_layer("d1").kernel))


class OwnStep(keras.Model):
    """Functional model whose train_step is written by hand with its own GradientTape."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = _own_loss(self, y, y_pred)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"own_loss": loss}


class SuperStep(keras.Model):
    """An override that delegates to Keras' own step (e.g. to add a metric around it)."""

    def train_step(self, data):
        return super().train_step(data)


class NoTapeStep(keras.Model):
    """An override that computes no gradient with a tape."""

    def train_step(self, data):
        return {"nothing": tf.constant(0.0)}


def _build(cls, name="own"):
    inp = keras.Input((6,))
    h = layers.Dense(8, activation="tanh", name="d1")(inp)
    out = layers.Dense(3, name="d2")(h)
    model = cls(inp, out, name=name)

    def manual(x, tape):
        h = model.get_layer("d1")(x)
        tape.watch(h)
        o = model.get_layer("d2")(h)
        tape.watch(o)
        return o, {f"{name}/d1": h, f"{name}/d2": o}

    return model, manual


def _data(n=16):
    rng = np.random.default_rng(4)
    return rng.normal(size=(n, 6)).astype("float32"), rng.normal(size=(n, 3)).astype("float32")


def _train(fit_helpers, cls, mode, callbacks, epochs=2):
    keras.utils.set_random_seed(11)
    model, manual = _build(cls)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse", **fit_helpers.compile_kwargs(mode))
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model, manual


@pytest.mark.slow
def test_own_train_step_gradients_are_logged(tmp_path, fit_mode, fit_helpers):
    saver = fit_helpers.WeightsBeforeStep()
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), update_freq=1, weights=True, max_elements=10_000
    )
    model, manual = _train(fit_helpers, OwnStep, fit_mode, [saver, logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series) == [1, 2, 3, 4]
    x, y = _data()
    for step in (1, 4):
        batch = (step - 1) % 2
        xb, yb = x[batch * 8 : (batch + 1) * 8], y[batch * 8 : (batch + 1) * 8]
        fit_helpers.check_step(
            series, step, model, manual, saver.before[step], xb, yb, lambda yt, yp: _own_loss(model, yt, yp)
        )


@pytest.mark.slow
def test_own_train_step_trains_bitwise_as_without_the_callback(tmp_path, fit_mode, fit_helpers):
    plain, _ = _train(fit_helpers, OwnStep, fit_mode, [])
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), update_freq=2, weights=True, targets={"unit_0": lambda p: p[:, 0]}
    )
    logged, _ = _train(fit_helpers, OwnStep, fit_mode, [logger])
    for a, b in zip(plain.get_weights(), logged.get_weights()):
        np.testing.assert_array_equal(a, b)
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series) == [2, 4]
    assert fit_helpers.layergrad_steps(series, target="unit_0") == [2, 4]


def test_override_calling_keras_own_step(tmp_path, fit_helpers):
    plain, _ = _train(fit_helpers, SuperStep, "graph", [])
    logged, _ = _train(fit_helpers, SuperStep, "graph", [tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))])
    for a, b in zip(plain.get_weights(), logged.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == [1, 2, 3, 4]


def test_step_without_a_tape_fails_clearly_and_restores(tmp_path, fit_helpers):
    original = dict(tf.GradientTape.__dict__)
    model, _ = _build(NoTapeStep)
    model.compile(optimizer="sgd", loss="mse")
    x, y = _data()
    with pytest.raises(RuntimeError, match="entered no tf.GradientTape"):
        model.fit(
            x,
            y,
            batch_size=8,
            epochs=1,
            verbose=0,
            callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))],
        )
    assert "train_step" not in model.__dict__
    assert not getattr(model.train_function, "_tb_layergrad_wrapper", False)
    assert "call" not in model.__dict__
    assert tf.GradientTape.__dict__["gradient"] is original["gradient"]
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # the model's own step runs again


class TwoCallStep(keras.Model):
    """A persistent tape asked twice (e.g. two objectives on two parts of the model): each call is a target,
    named for the top-level layer whose weights it asks for ("d2", then "d1")."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            y_pred = self(x, training=True)
            first = _own_loss(self, y, y_pred)
            second = tf.reduce_mean(tf.abs(y_pred))
        head = self.get_layer("d2").trainable_variables
        body = self.get_layer("d1").trainable_variables
        g_head = tape.gradient(first, head)
        g_body = tape.gradient(second, body)
        del tape
        self.optimizer.apply_gradients(zip(g_head + g_body, head + body))
        return {"first": first, "second": second}


@pytest.mark.slow
def test_persistent_tape_asked_twice_logs_each_call(tmp_path, fit_helpers):
    original = dict(tf.GradientTape.__dict__)
    plain, _ = _train(fit_helpers, TwoCallStep, "graph", [])
    saver = fit_helpers.WeightsBeforeStep()
    logged, manual = _train(
        fit_helpers,
        TwoCallStep,
        "graph",
        [saver, tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), max_elements=10_000)],
    )
    for a, b in zip(plain.get_weights(), logged.get_weights()):
        np.testing.assert_array_equal(a, b)
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"d2", "d1"}
    x, y = _data()
    losses = {"d2": lambda yt, yp: _own_loss(logged, yt, yp), "d1": lambda yt, yp: tf.reduce_mean(tf.abs(yp))}
    for target, loss in losses.items():
        assert fit_helpers.layergrad_steps(series, target=target) == [1, 2, 3, 4]
        fit_helpers.check_step(
            series, 3, logged, manual, saver.before[3], x[:8], y[:8], loss, with_weights=False, target=target
        )
    # The tape class is as it was: the observation swaps its methods only while a step is traced.
    assert tf.GradientTape.__dict__["__enter__"] is original["__enter__"]
    assert tf.GradientTape.__dict__["gradient"] is original["gradient"]
