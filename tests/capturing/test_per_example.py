"""Per-example gradient norms equal an independent computation: one tape per example,
its own loss on a batch of one.

The reference for weights is a plain `tape.gradient(loss_i, model.trainable_variables)`; for layer
outputs it is `capture().gradients` on the batch of one (per_example off: the path tests/capturing/test_capture.py
checks against by-hand forwards). The batch under test is captured with `per_example=True` in eager
mode and inside `tf.function`.

Tolerance: rtol 1e-4 on each example's norm (float32), as the issue asks.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad.capturing import ghost_norm, per_example
from tb_layergrad.capturing.layer_tree import LayerTree
from tb_layergrad.capturing.per_example import PATCHES_BY_CONVOLUTION

keras = tf.keras  # Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1 (as tests/fit_helpers.py)
layers = keras.layers
TF_KERAS = keras.Model.__module__.startswith("tf_keras")

MODES = ["eager", "function", "xla"]
RTOL = 1e-4


def mse(y, pred):
    """The batch mean of per-example losses (each example's: the mean of its squared errors)."""
    return tf.reduce_mean(tf.square(pred - y))


def _per_example(model, x, y, mode, training=False, **kw):
    def step(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True, **kw) as cap:
                loss = mse(y, model(x, training=training))
        return cap.per_example_norms(tape, loss)

    fn = step if mode == "eager" else tf.function(step, jit_compile=mode == "xla")
    return fn(x, y)


def _reference(model, x, y, training=False):
    """path -> [B] norms of each example's own gradient, one tape per example (batch of one)."""
    owners = LayerTree(model).variable_paths()
    norms = {}
    for i in range(int(x.shape[0])):
        xi, yi = x[i : i + 1], y[i : i + 1]
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = mse(yi, model(xi, training=training))
        g = cap.gradients(tape, loss)
        for path, grad in g.outputs.items():
            norms.setdefault(path, []).append(None if grad is None else float(tf.norm(tf.cast(grad, tf.float64))))
        for var, grad in zip(model.trainable_variables, g.variable_gradients):
            path = owners[id(var)][0]
            norms.setdefault(path, []).append(None if grad is None else _dense_norm(grad))
    return norms


def _dense_norm(grad):
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.convert_to_tensor(grad)  # sums the rows of repeated ids
    return float(tf.norm(tf.cast(grad, tf.float64)))


def _assert_matches(got, want, expect_paths=None):
    assert got.complete, got.unsupported
    for path, ref in want.items():
        if any(r is None for r in ref):
            assert got[path] is None, path
            continue
        assert got[path] is not None, path
        np.testing.assert_allclose(got[path].numpy(), np.array(ref), rtol=RTOL, err_msg=path)
    assert set(got) == set(want), (sorted(got), sorted(want))
    if expect_paths is not None:
        assert set(expect_paths) <= set(got)


# -- models --------------------------------------------------------------------------------------


def mlp():
    model = keras.Sequential(
        [
            keras.Input((8,)),
            layers.Dense(16, activation="tanh", name="d0"),
            layers.Dense(12, activation="relu", name="d1"),
            layers.Dense(10, activation="sigmoid", use_bias=False, name="d2"),
            layers.Dense(3, name="head"),
        ],
        name="mlp",
    )
    return model, tf.random.normal([6, 8]), tf.random.normal([6, 3])


def sequence():
    """Dense (and EinsumDense) applied per token; widths chosen so both the explicit (p·q small) and the
    ghost (T·(p+q) < p·q) ways run."""
    inp = keras.Input((5, 4))
    h = layers.Dense(4, activation="gelu", name="tok")(inp)  # T=5, p=4, q=4: explicit
    h = layers.Dense(32, activation="tanh", name="wide")(h)  # T=5, p=4, q=32: explicit
    h = layers.Dense(32, activation="relu", name="square")(h)  # T=5, p=32, q=32: ghost
    h = layers.EinsumDense("abc,cde->abde", output_shape=(5, 2, 8), bias_axes="de", activation="tanh", name="heads")(h)
    h = layers.EinsumDense("abde,ef->abdf", output_shape=(5, 2, 8), bias_axes="d", name="per_head")(h)  # bias (2, 1)
    h = layers.EinsumDense("abcd,cde->abe", output_shape=(5, 7), bias_axes="e", name="merge")(h)
    h = layers.EinsumDense("...d,de->...e", output_shape=(3,), bias_axes="e", name="ell")(h)
    out = layers.Dense(2, name="head")(layers.GlobalAveragePooling1D(name="pool")(h))
    model = keras.Model(inp, out, name="seq")
    assert ghost_norm.use_ghost(5, 32, 32) and not ghost_norm.use_ghost(5, 4, 32) and not ghost_norm.use_ghost(5, 4, 4)
    return model, tf.random.normal([4, 5, 4]), tf.random.normal([4, 2])


def cnn1d():
    """Patch lengths 9 and 15 (identity-kernel convolution) and 72 (by kernel offset)."""
    inp = keras.Input((12, 3))
    h = layers.Conv1D(5, 3, padding="causal", dilation_rate=2, activation="relu", name="causal")(inp)
    h = layers.Conv1D(24, 3, strides=2, padding="same", activation="tanh", name="strided")(h)
    h = layers.Conv1D(4, 3, padding="valid", use_bias=False, name="valid")(h)
    assert 15 <= PATCHES_BY_CONVOLUTION < 72
    out = layers.Dense(2, name="head")(layers.Flatten(name="flat")(h))
    return keras.Model(inp, out, name="cnn1d"), tf.random.normal([4, 12, 3]), tf.random.normal([4, 2])


def cnn2d():
    """Patch lengths 18 and 20 (identity-kernel convolution) and 72 (by kernel offset)."""
    inp = keras.Input((9, 9, 2))
    h = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu", name="same_s2")(inp)
    h = layers.Conv2D(5, (3, 3), padding="valid", activation="tanh", name="valid")(h)
    h = layers.Conv2D(3, 2, dilation_rate=2, padding="same", name="dilated")(h)
    out = layers.Dense(2, name="head")(layers.GlobalAveragePooling2D(name="pool")(h))
    return keras.Model(inp, out, name="cnn2d"), tf.random.normal([4, 9, 9, 2]), tf.random.normal([4, 2])


def embedding():
    inp = keras.Input((6,), dtype="int32")
    h = layers.Embedding(9, 5, name="emb")(inp)
    h = layers.Dense(4, activation="tanh", name="tok")(h)
    out = layers.Dense(2, name="head")(layers.GlobalAveragePooling1D(name="pool")(h))
    # Repeated ids inside one example (rows 0, 1) and ids shared across examples.
    x = tf.constant([[1, 1, 1, 2, 3, 1], [4, 5, 4, 5, 4, 5], [0, 1, 2, 3, 4, 5], [8, 7, 8, 6, 8, 0]], tf.int32)
    return keras.Model(inp, out, name="emb_model"), x, tf.random.normal([4, 2])


def layer_norm():
    inp = keras.Input((5, 6))
    h = layers.Dense(6, activation="relu", name="pre")(inp)
    h = layers.LayerNormalization(name="ln")(h)
    h = layers.LayerNormalization(axis=[1, 2], center=False, name="ln_both")(h)
    h = layers.Dense(4, name="post")(h)
    out = layers.Dense(2, name="head")(layers.Flatten(name="flat")(h))
    return keras.Model(inp, out, name="ln_model"), tf.random.normal([4, 5, 6]) * 3 + 1, tf.random.normal([4, 2])


class Shared(keras.Model):
    """One Dense called twice in a pass: its weight gradient sums both calls."""

    def __init__(self):
        super().__init__(name="shared")
        self.inp = layers.Dense(6, activation="tanh", name="inp")
        self.twice = layers.Dense(6, activation="tanh", name="twice")
        self.head = layers.Dense(2, name="head")

    def call(self, x):
        return self.head(self.twice(self.twice(self.inp(x))))


def shared():
    model = Shared()
    x = tf.random.normal([5, 3])
    model(x)
    return model, x, tf.random.normal([5, 2])


def float_ids():
    """Ids given as floats (an Input without dtype): Keras and tf_keras truncate them to int32, so 1.0 and 1.7
    are one row."""
    inp = keras.Input((4,))
    out = layers.Dense(2, name="head")(layers.Flatten(name="flat")(layers.Embedding(5, 3, name="emb")(inp)))
    x = tf.constant([[1.0, 1.7, 2.0, 2.9], [0.0, 4.5, 4.0, 3.2], [3.9, 3.0, 3.5, 0.1]])
    return keras.Model(inp, out, name="float_ids"), x, tf.random.normal([3, 2])


MODELS = {
    "mlp": mlp,
    "sequence": sequence,
    "cnn1d": cnn1d,
    "cnn2d": cnn2d,
    "embedding": embedding,
    "layer_norm": layer_norm,
    "shared_layer": shared,
    "float_ids": float_ids,
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.slow
def test_norms_equal_one_tape_per_example(kind, mode):
    model, x, y = MODELS[kind]()
    got = _per_example(model, x, y, mode)
    want = _reference(model, x, y)
    weight_paths = {LayerTree(model).variable_paths()[id(v)][0] for v in model.trainable_variables}
    _assert_matches(got, want, expect_paths=weight_paths)
    for path in weight_paths:
        assert got[path].shape == (x.shape[0],), path


# -- the same backward pass, and the API around it -----------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "function"])  # XLA: see test_capture.py's neutrality test
@pytest.mark.slow
def test_model_outputs_and_weight_gradients_unchanged_bitwise(mode):
    """The pre-activation observer and the extra δ sources leave the forward and backward bits alone."""
    for kind in ("mlp", "sequence", "cnn1d", "cnn2d", "embedding", "layer_norm"):
        model, x, y = MODELS[kind]()

        def plain(x, y):
            with tf.GradientTape() as tape:
                pred = model(x)
                loss = mse(y, pred)
            return pred, tape.gradient(loss, model.trainable_variables)

        def captured(x, y):
            with tf.GradientTape() as tape:
                with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
                    pred = model(x)
                    loss = mse(y, pred)
            g = cap.gradients(tape, loss)
            return pred, g.variable_gradients, g.per_example

        if mode == "function":
            plain, captured = tf.function(plain), tf.function(captured)
        pred0, grads0 = plain(x, y)
        pred1, grads1, per_example = captured(x, y)
        assert per_example.complete
        assert pred0.numpy().tobytes() == pred1.numpy().tobytes(), kind
        for a, b in zip(grads0, grads1):  # an embedding's gradient: IndexedSlices, compared as they come
            assert type(a) is type(b), kind
            parts = (lambda g: [g.values, g.indices]) if isinstance(a, tf.IndexedSlices) else (lambda g: [g])
            for pa, pb in zip(parts(a), parts(b)):
                assert pa.numpy().tobytes() == pb.numpy().tobytes(), kind


def test_non_persistent_tape_one_call_serves_both():
    model, x, y = mlp()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
            loss = mse(y, model(x))
    grads = cap.gradients(tape, loss)  # the tape's one gradient call
    norms = cap.per_example_norms(tape, loss)  # no second call: the same pass's result
    assert norms is grads.per_example
    assert set(norms) == set(grads)

    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
            loss = mse(y, model(x))
    norms = cap.per_example_norms(tape, loss)  # the other order
    assert cap.last_gradients.per_example is norms
    assert len(cap.last_gradients.variable_gradients) == len(model.trainable_variables)


def test_gradient_map_carries_per_example_out_of_a_tf_function():
    model, x, y = mlp()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
                loss = mse(y, model(x))
        return cap.gradients(tape, loss)

    grads = step(x, y)
    eager = _per_example(model, x, y, "eager")
    assert set(grads.per_example) == set(eager) and grads.per_example.complete
    for path in eager:
        np.testing.assert_allclose(grads.per_example[path].numpy(), eager[path].numpy(), rtol=RTOL)
    assert grads.with_entries({}).per_example is grads.per_example


def test_gradients_unchanged_without_per_example():
    model, x, y = mlp()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, weights=True) as cap:
            loss = mse(y, model(x))
    grads = cap.gradients(tape, loss)
    assert grads.per_example is None
    assert not any(
        "activation" in layer.__dict__
        and callable(layer.__dict__["activation"])
        and type(layer.__dict__["activation"]).__name__ == "PreactivationObserver"
        for layer in model.layers
    )
    with pytest.raises(ValueError, match="per_example=True"):
        cap.per_example_norms(tape, loss)


def test_leaving_the_context_restores_activations():
    model, x, y = mlp()
    before = {layer.name: layer.activation for layer in model.layers}
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True):
            model(x)
    assert {layer.name: layer.activation for layer in model.layers} == before


def test_outputs_only_without_weights():
    model, x, y = mlp()
    got = _per_example(model, x, y, "eager")
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, per_example=True) as cap:
            loss = mse(y, model(x))
    outputs_only = cap.per_example_norms(tape, loss)
    assert set(outputs_only) == {"mlp/d0", "mlp/d1", "mlp/d2", "mlp/head"}
    for path in outputs_only:
        np.testing.assert_array_equal(outputs_only[path].numpy(), got[path].numpy())


# -- flagged, never a wrong number ----------------------------------------------------------------


def _bn_model():
    inp = keras.Input((6,))
    h = layers.Dense(8, activation="relu", name="pre")(inp)
    h = layers.BatchNormalization(name="bn")(h)
    h = layers.Dense(5, activation="tanh", name="post")(h)
    out = layers.Dense(2, name="head")(h)
    return keras.Model(inp, out, name="bn_model"), tf.random.normal([6, 6]), tf.random.normal([6, 2])


@pytest.mark.parametrize("mode", MODES)
def test_batch_normalization_in_training_is_flagged(mode):
    model, x, y = _bn_model()
    got = _per_example(model, x, y, mode, training=True)
    assert got.coupled_by == ("bn_model/bn",)
    assert not got.complete
    flagged = {
        "bn_model/pre",
        "bn_model/pre/kernel",
        "bn_model/pre/bias",
        "bn_model/bn",
        "bn_model/bn/gamma",
        "bn_model/bn/beta",
    }
    assert set(got.unsupported) == flagged
    for path in flagged:
        assert got[path] is None
        assert "coupled by bn_model/bn" in got.unsupported[path]
    # Downstream of the coupling each example's loss depends on its own outputs only: numbers, and right.
    want = _reference_downstream(model, x, y)
    for path, ref in want.items():
        np.testing.assert_allclose(got[path].numpy(), ref, rtol=RTOL, err_msg=path)


def _reference_downstream(model, x, y):
    """Per-example gradients of the layers after the BatchNormalization, with its batch statistics of
    the whole batch: run the batch, take each example's own loss."""
    post, head = model.get_layer("post"), model.get_layer("head")
    with tf.GradientTape(persistent=True) as tape:
        h = model.get_layer("bn")(model.get_layer("pre")(x), training=True)
        tape.watch(h)
        p = post(h)
        tape.watch(p)
        o = head(p)
        losses = tf.unstack(tf.reduce_mean(tf.square(o - y), axis=-1))
    want = {}
    for i in range(int(x.shape[0])):
        gp, go, *gv = tape.gradient(losses[i], [p, o] + post.trainable_variables + head.trainable_variables)
        for path, g in zip(
            [
                "bn_model/post",
                "bn_model/head",
                "bn_model/post/kernel",
                "bn_model/post/bias",
                "bn_model/head/kernel",
                "bn_model/head/bias",
            ],
            [gp, go] + gv,
        ):
            want.setdefault(path, []).append(float(tf.norm(g)))
    return want


def test_batch_normalization_in_inference_is_not_flagged():
    model, x, y = _bn_model()
    got = _per_example(model, x, y, "eager", training=False)
    _assert_matches(got, _reference(model, x, y, training=False))


def test_batch_normalization_not_chosen_still_flags():
    model, x, y = _bn_model()
    got = _per_example(model, x, y, "eager", training=True, layers=["pre", "head"])
    assert got.coupled_by == ("bn_model/bn",)
    assert set(got.unsupported) == {"bn_model/pre", "bn_model/pre/kernel", "bn_model/pre/bias"}
    assert got["bn_model/head/kernel"] is not None


def test_layer_without_rule_is_unsupported_with_reason():
    class Scale(layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],), initializer="ones", name="w")

        def call(self, x):
            return x * self.w

    inp = keras.Input((4,))
    h = Scale(name="scale")(layers.Dense(4, name="d")(inp))
    model = keras.Model(inp, layers.Dense(2, name="head")(h), name="m")
    x, y = tf.random.normal([3, 4]), tf.random.normal([3, 2])
    got = _per_example(model, x, y, "eager")
    assert got["m/scale/w"] is None
    assert "no exact per-example rule for Scale" in got.unsupported["m/scale/w"]
    assert set(got.unsupported) == {"m/scale/w"}
    want = _reference(model, x, y)
    for path in ("m/d/kernel", "m/head/kernel", "m/scale"):
        np.testing.assert_allclose(got[path].numpy(), want[path], rtol=RTOL, err_msg=path)


def test_sparse_input_is_unsupported_with_reason():
    """A SparseTensor input (Keras 3 and tf_keras Dense take one): the rule cannot take it, so the layer's weights
    are reported, not computed; the next layer's are exact."""
    inp = keras.Input((5,), sparse=True)
    model = keras.Model(inp, layers.Dense(2, name="head")(layers.Dense(3, activation="tanh", name="d")(inp)), name="m")
    x = tf.sparse.from_dense(tf.constant([[1.0, 0, 0, 2, 0], [0, 0, 3, 0, 0], [0, 1, 0, 0, 1]]))
    y = tf.random.normal([3, 2])
    got = _per_example(model, x, y, "eager")
    assert set(got.unsupported) == {"m/d/kernel", "m/d/bias"}
    assert all("cannot take this call's input" in got.unsupported[p] for p in got.unsupported)
    want = _reference(model, tf.sparse.to_dense(x), y)
    for path in ("m/head/kernel", "m/head/bias", "m/d"):
        np.testing.assert_allclose(got[path].numpy(), want[path], rtol=RTOL, err_msg=path)


def test_subclass_that_overrides_call_is_unsupported():
    class Doubled(layers.Dense):
        def call(self, x):
            return super().call(x) * 2.0

    inp = keras.Input((4,))
    model = keras.Model(inp, Doubled(2, name="dbl")(inp), name="m")
    got = _per_example(model, tf.random.normal([3, 4]), tf.random.normal([3, 2]), "eager")
    assert got["m/dbl/kernel"] is None
    assert "Doubled" in got.unsupported["m/dbl/kernel"]


@pytest.mark.skipif(TF_KERAS, reason="tf_keras has no LoRA")
def test_lora_variables_are_unsupported_bias_is_not():
    inp = keras.Input((4,))
    dense = layers.Dense(3, name="d")
    model = keras.Model(inp, dense(inp), name="m")
    dense.enable_lora(2)
    x, y = tf.random.normal([3, 4]), tf.random.normal([3, 3])
    got = _per_example(model, x, y, "eager")
    lora = {p for p in got if "lora" in p}
    assert lora and lora == set(got.unsupported)
    want = _reference(model, x, y)
    np.testing.assert_allclose(got["m/d/bias"].numpy(), want["m/d/bias"], rtol=RTOL)


def test_quantized_layer_is_unsupported():
    inp = keras.Input((4,))
    dense = layers.Dense(3, name="d")
    model = keras.Model(inp, layers.Dense(2, name="head")(dense(inp)), name="m")
    if not hasattr(dense, "quantize"):
        pytest.skip("this Keras has no quantization")
    dense.quantize("int8")
    got = _per_example(model, tf.random.normal([3, 4]), tf.random.normal([3, 2]), "eager")
    flagged = {p for p in got.unsupported if p.startswith("m/d/")}
    assert flagged and all("quantized" in got.unsupported[p] for p in flagged)
    assert got["m/head/kernel"] is not None


def test_unsupported_einsum_form():
    inp = keras.Input((3, 4))
    h = layers.EinsumDense("abc,bcd->abd", output_shape=(3, 5), name="per_pos")(inp)  # a kernel per position
    model = keras.Model(inp, h, name="m")
    got = _per_example(model, tf.random.normal([2, 3, 4]), tf.random.normal([2, 3, 5]), "eager")
    assert got["m/per_pos/kernel"] is None
    assert "P C, C F -> P F" in got.unsupported["m/per_pos/kernel"]


def test_preactivation_is_trusted_only_when_the_activation_gives_the_output():
    from tb_layergrad.capturing.preactivation import PreactivationObserver

    observer = PreactivationObserver(tf.nn.relu)
    z = tf.constant([-1.0, 2.0])
    frame = observer.open()
    out = observer(z)
    assert observer.close(frame, out) is z  # one activation, and it is the output
    frame = observer.open()
    out = observer(z) * 2.0
    assert observer.close(frame, out) is None  # something after the activation
    frame = observer.open()
    observer(z)
    out = observer(z)
    assert observer.close(frame, out) is None  # applied twice: which input is the pre-activation?
    frame = observer.open()
    assert observer.close(frame, z) is None  # never applied
    np.testing.assert_array_equal(observer(z).numpy(), tf.nn.relu(z).numpy())  # outside a call: just the activation


# -- the norm arithmetic itself ---------------------------------------------------------------------


@pytest.mark.parametrize("tokens,p,q", [(1, 3, 4), (7, 3, 4), (7, 30, 40)])
def test_ghost_and_explicit_agree(tokens, p, q):
    a = tf.random.normal([3, tokens, p])
    d = tf.random.normal([3, tokens, q])
    explicit = tf.norm(tf.einsum("btp,btq->bpq", a, d), axis=[1, 2])
    gram = tf.reduce_sum(tf.matmul(a, a, transpose_b=True) * tf.matmul(d, d, transpose_b=True), axis=[1, 2])
    np.testing.assert_allclose(ghost_norm.norm([ghost_norm.Outer(a, d)]).numpy(), explicit.numpy(), rtol=RTOL)
    np.testing.assert_allclose(np.sqrt(gram.numpy()), explicit.numpy(), rtol=RTOL)


# (layer, input shape): both ways of the convolution rule (patch lengths <= and > PATCHES_BY_CONVOLUTION), every
# padding, strides, dilations, odd and even sizes, a non-square kernel.
CONVOLUTIONS = [
    (lambda c: layers.Conv2D(3, 3, padding="same"), (9, 9)),
    (lambda c: layers.Conv2D(3, 3, strides=2, padding="same"), (8, 9)),
    (lambda c: layers.Conv2D(3, (2, 3), strides=(3, 2), padding="same"), (10, 7)),
    (lambda c: layers.Conv2D(3, 3, dilation_rate=2, padding="same"), (8, 8)),
    (lambda c: layers.Conv2D(3, (3, 2), strides=2, padding="valid"), (9, 8)),
    (lambda c: layers.Conv2D(3, 2, dilation_rate=(2, 3), padding="valid"), (8, 9)),
    (lambda c: layers.Conv1D(3, 3, padding="causal", dilation_rate=2), (11,)),
    (lambda c: layers.Conv1D(3, 4, strides=3, padding="same"), (11,)),
    (lambda c: layers.Conv1D(3, 3, strides=2, padding="valid"), (10,)),
]


@pytest.mark.parametrize("case", range(len(CONVOLUTIONS)))
@pytest.mark.slow
def test_convolution_rule_equals_the_layers_own_gradient_per_example(case):
    """The kernel rule's norms against the gradient of Keras' own convolution, one example at a time:
    `tape.gradient(Σ conv(a_i) ⊙ δ_i, kernel)` is example i's kernel gradient for that δ. One input channel: the
    patches by convolution; twelve: by kernel offset, also with spatial sizes unknown while tracing."""
    make, spatial = CONVOLUTIONS[case]
    for channels in (1, 12):
        layer = make(channels)
        a = tf.random.normal([3, *spatial, channels])
        d = tf.random.normal(layer.compute_output_shape((3, *spatial, channels)))
        length = int(np.prod(layer.kernel_size)) * channels
        assert (length <= PATCHES_BY_CONVOLUTION) == (channels == 1)
        want = []
        for i in range(3):
            with tf.GradientTape() as tape:
                product = tf.reduce_sum(layer(a[i : i + 1]) * d[i : i + 1])
            want.append(float(tf.norm(tape.gradient(product, layer.kernel))))
        factors = per_example._conv(layer, a, d)
        np.testing.assert_allclose(ghost_norm.norm([factors["kernel"]]).numpy(), want, rtol=RTOL)
    unknown = [tf.TensorSpec([None] * (len(spatial) + 1) + [n]) for n in (channels, 3)]
    traced = tf.function(
        lambda a, d: ghost_norm.norm([per_example._conv(layer, a, d)["kernel"]]), input_signature=unknown
    )
    np.testing.assert_allclose(traced(a, d).numpy(), want, rtol=RTOL)
