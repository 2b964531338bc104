"""Hooks on a model's layers for ONE forward pass: installed on entry, removed on exit.

Why instance attributes: a layer's `call` (or an RNN's inner loop) replaced on
the instance is what Keras calls in every mode (eager, `tf.function`, XLA,
nested models), needs no subclassing, and leaves nothing behind once removed.
`Capture` (layer outputs) and `TimestepProbe` (per-timestep states) are the
two kinds of hooks.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

Saved = Tuple[Any, str, bool, Any]  # (object, attribute, had an instance attribute, its previous value)


def set_instance_attribute(obj: Any, attr: str, value: Any) -> Saved:
    """Set `obj.attr = value` on the instance itself (past Keras' tracking); returns what restores it."""
    saved = (obj, attr, attr in obj.__dict__, obj.__dict__.get(attr))
    object.__setattr__(obj, attr, value)
    return saved


def restore_instance_attribute(saved: Saved) -> None:
    obj, attr, had, previous = saved
    if had:
        object.__setattr__(obj, attr, previous)
    else:
        obj.__dict__.pop(attr, None)


class LayerHooks:
    """The shared life of a set of hooks: one forward pass, tensors of that pass only, extra tapes."""

    _what = "capture"  # for the message when entered twice

    def __init__(self, model: Any, nodes: Sequence[Any], tape: Any = None):
        self.model = model
        self.nodes = list(nodes)
        self._tapes: List[Any] = [tape] if tape is not None else []
        self._calls: Dict[int, int] = {}  # layer index -> calls in this pass
        self._lock = threading.Lock()
        self._installed: List[Saved] = []
        self._active = False
        self._graph: Optional[Any] = None

    def __enter__(self) -> "LayerHooks":
        if self._active:
            raise RuntimeError(f"this {self._what} is already active; create a new one per forward pass")
        self._calls.clear()
        self._start_pass()
        self._graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        for node in self.nodes:
            self._install(node)
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._installed:
            restore_instance_attribute(self._installed.pop())
        self._active = False

    def watch_with(self, tape: Any) -> None:
        """Also watch on `tape` (a tape created after the hooks, e.g. a second tape for another target)."""
        self._tapes.append(tape)

    def unwatch(self, tape: Any) -> None:
        """Watch no more on `tape` (the step left it)."""
        self._tapes = [t for t in self._tapes if t is not tape]

    def _start_pass(self) -> None:
        """Forget the previous pass's tensors."""

    def _install(self, node: Any) -> None:
        raise NotImplementedError

    def _hook(self, obj: Any, attr: str, value: Any) -> None:
        self._installed.append(set_instance_attribute(obj, attr, value))

    def _next_call(self, node: Any) -> int:
        """The number of this call of `node`'s layer in the pass (a shared layer is called more than once)."""
        with self._lock:
            call = self._calls.get(node.index, 0) + 1
            self._calls[node.index] = call
            return call

    def _belongs_to_this_pass(self, t: Any) -> bool:
        """False for tensors of Keras' build-time scratch graphs (shape inference)."""
        if self._graph is None:
            return hasattr(t, "numpy") and tf.executing_eagerly()
        return getattr(t, "graph", None) is self._graph
