"""MirroredStrategy over 2 logical CPUs: per-example records of every replica, in global batch order.

Usage: per_example_mirrored.py LOGDIR. Writes runs LOGDIR/{single,gather} (custom loop: a single device on
the global batch, then `summary.gradients` inside `strategy.run`, same weights, same batch),
and LOGDIR/{fit_single,fit_mirrored}/train (GradientLogger(per_example=True) in fit(), one step on the global batch).
"""

import os
import sys

from common import data, logical_cpus, tiny_model  # noqa: E402  (sets up sys.path, env)

logdir = sys.argv[1]
devices = logical_cpus(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tb_layergrad  # noqa: E402
from tb_layergrad import distribute  # noqa: E402

GLOBAL_BATCH = 8
x, y = data(np, GLOBAL_BATCH)
strategy = tf.distribute.MirroredStrategy(devices)


def per_example(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_pred - y_true), axis=-1)


with strategy.scope():
    model = tiny_model(keras)
single = tiny_model(keras)
single.set_weights(model.get_weights())
writer = distribute.create_file_writer(os.path.join(logdir, "gather"))
single_writer = tf.summary.create_file_writer(os.path.join(logdir, "single"))


def replica_step(xb, yb):
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, weights=True, tape=tape, per_example=True) as cap:
            loss = tf.nn.compute_average_loss(per_example(yb, model(xb)), global_batch_size=GLOBAL_BATCH)
    grads = cap.gradients(tape, loss)
    with writer.as_default(step=1):
        tb_layergrad.summary.gradients(grads)


@tf.function
def step_fn(xb, yb):
    strategy.run(replica_step, (xb, yb))


with tf.GradientTape() as tape:
    with tb_layergrad.capture(single, weights=True, tape=tape, per_example=True) as cap:
        loss = tf.reduce_mean(per_example(y, single(x)))
with single_writer.as_default(step=1):
    tb_layergrad.summary.gradients(cap.gradients(tape, loss))
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
for xb, yb in strategy.experimental_distribute_dataset(ds):
    step_fn(xb, yb)
for w in (writer, single_writer):
    w.flush()


def fit(run, strategy_=None):
    scope = strategy_.scope() if strategy_ is not None else tf.distribute.get_strategy().scope()
    with scope:
        m = tiny_model(keras)
        m.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", jit_compile=False)
    m.fit(
        x,
        y,
        batch_size=GLOBAL_BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[tb_layergrad.GradientLogger(os.path.join(logdir, run), weights=True, per_example=True)],
    )


fit("fit_single")
fit("fit_mirrored", strategy)
print("OK")
