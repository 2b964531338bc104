"""capturing.targets, in a custom loop: `target_values` inside the tape, then `target_gradients`, one backward pass
per target, each its own GradientMap; what a target function may return (fit() with `targets=`:
tests/keras/test_fit_targets.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad.capturing import targets as lg_targets

TARGETS = {
    "class_2": lambda p: p[:, 2],
    "mean_logit": lambda p: tf.reduce_mean(p, axis=1, keepdims=True),  # [batch, 1] is accepted too
}


def test_custom_loop_helpers(fit_helpers):
    """target_values + target_gradients: one persistent tape, one backward pass per target."""
    fit_helpers.keras.utils.set_random_seed(3)
    model, manual = fit_helpers.bn_residual_mlp()
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 6)).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        with tb_layergrad.capture(model, tape=tape, weights=True) as cap:
            y_pred = model(x, training=True)
        loss = tf.reduce_mean(tf.square(y_pred))
        values = lg_targets.target_values(TARGETS, y_pred)
    grads = cap.gradients(tape, loss)
    per_target = lg_targets.target_gradients(cap, tape, values)
    del tape
    assert grads.target == "loss" and set(per_target) == set(TARGETS)
    for name, fn in TARGETS.items():
        assert per_target[name].target == name
        g_out, _ = fit_helpers.reproduce(model, manual, model.get_weights(), x.numpy(), None, None, target=fn)
        length = fit_helpers.path_length(model, x.numpy(), target_terms=int(np.prod(g_out["bnres/out"].shape)))
        for path, g in g_out.items():
            fit_helpers.assert_close(per_target[name][path].numpy(), g, f"{name} {path}", length)


@pytest.mark.parametrize("bad", [lambda p: p, lambda p: p[:, :2], lambda p: tf.zeros([3, 2, 1])])
def test_not_scalar_per_example_is_rejected(bad):
    with pytest.raises(ValueError, match="one value per example"):
        lg_targets.target_value("bad", bad, tf.zeros([4, 3]))


def test_scalar_and_int_targets():
    assert float(lg_targets.target_value("s", lambda p: tf.reduce_max(p), tf.ones([4, 3]))) == 1.0
    with pytest.raises(ValueError, match="floating point"):
        lg_targets.target_value("i", lambda p: tf.argmax(p, axis=1), tf.ones([4, 3]))
