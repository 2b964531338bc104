"""Every tape of a custom train_step that trains something is its own target, with the step's own numbers.

The guide's GAN: "discriminator" then "generator", each equal to an independent tape on the
weights of that moment (snapshotted before the batch; the generator's tape sees the
discriminator after its update, reproduced with SGD's rule); training bitwise unchanged.
keras-io's WGAN-GP: each critic update its own target ("discriminator", "discriminator#2"), the
gradient-penalty tape not logged. weights=True: each target holds the weights its tape asked for.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tb_layergrad

tf = pytest.importorskip("tensorflow")


LR = 0.05


def _targets(series) -> set:
    return {info.target for info, _ in series.values()}


def _fit(custom_steps, fit_helpers, tmp_path, cls, mode, logger_kwargs=None, n=16):
    model = custom_steps.gan(cls, LR, **fit_helpers.compile_kwargs(mode))
    snaps = custom_steps.Snapshots()
    callbacks = [snaps]
    if logger_kwargs is not None:
        callbacks.append(tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), **logger_kwargs))
    x = custom_steps.data(n)
    model.fit(x, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return model, snaps, x


def _reproduce_gan(custom_steps, model, weights, real):
    """Output gradients of the GAN step's two losses, from scratch (d: before its update; g: after it)."""
    saved = model.get_weights()
    model.set_weights(weights)
    try:
        d, g = model.discriminator, model.generator
        real = tf.convert_to_tensor(real)
        z = custom_steps.latent(real)
        combined = tf.concat([g(z), real], axis=0)
        labels = tf.concat([tf.ones((real.shape[0], 1)), tf.zeros((real.shape[0], 1))], axis=0)
        with tf.GradientTape() as tape:
            h = d.layers[0](combined)
            tape.watch(h)
            out = d.layers[1](h)
            tape.watch(out)
            d_loss = model.loss_fn(labels, out)
        gh, gout, gw = tape.gradient(d_loss, (h, out, d.trainable_weights))
        d_grads = {"discriminator/d_hidden": gh.numpy(), "discriminator/d_out": gout.numpy()}
        for w, gr in zip(d.trainable_weights, gw):
            w.assign_sub(LR * gr)  # SGD's update, as the step's d_optimizer made it
        with tf.GradientTape() as tape:
            gh1 = g.layers[0](z)
            tape.watch(gh1)
            gout1 = g.layers[1](gh1)
            tape.watch(gout1)
            dh = d.layers[0](gout1)
            tape.watch(dh)
            dout = d.layers[1](dh)
            tape.watch(dout)
            g_loss = model.loss_fn(tf.zeros((real.shape[0], 1)), dout)
        grads = tape.gradient(g_loss, (gh1, gout1, dh, dout))
        g_grads = dict(
            zip(
                ["generator/g_hidden", "generator/g_out", "discriminator/d_hidden", "discriminator/d_out"],
                [t.numpy() for t in grads],
            )
        )
    finally:
        model.set_weights(saved)
    return d_grads, g_grads


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.slow
def test_gan_two_targets_equal_an_independent_tape(tmp_path, mode, custom_steps, fit_helpers):
    with pytest.warns(RuntimeWarning, match="outside its GradientTapes"):
        model, snaps, x = _fit(custom_steps, fit_helpers, tmp_path, custom_steps.GAN, mode, {"max_elements": 10_000})
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert _targets(series) == {"discriminator", "generator"}
    name = model.name
    for step in (1, 2):
        d_grads, g_grads = _reproduce_gan(custom_steps, model, snaps.before[step], x[(step - 1) * 8 : step * 8])
        for target, grads in (("discriminator", d_grads), ("generator", g_grads)):
            for path, g in grads.items():
                got = fit_helpers.one(series, f"{target}/output/{name}/{path}/tensor", step)
                fit_helpers.assert_close(got.reshape(g.shape[0], -1), g.reshape(g.shape[0], -1), f"{target} {path}", 64)
                st = fit_helpers.one(series, f"{target}/output/{name}/{path}/stats", step)
                assert fit_helpers.stat(st, "elements") == g.size and fit_helpers.stat(st, "no_gradient") == 0
    # The generator ran outside the discriminator's tape: it is absent from that target, not "no gradient".
    assert not [t for t in series if t.startswith(f"discriminator/output/{name}/generator/")]


@pytest.mark.parametrize("step_class", ["GAN", "WGAN"], ids=["gan", "wgan_gp"])  # of custom_steps
@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.slow
def test_training_is_bitwise_unchanged(tmp_path, mode, step_class, custom_steps, fit_helpers):
    """Also with the gradient penalty's nested tape (second-order: the outputs it watches are watched by the
    critic's tape too)."""
    cls = getattr(custom_steps, step_class)
    plain, _, _ = _fit(custom_steps, fit_helpers, tmp_path / "plain", cls, mode)
    logged, _, _ = _fit(
        custom_steps, fit_helpers, tmp_path / "logged", cls, mode, {"weights": True, "activations": True}
    )
    for a, b in zip(plain.get_weights(), logged.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["graph", "eager", "xla"])
@pytest.mark.slow
def test_weights_true_logs_the_weights_each_tape_asked_for(tmp_path, mode, custom_steps, fit_helpers):
    """The same in graph, eager and XLA: the discriminator's target holds its weights only, the generator's its own."""
    model, _, _ = _fit(custom_steps, fit_helpers, tmp_path, custom_steps.GAN, mode, {"weights": True})
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    weights = {}
    for info, by_step in series.values():
        if info.source == "weight":
            weights.setdefault(info.target, set()).add(info.layer.split("/")[1])
            assert sorted(by_step) == [1, 2]
    assert weights == {"discriminator": {"discriminator"}, "generator": {"generator"}}
    for tag, (info, by_step) in series.items():
        if info.source == "weight" and tag.endswith("/stats"):
            assert all(fit_helpers.stat(v[0], "no_gradient") == 0 for v in by_step.values())


@pytest.mark.slow
def test_wgan_each_critic_update_its_own_target_penalty_not_logged(tmp_path, custom_steps, fit_helpers):
    model, _, _ = _fit(custom_steps, fit_helpers, tmp_path, custom_steps.WGAN, "graph", {"weights": True})
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert _targets(series) == {"discriminator", "discriminator#2", "generator"}
    values = {
        info.target: by_step for info, by_step in series.values() if info.source == "target" and info.kind == "stats"
    }
    assert set(values) == {"discriminator", "discriminator#2", "generator"}
    for target in values:
        assert sorted(values[target]) == [1, 2]
    # two critic updates: the second sees the weights after the first, so its loss differs
    first, second = (float(fit_helpers.stat(values[t][1][0], "mean")) for t in ("discriminator", "discriminator#2"))
    assert first != second


def test_distiller_student_is_the_loss_and_the_frozen_teacher_is_not_warned_about(tmp_path, custom_steps, fit_helpers):
    keras = custom_steps.keras
    keras.utils.set_random_seed(0)
    model = custom_steps.Distiller()
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    x = custom_steps.data(16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            x,
            x[:, :2],
            batch_size=8,
            epochs=1,
            verbose=0,
            callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))],
        )
    assert not [w for w in caught if "outside its GradientTapes" in str(w.message)]
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert _targets(series) == {"loss"}
    layers_logged = {info.layer for info, _ in series.values() if info.source == "output"}
    assert layers_logged == {f"{model.name}/student", f"{model.name}/student/s_out"}


def test_wgan_penalty_tapes_logged_when_asked_for(tmp_path, custom_steps, fit_helpers):
    """targets={name: "inputs"}: each gradient penalty's tape is a target of its own (values: tests/keras/test_fit_gallery.py)."""
    _fit(custom_steps, fit_helpers, tmp_path, custom_steps.WGAN, "graph", {"targets": {"penalty": "inputs"}})
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert _targets(series) == {"discriminator", "discriminator#2", "generator", "penalty", "penalty#2"}
    layers_logged = {info.layer for info, _ in series.values() if info.target == "penalty" and info.source == "output"}
    assert layers_logged and all(layer.split("/")[1] == "discriminator" for layer in layers_logged), layers_logged


def test_inputs_target_on_a_step_without_such_tape_warns(tmp_path, custom_steps, fit_helpers):
    with pytest.warns(RuntimeWarning, match="differentiated no tape with respect to inputs only"):
        _fit(custom_steps, fit_helpers, tmp_path, custom_steps.GAN, "graph", {"targets": {"penalty": "inputs"}})
    assert _targets(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == {"discriminator", "generator"}


@pytest.mark.parametrize(
    "targets, error",
    [
        ({"penalty": "input"}, "a function of y_pred, or 'inputs'"),
        ({"a": "inputs", "b": "inputs"}, "give those tapes one name"),
        ({"loss": "inputs"}, "reserved for the training loss"),
        ({"a/b": "inputs"}, "without '/'"),
    ],
)
def test_inputs_target_bad_values_raise(tmp_path, targets, error, fit_helpers):
    with pytest.raises(ValueError, match=error):
        tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), targets=targets)
