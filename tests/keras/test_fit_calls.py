"""The rule of a custom train_step's targets (docs/FIT.md, "Custom `train_step`: what is logged"): every
`gradient()` call that differentiates a trainable weight of the model is one target, whatever the tape and
however its result is applied; named after what it differentiates.

The published steps (keras.io's CycleGAN, SimCLR, image captioning) are in the gallery (tests/gallery_calls.py,
run by tests/keras/test_fit_gallery.py: values against independent tapes, Keras' TensorBoard steps, training
unchanged); here: the name rule on a model of every shape of owner, one persistent tape whose calls are applied
four ways, nested tapes, what a step whose weights its first run builds is told, the name of a call made before
that step builds more weights, and `targets=` on a persistent tape asked several times.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad.capturing.layer_tree import LayerTree
from tb_layergrad.keras.step_observation import target_name

keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise: the tests run on both
layers = keras.layers

pytestmark = pytest.mark.slow  # trains: left to CI by the quick loop

tf = pytest.importorskip("tensorflow")


class Block(layers.Layer):
    """A composite layer: layers of its own."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.b0, self.b1 = layers.Dense(3, name="b0"), layers.Dense(3, name="b1")

    def call(self, x):
        return self.b1(self.b0(x))


class Owners(keras.Model):
    """Weights owned at every depth: a sub-model of one layer, a composite layer in a sub-model, a top-level
    layer, and the model's own weight."""

    def __init__(self):
        super().__init__(name="owners")
        self.encoder = keras.Sequential([layers.Dense(3, name="e0")], name="encoder")
        self.tower = keras.Sequential([Block(name="block"), layers.Dense(3, name="t1")], name="tower")
        self.head = layers.Dense(2, name="head")
        self.scale = self.add_weight(name="scale", shape=(), initializer="ones")

    def call(self, x):
        return self.head(self.tower(self.encoder(x))) * self.scale


def test_target_name_is_the_group_that_owns_the_asked_weights():
    model = Owners()
    model(tf.zeros((1, 4)))
    tree = LayerTree(model)
    owners, trainable = tree.variable_paths(), {id(v) for v in model.trainable_variables}

    def name(*groups):
        return target_name(tree, owners, frozenset(id(v) for g in groups for v in g), trainable)

    block = model.tower.layers[0]
    assert name(model.trainable_variables) == "loss"
    assert name(model.encoder.trainable_variables) == "encoder"  # its one layer is "e0": never the name
    assert name(block.b0.trainable_variables) == "block"  # a leaf's weights: the composite layer it is in
    assert name(block.trainable_variables) == "block"
    assert name(model.tower.layers[1].trainable_variables) == "tower"
    assert name(block.b1.trainable_variables, model.tower.layers[1].trainable_variables) == "tower"
    assert name(model.head.trainable_variables, model.encoder.trainable_variables) == "encoder+head"  # model order
    assert name(model.head.trainable_variables) == "head"  # a top-level layer is a group of the model
    assert name([model.scale]) == "owners"  # the model's own weight
    assert name([model.scale], model.head.trainable_variables) == "owners+head"


# -- one persistent tape, its calls applied four ways --------------------------------------------------------


def _stack(name: str) -> keras.Sequential:
    return keras.Sequential(
        [keras.Input((4,)), layers.Dense(5, activation="tanh", name=f"{name}0"), layers.Dense(4, name=f"{name}1")],
        name=name,
    )


class FourWays(keras.Model):
    """One persistent tape asked four times: `a`'s loss applied by the optimizer, `b`'s by a manual assign_sub,
    `a`'s loss again accumulated (applied by no one in this step), and a penalty w.r.t. the inputs."""

    def __init__(self):
        super().__init__(name="four")
        self.a, self.b = _stack("a"), _stack("b")
        self.sums = [self.add_weight(name=f"sum{i}", shape=v.shape, trainable=False) for i, v in enumerate(_w(self.a))]

    def losses(self, x):
        h = self.a(x)
        return tf.reduce_mean(tf.square(h - 1.0)), tf.reduce_mean(tf.square(self.b(h) - x))

    def train_step(self, x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            loss_a, loss_b = self.losses(x)
        grads_a = tape.gradient(loss_a, _w(self.a))
        self.optimizer.apply_gradients(zip(grads_a, _w(self.a)))
        for v, g in zip(_w(self.b), tape.gradient(loss_b, _w(self.b))):
            v.assign_sub(0.05 * g)
        for s, g in zip(self.sums, tape.gradient(loss_a, _w(self.a))):
            s.assign_add(g)
        penalty = tf.reduce_mean(tf.square(tape.gradient(loss_b, x)))
        del tape
        return {"loss_a": loss_a, "loss_b": loss_b, "penalty": penalty}


def _w(model):
    return model.trainable_variables


def _four_ways(fit_helpers, gallery_steps, tmp_path, mode, logger_kwargs):
    keras.utils.set_random_seed(5)
    model = FourWays()
    model.compile(optimizer=keras.optimizers.SGD(0.05), **fit_helpers.compile_kwargs(mode))
    x = np.random.default_rng(5).normal(size=(2 * gallery_steps.BATCH, 4)).astype(np.float32)
    snaps = gallery_steps.Snapshots()
    callbacks = [snaps]
    if logger_kwargs is not None:
        callbacks.append(
            tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), max_elements=10_000, **logger_kwargs)
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, batch_size=gallery_steps.BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return model, snaps.before, x, [str(w.message) for w in caught if "GradientLogger" in str(w.message)]


@pytest.mark.parametrize("mode", ["graph", "eager", "xla"])
def test_each_call_of_a_persistent_tape_whatever_applies_it(tmp_path, mode, fit_helpers, gallery_steps):
    plain, _, _, _ = _four_ways(fit_helpers, gallery_steps, tmp_path / "plain", mode, None)
    model, before, x, messages = _four_ways(
        fit_helpers, gallery_steps, tmp_path, mode, {"weights": True, "targets": {"penalty": "inputs"}}
    )
    if mode != "xla":  # under XLA: the same math (docs/FIT.md), checked on the generated steps
        for a, b in zip(plain.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)
    assert messages == []
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"a", "b", "a#2", "penalty"}
    for target in ("a", "b", "a#2", "penalty"):
        assert fit_helpers.layergrad_steps(series, target) == [1, 2]
    weights = {info.target: {info.layer.split("/")[1]} for info, _ in series.values() if info.source == "weight"}
    assert weights == {"a": {"a"}, "b": {"b"}, "a#2": {"a"}}
    # each call against the test's own tape on the weights before the batch (every call sees the forward pass
    # the tape recorded, before any update)
    for step in (1, 2):
        saved = model.get_weights()
        model.set_weights(before[step])
        xb = tf.constant(x[(step - 1) * gallery_steps.BATCH : step * gallery_steps.BATCH])
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(xb)
            h0 = model.a.layers[0](xb)
            h = model.a.layers[1](h0)
            g0 = model.b.layers[0](h)
            g = model.b.layers[1](g0)
            for t in (h0, h, g0, g):
                tape.watch(t)
            loss_a = tf.reduce_mean(tf.square(h - 1.0))
            loss_b = tf.reduce_mean(tf.square(g - xb))
            penalty_target = tape.gradient(loss_b, xb)
        outputs = {"four/a/a0": h0, "four/a/a1": h, "four/a": h, "four/b/b0": g0, "four/b/b1": g, "four/b": g}
        for target, loss in (("a", loss_a), ("a#2", loss_a), ("b", loss_b)):
            grads = tape.gradient(loss, outputs)
            for path, want in grads.items():
                st = fit_helpers.one(series, f"{target}/output/{path}/stats", step)
                assert fit_helpers.stat(st, "no_gradient") == (want is None), (target, path)  # "a"'s loss ignores b
                if want is not None:
                    got = fit_helpers.one(series, f"{target}/output/{path}/tensor", step)
                    fit_helpers.assert_close(
                        got, want.numpy(), f"{target} {path} at step {step}", 4 * (gallery_steps.BATCH * 4 + 60)
                    )
            (layer,) = {i.layer for i, _ in series.values() if i.target == target and i.source == "target"}
            fit_helpers.assert_close(
                fit_helpers.stat(fit_helpers.one(series, f"{target}/target/{layer}/stats", step), "mean"),
                float(loss),
                "loss",
                600,
            )
        del tape, penalty_target
        model.set_weights(saved)


# -- nested tapes ---------------------------------------------------------------------------------------------


class MetaStep(keras.Model):
    """A MAML-style step: an inner tape's gradient adapts the weights, the outer tape differentiates the loss of
    the adapted weights through it. Two calls, both on all of the model's weights: "loss", "loss#2"."""

    def __init__(self):
        super().__init__(name="meta")
        self.net = _stack("net")

    def call(self, x):
        return self.net(x)

    def train_step(self, x):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner_loss = tf.reduce_mean(tf.square(self.net(x) - x))
            grads = inner.gradient(inner_loss, self.trainable_variables)
            k0, b0, k1, b1 = (w - 0.1 * g for w, g in zip(self.trainable_variables, grads))
            adapted = tf.matmul(tf.tanh(tf.matmul(x, k0) + b0), k1) + b1
            outer_loss = tf.reduce_mean(tf.square(adapted - x))
        meta = outer.gradient(outer_loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(meta, self.trainable_variables))
        return {"inner": inner_loss, "outer": outer_loss}


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_nested_tapes_each_call_a_target(tmp_path, mode, fit_helpers, gallery_steps):
    def fit(logged):
        keras.utils.set_random_seed(6)
        model = MetaStep()
        model.compile(optimizer=keras.optimizers.SGD(0.05), **fit_helpers.compile_kwargs(mode))
        cbs = (
            [tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), weights=True, max_elements=10_000)]
            if logged
            else []
        )
        x = np.random.default_rng(6).normal(size=(2 * gallery_steps.BATCH, 4)).astype(np.float32)
        model.fit(x, batch_size=gallery_steps.BATCH, epochs=1, shuffle=False, verbose=0, callbacks=cbs)
        return model, x

    plain, _ = fit(False)
    model, x = fit(True)
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"loss", "loss#2"}
    # step 1, on the initial weights: the outer call's weight gradients are the meta-gradient
    keras.utils.set_random_seed(6)
    fresh = MetaStep()
    fresh(x[:1])
    xb = tf.constant(x[: gallery_steps.BATCH])
    variables = fresh.trainable_variables
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner_loss = tf.reduce_mean(tf.square(fresh.net(xb) - xb))
        grads = inner.gradient(inner_loss, variables)
        k0, b0, k1, b1 = (w - 0.1 * g for w, g in zip(variables, grads))
        outer_loss = tf.reduce_mean(tf.square(tf.matmul(tf.tanh(tf.matmul(xb, k0) + b0), k1) + b1 - xb))
    meta = outer.gradient(outer_loss, variables)
    paths = [f"meta/net/{layer.name}/{w}" for layer in fresh.net.layers for w in ("kernel", "bias")]
    for target, want in (("loss", grads), ("loss#2", meta)):
        for path, g in zip(paths, want):
            got = fit_helpers.one(series, f"{target}/weight/{path}/tensor", 1)
            fit_helpers.assert_close(
                got, np.reshape(g.numpy(), got.shape), f"{target} {path}", 4 * (gallery_steps.BATCH * 4 + 60)
            )


# -- what a step that builds its weights is told ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_step_that_builds_its_weights_is_logged_from_step_1_without_a_warning(
    tmp_path, mode, fit_helpers, gallery_calls, gallery_steps
):
    """keras.io's image captioning: its encoder and decoder create their weights in the first step, under a tape
    per caption; every step is logged, with their weights' real names, and nothing says otherwise."""
    model = gallery_calls.CAPTION_CASE.build()
    model.compile(optimizer=keras.optimizers.SGD(gallery_calls.CAPTION_LR), **fit_helpers.compile_kwargs(mode))
    arrays = tuple(a[: 2 * gallery_steps.BATCH] for a in gallery_calls.CAPTION_CASE.data())
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), weights=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(**gallery_steps.dataset(arrays), epochs=1, verbose=0, callbacks=[logger])
    assert [str(w.message) for w in caught if "GradientLogger" in str(w.message)] == []
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"loss", "loss#2"}
    for target in ("loss", "loss#2"):
        assert fit_helpers.layergrad_steps(series, target) == [1, 2]
    weights = {info.layer for info, _ in series.values() if info.source == "weight" and info.target == "loss"}
    assert weights == {
        "captioner/encoder/layernorm_1/gamma",
        "captioner/encoder/layernorm_1/beta",
        "captioner/encoder/dense_1/kernel",
        "captioner/encoder/dense_1/bias",
        "captioner/decoder/embedding/embeddings",
        "captioner/decoder/out/kernel",
        "captioner/decoder/out/bias",
    }
    for tag, (info, by_step) in series.items():
        if info.kind == "stats" and info.source != "target":
            assert all(fit_helpers.stat(v[0], "no_gradient") == 0 for v in by_step.values()), tag


class _Made(layers.Layer):
    """A layer that constructs its own layer in `build` (run inside the first step's forward pass)."""

    def build(self, input_shape):
        self.inner = layers.Dense(5, activation="tanh", name="inner")
        self.inner.build(input_shape)

    def call(self, x):
        return self.inner(x)


class _MadeInStep(keras.Model):
    """One layer constructed in another's `build`, fit_helpers.one in the model's `call`: neither exists before step 1."""

    def __init__(self):
        super().__init__(name="made")
        self.block = _Made(name="block")
        self.head = None

    def call(self, x):
        if self.head is None:
            self.head = layers.Dense(3, activation="softmax", name="head")
        return self.head(self.block(x))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_layer_constructed_in_the_step_is_logged_under_its_path_from_step_1(
    tmp_path, mode, fit_helpers, gallery_steps
):
    """Eagerly the step runs once as Python: the layers it constructs are called before any hook of their own;
    their outputs and weights are still logged at step 1, under their own paths, with step 1's gradients."""
    x = np.random.default_rng(0).normal(size=(3 * gallery_steps.BATCH, 4)).astype("float32")
    y = (np.arange(3 * gallery_steps.BATCH) % 3).astype("int32")

    def fitted(callbacks):
        keras.utils.set_random_seed(5)
        model = _MadeInStep()
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss="sparse_categorical_crossentropy",
            **fit_helpers.compile_kwargs(mode),
        )
        model.fit(x, y, batch_size=gallery_steps.BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        return model

    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), update_freq=1, weights=True, max_elements=fit_helpers.MAX
    )
    fitted([logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    paths = {"made/block", "made/block/inner", "made/head"}
    weights = {f"{p}/{w}" for p in ("made/block/inner", "made/head") for w in ("kernel", "bias")}
    for step in (1, 2, 3):
        logged = {info.layer for info, by_step in series.values() if step in by_step and info.target == "loss"}
        assert logged == paths | weights | {"loss"}, step
    # Step 1's gradients, from a tape of the test's own on the same initial weights.
    keras.utils.set_random_seed(5)
    fresh = _MadeInStep()
    fresh(x[:1])
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy()(
            y[: gallery_steps.BATCH], fresh(x[: gallery_steps.BATCH], training=True)
        )
    grads = tape.gradient(loss, fresh.trainable_variables)
    assert len(grads) == 4
    tensors = {
        info.layer: tag for tag, (info, _) in series.items() if info.source == "weight" and info.kind == "tensor"
    }
    for v, g in zip(fresh.trainable_variables, grads):
        owner = "made/head" if v.shape[-1] == 3 else "made/block/inner"
        path = f"{owner}/{'kernel' if len(v.shape) == 2 else 'bias'}"
        logged = fit_helpers.one(series, tensors[path], 1).reshape(g.shape)
        fit_helpers.assert_close(
            logged,
            g.numpy(),
            path,
            length=fit_helpers.path_length(fresh, x[: gallery_steps.BATCH], target_terms=gallery_steps.BATCH),
        )


class CondStep(keras.Model):
    """`b`'s call made inside a tf.cond (every other step, as an accumulation step might): not logged, warned."""

    def __init__(self):
        super().__init__(name="cond")
        self.a, self.b = _stack("a"), _stack("b")

    def train_step(self, x):
        with tf.GradientTape(persistent=True) as tape:
            h = self.a(x)
            loss_a, loss_b = tf.reduce_mean(tf.square(h)), tf.reduce_mean(tf.square(self.b(h) - x))
        self.optimizer.apply_gradients(zip(tape.gradient(loss_a, _w(self.a)), _w(self.a)))

        def update_b():
            for v, g in zip(_w(self.b), tape.gradient(loss_b, _w(self.b))):
                v.assign_sub(0.05 * g)
            return tf.constant(True)

        tf.cond(self.optimizer.iterations % 2 == 0, update_b, lambda: tf.constant(False))
        return {"loss_a": loss_a}


def test_a_call_inside_tf_cond_is_warned_about_and_the_others_logged(tmp_path, fit_helpers, gallery_steps):
    keras.utils.set_random_seed(7)
    model = CondStep()
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    x = np.random.default_rng(7).normal(size=(2 * gallery_steps.BATCH, 4)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            x,
            batch_size=gallery_steps.BATCH,
            verbose=0,
            callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))],
        )
    messages = {str(w.message) for w in caught if "GradientLogger" in str(w.message)}
    assert len(messages) == 1 and "made 1 gradient() call(s) of trainable weights inside a tf.cond" in messages.pop()
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"a"}
    assert fit_helpers.layergrad_steps(series, "a") == [1, 2]


class ListStep(keras.Model):
    """A call on a list of losses (tf.GradientTape sums them): one target, whose value is their sum."""

    def __init__(self):
        super().__init__(name="listed")
        self.net = _stack("net")

    def call(self, x):
        return self.net(x)

    def train_step(self, x):
        with tf.GradientTape() as tape:
            y = self.net(x)
            losses = [tf.reduce_mean(tf.square(y)), tf.reduce_mean(tf.abs(y - x))]
        grads = tape.gradient(losses, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"sum": losses[0] + losses[1]}


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_list_of_losses_is_one_target_valued_at_their_sum(tmp_path, mode, fit_helpers, gallery_steps):
    keras.utils.set_random_seed(8)
    model = ListStep()
    model.compile(optimizer=keras.optimizers.SGD(0.05), **fit_helpers.compile_kwargs(mode))
    x = np.random.default_rng(8).normal(size=(gallery_steps.BATCH, 4)).astype(np.float32)
    model(x[:1])
    y = model.net(x)
    want = float(tf.reduce_mean(tf.square(y)) + tf.reduce_mean(tf.abs(y - x)))
    model.fit(
        x,
        batch_size=gallery_steps.BATCH,
        verbose=0,
        callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))],
    )
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"loss"}
    (layer,) = {i.layer for i, _ in series.values() if i.source == "target"}
    fit_helpers.assert_close(
        fit_helpers.stat(fit_helpers.one(series, f"loss/target/{layer}/stats", 1), "mean"),
        want,
        "sum of the losses",
        4 * gallery_steps.BATCH * 4,
    )


class LateProbe(keras.Model):
    """keras.io's SimCLR, tiny: an encoder `Sequential` without `Input`, a contrastive tape that asks for the encoder's
    and the projection head's weights, then a linear probe, built by the second tape of the first step."""

    def __init__(self):
        super().__init__(name="late")
        self.encoder = keras.Sequential([layers.Dense(5, activation="relu", name="e0")], name="encoder")
        self.projection_head = keras.Sequential([layers.Dense(4, name="p0")], name="projection_head")
        self.linear_probe = keras.Sequential([layers.Dense(3, name="l0")], name="linear_probe")
        self.c_opt, self.p_opt = keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05)

    def train_step(self, x):
        with tf.GradientTape() as tape:
            z = self.projection_head(self.encoder(x))
            c_loss = tf.reduce_mean(tf.square(z))
        w = self.encoder.trainable_weights + self.projection_head.trainable_weights
        self.c_opt.apply_gradients(zip(tape.gradient(c_loss, w), w))
        with tf.GradientTape() as tape:
            p_loss = tf.reduce_mean(tf.square(self.linear_probe(self.encoder(x)) - 1.0))
        w = self.linear_probe.trainable_weights
        self.p_opt.apply_gradients(zip(tape.gradient(p_loss, w), w))
        return {"c_loss": c_loss, "p_loss": p_loss}


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_call_named_after_what_it_asks_when_later_weights_are_built_after_it(tmp_path, mode, fit_helpers):
    """At the contrastive call of the first step the probe is not built yet: its weights are all the model has so
    far, not all of the model's. Its name is the one every later step gives it, in eager and graph mode."""
    keras.utils.set_random_seed(9)
    model = LateProbe()
    model.compile(**fit_helpers.compile_kwargs(mode))
    x = np.random.default_rng(9).normal(size=(8, 4)).astype(np.float32)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), weights=True)
    model.fit(x, batch_size=4, epochs=1, verbose=0, callbacks=[logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"encoder+projection_head", "linear_probe"}
    for target in ("encoder+projection_head", "linear_probe"):
        assert fit_helpers.layergrad_steps(series, target) == [1, 2]
    weights = {info.layer for info, _ in series.values() if info.source == "weight"}
    assert {"late/encoder/e0/kernel", "late/linear_probe/l0/kernel"} <= weights


class PersistentPrediction(keras.Model):
    """One persistent tape under which the model itself is called, asked twice: `targets=` are computed once for
    it (at its first call), and nothing is warned: the model was called under it."""

    def __init__(self):
        super().__init__(name="pp")
        self.a, self.b = _stack("a"), _stack("b")

    def call(self, x):
        return self.b(self.a(x))

    def train_step(self, x):
        with tf.GradientTape(persistent=True) as tape:
            loss_all = tf.reduce_mean(tf.square(self(x) - x))
            loss_a = tf.reduce_mean(tf.square(self.a(x)))
        for loss, variables in ((loss_all, self.trainable_variables), (loss_a, _w(self.a))):
            self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return {"loss": loss_all}


def test_targets_on_a_persistent_tape_asked_twice_are_not_warned_about(tmp_path, fit_helpers):
    keras.utils.set_random_seed(10)
    model = PersistentPrediction()
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    x = np.random.default_rng(10).normal(size=(8, 4)).astype(np.float32)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), targets={"unit_0": lambda y: y[:, 0]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, batch_size=4, epochs=1, verbose=0, callbacks=[logger])
    assert [str(w.message) for w in caught if "GradientLogger" in str(w.message)] == []
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert {info.target for info, _ in series.values()} == {"loss", "a", "unit_0"}
