"""Runs whose answer is set by construction, written by the real capture and summary ops, to measure the detectors
(docs/ANOMALIES.md, "How well the rules find what they look for").

A small model, `d0 -> d1 -> gate -> d2 -> out`, sees a fresh batch at every step through fixed weights (no
optimizer: nothing but the planted change moves the gradients). `gate` is the identity in the forward pass; in
the backward pass it multiplies the gradient it passes on by `BACKWARD` (and its output by `FORWARD`), set per
run and step. So from step K on, exactly the layers before it (`d0`, `d1`: BEFORE) see the planted change:

| run | from step K | the truth |
|---|---|---|
| vanish | backward x 1e-5 | BEFORE vanishing at steps >= K, nothing else anywhere |
| explode | backward x 1e4 | BEFORE exploding at steps >= K, nothing else (the others are not vanishing) |
| dead | backward x 0 | BEFORE dead at steps >= K, nothing else |
| nan_backward | backward x NaN | born in the backward pass of `gate` at K; BEFORE non-finite from K |
| nan_forward | forward x NaN | born in the forward pass, output of `gate`, at K; every gradient non-finite from K |
| clean | nothing | no flag, no origin |

`timesteps`: per-timestep norms written with `summary.timesteps`, decaying by a set number of decades per layer.
"""

from __future__ import annotations

import os
import zlib
from typing import Dict, List, Tuple

import numpy as np

STEPS, K, BATCH = 24, 12, 16
LAYERS = ("d0", "d1", "gate", "d2", "out")
BEFORE = ("d0", "d1")
MODEL = "net"
PLANTS = {  # run -> (forward factor, backward factor) from step K on
    "vanish": (1.0, 1e-5),
    "explode": (1.0, 1e4),
    "dead": (1.0, 0.0),
    "nan_backward": (1.0, float("nan")),
    "nan_forward": (float("nan"), 1.0),
    "clean": (1.0, 1.0),
}
# The per-timestep runs: layer -> decades of decay from the last timestep back to the first (median over steps).
DECAYS = {"rnn/a": 0.5, "rnn/b": 2.0, "rnn/c": 2.8, "rnn/d": 3.3, "rnn/e": 4.5, "rnn/f": 6.0}
TIME_STEPS, TIMESTEPS_T = 12, 10


def path(layer: str) -> str:
    return f"{MODEL}/{layer}"


def _model(factors):
    import keras
    import tensorflow as tf

    class Gate(keras.layers.Layer):
        """Identity forward (times factors[0]); the gradient it passes back times factors[1]."""

        def call(self, x):
            forward, backward = tf.convert_to_tensor(factors[0]), tf.convert_to_tensor(factors[1])

            @tf.custom_gradient
            def gate(x):
                return x * forward, lambda dy: dy * backward

            return gate(x)

    keras.utils.set_random_seed(11)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="tanh", name="d0"),
            keras.layers.Dense(16, activation="tanh", name="d1"),
            Gate(name="gate"),
            keras.layers.Dense(16, activation="tanh", name="d2"),
            keras.layers.Dense(3, name="out"),
        ],
        name=MODEL,
    )


def write_planted(logdir: str) -> None:
    """Every run of PLANTS under `logdir`, one run directory each."""
    import tensorflow as tf

    import tb_layergrad

    for run, (forward, backward) in PLANTS.items():
        factors = [tf.Variable(1.0), tf.Variable(1.0)]
        model = _model(factors)
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        rng = np.random.default_rng(5)
        with writer.as_default():
            for step in range(STEPS):
                factors[0].assign(forward if step >= K else 1.0)
                factors[1].assign(backward if step >= K else 1.0)
                x = tf.constant(rng.normal(size=(BATCH, 6)).astype(np.float32))
                y = tf.constant(rng.normal(size=(BATCH, 3)).astype(np.float32))
                with tf.GradientTape() as tape:
                    with tb_layergrad.capture(model, tape=tape, activations=True) as cap:
                        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
                tb_layergrad.summary.gradients(cap.gradients(tape, loss), step=step)
        writer.close()


def truth_cells(run: str, kind: str, steps: List[int]) -> np.ndarray:
    """bool [layers, steps] (LAYERS order): the cells where `kind` is planted."""
    planted = {"vanish": "vanishing", "explode": "exploding", "dead": "dead"}.get(run)
    rows = np.array([layer in BEFORE for layer in LAYERS])[:, None]
    cols = np.asarray(steps)[None, :] >= K
    return rows & cols if planted == kind else np.zeros((len(LAYERS), len(steps)), bool)


def timestep_norms(layer: str, step: int) -> np.ndarray:
    """[T] norms falling by DECAYS[layer] decades from the last timestep back to the first, with noise."""
    rng = np.random.default_rng(zlib.crc32(f"{layer}|{step}".encode()))
    t = np.arange(TIMESTEPS_T)
    decades = DECAYS[layer] * (TIMESTEPS_T - 1 - t) / (TIMESTEPS_T - 1)
    return 10.0 ** (-decades + rng.uniform(-0.1, 0.1, TIMESTEPS_T))


def write_timesteps(logdir: str) -> Dict[str, float]:
    """A run `rnn` of DECAYS's layers: output gradients and their per-timestep norms; returns DECAYS."""
    import tensorflow as tf

    from tb_layergrad import summary

    writer = tf.summary.create_file_writer(os.path.join(logdir, "rnn"))
    rng = np.random.default_rng(9)
    with writer.as_default():
        for step in range(TIME_STEPS):
            grads = {layer: tf.constant(rng.normal(size=(4, 8)).astype(np.float32)) for layer in DECAYS}
            summary.gradients(grads, step=step)
            for layer in DECAYS:
                summary.timesteps(layer, tf.constant(timestep_norms(layer, step)), step=step)
    writer.close()
    return dict(DECAYS)


def precision_recall(flagged: np.ndarray, truth: np.ndarray) -> Tuple[float, float]:
    """(precision, recall) of bool cells; 1.0 where nothing was flagged or nothing was to be found."""
    tp = int((flagged & truth).sum())
    return (tp / flagged.sum() if flagged.any() else 1.0), (tp / truth.sum() if truth.any() else 1.0)


# The flipped-label run: two well-separated classes, one flipped label in each batch of FLIPPED_BATCHES.
FLIP_BATCHES, FLIP_BATCH_SIZE = 48, 32
FLIPPED_BATCHES = tuple(range(5, FLIP_BATCHES, 3))  # 0-based batch numbers


def flipped_positions() -> Dict[int, int]:
    """{0-based batch: batch position of its flipped label}, drawn once."""
    rng = np.random.default_rng(21)
    return {b: int(rng.integers(FLIP_BATCH_SIZE)) for b in FLIPPED_BATCHES}


def write_flipped(logdir: str) -> str:
    """`model.fit` with `GradientLogger(per_example=True)` over the flipped-label data; returns the run dir."""
    import keras

    import tb_layergrad

    rng = np.random.default_rng(22)
    x = rng.normal(size=(FLIP_BATCHES * FLIP_BATCH_SIZE, 8)).astype(np.float32)
    x[:, 1] = np.sign(x[:, 1]) * (2.0 + np.abs(x[:, 1]))  # a margin: every true label is easy
    y = (x[:, 1] > 0).astype(np.int32)
    for b, position in flipped_positions().items():
        y[b * FLIP_BATCH_SIZE + position] = 1 - y[b * FLIP_BATCH_SIZE + position]
    keras.utils.set_random_seed(23)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(24, activation="relu", name="h0"),
            keras.layers.Dense(24, activation="tanh", name="h1"),
            keras.layers.Dense(2, name="logits"),
        ],
        name="flip",
    )
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    run_dir = os.path.join(logdir, "flipped")
    logger = tb_layergrad.GradientLogger(run_dir, per_example=True)
    model.fit(x, y, batch_size=FLIP_BATCH_SIZE, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    return run_dir


# Vanishing over steps: runs whose gradient falls by decades, with or without their loss.
# `stall_*`: the fixed model above (no optimizer: the loss stalls) whose loss passes back only COLLAPSES[run] of its
# gradient from step K on (its value unchanged); `regression`, `classifier`: trained until the loss converges, the
# gradient falling by decades with it. The truth: a layer vanishes over steps where its gradient fell by
# STEP_DECAY_DECADES or more and the loss did not follow: every layer of the `stall_*` runs planted at that depth.
COLLAPSES = {"stall_4": 1e-4, "stall_3": 1e-3, "stall_2.5": 10**-2.5, "stall_1.5": 10**-1.5, "stall_1": 1e-1}
CONVERGING = ("regression", "classifier")


def write_stalled(logdir: str) -> None:
    """The `stall_*` runs: the loss's value as before, its gradient x COLLAPSES[run] from step K on."""
    import tensorflow as tf

    import tb_layergrad

    for run, factor in COLLAPSES.items():
        model = _model([tf.Variable(1.0), tf.Variable(1.0)])
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        rng = np.random.default_rng(6)
        with writer.as_default():
            for step in range(STEPS):
                f = factor if step >= K else 1.0
                x = tf.constant(rng.normal(size=(BATCH, 6)).astype(np.float32))
                y = tf.constant(rng.normal(size=(BATCH, 3)).astype(np.float32))
                with tf.GradientTape() as tape:
                    with tb_layergrad.capture(model, tape=tape) as cap:
                        value = tf.reduce_mean(tf.square(model(x, training=True) - y))
                        loss = f * value + tf.stop_gradient((1.0 - f) * value)  # same value, gradient x f
                tb_layergrad.summary.gradients(cap.gradients(tape, loss), step=step)
        writer.close()


CONVERGE_STEPS = 120


def write_converging(logdir: str) -> None:
    """`regression` (a student fitting a linear teacher exactly, mean squared error to ~0) and `classifier` (two
    separable classes, cross-entropy), trained with Adam; the gradient falls by decades as the loss converges."""
    import keras
    import tensorflow as tf

    import tb_layergrad

    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    teacher = rng.normal(size=(6, 3)).astype(np.float32)
    margin = x.copy()
    margin[:, 0] = np.sign(x[:, 0]) * (2.0 + np.abs(x[:, 0]))  # every label easy: the loss can reach ~0
    data = {
        "regression": (x, x @ teacher, 3, "mse"),
        "classifier": (margin, (margin[:, 0] > 0).astype(np.int32), 2, "xent"),
    }
    for run, (xs, ys, outputs, kind) in data.items():
        keras.utils.set_random_seed(12)
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(16, name="hidden"), keras.layers.Dense(outputs, name="out")],
            name=MODEL,
        )
        optimizer = keras.optimizers.Adam(0.05)
        lossfn = (
            keras.losses.MeanSquaredError()
            if kind == "mse"
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        with writer.as_default():
            for step in range(CONVERGE_STEPS):
                with tf.GradientTape(persistent=True) as tape:
                    with tb_layergrad.capture(model, tape=tape) as cap:
                        loss = lossfn(ys, model(xs, training=True))
                tb_layergrad.summary.gradients(cap.gradients(tape, loss), step=step)
                weights = model.trainable_weights
                optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
        writer.close()
