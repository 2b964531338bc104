"""`targets=` and `per_example=True` on a custom train_step with several tapes: they apply to every logged tape.

- per_example=True: each tape that trains weights has its own `examples` records (the guide's GAN: the
  discriminator's and the generator's), equal to one tape per example of that tape's loss on the weights it ran
  on; a tape w.r.t. inputs gets none (warned when both are asked for).
- targets={name: fn}: computed on every tape under which the model's own call ran, the k-th as "name#k", each on
  that tape's forward pass (the second sees the weights after the first update); a step whose tapes never call
  the model fails with a clear error; tapes that did not call it are named in a warning.
"""

from __future__ import annotations

import pytest

import tb_layergrad

tf = pytest.importorskip("tensorflow")
keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise, as in fit_helpers
LR = 0.05
RTOL = 1e-4


def _gan_fit(tmp_path, mode, custom_steps, fit_helpers, **logger_kwargs):
    model = custom_steps.gan(custom_steps.GAN, LR, **fit_helpers.compile_kwargs(mode))
    snaps = custom_steps.Snapshots()
    x = custom_steps.data(8)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), weights=True, **logger_kwargs)
    with pytest.warns(RuntimeWarning, match="outside its GradientTapes"):
        model.fit(x, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[snaps, logger])
    return model, snaps, x


def _per_example_weight_norms(model, weights, real, custom_steps, per_example_reference):
    """{variable path: [B] norms} of each example's own loss, for the discriminator's tape (its weights as the
    batch started) and the generator's (the discriminator after its SGD update, replayed)."""
    d, g = model.discriminator, model.generator
    saved = model.get_weights()
    model.set_weights(weights)
    try:
        real = tf.convert_to_tensor(real)
        n = real.shape[0]
        combined = tf.concat([g(custom_steps.latent(real)), real], axis=0)
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], axis=0)
        d_norms = per_example_reference.norms(
            per_example_reference.per_example_gradients(d, model.loss_fn, combined, labels)
        )
        with tf.GradientTape() as tape:
            d_loss = model.loss_fn(labels, d(combined))
        for w, grad in zip(d.trainable_weights, tape.gradient(d_loss, d.trainable_weights)):
            w.assign_sub(LR * grad)  # SGD's update, as the step's d_optimizer made it

        def g_loss(y, fake):  # the generator's tape: its loss through the discriminator
            return model.loss_fn(y, d(fake))

        g_norms = per_example_reference.norms(
            per_example_reference.per_example_gradients(g, g_loss, custom_steps.latent(real), tf.zeros((n, 1)))
        )
    finally:
        model.set_weights(saved)
    prefix = f"{model.name}/"
    return {
        "discriminator": {prefix + p: v for p, v in d_norms.items()},
        "generator": {prefix + p: v for p, v in g_norms.items()},
    }


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.slow
def test_per_example_on_every_tape(tmp_path, mode, custom_steps, fit_helpers, per_example_reference, tb_reading):
    model, snaps, x = _gan_fit(tmp_path, mode, custom_steps, fit_helpers, per_example=True)
    found = tb_reading.examples(fit_helpers.log_dir(tmp_path))["train"]
    assert set(found) == {(t, s) for t in ("discriminator", "generator") for s in ("output", "weight")}
    want = _per_example_weight_norms(model, snaps.before[1], x, custom_steps, per_example_reference)
    for target in ("discriminator", "generator"):
        rows = found[(target, "weight")][1]
        assert set(rows) == set(want[target]), (target, sorted(rows), sorted(want[target]))
        for path, row in rows.items():
            per_example_reference.assert_row(row, want[target][path], RTOL, f"{mode} {target} {path}")
        assert int(found[(target, "output")][1][next(iter(found[(target, "output")][1]))][0]) > 0


def test_per_example_with_input_tapes_warns_they_get_none(tmp_path, fit_helpers):
    with pytest.warns(UserWarning, match="'penalty' gets none"):
        tb_layergrad.GradientLogger(
            fit_helpers.log_dir(tmp_path), per_example=True, weights=True, targets={"penalty": "inputs"}
        )


class CalledTwice(keras.Model):
    """Two updates per batch, each tape calling the model itself: a target is computed on both."""

    def __init__(self, net: keras.Model, **kwargs):
        super().__init__(name="twice", **kwargs)
        self.net = net  # the guide's discriminator (custom_steps.discriminator)

    def call(self, x):
        return self.net(x)

    def train_step(self, data):
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(self(data) ** 2)
            grads = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        return {"loss": loss}


def _unit_target(model, weights, x):
    """(sum of output unit 0, its gradient w.r.t. the hidden layer's output) at `weights`."""
    saved = model.get_weights()
    model.set_weights(weights)
    try:
        with tf.GradientTape() as tape:
            h = model.net.layers[0](x)
            tape.watch(h)
            value = tf.reduce_sum(model.net.layers[1](h)[:, 0])
        return float(value), tape.gradient(value, h).numpy()
    finally:
        model.set_weights(saved)


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.slow
def test_targets_on_every_tape_that_calls_the_model(tmp_path, mode, custom_steps, fit_helpers):
    keras.utils.set_random_seed(3)
    model = CalledTwice(custom_steps.discriminator())
    model.compile(optimizer=keras.optimizers.SGD(LR), **fit_helpers.compile_kwargs(mode))
    snaps = custom_steps.Snapshots()
    x = custom_steps.data(8)
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), targets={"unit": lambda y: y[:, 0]}, max_elements=10_000
    )
    model.fit(x, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[snaps, logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"loss", "loss#2", "unit", "unit#2"}
    before = snaps.before[1]
    saved = model.get_weights()  # the weights after the first update: replayed with SGD on the first tape's loss
    model.set_weights(before)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(tf.constant(x)) ** 2)
    for w, g in zip(model.trainable_weights, tape.gradient(loss, model.trainable_weights)):
        w.assign_sub(LR * g)
    middle = model.get_weights()
    model.set_weights(saved)
    hidden = f"twice/{model.net.name}/d_hidden"
    for name, weights in (("unit", before), ("unit#2", middle)):
        value, grad = _unit_target(model, weights, tf.constant(x))
        (layer,) = {i.layer for i, _ in series.values() if i.target == name and i.source == "target"}
        fit_helpers.assert_close(
            fit_helpers.stat(fit_helpers.one(series, f"{name}/target/{layer}/stats", 1), "mean"),
            value,
            f"{name} value",
            64,
        )
        fit_helpers.assert_close(
            fit_helpers.one(series, f"{name}/output/{hidden}/tensor", 1), grad, f"{name} {hidden}", 64
        )


def test_targets_on_a_step_that_never_calls_the_model_fail_clearly(tmp_path, custom_steps, fit_helpers):
    model = custom_steps.gan(custom_steps.GAN, LR)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), targets={"unit": lambda y: y[:, 0]})
    with pytest.raises(RuntimeError, match="did not call the model itself"):
        model.fit(custom_steps.data(8), batch_size=8, epochs=1, verbose=0, callbacks=[logger])
