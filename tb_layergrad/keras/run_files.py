"""The run a logger writes to: its event file, opened per run, and the warning for two trainings in one run.

Why a warning: a record's step is the count of batches a model has trained
(batch_count), so two models trained into one run both write steps 1, 2, ...
and TensorBoard keeps one value per step: one training's records are lost,
silently. That happens when a hyperparameter search gives every trial the
same log_dir (KerasTuner points only its `TensorBoard` callbacks at each
trial's run), or when one logger is kept for several models. A later fit()
of the same model goes on from the step it stopped at and is not one of
them, nor is a resumed model whose count starts after the run's last step.

Why this process only: it knows which steps its own loggers gave each run
without reading event files back; a run written by an earlier process is
TensorBoard's own case of a re-run into one folder.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any, Dict, Optional

import tensorflow as tf

_last_step: Dict[str, int] = {}  # run folder -> the last step this process's loggers counted in it
_lock = threading.Lock()


def open_writer(run_dir: str) -> Any:
    """A summary writer for `run_dir` (created with its parents); an `OSError` that names the folder."""
    try:
        tf.io.gfile.makedirs(run_dir)
        return tf.summary.create_file_writer(run_dir)
    except (tf.errors.OpError, OSError) as e:
        raise OSError(f"GradientLogger cannot write to log_dir {run_dir!r}: {e}") from e


def _key(run_dir: str) -> str:
    return run_dir if "://" in run_dir else os.path.realpath(run_dir)


def check(run_dir: str, first_step: int) -> None:
    """Warn when a training whose first step is `first_step` would write steps `run_dir` already holds."""
    with _lock:
        last = _last_step.get(_key(run_dir), 0)
    if first_step > last:
        return
    warnings.warn(
        f"GradientLogger: the run {run_dir!r} already holds steps up to {last} of another training in this process, "
        f"and this one writes from step {first_step} on: the steps they share overwrite each other. Give each "
        "training its own log_dir. In a KerasTuner search, pass the keras.callbacks.TensorBoard callback itself "
        "as log_dir (GradientLogger(tensorboard_callback)): the logger then follows the log_dir the tuner gives "
        "each trial, and its records land in that trial's run, beside its hyperparameters.",
        UserWarning,
        stacklevel=2,
    )


def extend(run_dir: str, last_step: int) -> None:
    """Remember that `run_dir` holds steps up to `last_step` (at the end of a fit())."""
    with _lock:
        key = _key(run_dir)
        _last_step[key] = max(_last_step.get(key, 0), int(last_step))


class RunFile:
    """One logger's event file: kept across the fit()s into one run, a new one in a new run."""

    def __init__(self) -> None:
        self.writer: Any = None
        self.run_dir: Optional[str] = None
        self._unchecked = False  # is this fit()'s first step still to be checked against the run?

    def open(self, run_dir: str) -> Any:
        """At on_train_begin: the writer of `run_dir` (a followed log_dir may have moved since the last fit())."""
        if self.writer is not None and self.run_dir != run_dir:
            self.close()
        if self.writer is None:
            self.writer, self.run_dir = open_writer(run_dir), run_dir
        self._unchecked = True
        return self.writer

    def check(self, count: Any) -> None:
        """Once this fit()'s batch count (`batch_count.BatchCount`) is known: `check` its first step, once."""
        if self._unchecked and count.known:
            self._unchecked = False
            check(self.run_dir, count.count + 1)

    def end(self, count: int) -> None:
        """At the end of a fit() (or its failure): the run holds steps up to `count`."""
        if self.writer is not None:
            extend(self.run_dir, count)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer, self._unchecked = None, False
