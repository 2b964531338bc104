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
reader depends on how many read it.

Holding a tensor matters at run time too. TensorFlow's `AddN` kernel sums
into the buffer of the first input that no other op still holds and moves
that input to the front of its sum; with 3 or more terms (a layer applied
several times, or a chain of adds AddOpsRewrite merged into one `AddN`)
the order of the additions, so the last bits, then depend on which inputs
other readers still hold. So a tensor the records would hold (a copy's
input, or the tensor read as it is) is rebuilt too where it is a term of
such a sum, seen through ops whose output may share its input's buffer
(`Reshape` and the like): the records then hold only what the step's own
ops other than sums read, as those ops read it (a `MatMul`'s operands).
docs/DESIGN.md#neutrality.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, List, Optional, TypeVar

import tensorflow as tf

_ADDS = frozenset({"Add", "AddV2", "AddN"})
_MULS = frozenset({"Mul"})
# Ops grappler removes (their readers then read the tensor itself), and ops that only read a tensor's shape
# (grappler does not count those as readers).
_IDENTITIES = frozenset({"Identity", "IdentityN", "Snapshot"})
_SHAPE_READERS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# Ops whose output TensorFlow may make a view of their input's buffer.
_ALIASES = frozenset({"Reshape", "Squeeze", "ExpandDims", "StopGradient", "EnsureShape", "Bitcast"})
# Ops never copied: control flow and placeholders (their copies would not compute the same value).
_NOT_COPIED = frozenset({"Placeholder", "Switch", "Merge", "Enter", "Exit", "NextIteration", "Const", "If", "While"})


def neutral_read(tensor: Any, marker: tf.Tensor) -> Any:
    """`tensor`, or where reading it could change a rewrite of the step, an equal copy (module docstring).

    `marker`: a tensor of the step that its backward pass does not depend on (the batch count).
    Eagerly nothing is rewritten: the tensor itself.
    """
    if not isinstance(tensor, tf.Tensor) or tf.executing_eagerly():
        return tensor
    if not _mergeable(tensor) and not (_copyable(tensor.op) and _summed_with_others(tensor)):
        return tensor
    with tf.name_scope("layergrad_read"):
        return _rebuilt(tensor, marker, {})


T = TypeVar("T")

_CONDS = frozenset({"If", "StatelessIf"})


def neutral_inputs(build: Callable[[], T], marker: tf.Tensor) -> T:
    """`build()`, a `tf.cond` whose branch reads tensors of the step, each of those read through `neutral_read`.

    Why: a condition reads the outer tensors its branch uses through its own
    inputs (lowered, a `Switch` each), and a `Switch` is a reader that is not a
    shape read. A backward pass in the branch reads forward tensors the step
    itself reads for their shape only (an add's operands, with batches of
    unknown size); read by the condition too, a BatchNorm's `x * scale +
    offset` is no longer merged with a residual add that follows it
    (AddOpsRewrite), and the forward pass changes in its last bits.
    Which tensors a branch reads is known once it is built: its condition's
    inputs are then replaced, each by `neutral_read` of itself.
    """
    if tf.executing_eagerly():
        return build()
    graph = tf.compat.v1.get_default_graph()
    known = {op.name for op in graph.get_operations()}
    out = build()
    for op in graph.get_operations():
        # Re-pointing a built op's input has no public API; a TensorFlow without this one keeps the branch as
        # built: it records the same values, the step then merely not guaranteed bitwise (docs/DESIGN.md).
        update_input = getattr(op, "_update_input", None)
        if op.type in _CONDS and op.name not in known and update_input is not None:
            for i, x in enumerate(list(op.inputs)[1:], start=1):  # input 0: the predicate
                read = neutral_read(x, marker)
                if read is not x:
                    update_input(i, read)
    return out


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


def _shares_buffer(op: Any) -> bool:
    """An op whose output may be its input's buffer (TensorFlow forwards it): a reader of one holds the other."""
    return op.type in _IDENTITIES or op.type in _ALIASES


def _summed_with_others(tensor: tf.Tensor) -> bool:
    """Whether `tensor` (or a tensor sharing its buffer) is read by a sum that can take 3 or more terms at run time:
    an `AddN` of 3 or more, or an add in a chain of adds (AddOpsRewrite merges the chain into one `AddN`)."""
    for op in tensor.consumers():
        if _shares_buffer(op):
            if any(_summed_with_others(out) for out in op.outputs):
                return True
        elif op.type in _ADDS and (
            len(op.inputs) > 2
            or any(x.op.type in _ADDS for x in op.inputs)
            or any(r.type in _ADDS for out in op.outputs for r in _readers(out))
        ):
            return True
    return False


def _rebuilt(tensor: tf.Tensor, marker: tf.Tensor, done: Dict[str, tf.Tensor]) -> tf.Tensor:
    """A copy of `tensor`'s op with a control input from `marker`; its inputs rebuilt too where the copy would
    otherwise hold a buffer that the step's own sums read (module docstring)."""
    if tensor.name in done:
        return done[tensor.name]
    op = tensor.op
    inputs = []
    for x in op.inputs:
        if _read_by_its_parent_only(x) or (_copyable(x.op) and (_shares_buffer(op) or _summed_with_others(x))):
            inputs.append(_rebuilt(x, marker, done))
        else:
            inputs.append(x)
    with tf.device(op.device), tf.control_dependencies([marker]):
        copy = op.graph.create_op(
            op.type,
            inputs,
            dtypes=[out.dtype for out in op.outputs],
            attrs={k: v for k, v in op.node_def.attr.items() if not k.startswith("_")},
            op_def=op.op_def,
            name=op.type,
        )
    for original, out in zip(op.outputs, copy.outputs):
        done[original.name] = out
    return done[tensor.name]


def _copyable(op: Any) -> bool:
    """An op whose copy computes the same bits from the same inputs: stateless, outside control flow."""
    return not op.op_def.is_stateful and op.type not in _NOT_COPIED and not op.control_inputs
