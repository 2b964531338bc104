"""Walk a Keras model into a tree of layers with stable, unique paths.

Why not `model.layers` / `layer.output`: subclassed and nested models have no
usable graph of outputs ("has never been called", "not connected to inputs").
The tracked sub-layer tree, however, exists for every kind of model, so paths
are built from it: `root/child/grandchild`, the root's name first. A layer that
is reachable through several parents keeps its first path. Sibling layers that
share a name (possible with explicit names) get a `~2`, `~3` suffix.

Layers that run inside an RNN's loop (the cell and everything under it) are
marked `in_loop`: their outputs live inside a `tf.while_loop` body and cannot
be differentiated from outside it in graph mode.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union


@dataclasses.dataclass(eq=False)
class LayerNode:
    layer: Any
    path: str
    index: int  # pre-order position; the root is 0
    depth: int
    in_loop: bool
    children: List["LayerNode"] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def is_layer(obj: Any) -> bool:
    """Duck-typed: Keras 3 and tf_keras layers both have these."""
    # `trainable_weights` looked up on the class: tf_keras raises reading it on a model with a part not built yet
    return hasattr(obj, "call") and hasattr(type(obj), "trainable_weights") and hasattr(obj, "name")


def _is_rnn(layer: Any) -> bool:
    return any(cls.__name__ == "RNN" for cls in type(layer).__mro__) and is_layer(getattr(layer, "cell", None))


def _is_input_layer(layer: Any) -> bool:
    """Input placeholders are never called in a forward pass: nothing to capture."""
    return type(layer).__name__ == "InputLayer"


def trainable_weights(layer: Any) -> List[Any]:
    """`layer.trainable_weights`; where tf_keras refuses to read them (a `Sequential` without `Input` that its
    first call has not built yet, or a model holding one), those of its parts that exist so far."""
    try:
        return list(layer.trainable_weights)
    except ValueError:
        found: Dict[int, Any] = {}
        for child in direct_children(layer):
            for var in trainable_weights(child):
                found.setdefault(id(var), var)
        own = [v for v in getattr(layer, "_trainable_weights", []) if id(v) not in found]
        return own + list(found.values())


def direct_children(layer: Any) -> List[Any]:
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=False))
    return list(getattr(layer, "layers", []))


class LayerTree:
    """All layers of a model, in pre-order (which is model order for Sequential/Functional)."""

    def __init__(self, model: Any):
        if not is_layer(model):
            raise TypeError(f"expected a Keras model or layer, got {type(model).__name__}")
        self.model = model
        self.nodes: List[LayerNode] = []
        self._by_id: Dict[int, LayerNode] = {}
        self.root = self._visit(model, model.name, 0, False)

    def _visit(self, layer: Any, path: str, depth: int, in_loop: bool) -> LayerNode:
        node = LayerNode(layer, path, len(self.nodes), depth, in_loop)
        self.nodes.append(node)
        self._by_id[id(layer)] = node
        loop_children = {id(layer.cell)} if _is_rnn(layer) else set()
        used: Dict[str, int] = {}
        for child in direct_children(layer):
            if id(child) in self._by_id:
                continue
            name = child.name
            used[name] = used.get(name, 0) + 1
            if used[name] > 1:
                name = f"{name}~{used[name]}"
            node.children.append(self._visit(child, f"{path}/{name}", depth + 1, in_loop or id(child) in loop_children))
        return node

    def node_of(self, layer: Any) -> Optional[LayerNode]:
        return self._by_id.get(id(layer))

    @property
    def layers(self) -> List[LayerNode]:
        """Every layer below the root (the root model itself is not a 'layer' here)."""
        return self.nodes[1:]

    def select(self, spec: Union[None, str, Any, Sequence[Union[str, Any]]]) -> List[LayerNode]:
        """Resolve the user's `layers=` argument to nodes, in model order.

        None: every layer that can be captured. Strings match a full path, a
        layer name, or a glob pattern over either. Layer objects match
        themselves. Anything unmatched is an error that lists what exists.
        """
        if spec is None:
            return [n for n in self._candidates() if not n.in_loop]
        specs: Iterable[Any] = [spec] if isinstance(spec, str) or is_layer(spec) else list(spec)
        chosen: Dict[int, LayerNode] = {}
        for item in specs:
            for node in self._match(item):
                if node.in_loop:
                    raise ValueError(
                        f"layer {node.path!r} runs inside an RNN's loop (it is, or is inside, a cell): its "
                        "per-call outputs cannot be differentiated from outside the loop. Capture the RNN "
                        "layer itself, or use per-timestep gradients (timesteps=True)."
                    )
                chosen[node.index] = node
        return [chosen[i] for i in sorted(chosen)]

    def _candidates(self) -> List[LayerNode]:
        return [n for n in self.layers if not _is_input_layer(n.layer)]

    def _match(self, item: Any) -> List[LayerNode]:
        if is_layer(item):
            node = self.node_of(item)
            if node is None or node is self.root:
                raise ValueError(f"layer {item.name!r} is not part of model {self.model.name!r}")
            return [node]
        if not isinstance(item, str):
            raise TypeError(f"layers must be names, glob patterns or Layer objects, got {type(item).__name__}")
        candidates = self._candidates()
        exact = [n for n in candidates if item in (n.path, n.name)]
        if exact:
            return exact
        if any(ch in item for ch in "*?["):
            globbed = [n for n in candidates if fnmatch.fnmatchcase(n.path, item) or fnmatch.fnmatchcase(n.name, item)]
            if globbed:
                return globbed
        names = [n.path for n in candidates]
        close = difflib.get_close_matches(item, names + [n.name for n in candidates], n=5, cutoff=0.5)
        rest = [p for p in names if p not in close]
        listing = ", ".join(close + rest)
        raise ValueError(f"no layer matches {item!r} in model {self.model.name!r}. Layers: {listing}")

    def variable_paths(self) -> Dict[int, tuple]:
        """id(variable) -> (path, owning node), the deepest layer that owns it claiming it."""
        owner: Dict[int, tuple] = {}
        for node in sorted(self.nodes, key=lambda n: -n.depth):
            taken: Dict[str, int] = {}
            for var in trainable_weights(node.layer):
                if id(var) in owner:
                    continue
                short = _short_variable_name(var)
                taken[short] = taken.get(short, 0) + 1
                if taken[short] > 1:
                    short = f"{short}~{taken[short]}"
                owner[id(var)] = (f"{node.path}/{short}", node)
        return owner


def _short_variable_name(var: Any) -> str:
    name = getattr(var, "name", "variable")
    return name.split(":")[0].rsplit("/", 1)[-1]
