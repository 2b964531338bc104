"""The demo's small sweep: learning rate x activation, six runs whose hyperparameters are logged with HParams.

Each run is what a sweep user writes: `hp.KerasCallback(run_dir, {...})` beside
`tb_layergrad.GradientLogger(run_dir)` in `model.fit()`, one run folder per trial, named
`sweep/lr=<lr>,act=<activation>`. The same deep MLP on the same data; only the two hyperparameters
differ, so the report's `hp/` columns and `--sort` tell which one explains what: with sigmoid the
first layers' gradient vanishes at every learning rate, with ReLU at none: the activation explains it,
not the learning rate.

Eager and short: the sweep must add little to the demo's time (fits of this size trace longer than
they train). On JAX, where `hp.KerasCallback` cannot run (it writes with TensorFlow), `HParamsWriter` writes the
same session record (`hp.hparams_pb`) with TensorBoard's TensorFlow-free event writer.
"""

from __future__ import annotations

import glob
import itertools
import os
import time
from typing import List

from tb_layergrad.cli import demo_fit

LEARNING_RATES = (0.01, 0.1, 1.0)
ACTIVATIONS = ("sigmoid", "relu")
DEPTH = 6  # hidden layers: enough for sigmoid's gradient to shrink ~4x per layer toward the input
WIDTH = 16
STEPS = {True: 15, False: 40}  # quick, full
BATCH = 32
SWEEP = "sweep"


def run_name(lr: float, activation: str) -> str:
    """'sweep/lr=0.1,act=relu': one run folder per trial, as sweep tools name them."""
    return f"{SWEEP}/lr={lr:g},act={activation}"


TRIALS = tuple(itertools.product(ACTIVATIONS, LEARNING_RATES))  # (activation, learning rate)
RUN_NAMES = tuple(run_name(lr, act) for act, lr in TRIALS)


def _clear_previous(logdir: str) -> None:
    """Remove the event files of an earlier demo's sweep (else both would show in each run)."""
    for name in RUN_NAMES:
        for path in glob.glob(
            os.path.join(glob.escape(os.path.join(logdir, name)), "**", "*tfevents*"), recursive=True
        ):
            os.remove(path)


def hparams_callback(run_dir: str, values: dict):
    """`hp.KerasCallback(run_dir, values)` on TensorFlow; on JAX a callback that writes the same record."""
    import keras

    if demo_fit.on_tensorflow():
        from tensorboard.plugins.hparams import api as hp

        return hp.KerasCallback(run_dir, values)

    class HParamsWriter(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            from tensorboard.compat.proto import event_pb2
            from tensorboard.plugins.hparams import summary_v2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            writer = EventFileWriter(run_dir)
            writer.add_event(event_pb2.Event(step=0, wall_time=time.time(), summary=summary_v2.hparams_pb(values)))
            writer.close()

    return HParamsWriter()


def sweep_runs(logdir: str, quick: bool) -> List[str]:
    """Train the six trials into `logdir/sweep/...`; returns their run names.

    Args:
      logdir: the demo's logdir.
      quick: fewer steps (`tb-layergrad demo --quick`).

    Returns:
      `RUN_NAMES`, each a run holding its gradients and its hyperparameters.

    Example:

        from tb_layergrad.cli import demo_sweep
        demo_sweep.sweep_runs("/tmp/layergrad_demo", quick=True)
    """
    import keras
    import numpy as np

    import tb_layergrad

    _clear_previous(logdir)
    steps = STEPS[quick]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * BATCH, 8)).astype("float32")
    y = (x[:, :4].sum(axis=1, keepdims=True) > 0).astype("float32")
    for activation, lr in TRIALS:
        name = run_name(lr, activation)
        keras.utils.set_random_seed(0)  # the same initial weights per activation: only the hyperparameters differ
        hidden = [keras.layers.Dense(WIDTH, activation=activation, name=f"dense_{i}") for i in range(DEPTH)]
        model = keras.Sequential([keras.Input((8,)), *hidden, keras.layers.Dense(1, name="logit")], name="mlp")
        model.compile(
            optimizer=keras.optimizers.SGD(lr), loss=keras.losses.BinaryCrossentropy(from_logits=True), run_eagerly=True
        )
        run_dir = os.path.join(logdir, name)
        progress = demo_fit.Progress(name[len(SWEEP) + 1 :], steps, "sweep: learning rate x activation")
        model.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[
                hparams_callback(run_dir, {"learning_rate": lr, "activation": activation}),
                tb_layergrad.GradientLogger(run_dir),
                demo_fit.progress_callback(progress),
            ],
        )
        progress.finish()
        demo_fit.lift_train_run(run_dir)
    return list(RUN_NAMES)
