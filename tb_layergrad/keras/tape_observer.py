"""Internal: see the `tf.GradientTape`s a train step trains with, and answer their gradient calls.

Why. `GradientLogger` logs the gradients of `model.fit()`'s *own* step: Keras'
unmodified `train_step`, or a model's override of it, whatever the Keras
version. Every such step opens a `tf.GradientTape`, runs (part of) the model
under it, and asks that tape for the gradient of a loss w.r.t. weights (Keras
3 directly, tf_keras through `optimizer.minimize(..., tape=tape)`); a custom
step may do so several times (a GAN's discriminator, then generator tape; a
CycleGAN's one persistent tape asked for four losses). So, while an
`Observation` is active on a thread:

- every `tf.GradientTape` entered on that thread is handed to
  `Observation.adopt` (the layer hooks then watch their outputs on it), and
  to `Observation.leave` when the step exits it;
- every `gradient()` call made on an adopted tape (each call of a persistent
  one) is handed to `Observation.answer`, which either passes it through (a
  call that asks for no trainable weight, e.g. a gradient penalty's) or makes
  ONE call of the real method for the sources the step asked for *and* its
  own (layer outputs, timestep probes) and returns the step's part unchanged.
  The observation's own calls go to the real method directly, and a tape
  entered while a gradient() call runs (TensorFlow's own, inside a backward
  pass) is not the step's: it is not adopted.

Nothing in the step is replaced: the tape, the loss, the optimizer and the
update are the step's own, so training is bit for bit what it is without the
observation (tests/keras/test_fit_neutral.py).

The class's `__enter__`, `__exit__` and `gradient` are swapped only while some
thread observes (reference counted, so replicas tracing in threads can
overlap), and every other thread or call passes straight through.
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
        #: the first tape the step entered, None until then.
        self.tape: Optional[Any] = None
        self._adopted: Dict[int, Any] = {}

    def adopt(self, tape: Any) -> None:
        """Called right after the step entered a tape (still recording)."""

    def leave(self, tape: Any) -> None:
        """Called right before the step exits an adopted tape."""

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


def _differentiating() -> int:
    """How many gradient() calls run on this thread now (a backward pass in progress)."""
    return getattr(_local, "differentiating", 0)


def _enter(tape: Any) -> Any:
    result = _originals["__enter__"](tape)
    observation = _current()
    # A tape entered while a gradient() call runs is TensorFlow's own (the gradient of a fused batch norm's
    # gradient opens one, as does tf.recompute_grad), not one of the step's: not adopted, its calls pass through.
    if (
        observation is not None
        and not _differentiating()
        and id(tape) not in observation._adopted
        and not getattr(tape, "_layergrad_own", False)
    ):
        observation._adopted[id(tape)] = tape
        if observation.tape is None:
            observation.tape = tape
        observation.adopt(tape)
    return result


def _exit(tape: Any, *exc: Any) -> Any:
    observation = _current()
    if observation is not None and observation._adopted.get(id(tape)) is tape:
        observation.leave(tape)
    return _originals["__exit__"](tape, *exc)


def _gradient(tape: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
    real = _originals["gradient"]
    observation = _current()
    if observation is None:
        return real(tape, target, sources, *args, **kwargs)
    _local.differentiating = _differentiating() + 1
    try:
        if observation._adopted.get(id(tape)) is not tape:
            return real(tape, target, sources, *args, **kwargs)
        return observation.answer(tape, target, sources, args, kwargs, real)
    finally:
        _local.differentiating -= 1


def _install() -> None:
    global _users
    with _lock:
        if _users == 0:
            cls = tf.GradientTape
            _originals["__enter__"] = cls.__dict__["__enter__"]
            _originals["__exit__"] = cls.__dict__["__exit__"]
            _originals["gradient"] = cls.__dict__["gradient"]
            cls.__enter__ = _enter
            cls.__exit__ = _exit
            cls.gradient = _gradient
        _users += 1


def _uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            cls = tf.GradientTape
            cls.__enter__ = _originals.pop("__enter__")
            cls.__exit__ = _originals.pop("__exit__")
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
