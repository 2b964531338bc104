"""MirroredStrategy over 2 logical CPUs, custom loop: every write path vs a single device on the same batch.

Usage: custom_loop.py LOGDIR. Writes runs LOGDIR/{single,gather,cross,low} and
LOGDIR/weights.npz (final weights with and without logging, under the strategy).
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

GLOBAL_BATCH, STEPS = 8, 3
x, y = data(np, GLOBAL_BATCH * STEPS)
strategy = tf.distribute.MirroredStrategy(devices)
assert strategy.num_replicas_in_sync == 2


def per_example(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_pred - y_true), axis=-1)


def train(log: bool):
    """Train STEPS steps under the strategy; with `log`, write through the three distributed paths."""
    with strategy.scope():
        model = tiny_model(keras)
        opt = keras.optimizers.SGD(0.1)
    single = tiny_model(keras)
    if log:
        writers = {k: distribute.create_file_writer(os.path.join(logdir, k)) for k in ("gather", "cross", "low")}
        single_writer = tf.summary.create_file_writer(os.path.join(logdir, "single"))

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, weights=True, tape=tape, activations=True) as cap:
                loss = tf.nn.compute_average_loss(per_example(yb, model(xb)), global_batch_size=GLOBAL_BATCH)
        grads = cap.gradients(tape, loss)
        step = opt.iterations + 1
        if log:
            with writers["gather"].as_default(step=step):
                tb_layergrad.summary.gradients(grads)
            with writers["low"].as_default(step=step):  # the low-level op, one output and one weight
                tb_layergrad.summary.histogram_and_stats("tiny/hidden", grads["tiny/hidden"])
                tb_layergrad.summary.histogram_and_stats("tiny/out/bias", grads["tiny/out/bias"], source="weight")
        opt.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
        return grads

    @tf.function
    def step_fn(xb, yb):
        step = opt.iterations + 1
        grads = strategy.run(replica_step, (xb, yb))
        if log:
            with writers["cross"].as_default(step=step):
                tb_layergrad.summary.gradients(grads, strategy=strategy)  # cross-replica: strategy.gather
        return step

    @tf.function
    def single_step(xb, yb, step):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(single, weights=True, tape=tape, activations=True) as cap:
                loss = tf.reduce_mean(per_example(yb, single(xb)))
        grads = cap.gradients(tape, loss)
        with single_writer.as_default(step=step):
            tb_layergrad.summary.gradients(grads)

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    for xb, yb in zip(ds, strategy.experimental_distribute_dataset(ds)):
        if log:  # the single-device reference: same weights, same global batch
            single.set_weights(model.get_weights())
            single_step(xb[0], xb[1], opt.iterations + 1)
        step_fn(*yb)
    if log:
        for w in list(writers.values()) + [single_writer]:
            w.flush()
    return [v.numpy() for v in model.trainable_variables]


logged = train(True)
plain = train(False)
np.savez(os.path.join(logdir, "weights.npz"), *(logged + plain))
print("OK", len(logged))

# Bad usage: clear errors, not half a batch.
errors = {}
with strategy.scope():
    emodel = tiny_model(keras)
ewriter = tf.summary.create_file_writer(os.path.join(logdir, "errors"))


def capture_step(xb, yb):
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(emodel, tape=tape) as cap:
            loss = tf.reduce_sum(emodel(xb))
    return cap.gradients(tape, loss)


def in_cond(xb, yb):
    grads = capture_step(xb, yb)
    with ewriter.as_default(step=1):
        tf.cond(tf.reduce_sum(xb) > -1e9, lambda: tb_layergrad.summary.gradients(grads), lambda: tf.constant(False))


def cross_without_strategy(xb, yb):
    return capture_step(xb, yb)


batch = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))))
for name, fn in (("in_cond", in_cond),):
    try:
        tf.function(lambda a, b: strategy.run(fn, (a, b)))(*batch)
        errors[name] = "no error"
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        errors[name] = f"{type(e).__name__}: {e}"


@tf.function
def cross_step(a, b):
    out = strategy.run(cross_without_strategy, (a, b))
    with ewriter.as_default(step=1):
        tb_layergrad.summary.gradients(out)  # outside strategy.scope(), no strategy=


try:
    cross_step(*batch)
    errors["cross_without_strategy"] = "no error"
except Exception as e:  # noqa: BLE001
    errors["cross_without_strategy"] = f"{type(e).__name__}: {e}"
import json  # noqa: E402

with open(os.path.join(logdir, "errors.json"), "w") as f:
    json.dump(errors, f)
print("ERRORS", sorted(errors))
