"""Training is unchanged: weights after several epochs are BITWISE equal to a run without GradientLogger.

Two models: an MLP and a tiny CNN with BatchNormalization (batch statistics in
training) and a residual Add. Every layer captured, weights, an extra target,
the bounded raw tensors, every 2nd step logged (both branches of the step's
condition run), momentum SGD. Eager, graph and XLA.
"""
from __future__ import annotations

import numpy as np
import pytest

import tb_layergrad
from fit_helpers import compile_kwargs, keras, layergrad_steps, layers, log_dir, read_series, tiny_conv_bn_residual


def _mlp():
    return keras.Sequential(
        [keras.Input((10,)), layers.Dense(16, activation="relu", name="a"), layers.Dense(16, activation="sigmoid", name="b"), layers.Dense(4, activation="softmax", name="c")],
        name="mlp",
    )


def _run(build, x, y, mode, callbacks, epochs=2):
    keras.utils.set_random_seed(21)
    model = build()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy", **compile_kwargs(mode))
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model.get_weights()  # includes BatchNorm's moving statistics


def _logger(tmp_path, layers):
    return tb_layergrad.GradientLogger(
        log_dir(tmp_path), layers=layers, every_n_steps=2, weights=True, targets={"class_1": lambda p: p[:, 1]}, max_elements=64
    )


# Under XLA each captured tensor adds ~1 s of compilation on this machine: fewer layers there.
@pytest.mark.parametrize(
    "model,mode,chosen",
    [
        ("mlp", "eager", None),
        ("mlp", "graph", None),
        ("mlp", "xla", ["b"]),
        ("cnn", "graph", None),
        ("cnn", "xla", ["bn2", "add"]),
    ],
)
def test_weights_bitwise_equal(tmp_path, model, mode, chosen):
    rng = np.random.default_rng(0)
    if model == "mlp":
        build, x = _mlp, rng.normal(size=(24, 10)).astype("float32")
    else:
        build, x = tiny_conv_bn_residual, rng.normal(size=(24, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 4, size=(24,)).astype("int32")
    plain = _run(build, x, y, mode, [])
    logged = _run(build, x, y, mode, [_logger(tmp_path, chosen)])
    assert len(plain) == len(logged)
    for a, b in zip(plain, logged):
        np.testing.assert_array_equal(a, b)
    assert layergrad_steps(read_series(log_dir(tmp_path))) == [2, 4, 6]  # it did log
