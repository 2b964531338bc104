"""GradientLogger in fit() under MirroredStrategy (2 logical CPUs) vs one device on the same global batches.

Usage: fit_mirrored.py LOGDIR. Runs (LOGDIR/<run>/train):
- single: one device; gather: MirroredStrategy (the replicas' tensors all-gathered).
  SGD with learning rate 0: every run sees the same weights at every step, so the
  records can be compared value for value (a real update would differ in the last
  bits between 1 and 2 replicas: another summation order).
- LOGDIR/weights.npz: final weights under the strategy (learning rate 0.1) with the
  logger and without: must be identical.

The records are the gradients fit() itself computes. Keras 3.15 divides each
replica's loss by the replica count, so its step under the strategy is the
single-device step of the global batch, and so are the records. Keras 3.3 does
not: its update under the strategy is no multiple of the single-device one.
The script measures what the installed Keras does (`keras_loss_factor`, one SGD
update with and without the strategy, no logger) and writes it to
LOGDIR/keras_factor.json: a whole factor (1, or the replica count) goes into the
single-device run's loss so the records compare value for value; null means
there is no single-device step to compare with.
"""

import json
import os
import sys

from common import data, logical_cpus, tiny_model  # noqa: E402

logdir = sys.argv[1]
modes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["graph"]
devices = logical_cpus(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tb_layergrad  # noqa: E402

GLOBAL_BATCH, STEPS = 8, 3
x, y = data(np, GLOBAL_BATCH * STEPS)
strategy = tf.distribute.MirroredStrategy(devices)


def fit(run, lr=0.0, strategy_=None, eager=False, factor=1.0, steps=STEPS):
    scope = strategy_.scope() if strategy_ is not None else tf.distribute.get_strategy().scope()
    with scope:
        model = tiny_model(keras)
        loss = "mse" if factor == 1.0 else (lambda yt, yp: factor * keras.losses.mean_squared_error(yt, yp))
        model.compile(optimizer=keras.optimizers.SGD(lr), loss=loss, run_eagerly=eager)
    callbacks = []
    if run is not None:
        callbacks.append(tb_layergrad.GradientLogger(os.path.join(logdir, run), weights=True, activations=True))
    n = GLOBAL_BATCH * steps
    model.fit(x[:n], y[:n], batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return [v.numpy() for v in model.trainable_variables]


def keras_loss_factor():
    """Keras' update under the strategy over the single-device one, for one SGD step: 1 or the replica count."""
    start = fit(None, lr=0.0, steps=1)
    one = fit(None, lr=1.0, steps=1)
    two = fit(None, lr=1.0, strategy_=strategy, steps=1)
    moved = [(a != s) for s, a in zip(start, one)]
    ratios = np.concatenate([((b - s) / np.where(m, a - s, 1.0))[m] for s, a, b, m in zip(start, one, two, moved)])
    if np.ptp(ratios) > 1e-3 * np.abs(ratios).max():
        return None  # not one factor for every weight
    return float(round(float(np.median(ratios))))


factor = keras_loss_factor()
with open(os.path.join(logdir, "keras_factor.json"), "w") as f:
    json.dump({"factor": factor}, f)


for mode in modes:
    eager = mode == "eager"
    fit(f"single_{mode}", eager=eager, factor=factor or 1.0)
    fit(f"gather_{mode}", strategy_=strategy, eager=eager)
logged = fit("neutral", lr=0.1, strategy_=strategy)
plain = fit(None, lr=0.1, strategy_=strategy)
np.savez(os.path.join(logdir, "weights.npz"), *(logged + plain))
print("OK")
