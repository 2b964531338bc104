"""Internal: see the `tf.GradientTape` a train step trains with, and answer its one gradient call.

Why. `GradientLogger` logs the gradients of `model.fit()`'s *own* step: Keras'
unmodified `train_step`, or a model's override of it, whatever the Keras
version. Every such step opens a `tf.GradientTape`, runs the model under it,
and asks that tape once for the gradient of its loss w.r.t. the weights
(Keras 3 directly, tf_keras through `optimizer.minimize(..., tape=tape)`).
So, while an `Observation` is active on a thread:

- the first `tf.GradientTape` entered on that thread is handed to
  `Observation.adopt` (the layer hooks then watch their outputs on it);
- the first `gradient()` call made on that tape is handed to
  `Observation.answer`, which makes ONE call of the real method for the
  sources the step asked for *and* its own (layer outputs, timestep probes)
  and returns the step's part unchanged.

Nothing in the step is replaced: the tape, the loss, the optimizer and the
update are the step's own, so training is bit for bit what it is without the
observation (tests/test_fit_neutral.py).

The class's `__enter__` and `gradient` are swapped only while some thread
observes (reference counted, so replicas tracing in threads can overlap), and
every other tape, thread or call passes straight through.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, Optional

import tensorflow as tf

__all__ = ["Observation", "observing"]

GradientFn = Callable[..., Any]


class Observation:
    """One run of a train step on one thread; subclasses say what to do with the tape and the call."""

    def __init__(self) -> None:
        #: the adopted tape (the first one entered), None until then.
        self.tape: Optional[Any] = None
        #: has the adopted tape's first gradient() call been answered?
        self.answered = False

    def adopt(self, tape: Any) -> None:
        """Called right after the step entered its tape (still recording)."""

    def answer(
        self, tape: Any, target: Any, sources: Any, args: tuple, kwargs: Dict[str, Any], gradient: GradientFn
    ) -> Any:
        """Return what `tape.gradient(target, sources, *args, **kwargs)` returns; `gradient` is the real method."""
        return gradient(tape, target, sources, *args, **kwargs)


_local = threading.local()
_lock = threading.Lock()
_users = 0
_originals: Dict[str, Any] = {}


def _current() -> Optional[Observation]:
    return getattr(_local, "observation", None)


def _enter(tape: Any) -> Any:
    result = _originals["__enter__"](tape)
    observation = _current()
    if observation is not None and observation.tape is None:
        observation.tape = tape
        observation.adopt(tape)
    return result


def _gradient(tape: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
    real = _originals["gradient"]
    observation = _current()
    if observation is None or observation.answered or tape is not observation.tape:
        return real(tape, target, sources, *args, **kwargs)
    observation.answered = True
    return observation.answer(tape, target, sources, args, kwargs, real)


def _install() -> None:
    global _users
    with _lock:
        if _users == 0:
            cls = tf.GradientTape
            _originals["__enter__"] = cls.__dict__["__enter__"]
            _originals["gradient"] = cls.__dict__["gradient"]
            cls.__enter__ = _enter
            cls.gradient = _gradient
        _users += 1


def _uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            cls = tf.GradientTape
            cls.__enter__ = _originals.pop("__enter__")
            cls.gradient = _originals.pop("gradient")


@contextlib.contextmanager
def observing(observation: Observation) -> Iterator[Observation]:
    """Observe the tapes this thread enters (see the module docstring) until the block ends."""
    _install()
    previous = _current()
    _local.observation = observation
    try:
        yield observation
    finally:
        _local.observation = previous
        _uninstall()
