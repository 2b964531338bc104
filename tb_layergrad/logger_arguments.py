"""The arguments every backend's `GradientLogger` takes alike, checked in one place (no TensorFlow, no JAX).

Why apart from the TensorFlow room's other options: the JAX room takes the same arguments with the same
meanings and messages, and must not import TensorFlow to check them.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Union

#: what `on_nonfinite=` may say: `nonfinite_check.MODES` act on the step, "ignore" checks nothing
ON_NONFINITE = ("log", "stop", "raise", "ignore")


def update_freq(value: Any) -> Union[int, str]:
    """An int N >= 1, "batch" (1) or "epoch"."""
    if value == "batch":
        return 1
    if value == "epoch":
        return "epoch"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'update_freq must be an integer >= 1, "batch" or "epoch", got {value!r}')
    return value


def max_elements(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_elements must be an integer >= 0, got {value!r}")
    return value


def on_nonfinite(value: Any) -> str:
    if value not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {value!r}")
    return value


def log_dir(value: Any) -> Any:
    """A path, or a callback whose `log_dir` the logger follows (Keras' `TensorBoard`), kept as it is.

    Why follow: a tuner that copies the callbacks for each trial and points its
    `TensorBoard` callback at the trial's own run (KerasTuner) leaves a logger
    given a path writing every trial to that one path. A logger holding the
    callback reads its log_dir at each fit() (`resolve_log_dir`), after the
    tuner has set it.
    """
    if not isinstance(value, (str, bytes, os.PathLike)) and hasattr(value, "log_dir"):
        resolve_log_dir(value)  # a path now, or raise now rather than at fit()
        return value
    return _path(value, "log_dir must be a path, or the keras.callbacks.TensorBoard callback whose log_dir to follow")


def resolve_log_dir(value: Any) -> str:
    """The folder `value` (from `log_dir`) stands for now: the path, or the followed callback's log_dir."""
    if isinstance(value, (str, bytes)):
        return value
    return _path(value.log_dir, f"log_dir follows {type(value).__name__}.log_dir, which must be a path")


def _path(value: Any, what: str) -> str:
    try:
        path = os.fspath(value)
    except TypeError:
        raise TypeError(f"{what}, got {type(value).__name__}") from None
    if not path:
        raise ValueError(f"{what}, got an empty one")
    return path


def warn_without_effect(weights: bool, per_example: bool, stacklevel: int = 3) -> None:
    """Warn of `per_example=True` without `weights=True`: the noise scale needs the weight gradients.

    `stacklevel`: the user's line, from the logger's `__init__` calling this directly (3).
    """
    if per_example and not weights:
        warnings.warn(
            "GradientLogger(per_example=True, weights=False): the gradient noise scale needs the weight "
            "gradients and is not written (the per-example norms of the layer outputs are); pass weights=True "
            "for it",
            UserWarning,
            stacklevel=stacklevel,
        )
