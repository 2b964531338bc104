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

With `weights=True` (graph mode) a battery of models, optimizers and inputs
(numpy, tf.data, a generator; update_freq 1, 3, 100), each a case that broke one
way of sourcing the weight records (docs/DESIGN.md#neutrality), and a GAN's two tapes. With `targets=` (their
backward passes in the recording condition) the BatchNorm + residual CNN on numpy and tf.data, update_freq 1 and 3.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad

keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise: the tests run on both
layers = keras.layers


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


def _run(fit_helpers, build, x, y, mode, callbacks, epochs=2):
    keras.utils.set_random_seed(21)
    model = build()
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        **fit_helpers.compile_kwargs(mode),
    )
    if epochs:  # epochs=0: the initial weights (tf_keras refuses fit(epochs=0))
        model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model, model.get_weights()  # includes BatchNorm's moving statistics


def _logger(fit_helpers, tmp_path, layers, update_freq=2):
    return tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path),
        layers=layers,
        update_freq=update_freq,
        weights=True,
        targets={"class_1": lambda p: p[:, 1]},
        max_elements=64,
    )


def _data(fit_helpers, model):
    rng = np.random.default_rng(0)
    if model == "mlp":
        build, x = _mlp, rng.normal(size=(24, 10)).astype("float32")
    else:
        build, x = fit_helpers.tiny_conv_bn_residual, rng.normal(size=(24, 8, 8, 3)).astype("float32")
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
def test_weights_bitwise_equal(tmp_path, model, mode, chosen, fit_helpers):
    build, x, y = _data(fit_helpers, model)
    _, plain = _run(fit_helpers, build, x, y, mode, [])
    _, logged = _run(fit_helpers, build, x, y, mode, [_logger(fit_helpers, tmp_path, chosen)])
    assert len(plain) == len(logged)
    for a, b in zip(plain, logged):
        np.testing.assert_array_equal(a, b)
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == [
        2,
        4,
        6,
    ]  # it did log


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
def test_bitwise_with_a_batch_of_unknown_size(tmp_path, fit_helpers):
    # A dataset's batches have no static size: the gradient of `+` reads each MatMul output's shape at run time.
    # The second backward pass (weights=True) and the target's must leave that MatMul one reader, as the real one
    # does, or grappler stops fusing it with its bias and tanh and the forward pass changes in its last bits.
    _, x, y = _data(fit_helpers, "mlp")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    runs = []
    for callbacks in ([], [_logger(fit_helpers, tmp_path, None)]):
        keras.utils.set_random_seed(21)
        model = _affine_mlp()
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss="sparse_categorical_crossentropy",
            **fit_helpers.compile_kwargs("graph"),
        )
        model.fit(data, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        runs.append(model.get_weights())
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == [2, 4, 6]


@pytest.mark.parametrize("model,chosen", [("mlp", ["b"]), ("cnn", ["bn2", "add"])])
@pytest.mark.slow
def test_under_xla_the_same_math(tmp_path, model, chosen, fit_helpers, tolerances):
    build, x, y = _data(fit_helpers, model)
    # One update: w1 = w0 - lr * g (momentum's first step), BatchNorm's moving statistics one step on.
    start_model, start = _run(fit_helpers, build, x[:8], y[:8], "xla", [], epochs=0)
    _, plain = _run(fit_helpers, build, x[:8], y[:8], "xla", [], epochs=1)
    _, logged = _run(
        fit_helpers,
        build,
        x[:8],
        y[:8],
        "xla",
        [_logger(fit_helpers, tmp_path / "one", chosen, update_freq=1)],
        epochs=1,
    )
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path / "one"))) == [1]
    # The gradient (and a batch statistic) of one step: float32 math along a path of at most `length`
    # reductions (contractions forward and back, the batch's moments and the pooling's mean for the CNN,
    # the softmax's 4 terms), in another order; the update adds one rounding of w on each side.
    other = 2 * (8 * 8 * 8) + 8 * 8 if model == "cnn" else 0
    length = tolerances.reduction_path_length(start_model, x[:8], target_terms=4, other=other)
    for w0, a, b in zip(start, plain, logged):
        slack = 2 * tolerances.gamma(1, np.float32) * float(np.max(np.abs(w0), initial=0.0))
        tolerances.assert_same_float32_math(b - w0, a - w0, length, err_msg=f"update of a weight of shape {w0.shape}")
        np.testing.assert_allclose(
            b, a, rtol=0, atol=slack + np.max(np.abs(a - w0), initial=0.0) * 2 * tolerances.gamma(length, np.float32)
        )
    if all(np.array_equal(a, b) for a, b in zip(plain, logged)):
        # Where the first update is bitwise, XLA fused the same way: so must the whole run be.
        _, plain = _run(fit_helpers, build, x, y, "xla", [])
        _, logged = _run(fit_helpers, build, x, y, "xla", [_logger(fit_helpers, tmp_path / "all", chosen)])
        for a, b in zip(plain, logged):
            np.testing.assert_array_equal(a, b)
        assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path / "all"))) == [2, 4, 6]


# -- the weight records are the step's own gradients: training bitwise, whatever feeds the step -----------------
class _Equalized(layers.Layer):
    """x @ (kernel * c) + bias, an equalized learning rate (StyleGAN's): the kernel's gradient ends in a `Mul` by c,
    which the optimizer's `Mul` by the learning rate reads; grappler reorders the two multiplies
    (MinimizeBroadcasts) only while nothing else reads that gradient."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(input_shape[-1], self.units), initializer="random_normal")
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")
        self.scale = float(1.0 / np.sqrt(int(input_shape[-1])))

    def call(self, x):
        return tf.tanh(tf.matmul(x, self.kernel * self.scale) + self.bias)


class _DecayedStep(keras.Model):
    """A step that adds weight decay to its gradients with `+` before applying them, one Dense layer applied twice
    (its gradients an `AddN`): grappler merges each `AddN` into the `+` (AddOpsRewrite) only while that is its one
    reader."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.shared = layers.Dense(10, activation="tanh", name="shared")
        self.out = layers.Dense(4, activation="softmax", name="out")

    def call(self, x):
        return self.out(self.shared(self.shared(x)))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, self(x, training=True)))
        grads = tape.gradient(loss, self.trainable_weights)
        grads = [g + 1e-3 * w for g, w in zip(grads, self.trainable_weights)]
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        return {"loss": loss}


class _L1L2Step(_DecayedStep):
    """Each layer applied once, L2 and L1 decay added with two `+`: AddOpsRewrite merges `g + a + b` into one `AddN`
    of 3 terms whose first is the kernel's `MatMul` gradient, which TensorFlow's `AddN` may sum in another order
    while another op still holds it."""

    def call(self, x):
        return self.out(self.shared(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, self(x, training=True)))
        grads = tape.gradient(loss, self.trainable_weights)
        grads = [g + 1e-3 * w + 1e-4 * tf.sign(w) for g, w in zip(grads, self.trainable_weights)]
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        return {"loss": loss}


def _battery_model(fit_helpers, kind: str):
    if kind == "layernorm":  # the tf.data case a second backward pass changed: LayerNormalization's adds
        return keras.Sequential(
            [keras.Input((6, 8)), layers.LayerNormalization(), layers.Dense(5, activation="softmax")]
        )
    if kind == "equalized":
        return keras.Sequential([keras.Input((10,)), _Equalized(8, name="eq"), layers.Dense(4, activation="softmax")])
    if kind == "rnn":
        return keras.Sequential([keras.Input((5, 3)), layers.LSTM(6), layers.Dense(4, activation="softmax")])
    if kind == "cnn":
        return fit_helpers.tiny_conv_bn_residual()
    if kind == "decayed":
        return _DecayedStep(name="decayed")
    if kind == "l1l2":
        return _L1L2Step(name="l1l2")
    return _mlp()


_OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
}


def _battery_data(kind: str):
    rng = np.random.default_rng(3)
    shape = {"layernorm": (6, 8), "rnn": (5, 3), "cnn": (8, 8, 3)}.get(kind, (10,))
    labels = (16, 6) if kind == "layernorm" else (16,)
    return rng.normal(size=(16,) + shape).astype("float32"), rng.integers(0, 4, size=labels).astype("int32")


def _fed(feed: str, x, y) -> dict:
    """fit()'s arguments for 4 batches of 4: numpy arrays, a tf.data dataset or a Python generator (the latter two:
    batches of unknown size)."""
    if feed == "numpy":
        return {"x": x, "y": y, "batch_size": 4}
    if feed == "tf.data":
        return {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(4)}

    def batches():
        for i in range(0, len(x), 4):
            yield x[i : i + 4], y[i : i + 4]

    return {"x": batches(), "steps_per_epoch": 4}


def _trained(fit_helpers, kind, optimizer, feed, callbacks, policy="float32"):
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(21)
        model = _battery_model(fit_helpers, kind)
        model.compile(
            optimizer=_OPTIMIZERS[optimizer](),
            loss="sparse_categorical_crossentropy",
            **fit_helpers.compile_kwargs("graph"),
        )
        model(_battery_data(kind)[0][:1])  # built: the subclassed step's weights exist before fit (get_weights below)
        initial = model.get_weights()
        model.fit(**_fed(feed, *_battery_data(kind)), epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, initial, model.get_weights()


@pytest.mark.parametrize(
    "kind,optimizer,feed,update_freq,policy",
    [
        ("layernorm", "adam", "tf.data", 1, "float32"),
        ("layernorm", "adam", "generator", 100, "float32"),  # nothing written: the graph alone changed it before
        ("mlp", "sgd", "generator", 3, "float32"),  # Adam and tf.data: test_bitwise_with_a_batch_of_unknown_size
        ("equalized", "sgd", "tf.data", 1, "float32"),
        ("equalized", "momentum", "numpy", 3, "float32"),
        ("equalized", "sgd", "tf.data", 1, "mixed_float16"),
        ("cnn", "momentum", "tf.data", 1, "float32"),
        ("rnn", "adam", "tf.data", 3, "float32"),
        ("decayed", "sgd", "tf.data", 1, "float32"),
        ("l1l2", "sgd", "tf.data", 1, "float32"),
    ],
)
@pytest.mark.slow  # ten cases, each trained twice: left to CI by the quick loop
def test_weights_true_trains_bitwise_whatever_feeds_the_step(
    tmp_path, kind, optimizer, feed, update_freq, policy, fit_helpers, tolerances
):
    # weights=True records the tensors the step's own gradient call returned: no second backward pass. Each case
    # broke one way of getting them: a second pass reads forward tensors (LayerNormalization's and BatchNorm's adds,
    # with batches of unknown size); reading the step's tensor as it is stops a rewrite of the update (equalized:
    # MinimizeBroadcasts; decayed: AddOpsRewrite); a copy holding the terms of a sum of 3 changes its order at run
    # time (decayed on TensorFlow 2.16; l1l2).
    _, _, plain = _trained(fit_helpers, kind, optimizer, feed, [], policy)
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), update_freq=update_freq, weights=True, max_elements=fit_helpers.MAX
    )
    model, initial, logged = _trained(fit_helpers, kind, optimizer, feed, [logger], policy)
    for a, b in zip(plain, logged):
        np.testing.assert_array_equal(a, b)
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series) == [s for s in (1, 2, 3, 4) if s % update_freq == 0]
    weight_tags = [t for t, (info, _) in series.items() if info.source == "weight"]
    assert bool(weight_tags) == (update_freq < 100)
    if kind in ("equalized", "decayed", "l1l2") and update_freq == 1 and policy == "float32":
        # Each record read from a copy (of the step's last multiply; of its sum and the products it sums) is the
        # gradient of step 1 the tape returned, before the step adds its decay.
        x, y = _battery_data(kind)
        model.set_weights(initial)
        with tf.GradientTape() as tape:
            loss = keras.losses.SparseCategoricalCrossentropy()(y[:4], model(x[:4], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        by_name = {
            (getattr(v, "path", None) or v.name).split(":")[0]: g.numpy()
            for v, g in zip(model.trainable_variables, grads)
        }
        length = tolerances.reduction_path_length(model, x[:4], target_terms=4)
        tensors = {
            info.layer: tag for tag, (info, _) in series.items() if info.source == "weight" and info.kind == "tensor"
        }
        assert len(tensors) == len(by_name) == 4
        for path, tag in tensors.items():
            tail = path.split("/", 1)[1]  # "sequential/eq/kernel" -> "eq/kernel"
            g = next(g for name, g in by_name.items() if name == tail or name.endswith("/" + tail))
            tolerances.assert_same_float32_math(
                fit_helpers.one(series, tag, 1), g.reshape(fit_helpers.one(series, tag, 1).shape), length, tag
            )


def test_gan_two_tapes_bitwise_with_weights(tmp_path, custom_steps, fit_helpers):
    # A custom step with two tapes and two optimizers (Keras' guide's GAN), fed by tf.data: each tape's weight
    # records are its own gradient call's tensors; both updates bitwise as without the logger.
    runs = []
    for callbacks in ([], [tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=1, weights=True)]):
        model = custom_steps.gan(**fit_helpers.compile_kwargs("graph"))
        model.fit(
            tf.data.Dataset.from_tensor_slices(custom_steps.data(16)).batch(4), epochs=1, verbose=0, callbacks=callbacks
        )
        runs.append(model.get_weights())
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values() if info.source == "weight"} == {"discriminator", "generator"}
    assert fit_helpers.layergrad_steps(series, "generator") == [1, 2, 3, 4]


# -- the targets' backward passes: training bitwise, whatever feeds the step ----------------------------------------
def _class_1(y_pred):
    """The first output position's class-1 probability: one value per example, also of a per-position output."""
    return tf.reshape(y_pred[..., 1], (tf.shape(y_pred)[0], -1))[:, 0]


@pytest.mark.parametrize(
    "kind,feed,update_freq,weights",
    [
        ("cnn", "tf.data", 1, False),
        ("cnn", "tf.data", 3, True),
        ("cnn", "numpy", 1, False),
    ],
)
@pytest.mark.slow
def test_targets_train_bitwise_whatever_feeds_the_step(tmp_path, kind, feed, update_freq, weights, fit_helpers):
    # A target's backward pass runs in the recording condition and reads forward tensors the step reads for their
    # shape only (batches of unknown size: tf.data); read by the condition, BatchNorm's `x * scale + offset` was no
    # longer merged with the residual add (AddOpsRewrite) and the forward pass moved in its last bits.
    _, _, plain = _trained(fit_helpers, kind, "momentum", feed, [])
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path),
        update_freq=update_freq,
        weights=weights,
        targets={"class_1": _class_1},
        max_elements=fit_helpers.MAX,
    )
    _, _, logged = _trained(fit_helpers, kind, "momentum", feed, [logger])
    for a, b in zip(plain, logged):
        np.testing.assert_array_equal(a, b)
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series, "class_1") == [s for s in (1, 2, 3, 4) if s % update_freq == 0]
