"""A real behaviour, not a fixed number: vanishing gradients in a deep sigmoid MLP, seen from fit().

Per-layer norms of dL/d(layer output) at the first step shrink geometrically
toward the input (each layer multiplies by sigmoid' <= 1/4 times a Glorot
matrix); the ReLU/He twin keeps them of the same order.
"""

from __future__ import annotations

import numpy as np
import pytest

import tb_layergrad

DEPTH = 8


def _deep(fit_helpers, activation, initializer, name):
    stack = [fit_helpers.keras.Input((32,))]
    stack += [
        fit_helpers.layers.Dense(32, activation=activation, kernel_initializer=initializer, name=f"dense_{i}")
        for i in range(DEPTH)
    ]
    stack.append(fit_helpers.layers.Dense(10, name="logits"))
    return fit_helpers.keras.Sequential(stack, name=name)


def _ratios(fit_helpers, tmp_path, activation, initializer):
    fit_helpers.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 32)).astype("float32")
    y = rng.integers(0, 10, size=(64,))
    model = _deep(fit_helpers, activation, initializer, activation)
    model.compile(optimizer="sgd", loss=fit_helpers.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    logdir = fit_helpers.log_dir(tmp_path / activation)
    model.fit(
        x, y, batch_size=64, epochs=1, verbose=0, callbacks=[tb_layergrad.GradientLogger(logdir, layers="dense_*")]
    )
    series = fit_helpers.read_series(logdir)
    norms = np.array(
        [
            fit_helpers.stat(fit_helpers.one(series, f"loss/output/{activation}/dense_{i}/stats", 1), "norm")
            for i in range(DEPTH)
        ]
    )
    return norms[:-1] / norms[1:]  # layer i relative to layer i+1 (one step closer to the output)


@pytest.mark.slow
def test_sigmoid_shrinks_geometrically_relu_does_not(tmp_path, fit_helpers):
    sigmoid = _ratios(fit_helpers, tmp_path, "sigmoid", "glorot_uniform")
    relu = _ratios(fit_helpers, tmp_path, "relu", "he_normal")
    # Sigmoid: every layer toward the input loses the same large factor (about 1/4).
    assert np.all(sigmoid < 0.5), sigmoid
    assert sigmoid.max() / sigmoid.min() < 1.6, sigmoid  # a constant factor: geometric
    assert np.prod(sigmoid) < 1e-3
    # ReLU + He: of the same order all the way down.
    assert np.all((relu > 0.5) & (relu < 2.0)), relu
    assert 0.1 < np.prod(relu) < 10
