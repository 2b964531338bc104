"""Captured gradients equal an independent tape.watch computation, in every mode."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad.capturing.layer_tree import LayerTree

MODES = ["eager", "function", "xla"]


def _compile(fn, mode):
    if mode == "eager":
        return fn
    return tf.function(fn, jit_compile=(mode == "xla"))


def _captured(model_zoo, model, x, y, mode, target_fn=None, name="loss", **kw):
    def step(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape, **kw) as cap:
                pred = model(x)
                target = model_zoo.mse(y, pred) if target_fn is None else target_fn(pred)
        return cap.gradients(tape, target, name=name)

    return _compile(step, mode)(x, y)


def _reference(model_zoo, manual, model, x, y, target_fn=None):
    with tf.GradientTape() as tape:
        pred, exposed = manual(x, tape)
        target = model_zoo.mse(y, pred) if target_fn is None else target_fn(pred)
    keys = list(exposed)
    var_grads, out_grads = tape.gradient(target, (model.trainable_variables, [exposed[k] for k in keys]))
    return dict(zip(keys, out_grads)), var_grads


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.slow
def test_output_gradients_match_independent_computation(zoo_kind, mode, model_zoo, tolerances):
    model, x, y, manual = model_zoo.ALL[zoo_kind]()
    grads = _captured(model_zoo, model, x, y, mode)
    expected, expected_vars = _reference(model_zoo, manual, model, x, y)
    length = tolerances.reduction_path_length(model, x, target_terms=int(np.prod(y.shape)))  # mse: a mean over y
    assert set(grads.outputs) == set(expected), (sorted(grads.outputs), sorted(expected))
    for path, want in expected.items():
        got = grads[path]
        assert got is not None, path
        tolerances.assert_same_float32_math(got.numpy(), want.numpy(), length, err_msg=path)
    for got, want in zip(grads.variable_gradients, expected_vars):
        tolerances.assert_same_float32_math(got.numpy(), want.numpy(), length)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["seed_subclassed_rnn", "sequential"])
@pytest.mark.slow
def test_non_loss_target_one_output_unit(kind, mode, model_zoo, tolerances):
    model, x, y, manual = model_zoo.ALL[kind]()

    def unit(pred):
        return tf.reduce_sum(pred[:, 1])

    grads = _captured(model_zoo, model, x, y, mode, target_fn=unit, name="unit_1", weights=True)
    expected, expected_vars = _reference(model_zoo, manual, model, x, y, target_fn=unit)
    length = tolerances.reduction_path_length(model, x, target_terms=int(x.shape[0]))  # unit 1 summed over the batch
    assert grads.target == "unit_1"
    for path, want in expected.items():
        tolerances.assert_same_float32_math(grads[path].numpy(), want.numpy(), length, err_msg=path)
    # Weight gradients of the output (the second seed question) under their paths.
    weights = grads.weights
    assert len(weights) == len(model.trainable_variables)
    by_id = dict(zip(map(id, model.trainable_variables), expected_vars))
    owners = LayerTree(model).variable_paths()
    for var in model.trainable_variables:
        path = owners[id(var)][0]
        tolerances.assert_same_float32_math(weights[path].numpy(), by_id[id(var)].numpy(), length, err_msg=path)


def test_seed_model_paths_and_weight_paths(model_zoo):
    model, x, y, _ = model_zoo.seed_model()
    grads = _captured(model_zoo, model, x, y, "eager", weights=True)
    assert list(grads.outputs) == ["my_model/minimalrnn", "my_model/out"]
    cell = model.minimalrnn.cell.name  # Keras numbers auto-named layers per process
    assert set(grads.weights) == {
        f"my_model/minimalrnn/{cell}/kernel",
        f"my_model/minimalrnn/{cell}/recurrent_kernel",
        "my_model/out/kernel",
        "my_model/out/bias",
    }


def test_get_layer_output_fails_but_capture_works(model_zoo):
    """The seed question's failure, and that capture does not need it."""
    model, x, y, _ = model_zoo.seed_model()
    with pytest.raises((AttributeError, ValueError)):
        _ = model.get_layer("minimalrnn").output
    grads = _captured(model_zoo, model, x, y, "eager")
    assert grads["my_model/minimalrnn"].shape == (2, 2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.slow
def test_capture_is_bitwise_neutral(mode, model_zoo, tolerances):
    """Loss and weight gradients identical, bit for bit, to a run without capture (eager, tf.function);
    under jit_compile=True within the bound of the same float32 math in another order (README)."""
    import keras
    from keras import layers

    inp = keras.Input((8, 8, 3))
    h = layers.Conv2D(4, 3, padding="same", name="conv")(inp)
    h = layers.BatchNormalization(name="bn")(h, training=True)
    h2 = layers.Conv2D(4, 3, padding="same", activation="relu", name="conv2")(h)
    h = layers.Add(name="residual")([h, h2])
    out = layers.Dense(3, name="head")(layers.GlobalAveragePooling2D(name="pool")(h))
    model = keras.Model(inp, out, name="resbn")
    x = tf.random.normal([4, 8, 8, 3])
    y = tf.random.normal([4, 3])

    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = model_zoo.mse(y, model(x, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    def captured(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = model_zoo.mse(y, model(x, training=True))
        g = cap.gradients(tape, loss)
        return loss, g.variable_gradients, g

    def watched_only(x, y):  # outputs watched, their gradients not asked for
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape):
                loss = model_zoo.mse(y, model(x, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    loss0, grads0 = _compile(plain, mode)(x, y)
    loss1, grads1, gmap = _compile(captured, mode)(x, y)
    assert gmap["resbn/bn"] is not None
    if mode != "xla":
        assert loss0.numpy().tobytes() == loss1.numpy().tobytes()
        for a, b in zip(grads0, grads1):
            assert a.numpy().tobytes() == b.numpy().tobytes()
        return
    # XLA compiles the whole step: the output gradients become outputs of the program, XLA fuses
    # around them differently (docs/DESIGN.md), and the CPU's vector width decides whether a
    # reduction's order changes with it (bitwise on AVX2, not on an AVX-512 EPYC). The same float32
    # math in another order: conv/dense contractions, BatchNorm's batch moments and their backprop
    # sums over the 4 x 8 x 8 positions, the pooling's 64-term mean.
    length = tolerances.reduction_path_length(model, x, target_terms=int(np.prod(y.shape)), other=2 * 4 * 8 * 8 + 8 * 8)
    tolerances.assert_same_float32_math(loss1.numpy(), loss0.numpy(), length)
    # conv's bias gradient is 0 in exact arithmetic (batch normalization follows: it removes the
    # mean over the 4 x 8 x 8 positions that the bias shifts), so it holds only the rounding of that
    # sum; its bound is relative to the sum |terms|: the L1 norm of d loss / d conv's output, per channel.
    conv_bias = model.get_layer("conv").bias
    bias_terms = np.sum(np.abs(gmap["resbn/conv"].numpy()), axis=(0, 1, 2))
    for v, a, b in zip(model.trainable_variables, grads1, grads0):
        magnitude = bias_terms if v is conv_bias else None
        tolerances.assert_same_float32_math(a.numpy(), b.numpy(), length, magnitude=magnitude)
    # Watching alone adds no op: XLA compiles the very same program, so the same bits on any CPU.
    loss2, grads2 = _compile(watched_only, mode)(x, y)
    assert loss0.numpy().tobytes() == loss2.numpy().tobytes()
    for a, b in zip(grads0, grads2):
        assert a.numpy().tobytes() == b.numpy().tobytes()


def test_leaving_the_context_restores_the_model(model_zoo):
    model, x, y, _ = model_zoo.nested_model()
    before = model(x).numpy()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            model(x)
            assert all("call" in n.layer.__dict__ for n in cap.nodes)
    assert not any("call" in n.layer.__dict__ for n in cap.tree.nodes)
    np.testing.assert_array_equal(model(x).numpy(), before)


def test_restores_even_when_the_forward_pass_raises(model_zoo):
    model, x, y, _ = model_zoo.sequential_mlp()
    with pytest.raises(ValueError):
        with tb_layergrad.capture(model):
            model(tf.zeros([2, 99]))  # wrong input width
    assert not any("call" in layer.__dict__ for layer in model.layers)


def test_layer_selection_by_name_glob_and_object(model_zoo):
    model, x, y, _ = model_zoo.nested_model()
    paths = lambda spec: [n.path for n in tb_layergrad.capture(model, layers=spec).nodes]  # noqa: E731
    assert paths("head") == ["nested/head"]
    assert paths("nested/inner/*") == ["nested/inner/dense", "nested/inner/dense_b"]
    assert paths("dense") == ["nested/dense", "nested/block/dense", "nested/inner/dense"]
    assert paths([model.shared, "proj"]) == ["nested/block/proj", "nested/shared"]


def test_only_chosen_layers_are_reported(model_zoo):
    model, x, y, _ = model_zoo.sequential_mlp()
    grads = _captured(model_zoo, model, x, y, "eager", layers=["d1", "head"], weights=True)
    assert list(grads.outputs) == ["mlp/d1", "mlp/head"]
    assert sorted(grads.weights) == ["mlp/d1/bias", "mlp/d1/kernel", "mlp/head/bias", "mlp/head/kernel"]


def test_unused_output_reports_no_gradient(model_zoo):
    model, x, y, _ = model_zoo.multi_output_model()

    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            model(x)
            a, _ = cap.outputs["multi/split[0]"], cap.outputs["multi/split[1]"]
            t = tf.reduce_sum(a)
    grads = cap.gradients(tape, t, name="first_only")
    assert grads["multi/split[1]"] is None
    assert grads["multi/head"] is None
    np.testing.assert_array_equal(grads["multi/split[0]"].numpy(), np.ones_like(a.numpy()))  # d sum / d a: exact ones


def test_integer_outputs_are_reported_without_gradient():
    import keras
    from keras import layers

    class ArgMax(layers.Layer):
        def call(self, x):
            return tf.argmax(x, axis=-1), x

    class M(keras.Model):
        def __init__(self):
            super().__init__(name="m")
            self.d = layers.Dense(3, name="d")
            self.arg = ArgMax(name="arg")

        def call(self, x):
            idx, h = self.arg(self.d(x))
            return h * tf.cast(tf.expand_dims(idx, -1), h.dtype)

    model = M()
    x = tf.random.normal([2, 4])
    model(x)
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = tf.reduce_sum(model(x))
    grads = cap.gradients(tape, loss)
    assert grads["m/arg[0]"] is None
    assert grads.entry("m/arg[0]").dtype == "int64"
    assert grads["m/arg[1]"] is not None


# -- bad input -------------------------------------------------------------------------


def test_unknown_layer_lists_close_matches_first(model_zoo):
    model, *_ = model_zoo.seed_model()
    with pytest.raises(ValueError) as e:
        tb_layergrad.capture(model, layers=["minimal_rnn"])
    msg = str(e.value)
    assert "no layer matches 'minimal_rnn'" in msg
    assert msg.index("my_model/minimalrnn") < msg.index("my_model/out")


def test_rnn_cell_cannot_be_chosen_directly(model_zoo):
    model, *_ = model_zoo.seed_model()
    with pytest.raises(ValueError, match="inside an RNN's loop"):
        tb_layergrad.capture(model, layers=[model.minimalrnn.cell])


def test_non_scalar_target_is_refused(model_zoo):
    model, x, y, _ = model_zoo.seed_model()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            pred = model(x)
    with pytest.raises(ValueError, match="target must be a scalar"):
        cap.gradients(tape, pred)


def test_gradients_twice_on_one_tape(model_zoo):
    model, x, y, _ = model_zoo.seed_model()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = model_zoo.mse(y, model(x))
    cap.gradients(tape, loss)
    with pytest.raises(RuntimeError, match="already called with this non-persistent tape"):
        cap.gradients(tape, loss)


class _OneShotView:
    """A non-persistent stand-in for a tape, as fit()'s per-target wrappers are (one gradient() each)."""

    _persistent = False

    def __init__(self, tape):
        self._tape = tape

    def gradient(self, target, sources, **kwargs):
        return self._tape.gradient(target, sources, **kwargs)


def test_a_fresh_wrapper_is_not_taken_for_a_used_one_whose_id_it_reuses(model_zoo):
    """Used tapes were remembered by id(): a freed wrapper's id, reused by the next one (CPython
    usually hands the same address to the next object of that size), read as "already called"."""
    model, x, y, _ = model_zoo.seed_model()
    with tf.GradientTape(persistent=True) as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = model_zoo.mse(y, model(x))
    first = _OneShotView(tape)
    want = cap.gradients(first, loss)
    with pytest.raises(RuntimeError, match="already called with this non-persistent tape"):
        cap.gradients(first, loss)
    del first
    for _ in range(3):
        got = cap.gradients(_OneShotView(tape), loss)
        for path in want:
            np.testing.assert_array_equal(got[path].numpy(), want[path].numpy())


def test_persistent_tape_allows_several_targets(model_zoo, tolerances):
    model, x, y, manual = model_zoo.seed_model()
    with tf.GradientTape(persistent=True) as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            pred = model(x)
            loss = model_zoo.mse(y, pred)
            unit = tf.reduce_sum(pred[:, 3])
    g_loss = cap.gradients(tape, loss)
    g_unit = cap.gradients(tape, unit, name="unit_3")
    expected, _ = _reference(model_zoo, manual, model, x, y, target_fn=lambda p: tf.reduce_sum(p[:, 3]))
    length = tolerances.reduction_path_length(model, x, target_terms=int(x.shape[0]))
    tolerances.assert_same_float32_math(
        g_unit["my_model/minimalrnn"].numpy(), expected["my_model/minimalrnn"].numpy(), length
    )
    with pytest.raises(AssertionError):  # the loss's gradient is another one, not a rounding of it
        tolerances.assert_same_float32_math(
            g_loss["my_model/minimalrnn"].numpy(), g_unit["my_model/minimalrnn"].numpy(), length
        )


def test_model_not_called_inside_the_context(model_zoo):
    model, x, y, _ = model_zoo.seed_model()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            pass
        loss = model_zoo.mse(y, model(x))
    with pytest.raises(RuntimeError, match="was not called inside"):
        cap.gradients(tape, loss)


def test_never_built_model_gives_clear_error(model_zoo):
    model = model_zoo.SeedModel(2)  # never called: no weights yet
    x, y = model_zoo.seed_data()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = model_zoo.mse(y, model(x))  # first call builds it inside the context
    grads = cap.gradients(tape, loss)
    assert grads["my_model/minimalrnn"] is not None
    with pytest.raises(TypeError, match="expected a Keras model"):
        tb_layergrad.capture(object())


def test_without_tape_argument_weight_fed_outputs_still_match(model_zoo, tolerances):
    model, x, y, manual = model_zoo.nested_model()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model) as cap:
            loss = model_zoo.mse(y, model(x))
    grads = cap.gradients(tape, loss)
    expected, _ = _reference(model_zoo, manual, model, x, y)
    length = tolerances.reduction_path_length(model, x, target_terms=int(np.prod(y.shape)))
    for path, want in expected.items():
        tolerances.assert_same_float32_math(grads[path].numpy(), want.numpy(), length, err_msg=path)


def test_without_tape_argument_unrecorded_outputs_warn(model_zoo):
    model, x, y, _ = model_zoo.weightless_front()
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model) as cap:
            loss = model_zoo.mse(y, model(x))
    with pytest.warns(UserWarning, match="front/scale.*capture\\(model, tape=tape\\)"):
        grads = cap.gradients(tape, loss)
    assert grads["front/scale"] is None
    assert grads["front/dense"] is not None
