"""Measure the cost of capture(per_example=True) against a plain training step (docs/PER_EXAMPLE.md, "Cost").

    python scripts/per_example_cost.py

Side by side in one process: each variant is a tf.function step that applies SGD; median of 15 interleaved
repeats of 10 steps. Prints one line per model with the ratios to the plain step.
"""

import statistics
import sys
import time

import keras
import tensorflow as tf
from keras import layers

import tb_layergrad

keras.utils.set_random_seed(0)


def mlp():
    m = keras.Sequential(
        [
            keras.Input((32,)),
            layers.Dense(128, activation="relu"),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ]
    )
    return m, tf.random.normal([64, 32]), tf.random.normal([64, 10])


def seq():
    inp = keras.Input((32, 64))
    h = layers.Dense(256, activation="gelu")(inp)
    h = layers.Dense(64)(h)
    h = layers.LayerNormalization()(h + inp)
    out = layers.Dense(10)(layers.GlobalAveragePooling1D()(h))
    return keras.Model(inp, out), tf.random.normal([32, 32, 64]), tf.random.normal([32, 10])


def cnn():
    inp = keras.Input((32, 32, 3))
    h = layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
    h = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(h)
    out = layers.Dense(10)(layers.GlobalAveragePooling2D()(h))
    return keras.Model(inp, out), tf.random.normal([32, 32, 32, 3]), tf.random.normal([32, 10])


def variants(model, opt):
    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        g = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(g, model.trainable_variables))
        return loss

    def make(**kw):
        def step(x, y):
            with tf.GradientTape() as tape:
                with tb_layergrad.capture(model, tape=tape, **kw) as cap:
                    loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            g = cap.gradients(tape, loss)
            opt.apply_gradients(zip(g.variable_gradients, model.trainable_variables))
            pe = g.per_example
            s = tf.add_n([tf.reduce_sum(v) for v in pe.values() if v is not None]) if pe is not None else loss
            return loss + 0 * s

        return step

    return {
        "plain": plain,
        "capture": make(weights=True),
        "per_example outputs": make(per_example=True),
        "per_example outputs+weights": make(weights=True, per_example=True),
    }


for name, build in [("MLP 32-128-128-10 b64", mlp), ("token MLP block T32 d64 b32", seq), ("CNN 32x32 b32", cnn)]:
    model, x, y = build()
    opt = keras.optimizers.SGD(1e-4)
    fns = {k: tf.function(v) for k, v in variants(model, opt).items()}
    for f in fns.values():
        f(x, y)
        f(x, y)
    times = {k: [] for k in fns}
    for _ in range(15):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(10):
                f(x, y).numpy()
            times[k].append((time.perf_counter() - t) / 10)
    base = statistics.median(times["plain"])
    print(
        f"{name}: plain {base * 1e3:.2f} ms; "
        + "; ".join(f"{k} {statistics.median(v) / base:.2f}x" for k, v in times.items() if k != "plain")
    )
    sys.stdout.flush()
