"""The cost of GradientLogger in Keras' fit() on JAX: each variant's step time over the plain step's.

Run as a JAX user runs it: `KERAS_BACKEND=jax python bench/jax_fit.py` (no TensorFlow needed). Variants take
turns in a shuffled order each round (docs/DESIGN.md, "Benchmark notes"); each fit() trains two epochs and a
variant's time is that of the second epoch's steps after its first, to its end with every callback's records
handed out and written: by then every step the variant runs is compiled (with `on_nonfinite="ignore"` the
written and the unwritten steps are two). The figure is the median over rounds of the within-round ratio to
the plain step.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from unittest import mock

import jax
import keras
import numpy as np

import tb_layergrad


class _StepTimer(keras.callbacks.Callback):
    """Seconds per step of the second epoch, from the end of its first batch (finished) to its end."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0 and self.epoch == 1:
            jax.block_until_ready(logs)
            self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            jax.effects_barrier()
            self.seconds = time.perf_counter() - self.start


def _mlp(width: int):
    model = keras.Sequential(
        [keras.Input((784,)), keras.layers.Dense(width, activation="relu"),
         keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10)],
    )  # fmt: skip
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _cnn(width: int):
    model = keras.Sequential(
        [keras.Input((32, 32, 3)), keras.layers.Conv2D(width, 3, activation="relu"),
         keras.layers.Conv2D(width, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
         keras.layers.Dense(10)],
    )  # fmt: skip
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# The records reduced inside the step by XLA's definitions, as where the C++ loops are not built.
XLA_IN_THE_STEP = {"TB_LAYERGRAD_FUSED": "0"}


def measure(name: str, build, shape, batch: int, steps: int, rounds: int, logdir: str, with_xla: bool = False) -> dict:
    rng = np.random.RandomState(0)
    x = rng.rand(batch * steps, *shape).astype(np.float32)
    y = rng.randint(0, 10, batch * steps)
    variants = {
        "plain": (build(), []),
        "every step": (build(), [tb_layergrad.GradientLogger(os.path.join(logdir, name, "1"), weights=True)]),
        "every 10th step": (
            build(),
            [tb_layergrad.GradientLogger(os.path.join(logdir, name, "10"), weights=True, update_freq=10)],
        ),
        # What a step off the schedule costs: the observation and the NaN/Inf check, nothing written.
        "not written": (
            build(),
            [tb_layergrad.GradientLogger(os.path.join(logdir, name, "0"), weights=True, update_freq=10**9)],
        ),
    }
    for label, freq in (("every 10th, ignore", 10), ("not written, ignore", 10**9)):  # Keras' own step between
        logger = tb_layergrad.GradientLogger(
            os.path.join(logdir, name, f"ignore{freq}"), weights=True, update_freq=freq, on_nonfinite="ignore"
        )
        variants[label] = (build(), [logger])
    env = {v: {} for v in variants}
    if with_xla:  # the same written steps, reduced by XLA inside the step: an A/B of the two in this process
        for label, freq in (("every step, XLA", 1), ("every 10th, XLA", 10)):
            logger = tb_layergrad.GradientLogger(
                os.path.join(logdir, name, f"xla{freq}"), weights=True, update_freq=freq
            )
            variants[label], env[label] = (build(), [logger]), XLA_IN_THE_STEP
    ratios = {v: [] for v in variants if v != "plain"}
    plain_steps = []
    for _ in range(rounds + 1):  # the first round compiles
        order = list(variants)
        random.shuffle(order)
        seconds = {}
        for variant in order:
            model, callbacks = variants[variant]
            timer = _StepTimer()
            with mock.patch.dict(os.environ, env[variant]):
                model.fit(x, y, batch_size=batch, epochs=2, verbose=0, shuffle=False, callbacks=[*callbacks, timer])
            seconds[variant] = timer.seconds / (steps - 1)
        for variant in ratios:
            ratios[variant].append(seconds[variant] / seconds["plain"])
        plain_steps.append(seconds["plain"])
    out = {v: statistics.median(r[1:]) for v, r in ratios.items()}
    out["plain step (ms)"] = 1e3 * statistics.median(plain_steps[1:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs")
    parser.add_argument("--only", choices=["mlp", "cnn"], help="one model")
    parser.add_argument("--with-xla", action="store_true", help="also the written steps reduced by XLA inside the step")
    args = parser.parse_args()
    small = args.smoke
    with tempfile.TemporaryDirectory() as logdir:
        cases = [
            ("mlp", lambda: _mlp(64 if small else 1024), (784,), 32 if small else 256),
            ("cnn", lambda: _cnn(4 if small else 32), (32, 32, 3), 8 if small else 64),
        ]
        print(f"jax {jax.__version__}, keras {keras.__version__}, {jax.devices()[0].platform}")
        print(f"load average at the start: {os.getloadavg()[0]:.1f}")
        head = "| model | plain step (ms) | every step | every 10th step | not written | every 10th, ignore | not written, ignore |"
        print(head)
        print("|---|---|---|---|---|---|---|")
        for name, build, shape, batch in [c for c in cases if args.only in (None, c[0])]:
            steps, rounds = (5, 1) if small else (args.steps, args.rounds)
            r = measure(name, build, shape, batch, steps, rounds, logdir, args.with_xla)
            xla = f" (XLA: {r['every step, XLA']:.2f}x / {r['every 10th, XLA']:.2f}x)" if args.with_xla else ""
            print(
                f"| {name} | {r['plain step (ms)']:.1f} | {r['every step']:.2f}x | {r['every 10th step']:.2f}x "
                f"| {r['not written']:.2f}x | {r['every 10th, ignore']:.2f}x | {r['not written, ignore']:.2f}x |{xla}"
            )
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
