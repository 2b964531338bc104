"""What every `tb-layergrad demo` run shares: its progress line and the `model.fit()` a user writes.

Keras is imported inside the functions: `tb-layergrad report` loads the `cli` package and must not
pay for it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import tb_layergrad
from tb_layergrad import backend


class Progress:
    """One line per run: a bar, steps, seconds; `\r`-updated on a terminal, printed once when done otherwise."""

    def __init__(self, label: str, total: int, shows: str, stream=None) -> None:
        self.label, self.total, self.shows = label, total, shows
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.time()
        self.done = 0
        self._draw()

    def _line(self) -> str:
        width = 24
        filled = int(width * self.done / max(1, self.total))
        bar = "#" * filled + "-" * (width - filled)
        return f"  {self.label:<17} [{bar}] {self.done:>3}/{self.total} steps {time.time() - self.started:5.1f}s  {self.shows}"

    def _draw(self) -> None:
        if self.tty:
            # One terminal line, or `\r` could not redraw it.
            width = shutil.get_terminal_size((100, 24)).columns - 1
            self.stream.write("\r" + self._line()[:width])
            self.stream.flush()

    def update(self, done: int) -> None:
        self.done = min(done, self.total)
        if self.tty and (self.done == self.total or self.done % max(1, self.total // 24) == 0):
            self._draw()

    def finish(self) -> float:
        self.done = self.total
        if self.tty:
            self.stream.write("\r" + " " * (shutil.get_terminal_size((100, 24)).columns - 1) + "\r")
        self.stream.write(self._line() + "\n")
        self.stream.flush()
        return time.time() - self.started


def on_tensorflow() -> bool:
    """Does Keras train on TensorFlow here? Else on JAX, where the TensorFlow-only runs and options are left out."""
    return backend.keras_backend() == "tensorflow"


def progress_callback(progress: Progress):
    """A Keras callback that moves `progress` at each batch's end."""
    import keras

    class _Bar(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            progress.update(batch + 1)

    return _Bar()


def fit(
    name: str,
    shows: str,
    logdir: str,
    model,
    data: tuple,
    steps: int,
    *,
    optimizer,
    loss,
    batch: int = 64,
    timesteps: bool = False,
    activations: bool = False,
    update_freq: int = 1,
    per_example: bool = False,
) -> None:
    """model.fit() on `data` = (x, y) for `steps` batches with GradientLogger: exactly what a user writes.

    GradientLogger writes to `logdir/<name>/train`; the run is then lifted up to `logdir/<name>`
    (`lift_train_run`), so that each demo run is one run named for what it shows.
    """
    x, y = data
    model.compile(optimizer=optimizer, loss=loss)
    progress = Progress(name, steps, shows)
    model.fit(
        x[: steps * batch],
        y[: steps * batch],
        batch_size=batch,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[
            tb_layergrad.GradientLogger(
                os.path.join(logdir, name),
                timesteps=timesteps,
                activations=activations,
                update_freq=update_freq,
                weights=per_example,
                per_example=per_example,
            ),
            progress_callback(progress),
        ],
    )
    progress.finish()
    lift_train_run(os.path.join(logdir, name))


def lift_train_run(run_dir: str) -> None:
    """Move `run_dir/train/*` into `run_dir`: GradientLogger writes to `log_dir/train`, and each demo run is one
    run named for what it shows (event files do not hold their run's name)."""
    train = os.path.join(run_dir, "train")
    for entry in os.listdir(train):
        os.replace(os.path.join(train, entry), os.path.join(run_dir, entry))
    os.rmdir(train)
