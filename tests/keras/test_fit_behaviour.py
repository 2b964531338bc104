"""A real behaviour, not a fixed number: vanishing gradients in a deep sigmoid MLP, seen from fit().

Per-layer norms of dL/d(layer output) at the first step shrink geometrically
toward the input (each layer multiplies by sigmoid' <= 1/4 times a Glorot
matrix); the ReLU/He twin keeps them of the same order.
"""

from __future__ import annotations

import numpy as np
import pytest
from fit_helpers import keras, layers, log_dir, one, read_series, stat

import tb_layergrad

DEPTH = 8


def _deep(activation, initializer, name):
    stack = [keras.Input((32,))]
    stack += [
        layers.Dense(32, activation=activation, kernel_initializer=initializer, name=f"dense_{i}") for i in range(DEPTH)
    ]
    stack.append(layers.Dense(10, name="logits"))
    return keras.Sequential(stack, name=name)


def _ratios(tmp_path, activation, initializer):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 32)).astype("float32")
    y = rng.integers(0, 10, size=(64,))
    model = _deep(activation, initializer, activation)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    logdir = log_dir(tmp_path / activation)
    model.fit(
        x, y, batch_size=64, epochs=1, verbose=0, callbacks=[tb_layergrad.GradientLogger(logdir, layers="dense_*")]
    )
    series = read_series(logdir)
    norms = np.array([stat(one(series, f"loss/output/{activation}/dense_{i}/stats", 1), "norm") for i in range(DEPTH)])
    return norms[:-1] / norms[1:]  # layer i relative to layer i+1 (one step closer to the output)


@pytest.mark.slow
def test_sigmoid_shrinks_geometrically_relu_does_not(tmp_path):
    sigmoid = _ratios(tmp_path, "sigmoid", "glorot_uniform")
    relu = _ratios(tmp_path, "relu", "he_normal")
    # Sigmoid: every layer toward the input loses the same large factor (about 1/4).
    assert np.all(sigmoid < 0.5), sigmoid
    assert sigmoid.max() / sigmoid.min() < 1.6, sigmoid  # a constant factor: geometric
    assert np.prod(sigmoid) < 1e-3
    # ReLU + He: of the same order all the way down.
    assert np.all((relu > 0.5) & (relu < 2.0)), relu
    assert 0.1 < np.prod(relu) < 10
