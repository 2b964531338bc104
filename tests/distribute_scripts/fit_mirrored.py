"""GradientLogger in fit() under MirroredStrategy (2 logical CPUs) vs one device on the same global batches.

Usage: fit_mirrored.py LOGDIR. Runs (LOGDIR/<run>/train):
- single: one device; gather, stats: MirroredStrategy with replicas="gather" / "stats".
  SGD with learning rate 0: every run sees the same weights at every step, so the
  records can be compared value for value (a real update would differ in the last
  bits between 1 and 2 replicas: another summation order).
- LOGDIR/weights.npz: final weights under the strategy (learning rate 0.1) with the
  logger and without: must be identical.
"""
import os
import sys

from common import data, logical_cpus, tiny_model  # noqa: E402

logdir = sys.argv[1]
modes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["graph"]
devices = logical_cpus(2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import tb_layergrad  # noqa: E402

GLOBAL_BATCH, STEPS = 8, 3
x, y = data(np, GLOBAL_BATCH * STEPS)
strategy = tf.distribute.MirroredStrategy(devices)


def fit(run, replicas=None, lr=0.0, strategy_=None, eager=False):
    scope = strategy_.scope() if strategy_ is not None else tf.distribute.get_strategy().scope()
    with scope:
        model = tiny_model(keras)
        model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse", run_eagerly=eager)
    callbacks = []
    if run is not None:
        callbacks.append(tb_layergrad.GradientLogger(os.path.join(logdir, run), weights=True, replicas=replicas or "gather"))
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return [v.numpy() for v in model.trainable_variables]


for mode in modes:
    eager = mode == "eager"
    fit(f"single_{mode}", eager=eager)
    fit(f"gather_{mode}", "gather", strategy_=strategy, eager=eager)
    fit(f"stats_{mode}", "stats", strategy_=strategy, eager=eager)
logged = fit("neutral", "gather", lr=0.1, strategy_=strategy)
plain = fit(None, lr=0.1, strategy_=strategy)
np.savez(os.path.join(logdir, "weights.npz"), *(logged + plain))
print("OK")
