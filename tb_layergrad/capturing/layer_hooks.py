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
Hook = Tuple[Any, str, Any]  # (object, attribute, the hook), as `hook` set it


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


class _PerThread:
    """The hooks of one (object, attribute) pair, per thread: what `LayerHooks` installs as the attribute.

    Why: MirroredStrategy traces its replicas' steps in threads that take turns at
    each cross-replica call, over the same layer objects. A hook that every thread
    saw would record another replica's outputs, and hooks set and removed by
    interleaved threads would restore each other's. So the attribute is one
    dispatching function, installed while any thread hooks it: a call goes to the
    calling thread's innermost hook (which calls the attribute it read, this
    function again, reaching the next one, then the original), or straight to the
    original on a thread that set none.
    """

    def __init__(self, obj: Any, attr: str):
        self.original = getattr(obj, attr)
        self.stacks: Dict[int, List[Any]] = {}
        local = threading.local()  # the depth of the hook chain running on this thread

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            stack = self.stacks.get(threading.get_ident(), [])
            outer = getattr(local, "depth", None)
            depth = len(stack) if outer is None else outer
            local.depth = depth - 1 if depth else None
            try:
                return stack[depth - 1](*args, **kwargs) if depth else self.original(*args, **kwargs)
            finally:
                local.depth = outer

        dispatch.__wrapped__ = self.original  # keeps inspect.signature() truthful
        dispatch._layergrad_per_thread = self
        self.saved = set_instance_attribute(obj, attr, dispatch)


_per_thread_lock = threading.Lock()


class LayerHooks:
    """The shared life of a set of hooks: one forward pass, tensors of that pass only, extra tapes."""

    _what = "capture"  # for the message when entered twice

    def __init__(self, model: Any, nodes: Sequence[Any], tape: Any = None):
        self.model = model
        self.nodes = list(nodes)
        self._tapes: List[Any] = [tape] if tape is not None else []
        self._calls: Dict[int, int] = {}  # layer index -> calls in this pass
        self._lock = threading.Lock()
        self._installed: List[Hook] = []
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
            unhook(self._installed.pop())
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
        self._installed.append(hook(obj, attr, value))

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


def hook(obj: Any, attr: str, value: Any) -> Hook:
    """`obj.attr` is `value` for the calling thread (`_PerThread`) until `unhook`; others see what they saw."""
    with _per_thread_lock:
        current = obj.__dict__.get(attr)
        hooks = getattr(current, "_layergrad_per_thread", None) or _PerThread(obj, attr)
        hooks.stacks.setdefault(threading.get_ident(), []).append(value)
    return (obj, attr, value)


def unhook(installed: Hook) -> None:
    """Undo one `hook` (on the thread that set it); the attribute is restored when no thread hooks it."""
    obj, attr, value = installed
    with _per_thread_lock:
        hooks = getattr(obj.__dict__.get(attr), "_layergrad_per_thread", None)
        if hooks is None:
            return
        ident = threading.get_ident()
        stack = [v for v in hooks.stacks.get(ident, []) if v is not value]
        if stack:
            hooks.stacks[ident] = stack
        else:
            hooks.stacks.pop(ident, None)
        if not hooks.stacks:
            restore_instance_attribute(hooks.saved)


def layer_base_class(model: Any) -> Optional[type]:
    """The Keras `Layer` class whose `__call__` every layer of `model`'s Keras runs (Keras 3's or tf_keras')."""
    for cls in type(model).__mro__:
        if cls.__name__ == "Layer" and "__call__" in cls.__dict__:
            return cls
    return None


class ClassCallHook:
    """`cls.__call__` sees every call of any of its instances, made on the installing thread, first.

    Why: a layer constructed while the model runs (in its parent's `build` or
    `call`) is not in the tree the hooks were installed from, and is called
    before any hook of its own could be set; eagerly, where the step runs once
    as Python, its first calls are seen only here. `before(layer)` runs before
    each such call. As `_PerThread` for instances: one dispatching `__call__`
    on the class while any thread hooks it, each thread's hooks its own, the
    original restored when the last is removed, in whatever order.
    """

    _dispatchers: Dict[type, Tuple[Any, Dict[int, List[Any]]]] = {}  # cls -> (its __call__, hooks by thread)

    def __init__(self, cls: type, before: Any):
        self.cls, self.before, self.thread = cls, before, threading.get_ident()
        with _per_thread_lock:
            if cls not in self._dispatchers:
                original = cls.__dict__["__call__"]
                stacks: Dict[int, List[Any]] = {}

                # Not converted by AutoGraph: a thread tracing a tf.function meanwhile calls layers through it, and
                # AutoGraph would convert Keras' own __call__ beneath it.
                @tf.autograph.experimental.do_not_convert
                def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 - the class's __call__
                    for before in stacks.get(threading.get_ident(), ()):
                        before(layer)
                    return original(layer, *args, **kwargs)

                __call__.__wrapped__ = original
                self._dispatchers[cls] = (original, stacks)
                type.__setattr__(cls, "__call__", __call__)
            self._dispatchers[cls][1].setdefault(self.thread, []).append(before)

    def remove(self) -> None:
        with _per_thread_lock:
            original, stacks = self._dispatchers.get(self.cls, (None, {}))
            mine = [b for b in stacks.get(self.thread, []) if b is not self.before]
            if mine:
                stacks[self.thread] = mine
            else:
                stacks.pop(self.thread, None)
            if not stacks and original is not None:
                type.__setattr__(self.cls, "__call__", original)
                del self._dispatchers[self.cls]
