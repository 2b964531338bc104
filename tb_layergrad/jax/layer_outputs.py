"""The chosen layers' `call`, observed: a per-instance subclass whose `call` passes each output through the trace.

Why a subclass of the instance's own class and not an attribute on the instance: Keras' JAX layers may run
their call under `jax.checkpoint` (rematerialisation), where a bound function stored on the instance keeps
values of the inner trace alive past it; a class attribute is looked up afresh. The subclass also puts the
observation after the checkpoint (`rematerialized_call`): inside it, the value and cotangent would belong to
the checkpoint's own trace and leak out of it. Only while a `StepTrace` is
open (the train step being traced) is anything observed: evaluation and prediction call the real `call`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from tb_layergrad.capturing.layer_tree import LayerNode, trainable_weights
from tb_layergrad.capturing.per_example_rules import couples_examples, rule_for
from tb_layergrad.jax.example_norms import Call
from tb_layergrad.jax.step_trace import StepTrace


class LayerOutputs:
    """Installs the observing subclass on each chosen layer; `restore` puts every class back.

    `per_example`: also keep, for the layers with a rule (`capturing.per_example_rules`), each call's inputs
    (`example_norms.Call`), and note every call that couples the examples, on the chosen layers and on `watch`
    (BatchNormalization layers not chosen: they couple the examples all the same).
    """

    def __init__(
        self,
        nodes: Sequence[LayerNode],
        current: Callable[[], Optional[StepTrace]],
        per_example: bool = False,
        watch: Sequence[LayerNode] = (),
    ):
        self._restores: List[Callable[[], None]] = []
        self.rules: dict = {}  # layer position -> (rule, why none), for the chosen layers with trainable weights
        for node in nodes:
            if per_example and trainable_weights(node.layer):
                self.rules[node.index] = rule_for(node.layer)
            self._install(node, current, per_example, observe_outputs=True)
        for node in watch if per_example else ():
            self._install(node, current, per_example, observe_outputs=False)

    def _install(
        self, node: LayerNode, current: Callable[[], Optional[StepTrace]], per_example: bool, observe_outputs: bool
    ) -> None:
        layer = node.layer
        cls = type(layer)
        original = cls.call
        keep_inputs = per_example and self.rules.get(node.index, (None, None))[0] is not None

        def observe(out: Any, trace: StepTrace) -> Tuple[Any, Optional[str]]:
            """`out` through the trace, and the key of its one output (None for a structure)."""
            number = trace.call_number(node.path)
            base = node.path if number == 1 else f"{node.path}#{number}"
            leaves, treedef = jax.tree_util.tree_flatten_with_path(out)
            single = len(leaves) == 1 and not leaves[0][0]
            observed = []
            for path, leaf in leaves:
                if not _differentiable(leaf):
                    observed.append(leaf)
                    continue
                key = base if single else f"{base}[{_sub_key(path)}]"
                observed.append(trace.observe(key, node.index, leaf))
            return jax.tree_util.tree_unflatten(treedef, observed), (base if single else None)

        def run(self: Any, args: Any, kwargs: Any, fn: Callable[..., Any]) -> Any:
            trace = current()
            if trace is None:
                return fn(*args, **kwargs)
            kept = None
            if keep_inputs:
                leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
                pairs = [trace.keep(leaf) for leaf in leaves]
                args, kwargs = jax.tree_util.tree_unflatten(treedef, [x for x, _ in pairs])
                kept = (treedef, [seen for _, seen in pairs])
            out = fn(*args, **kwargs)
            key = None
            if observe_outputs:
                out, key = observe(out, trace)
            if per_example and couples_examples(self, args, kwargs):
                trace.coupled.append((len(trace.seen), node.path))
            if kept is not None:
                seq = trace.seen[key].seq if key in trace.seen else len(trace.seen)  # its output's position
                trace.calls.append(Call(node, key, seq, kept[0], kept[1], functools.partial(original, self)))
            return out

        @functools.wraps(original)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return run(self, args, kwargs, functools.partial(original, self))

        attributes = {"call": call, "__module__": cls.__module__}
        if hasattr(cls, "rematerialized_call"):
            base_remat = cls.rematerialized_call

            def rematerialized_call(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
                """Rematerialised (`keras.RematScope`): the layer's own call goes under `jax.checkpoint`, the
                observation after it, where its value and cotangent are the step's, not the checkpoint's."""
                if getattr(fn, "__func__", None) is not call:
                    return base_remat(self, fn, *args, **kwargs)
                inner = base_remat(self, functools.partial(original, self), *args, **kwargs)
                return lambda *a, **k: run(self, a, k, inner)

            attributes["rematerialized_call"] = rematerialized_call
        layer.__class__ = type(cls.__name__, (cls,), attributes)

        def restore() -> None:
            layer.__class__ = cls

        self._restores.append(restore)

    def restore(self) -> None:
        restores, self._restores = self._restores, []
        for restore in reversed(restores):
            restore()


def _differentiable(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


def _sub_key(path: Sequence[Any]) -> str:
    """`0`, `state][0`: the sub-keys of a structured output, as TensorFlow's capture names them."""
    parts = []
    for entry in path:
        for attr in ("idx", "key", "name"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
    return "][".join(parts)
