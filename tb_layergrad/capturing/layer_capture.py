"""`capture(model)`: record layer outputs during a forward pass, then differentiate.

How it works: entering the context stores a wrapper as the *instance*
attribute `call` of each chosen layer (set with `object.__setattr__`, which
bypasses Keras' attribute tracking). `Layer.__call__` looks up `self.call`, so
the wrapper is reached for Sequential, Functional, subclassed and nested models
alike, and nothing depends on `layer.output`. The wrapper returns the layer's
outputs untouched (no op is added to the forward pass) and, when it knows the
tape, `tape.watch`es them. `gradients()` then makes ONE `tape.gradient` call
for (trainable variables, recorded outputs): in eager mode and `tf.function`
the weight gradients are the very ones a plain step would compute, bit for
bit. Under `jit_compile=True` the output gradients become outputs of the XLA
program, which may fuse (and so order) the weight gradients' reductions
differently: equal to within float32 rounding of the same math
(docs/DESIGN.md, "XLA neutrality"). Leaving the context deletes the instance
attributes, which restores the class's `call`.

With `per_example=True` the same single call also differentiates, for the layers that have a
per-example rule, the tensor δ is taken at (the pre-activation, seen by replacing the layer's
`activation` attribute with an observer that calls it unchanged); `per_example_pass` turns the
results into each example's own gradient norms (docs/PER_EXAMPLE.md).

Why pass `tape=`: TensorFlow offers no way to watch a tensor on "the active
tape", and an output that nothing trainable feeds (a layer before the first
weight) is only recorded if it is watched. Without `tape=`, such outputs may
report no gradient; with it, every output is exact.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.gradient_map import Entry, GradientMap
from tb_layergrad.capturing.layer_hooks import LayerHooks
from tb_layergrad.capturing.layer_tree import LayerNode, LayerTree
from tb_layergrad.capturing.per_example_map import PerExampleNorms
from tb_layergrad.capturing.per_example_pass import PerExamplePass

LayerSpec = Union[None, str, Any, Sequence[Union[str, Any]]]


try:  # private, but the only way to ask "does any active tape record this tensor?"
    from tensorflow.python.eager.record import should_record_backprop as _recorded
except ImportError:  # pragma: no cover - a TF without it: assume recorded, never warn

    def _recorded(tensors: Any) -> bool:
        return True


class _Record:
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

    def renumbered(self, call: int) -> "_Record":
        return _Record(self.node, call, self.sub, self.tensor, self.recorded, self.seq, self.tapes)

    @property
    def key(self) -> str:
        key = self.node.path if self.call == 1 else f"{self.node.path}#{self.call}"
        return key if self.sub is None else f"{key}[{self.sub}]"


def _is_differentiable(t: Any) -> bool:
    return isinstance(t, tf.Tensor) and (t.dtype.is_floating or t.dtype.is_complex)


def _flatten_output(out: Any, prefix: Optional[str] = None) -> List[tuple]:
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
        flat.extend(_flatten_output(value, key if prefix is None else f"{prefix}][{key}"))
    return flat


def _static_elements(t: Any) -> int:
    n = t.shape.num_elements() if t.shape.rank is not None else None
    return -1 if n is None else int(n)


class Capture(LayerHooks):
    """Context manager returned by `capture()`; see the module docstring."""

    def __init__(
        self,
        model: Any,
        layers: LayerSpec = None,
        weights: bool = False,
        tape: Any = None,
        activations: bool = False,
        per_example: bool = False,
    ):
        self.tree = LayerTree(model)
        super().__init__(model, self.tree.select(layers), tape)
        self.weights = bool(weights)
        #: Per-example bookkeeping (`per_example=True`), else None: then nothing of it runs.
        self._per_example: Optional[PerExamplePass] = PerExamplePass(self.nodes, self.weights) if per_example else None
        # The last gradients() result with its tape and target: per_example_norms() reuses it (one tape call).
        self._last: Optional[tuple] = None
        #: Do `gradients()` results carry the layer outputs (`GradientMap.activations`), for the summary to write?
        self.with_activations = bool(activations)
        self._records: List[_Record] = []
        # id -> the tape itself: held, so that a freed wrapper's id, reused by a new object, is no false match.
        self._used_tapes: Dict[int, Any] = {}

    def _start_pass(self) -> None:
        self._records.clear()
        self._used_tapes.clear()
        self._last = None
        if self._per_example is not None:
            self._per_example.reset()

    def __enter__(self) -> "Capture":
        super().__enter__()
        if self._per_example is not None:  # a BatchNormalization not chosen in layers= still couples the examples
            chosen = {n.index for n in self.nodes}
            for node in self.tree.layers:
                if node.index not in chosen and not node.in_loop and "BatchNormalization" in type(node.layer).__name__:
                    self._install_coupling_watch(node)
        return self

    def _install(self, node: LayerNode) -> None:
        layer = node.layer
        original = layer.call
        per_example = self._per_example
        observer = per_example.observer_for(node) if per_example is not None else None
        if observer is not None:
            self._hook(layer, "activation", observer)

        def call_and_record(*args: Any, **kwargs: Any) -> Any:
            frame = observer.open() if observer is not None else None
            out = None
            try:
                out = original(*args, **kwargs)
            finally:
                preactivation = observer.close(frame, out) if observer is not None else None
            seq = self._record(node, out)
            if per_example is not None and seq is not None:
                per_example.observe(node, seq, args, kwargs, out, preactivation, len(self._records))
            return out

        call_and_record.__wrapped__ = original  # keeps inspect.signature() truthful
        self._hook(layer, "call", call_and_record)

    def _install_coupling_watch(self, node: LayerNode) -> None:
        original = node.layer.call

        def call_and_note(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if any(self._belongs_to_this_pass(t) for _, t in _flatten_output(out)):
                self._per_example.note_coupling(node, args, kwargs, len(self._records))
            return out

        call_and_note.__wrapped__ = original
        self._hook(node.layer, "call", call_and_note)

    def _record(self, node: LayerNode, out: Any) -> Optional[int]:
        """Record this call's outputs; returns the position of the first one, or None (not of this pass)."""
        tensors = [(s, t) for s, t in _flatten_output(out) if self._belongs_to_this_pass(t)]
        if not tensors:
            return None
        call = self._next_call(node)
        tapes = tuple(id(tape) for tape in self._tapes)
        with self._lock:
            first = len(self._records)
            for sub, t in tensors:
                watched = bool(self._tapes) or not _is_differentiable(t) or bool(_recorded([t]))
                self._records.append(_Record(node, call, sub, t, watched, len(self._records), tapes))
        for tape in self._tapes:
            for _, t in tensors:
                if _is_differentiable(t):
                    tape.watch(t)
        return first

    # -- differentiation -------------------------------------------------------
    @property
    def outputs(self) -> Dict[str, Any]:
        """The recorded layer outputs of this context, by key, in model order."""
        return {r.key: r.tensor for r in self._ordered_records()}

    def activations(self) -> "LayerOutputs":
        """The forward values of the recorded (floating-point) layer outputs, by the same keys as the gradients.

        They are the very tensors the gradients are taken with respect to: the
        activations and the gradients written at one step come from one pass.
        """
        entries = self._activation_entries()
        return LayerOutputs({p: e.gradient for p, e in entries.items()}, {p: e.index for p, e in entries.items()})

    def _activation_entries(self) -> Dict[str, Entry]:
        return {
            r.key: Entry(
                r.tensor, metadata.SOURCE_ACTIVATION, r.node.index, _static_elements(r.tensor), r.tensor.dtype.name
            )
            for r in self._ordered_records()
            if _is_differentiable(r.tensor)
        }

    def _ordered_records(self) -> List[_Record]:
        return sorted(self._records, key=lambda r: (r.node.index, r.call))

    def gradients(self, tape: Any, target: Any, name: str = metadata.DEFAULT_TARGET) -> GradientMap:
        """d target / d (each recorded output), and the weight gradients.

        Args:
          tape: the `tf.GradientTape` the forward pass ran under.
          target: a scalar tensor: the loss, `tf.reduce_sum(model(x))`, one unit...
          name: the target's name in the logs ("loss" by default).

        Returns:
          A GradientMap: path -> gradient (None where the target does not
          depend on that output), weight paths too when `weights=True`, and
          `.variable_gradients` aligned with `model.trainable_variables`.
        """
        target = tf.convert_to_tensor(target)
        if target.shape.rank is None or target.shape.rank != 0:
            raise ValueError(
                f"target must be a scalar, got shape {target.shape}; reduce it first, e.g. "
                "tf.reduce_sum(model(x)[:, 3]) for one output unit summed over the batch"
            )
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"target name must be a non-empty string without '/', got {name!r}")
        if not self._records:
            raise RuntimeError(
                f"no layer output was recorded: model {self.model.name!r} was not called inside "
                "`with capture(...)` (or none of the chosen layers ran)"
            )
        return self._gradients(tape, target, name, self._ordered_records(), self._per_example, warn=True)

    def records_watched_on(self, tape: Any) -> List["_Record"]:
        """The records of this pass watched on `tape`, in model order; None: those no tape watched."""
        return [r for r in self._ordered_records() if (id(tape) in r.tapes if tape is not None else not r.tapes)]

    def tape_gradients(
        self, tape: Any, target: Any, name: str, watched_on: Any, per_example: bool = True
    ) -> GradientMap:
        """`gradients()` of the outputs recorded while `watched_on` watched them (one tape of several in a step).

        A layer called several times under that tape is numbered by its calls under it (`path`, `path#2`),
        whatever ran before; `per_example`: also the per-example norms (`capture(per_example=True)`).
        """
        calls: Dict[tuple, int] = {}  # (layer, its call in the pass) -> its call under this tape
        records = []
        for r in self._ordered_records():
            if id(watched_on) in r.tapes:
                under = sum(1 for node, _ in calls if node == r.node.index) + 1
                number = calls.setdefault((r.node.index, r.call), under)
                records.append(r.renumbered(number))
        return self._gradients(tape, target, name, records, self._per_example if per_example else None, warn=False)

    def _gradients(
        self,
        tape: Any,
        target: Any,
        name: str,
        records: List["_Record"],
        per_example_pass: Optional[PerExamplePass],
        warn: bool,
    ) -> GradientMap:
        target = tf.convert_to_tensor(target)
        persistent = getattr(tape, "_persistent", False)
        if self._used_tapes.get(id(tape)) is tape and not persistent:
            raise RuntimeError(
                "gradients() was already called with this non-persistent tape; a non-persistent "
                "GradientTape computes one set of gradients. Use tf.GradientTape(persistent=True) "
                "for several targets."
            )
        variables = list(self.model.trainable_variables)
        differentiable = [r for r in records if _is_differentiable(r.tensor)]
        sources: tuple = (variables, [r.tensor for r in differentiable])
        if per_example_pass is not None:  # the δ sources ride along in the same single tape call
            sources += (per_example_pass.sources(),)
        try:
            var_grads, out_grads, *delta_grads = tape.gradient(target, sources)
        except RuntimeError as e:
            if "non-persistent" in str(e):
                raise RuntimeError(
                    "this GradientTape was already used to compute gradients; call cap.gradients(tape, ...) "
                    "instead of tape.gradient(...) (its result carries .variable_gradients), or make the "
                    "tape persistent"
                ) from e
            raise
        self._used_tapes[id(tape)] = tape
        grad_of = {id(r): g for r, g in zip(differentiable, out_grads)}
        unsure = [r.key for r in differentiable if grad_of[id(r)] is None and not r.recorded]
        if unsure and warn:
            warnings.warn(
                f"no gradient for {', '.join(unsure)}: nothing trainable feeds these outputs, so no tape "
                "recorded them. Pass the tape to capture(model, tape=tape) to watch them.",
                stacklevel=2,
            )
        entries: Dict[str, Entry] = {}
        for r in records:
            g = grad_of.get(id(r))
            entries[r.key] = Entry(
                g, metadata.SOURCE_OUTPUT, r.node.index, _static_elements(r.tensor), r.tensor.dtype.name
            )
        weight_owners: List[tuple] = []
        if self.weights:
            entries.update(self._weight_entries(variables, var_grads, weight_owners))
        activations = self._activation_entries() if self.with_activations else None
        per_example = None
        if per_example_pass is not None:
            per_example = per_example_pass.norms(
                [(r.key, r.seq, grad_of.get(id(r))) for r in records], weight_owners, delta_grads[0]
            )
        result = GradientMap(
            entries, name, var_grads, activations=activations, target_value=target, per_example=per_example
        )
        self._last = (tape, target, result)
        return result

    def per_example_norms(self, tape: Any, loss: Any, name: str = metadata.DEFAULT_TARGET) -> PerExampleNorms:
        """‖∇ℓ_i‖ for each example i: path (as in `gradients()`) -> a [batch] tensor.

        `loss` must be the batch MEAN of per-example losses, L = (1/B) Σ ℓ_i (Keras' default
        "sum_over_batch_size"): the norms are B times the norms of each example's part of ∇L. With a
        SUM reduction divide them by B; with sample weights w_i and the mean they are ‖w_i ∇ℓ_i‖
        (docs/PER_EXAMPLE.md). A path has None when the target does not depend on it or when there is
        no exact value: then `result.unsupported[path]` says why (no rule for the layer, examples
        coupled by a BatchNormalization in training mode).

        One backward pass serves both: if `gradients(tape, loss)` was already called with this tape
        and this loss, its result's `.per_example` is returned (a non-persistent tape is not asked
        again); otherwise this calls `gradients()` once, and `cap.last_gradients` holds the batch
        gradients (`.variable_gradients`) of that same call.
        """
        if self._per_example is None:
            raise ValueError("per-example norms need capture(model, ..., per_example=True)")
        if self._last is not None and self._last[0] is tape and self._last[1] is loss:
            return self._last[2].per_example
        return self.gradients(tape, loss, name=name).per_example

    @property
    def last_gradients(self) -> Optional[GradientMap]:
        """The result of the last `gradients()` call of this pass (None before it)."""
        return None if self._last is None else self._last[2]

    def _weight_entries(
        self, variables: List[Any], grads: List[Any], owners_out: Optional[List[tuple]] = None
    ) -> Dict[str, Entry]:
        owners = self.tree.variable_paths()
        chosen = {node.index for node in self.nodes}
        chosen_layers = [node for node in self.nodes]
        entries: Dict[str, Entry] = {}
        for var, g in zip(variables, grads):
            path, owner = owners.get(id(var), (getattr(var, "path", var.name), self.tree.root))
            if owner.index not in chosen and not any(path.startswith(n.path + "/") for n in chosen_layers):
                continue
            entries[path] = Entry(
                g,
                metadata.SOURCE_WEIGHT,
                owner.index,
                _static_elements(var),
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


def capture(
    model: Any,
    layers: LayerSpec = None,
    weights: bool = False,
    *,
    tape: Any = None,
    activations: bool = False,
    per_example: bool = False,
) -> Capture:
    """Capture d target / d (layer output) for the chosen layers of `model`.

    Example:
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = loss_fn(y, model(x))
        grads = cap.gradients(tape, loss)
        optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))

    Args:
      model: any Keras model (Sequential, Functional, subclassed) or layer.
      layers: None for every layer, or names / glob patterns / Layer objects.
      weights: also return the gradients of the chosen layers' weights.
      tape: the GradientTape to watch outputs on (recommended; see module doc).
      activations: the `gradients()` result also carries the layer outputs
        (forward values) and `summary.gradients` writes them beside the
        gradients (source "activation"); `cap.activations()` gives them anyway.
      per_example: also compute each example's own gradient norm (`cap.per_example_norms`, and
        `.per_example` of every `gradients()` result) from the same backward pass; the loss must be
        the batch mean (docs/PER_EXAMPLE.md).
    """
    return Capture(model, layers=layers, weights=weights, tape=tape, activations=activations, per_example=per_example)
