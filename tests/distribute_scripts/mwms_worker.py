"""One worker of a 2-process MultiWorkerMirroredStrategy (TF_CONFIG from the environment).

Usage: mwms_worker.py LOGDIR. Every worker runs the same program on the same
LOGDIR (a shared file system). A custom loop writes with summary.gradients in
replica context, through distribute.create_file_writer, to LOGDIR/gather (the
replicas' tensors all-gathered): only the chief may leave event files.
The chief also writes LOGDIR/single: one device, the same weights, the whole
global batch of each step (histograms and statistics do not depend on the order
of the examples, so it does not matter how the batch was split over workers).

Not fit(): Keras 3.15's own fit() fails under MultiWorkerMirroredStrategy before
any callback runs (docs/DISTRIBUTED.md).
"""

import json
import os
import sys

from common import data, tiny_model  # noqa: E402

logdir = sys.argv[1]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # first: before any other TensorFlow op
import keras  # noqa: E402

import tb_layergrad  # noqa: E402
from tb_layergrad import distribute  # noqa: E402

GLOBAL_BATCH, STEPS = 8, 3
x, y = data(np, GLOBAL_BATCH * STEPS)
task = json.loads(os.environ["TF_CONFIG"])["task"]
assert strategy.num_replicas_in_sync == 2, strategy.num_replicas_in_sync
chief = distribute.is_chief(strategy)

with strategy.scope():
    model = tiny_model(keras)
    opt = keras.optimizers.SGD(0.1)
single = tiny_model(keras)
writer = distribute.create_file_writer(os.path.join(logdir, "gather"))
single_writer = tf.summary.create_file_writer(os.path.join(logdir, "single")) if chief else None


def loss_of(model_, xb, yb, global_batch):
    per_example = tf.reduce_mean(tf.square(model_(xb) - yb), axis=-1)
    return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)


@tf.function
def step_fn(xb, yb):
    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, weights=True, tape=tape) as cap:
                loss = loss_of(model, xb, yb, GLOBAL_BATCH)
        grads = cap.gradients(tape, loss)
        with writer.as_default(step=opt.iterations + 1):
            tb_layergrad.summary.gradients(grads)
        opt.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))

    strategy.run(replica_step, (xb, yb))


@tf.function
def single_step(xb, yb, step):
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(single, weights=True, tape=tape) as cap:
            loss = loss_of(single, xb, yb, GLOBAL_BATCH)
    with single_writer.as_default(step=step):
        tb_layergrad.summary.gradients(cap.gradients(tape, loss))


ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
for (xg, yg), (xb, yb) in zip(ds, strategy.experimental_distribute_dataset(ds)):
    if chief:
        single.set_weights([v.numpy() for v in model.weights])
        single_step(xg, yg, opt.iterations + 1)
    step_fn(xb, yb)
for w in [writer] + ([single_writer] if chief else []):
    w.flush()
print("OK", task["type"], task["index"], chief)
