"""Training is unchanged: weights after several epochs are BITWISE equal to a run without GradientLogger.

Two models: an MLP and a tiny CNN with BatchNormalization (batch statistics in
training) and a residual Add. Every layer captured, weights, an extra target,
the bounded raw tensors, every 2nd step logged (both branches of the step's
condition run), momentum SGD. Eager and graph: bitwise; in graph mode also with
batches of unknown size through layers that add their bias with `+`. XLA: the layer-output
gradients become outputs of the compiled step and XLA may fuse its backward
pass differently around them (docs/DESIGN.md, "XLA neutrality"): bitwise on
some CPUs (this test's AVX2 machine), on others the same float32 math in
another order, so under XLA one update is checked against the derived bound of
that math, and several epochs for equal bits only where the first update was.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from fit_helpers import compile_kwargs, keras, layergrad_steps, layers, log_dir, read_series, tiny_conv_bn_residual
from tolerances import assert_same_float32_math, gamma, reduction_path_length

import tb_layergrad


def _mlp():
    return keras.Sequential(
        [
            keras.Input((10,)),
            layers.Dense(16, activation="relu", name="a"),
            layers.Dense(16, activation="sigmoid", name="b"),
            layers.Dense(4, activation="softmax", name="c"),
        ],
        name="mlp",
    )


def _run(build, x, y, mode, callbacks, epochs=2):
    keras.utils.set_random_seed(21)
    model = build()
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        **compile_kwargs(mode),
    )
    if epochs:  # epochs=0: the initial weights (tf_keras refuses fit(epochs=0))
        model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model, model.get_weights()  # includes BatchNorm's moving statistics


def _logger(tmp_path, layers, update_freq=2):
    return tb_layergrad.GradientLogger(
        log_dir(tmp_path),
        layers=layers,
        update_freq=update_freq,
        weights=True,
        targets={"class_1": lambda p: p[:, 1]},
        max_elements=64,
    )


def _data(model):
    rng = np.random.default_rng(0)
    if model == "mlp":
        build, x = _mlp, rng.normal(size=(24, 10)).astype("float32")
    else:
        build, x = tiny_conv_bn_residual, rng.normal(size=(24, 8, 8, 3)).astype("float32")
    return build, x, rng.integers(0, 4, size=(24,)).astype("int32")


# Under XLA each captured tensor adds ~1 s of compilation on this machine: fewer layers there.
@pytest.mark.parametrize(
    "model,mode,chosen",
    [
        ("mlp", "eager", None),
        ("mlp", "graph", None),
        ("cnn", "graph", None),
    ],
)
@pytest.mark.slow
def test_weights_bitwise_equal(tmp_path, model, mode, chosen):
    build, x, y = _data(model)
    _, plain = _run(build, x, y, mode, [])
    _, logged = _run(build, x, y, mode, [_logger(tmp_path, chosen)])
    assert len(plain) == len(logged)
    for a, b in zip(plain, logged):
        np.testing.assert_array_equal(a, b)
    assert layergrad_steps(read_series(log_dir(tmp_path))) == [2, 4, 6]  # it did log


class _Affine(layers.Layer):
    """tanh(x @ kernel + bias), the bias added with `+` (an AddV2, as Keras 3.3's Dense does): grappler fuses the
    three ops into one, and the gradient of `+` reads the MatMul output's shape."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(input_shape[-1], self.units), initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="random_normal")

    def call(self, x):
        return tf.tanh(tf.matmul(x, self.kernel) + self.bias)


def _affine_mlp():
    return keras.Sequential(
        [keras.Input((10,)), _Affine(16, name="a"), _Affine(16, name="b"), layers.Dense(4, activation="softmax")]
    )


@pytest.mark.slow
def test_bitwise_with_a_batch_of_unknown_size(tmp_path):
    # A dataset's batches have no static size: the gradient of `+` reads each MatMul output's shape at run time.
    # The second backward pass (weights=True) and the target's must leave that MatMul one reader, as the real one
    # does, or grappler stops fusing it with its bias and tanh and the forward pass changes in its last bits.
    _, x, y = _data("mlp")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    runs = []
    for callbacks in ([], [_logger(tmp_path, None)]):
        keras.utils.set_random_seed(21)
        model = _affine_mlp()
        model.compile(
            optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", **compile_kwargs("graph")
        )
        model.fit(data, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        runs.append(model.get_weights())
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert layergrad_steps(read_series(log_dir(tmp_path))) == [2, 4, 6]


@pytest.mark.parametrize("model,chosen", [("mlp", ["b"]), ("cnn", ["bn2", "add"])])
@pytest.mark.slow
def test_under_xla_the_same_math(tmp_path, model, chosen):
    build, x, y = _data(model)
    # One update: w1 = w0 - lr * g (momentum's first step), BatchNorm's moving statistics one step on.
    start_model, start = _run(build, x[:8], y[:8], "xla", [], epochs=0)
    _, plain = _run(build, x[:8], y[:8], "xla", [], epochs=1)
    _, logged = _run(build, x[:8], y[:8], "xla", [_logger(tmp_path / "one", chosen, update_freq=1)], epochs=1)
    assert layergrad_steps(read_series(log_dir(tmp_path / "one"))) == [1]
    # The gradient (and a batch statistic) of one step: float32 math along a path of at most `length`
    # reductions (contractions forward and back, the batch's moments and the pooling's mean for the CNN,
    # the softmax's 4 terms), in another order; the update adds one rounding of w on each side.
    other = 2 * (8 * 8 * 8) + 8 * 8 if model == "cnn" else 0
    length = reduction_path_length(start_model, x[:8], target_terms=4, other=other)
    for w0, a, b in zip(start, plain, logged):
        slack = 2 * gamma(1, np.float32) * float(np.max(np.abs(w0), initial=0.0))
        assert_same_float32_math(b - w0, a - w0, length, err_msg=f"update of a weight of shape {w0.shape}")
        np.testing.assert_allclose(
            b, a, rtol=0, atol=slack + np.max(np.abs(a - w0), initial=0.0) * 2 * gamma(length, np.float32)
        )
    if all(np.array_equal(a, b) for a, b in zip(plain, logged)):
        # Where the first update is bitwise, XLA fused the same way: so must the whole run be.
        _, plain = _run(build, x, y, "xla", [])
        _, logged = _run(build, x, y, "xla", [_logger(tmp_path / "all", chosen)])
        for a, b in zip(plain, logged):
            np.testing.assert_array_equal(a, b)
        assert layergrad_steps(read_series(log_dir(tmp_path / "all"))) == [2, 4, 6]
