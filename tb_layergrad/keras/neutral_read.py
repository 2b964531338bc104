"""Internal: read a tensor of the step's graph for a record without changing how grappler rewrites the step.

Why. In graph mode TensorFlow's graph optimizer (grappler) rewrites the step
before it runs, and some of its arithmetic rewrites depend on how many ops
read a tensor: an `Add`/`AddN` is merged into the `Add` that reads it
(AddOpsRewrite), and a `Mul` into the `Mul` that reads it, in another order
(MinimizeBroadcasts: `(g * c) * lr` becomes `g * (c * lr)`), only where that
op is its one reader. A weight gradient whose last op is a `Mul` (a kernel
scaled by a constant in the forward pass, as an equalized learning rate
does) is read by the optimizer's multiply by the learning rate; reading it
for a record too stops the rewrite, and the update changes in its last bits.

So where a tensor could be merged into a reader (its op is one of those and
a reader, seen through identities, is of the same kind, or a function call
whose body may hold one), the record reads a copy: the same ops on the same
inputs, rebuilt down through every such op that only its parent reads, each
copy with a control input from `marker`. Without that control input
grappler's common-subgraph elimination would merge each copy back into its
original (same op, same inputs), which would then have two readers again;
a control input from the tensor itself would not do either, as grappler
never merges an op that drives a control dependency. The same elementwise
op on the same inputs gives the same bits: the record is the tensor as the
step's graph defines it. Every other tensor (a `MatMul`, a
`Conv2DBackpropFilter`, a reduction) is read as it is: no rewrite of its
reader depends on how many read it. docs/DESIGN.md#neutrality.
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Optional

import tensorflow as tf

_ADDS = frozenset({"Add", "AddV2", "AddN"})
_MULS = frozenset({"Mul"})
# Ops grappler removes (their readers then read the tensor itself), and ops that only read a tensor's shape
# (grappler does not count those as readers).
_IDENTITIES = frozenset({"Identity", "IdentityN", "Snapshot"})
_SHAPE_READERS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def neutral_read(tensor: Any, marker: tf.Tensor) -> Any:
    """`tensor`, or where reading it could change a rewrite of the step, an equal copy (module docstring).

    `marker`: a tensor of the step that its backward pass does not depend on (the batch count).
    Eagerly nothing is rewritten: the tensor itself.
    """
    if not isinstance(tensor, tf.Tensor) or tf.executing_eagerly() or not _mergeable(tensor):
        return tensor
    with tf.name_scope("layergrad_read"):
        return _rebuilt(tensor, marker, {})


def _kind(op_type: str) -> Optional[FrozenSet[str]]:
    return _ADDS if op_type in _ADDS else _MULS if op_type in _MULS else None


def _readers(tensor: tf.Tensor) -> List[Any]:
    """The ops that read `tensor`, each once, seen through identities."""
    found: Dict[str, Any] = {}
    for op in tensor.consumers():
        if op.type in _IDENTITIES:
            for i, x in enumerate(op.inputs):
                if x.name == tensor.name:
                    found.update((r.name, r) for r in _readers(op.outputs[i]))
        else:
            found[op.name] = op
    return list(found.values())


def _mergeable(tensor: tf.Tensor) -> bool:
    kind = _kind(tensor.op.type)
    return kind is not None and any(op.type in kind or op.type in _CALLS for op in _readers(tensor))


def _read_by_its_parent_only(tensor: tf.Tensor) -> bool:
    readers = {op.name for op in tensor.consumers() if op.type not in _SHAPE_READERS}
    return _kind(tensor.op.type) is not None and len(readers) == 1


def _rebuilt(tensor: tf.Tensor, marker: tf.Tensor, done: Dict[str, tf.Tensor]) -> tf.Tensor:
    if tensor.name in done:
        return done[tensor.name]
    op = tensor.op
    inputs = [_rebuilt(x, marker, done) if _read_by_its_parent_only(x) else x for x in op.inputs]
    with tf.device(op.device), tf.control_dependencies([marker]):
        if op.type == "AddN":
            copy = tf.raw_ops.AddN(inputs=inputs)
        else:
            copy = getattr(tf.raw_ops, op.type)(x=inputs[0], y=inputs[1])
    done[tensor.name] = copy
    return copy
