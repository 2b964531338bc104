"""What `Capture` records: one layer call's outputs, and the entries a `GradientMap` is made of.

Kept apart from `layer_capture` (which hooks the layers and makes the one gradient call) so that each
reads on its own: here is only how an output is keyed, flattened and counted.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.gradient_map import Entry
from tb_layergrad.capturing.layer_tree import LayerNode, LayerTree

try:  # private, but the only way to ask "does any active tape record this tensor?"
    from tensorflow.python.eager.record import should_record_backprop as is_recorded
except ImportError:  # pragma: no cover - a TF without it: assume recorded, never warn

    def is_recorded(tensors: Any) -> bool:
        return True


class Record:
    """One recorded output of one layer call: its layer, its call number in the pass, its sub-key in the
    layer's output structure, and on which tapes it was watched."""

    __slots__ = ("node", "call", "sub", "tensor", "recorded", "seq", "tapes")

    def __init__(
        self,
        node: LayerNode,
        call: int,
        sub: Optional[str],
        tensor: Any,
        recorded: bool = True,
        seq: int = 0,
        tapes: tuple = (),
    ):
        self.node, self.call, self.sub, self.tensor = node, call, sub, tensor
        self.recorded = recorded
        self.seq = seq  # position in call-completion order (per-example norms: what ran before a coupling call)
        self.tapes = tapes  # ids of the tapes it was watched on

    def renumbered(self, call: int) -> "Record":
        return Record(self.node, call, self.sub, self.tensor, self.recorded, self.seq, self.tapes)

    @property
    def key(self) -> str:
        key = self.node.path if self.call == 1 else f"{self.node.path}#{self.call}"
        return key if self.sub is None else f"{key}[{self.sub}]"


def is_differentiable(t: Any) -> bool:
    return isinstance(t, tf.Tensor) and (t.dtype.is_floating or t.dtype.is_complex)


def flatten_output(out: Any, prefix: Optional[str] = None) -> List[tuple]:
    """[(sub-key or None, tensor)] for a layer's output structure.

    A single tensor has no sub-key; a tuple/list output is keyed by position
    and a dict by key, nested levels joined: `0`, `1`, `state][0`, so that the
    full key reads `path[0]`, `path[state][0]`.
    """
    if isinstance(out, tf.Tensor):
        return [(prefix, out)]
    if isinstance(out, dict):
        items = [(str(k), v) for k, v in sorted(out.items(), key=lambda kv: str(kv[0]))]
    elif isinstance(out, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(out)]
    else:
        return []
    flat: List[tuple] = []
    for key, value in items:
        flat.extend(flatten_output(value, key if prefix is None else f"{prefix}][{key}"))
    return flat


def static_elements(t: Any) -> int:
    n = t.shape.num_elements() if t.shape.rank is not None else None
    return -1 if n is None else int(n)


def weight_entries(
    tree: LayerTree,
    nodes: Sequence[LayerNode],
    variables: List[Any],
    grads: List[Any],
    owners_out: Optional[List[tuple]] = None,
) -> Dict[str, Entry]:
    """Entries of the weights of the chosen layers (`nodes`) and of the layers inside them; `owners_out` gets
    (path, variable, owner, gradient) of each, for the per-example norms."""
    owners = tree.variable_paths()
    chosen = {node.index for node in nodes}
    chosen_layers = list(nodes)
    entries: Dict[str, Entry] = {}
    for var, g in zip(variables, grads):
        path, owner = owners.get(id(var), (getattr(var, "path", var.name), tree.root))
        if owner.index not in chosen and not any(path.startswith(n.path + "/") for n in chosen_layers):
            continue
        entries[path] = Entry(
            g,
            metadata.SOURCE_WEIGHT,
            owner.index,
            static_elements(var),
            var.dtype.name if hasattr(var.dtype, "name") else str(var.dtype),
        )
        if owners_out is not None:
            owners_out.append((path, var, owner, g))
    return entries


class LayerOutputs(dict):
    """`Capture.activations()`: layer path -> forward value, in model order; `indexes` keeps each layer's position.

    A dict, so that it passes through `tf.nest` (a `tf.function` may return it);
    rebuilt there, it loses `indexes` (the positions are then the dict's order).
    """

    def __init__(self, values: Optional[Dict[str, Any]] = None, indexes: Optional[Dict[str, int]] = None):
        super().__init__(values or {})
        self.indexes = dict(indexes or {})
