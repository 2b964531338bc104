"""Small models of every kind the capture must handle, each with a by-hand forward.

Each builder returns (model, x, y, manual) where `manual(x, tape)` runs the
same computation layer by layer, `tape.watch`es every layer output it exposes
and returns (prediction, {expected path: output tensor}). That is the
independent ground truth the captured gradients are checked against.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from tb_layergrad.cli.demo_models import MinimalRNNCell, MyModel  # noqa: F401

SeedModel = MyModel  # the seed question's model, shared with the demo


def seed_data():
    x = np.array([[[3.0], [0.0], [1.0], [2.0], [3.0]]] * 2, np.float32)
    y = np.array([[0.0, 1.0, 2.0, 3.0]] * 2, np.float32)
    return tf.constant(x), tf.constant(y)


def seed_model():
    model = SeedModel(2)
    x, y = seed_data()
    model(x)

    def manual(x, tape):
        h = model.minimalrnn(x)
        tape.watch(h)
        out = model.out(h)
        return out, {"my_model/minimalrnn": h, "my_model/out": out}

    return model, x, y, manual


def sequential_mlp(depth=4, width=16, activation="tanh"):
    model = keras.Sequential(
        [keras.Input((8,))]
        + [layers.Dense(width, activation=activation, name=f"d{i}") for i in range(depth)]
        + [layers.Dense(3, name="head")],
        name="mlp",
    )
    x = tf.random.normal([6, 8])
    y = tf.random.normal([6, 3])

    def manual(x, tape):
        exposed = {}
        h = x
        for layer in model.layers:
            h = layer(h)
            tape.watch(h)
            exposed[f"mlp/{layer.name}"] = h
        return h, exposed

    return model, x, y, manual


def functional_branches():
    inp = keras.Input((6,), name="inp")
    trunk = layers.Dense(8, activation="relu", name="trunk")(inp)
    left = layers.Dense(5, activation="tanh", name="left")(trunk)
    right = layers.Dense(5, activation="sigmoid", name="right")(trunk)
    merged = layers.Add(name="merge")([left, right])
    out = layers.Dense(2, name="out")(layers.Concatenate(name="cat")([merged, trunk]))
    model = keras.Model(inp, out, name="branches")
    x = tf.random.normal([4, 6])
    y = tf.random.normal([4, 2])
    L = {layer.name: layer for layer in model.layers}

    def manual(x, tape):
        t = L["trunk"](x)
        tape.watch(t)
        a = L["left"](t)
        tape.watch(a)
        b = L["right"](t)
        tape.watch(b)
        m = L["merge"]([a, b])
        tape.watch(m)
        c = L["cat"]([m, t])
        tape.watch(c)
        o = L["out"](c)
        tape.watch(o)
        exposed = {
            "branches/trunk": t,
            "branches/left": a,
            "branches/right": b,
            "branches/merge": m,
            "branches/cat": c,
            "branches/out": o,
        }
        return o, exposed

    return model, x, y, manual


class Block(layers.Layer):
    """A custom layer holding layers; its inner 'dense' collides by name with the outer one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = layers.Dense(6, activation="tanh", name="dense")
        self.proj = layers.Dense(6, name="proj")

    def call(self, x):
        return self.proj(self.dense(x)) + x


class NestedModel(keras.Model):
    """Subclassed model > custom Block > Dense, plus an inner Sequential and a shared layer."""

    def __init__(self):
        super().__init__(name="nested")
        self.dense = layers.Dense(6, name="dense")
        self.block = Block(name="block")
        self.inner = keras.Sequential(
            [layers.Dense(6, activation="relu", name="dense"), layers.Dense(6, name="dense_b")], name="inner"
        )
        self.shared = layers.Dense(6, activation="tanh", name="shared")
        self.head = layers.Dense(2, name="head")

    def call(self, x):
        h = self.dense(x)
        h = self.block(h)
        h = self.inner(h)
        h = self.shared(h)
        h = self.shared(h)  # called twice in one pass
        return self.head(h)


def nested_model():
    model = NestedModel()
    x = tf.random.normal([5, 3])
    y = tf.random.normal([5, 2])
    model(x)

    def manual(x, tape):
        e = {}

        def w(key, t):
            tape.watch(t)
            e[key] = t
            return t

        h = w("nested/dense", model.dense(x))
        inner_dense = w("nested/block/dense", model.block.dense(h))
        proj = w("nested/block/proj", model.block.proj(inner_dense))
        h = w("nested/block", proj + h)
        a = w("nested/inner/dense", model.inner.layers[0](h))
        b = w("nested/inner/dense_b", model.inner.layers[1](a))
        e["nested/inner"] = b  # the Sequential's output is its last layer's output
        s1 = w("nested/shared", model.shared(b))
        s2 = w("nested/shared#2", model.shared(s1))
        o = w("nested/head", model.head(s2))
        return o, e

    return model, x, y, manual


class SplitLayer(layers.Layer):
    """A layer with several outputs (a tuple)."""

    def call(self, x):
        return tf.tanh(x), x * 2.0


class MultiOutputModel(keras.Model):
    def __init__(self):
        super().__init__(name="multi")
        self.pre = layers.Dense(4, name="pre")
        self.split = SplitLayer(name="split")
        self.head = layers.Dense(1, name="head")

    def call(self, x):
        a, b = self.split(self.pre(x))
        return self.head(a * b)


def multi_output_model():
    model = MultiOutputModel()
    x = tf.random.normal([3, 5])
    y = tf.random.normal([3, 1])
    model(x)

    def manual(x, tape):
        p = model.pre(x)
        tape.watch(p)
        a, b = model.split(p)
        tape.watch(a)
        tape.watch(b)
        o = model.head(a * b)
        tape.watch(o)
        return o, {"multi/pre": p, "multi/split[0]": a, "multi/split[1]": b, "multi/head": o}

    return model, x, y, manual


def weightless_front():
    """Layers before the first weight: only watching makes their outputs differentiable."""
    model = keras.Sequential(
        [
            keras.Input((4,)),
            layers.Rescaling(0.5, name="scale"),
            layers.Activation("tanh", name="act"),
            layers.Dense(2, name="dense"),
        ],
        name="front",
    )
    x = tf.random.normal([3, 4])
    y = tf.random.normal([3, 2])

    def manual(x, tape):
        e = {}
        h = x
        for layer in model.layers:
            h = layer(h)
            tape.watch(h)
            e[f"front/{layer.name}"] = h
        return h, e

    return model, x, y, manual


ALL = {
    "seed_subclassed_rnn": seed_model,
    "sequential": sequential_mlp,
    "functional_branches": functional_branches,
    "nested": nested_model,
    "multi_output": multi_output_model,
    "weightless_front": weightless_front,
}


def mse(y, pred):
    return tf.reduce_mean(tf.square(pred - y))
