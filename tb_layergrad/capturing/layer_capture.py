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
from tb_layergrad.capturing.layer_hooks import ClassCallHook, LayerHooks, layer_base_class
from tb_layergrad.capturing.layer_tree import LayerNode, LayerTree, trainable_weights
from tb_layergrad.capturing.per_example_map import PerExampleNorms
from tb_layergrad.capturing.per_example_pass import PerExamplePass
from tb_layergrad.capturing.records import (
    LayerOutputs,
    Record,
    flatten_output,
    is_differentiable,
    is_recorded,
    static_elements,
    weight_entries,
)

LayerSpec = Union[None, str, Any, Sequence[Union[str, Any]]]


class Capture(LayerHooks):
    """What `capture()` returns: a context manager that records the chosen layers' outputs while the model runs.

    Args:
      model, layers, weights, tape, activations, per_example: as `tb_layergrad.capture`, which constructs it.

    Inside the `with` block, run the model
    as usual; after it, `gradients(tape, target, name="loss")` gives a `GradientMap` for any scalar target
    (call it once per target on a persistent tape for several), `outputs` the recorded outputs by path,
    `activations()` them as a map `summary.gradients` can write, and `per_example_norms(tape, loss)` each
    example's own gradient norms (with `per_example=True`).

    Raises:
      RuntimeError: the same `Capture` entered twice at once, or `gradients()` asked before the model ran.

    Example:

    ```python
    import tensorflow as tf, keras, tb_layergrad

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="out")], name="m")
    x = tf.ones([4, 3])
    with tf.GradientTape(persistent=True) as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            y = model(x)
        loss, unit_0 = tf.reduce_sum(tf.square(y)), tf.reduce_sum(y[:, 0])
    print(cap.gradients(tape, loss)["m/out"].shape, cap.gradients(tape, unit_0, name="unit_0").target)
    del tape
    ```
    """

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
        self._layer_spec = layers
        super().__init__(model, self.tree.select(layers), tape)
        self._late_layers: Optional[ClassCallHook] = None
        self._foreign: Dict[
            int, Any
        ] = {}  # layers called in this pass that are not the model's (held: ids stay theirs)
        self.weights = bool(weights)
        #: Per-example bookkeeping (`per_example=True`), else None: then nothing of it runs.
        self._per_example: Optional[PerExamplePass] = PerExamplePass(self.nodes, self.weights) if per_example else None
        # The last gradients() result with its tape and target: per_example_norms() reuses it (one tape call).
        self._last: Optional[tuple] = None
        #: Do `gradients()` results carry the layer outputs (`GradientMap.activations`), for the summary to write?
        self.with_activations = bool(activations)
        self._records: List[Record] = []
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
        base = layer_base_class(self.model) if tf.executing_eagerly() else None
        if base is not None:  # in a graph, Keras traces the step again once its variables exist: no late layers
            self._late_layers = ClassCallHook(base, self._adopt_if_new)
        if self._per_example is not None:  # a BatchNormalization not chosen in layers= still couples the examples
            chosen = {n.index for n in self.nodes}
            for node in self.tree.layers:
                if node.index not in chosen and not node.in_loop and "BatchNormalization" in type(node.layer).__name__:
                    self._install_coupling_watch(node)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._late_layers is not None:
            self._late_layers.remove()
            self._late_layers = None
        self._foreign.clear()
        super().__exit__(*exc)

    def _adopt_if_new(self, layer: Any) -> None:
        """Before a layer's call: a layer of the model constructed while it runs joins the tree, hooked if chosen.

        Its path, its outputs and its weights' paths are then those it has at every later step.
        """
        if not self._active or not tf.executing_eagerly():  # a tf.function traced inside the step: not the pass
            return
        if self.tree.node_of(layer) is not None or layer is self.model or self._foreign.get(id(layer)) is layer:
            return
        tree = LayerTree(self.model)
        if tree.node_of(layer) is None:  # not part of the model: a layer of another model, a scratch one
            self._foreign[id(layer)] = layer
            return
        hooked = {id(node.layer) for node in self.nodes}
        moved = {node.index: tree.node_of(node.layer) for node in self.tree.nodes}
        self.tree = tree
        self.nodes = tree.select(self._layer_spec)
        with self._lock:
            for r in self._records:
                r.node = moved[r.node.index]
            self._calls = {moved[i].index: n for i, n in self._calls.items()}
        for node in self.nodes:
            if id(node.layer) not in hooked and self._per_example is None:  # per-example rules: chosen up front
                self._install(node)

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
            if any(self._belongs_to_this_pass(t) for _, t in flatten_output(out)):
                self._per_example.note_coupling(node, args, kwargs, len(self._records))
            return out

        call_and_note.__wrapped__ = original
        self._hook(node.layer, "call", call_and_note)

    def _record(self, node: LayerNode, out: Any) -> Optional[int]:
        """Record this call's outputs; returns the position of the first one, or None (not of this pass)."""
        tensors = [(s, t) for s, t in flatten_output(out) if self._belongs_to_this_pass(t)]
        if not tensors:
            return None
        call = self._next_call(node)
        tapes = tuple(id(tape) for tape in self._tapes)
        with self._lock:
            first = len(self._records)
            for sub, t in tensors:
                watched = bool(self._tapes) or not is_differentiable(t) or bool(is_recorded([t]))
                self._records.append(Record(node, call, sub, t, watched, len(self._records), tapes))
        for tape in self._tapes:
            for _, t in tensors:
                if is_differentiable(t):
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
        return LayerOutputs({p: e.value for p, e in entries.items()}, {p: e.index for p, e in entries.items()})

    def _activation_entries(self) -> Dict[str, Entry]:
        return {
            r.key: Entry(
                r.tensor, metadata.SOURCE_ACTIVATION, r.node.index, static_elements(r.tensor), r.tensor.dtype.name
            )
            for r in self._ordered_records()
            if is_differentiable(r.tensor)
        }

    def _ordered_records(self) -> List[Record]:
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

    def records_watched_on(self, tape: Any) -> List["Record"]:
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
        records: List["Record"],
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
        variables = trainable_weights(self.model)  # the model's trainable_variables, where they can be read
        differentiable = [r for r in records if is_differentiable(r.tensor)]
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
                g, metadata.SOURCE_OUTPUT, r.node.index, static_elements(r.tensor), r.tensor.dtype.name
            )
        weight_owners: List[tuple] = []
        if self.weights:
            entries.update(weight_entries(self.tree, self.nodes, variables, var_grads, weight_owners))
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


def capture(
    model: Any,
    layers: LayerSpec = None,
    weights: bool = False,
    *,
    tape: Any = None,
    activations: bool = False,
    per_example: bool = False,
) -> Capture:
    """Capture d(target)/d(layer output) for the chosen layers of `model`, from the backward pass you make anyway.

    Works for Sequential, Functional, subclassed and nested models (no `layer.output` needed), in eager code,
    `tf.function` and XLA. While the `with` block runs the model, each chosen layer's outputs are recorded and
    watched on `tape`; `cap.gradients(tape, target)` then makes the ONE `tape.gradient` call for the weights
    and the outputs together, so the model computes exactly what it computes without capturing. Leaving the
    block restores the model.

    Args:
      model: a Keras model (Sequential, Functional, subclassed) or layer; Keras 3 or tf_keras.
      layers: None for every layer, or layer names, full paths (`"model/block/dense"`), glob patterns
        (`"encoder/*"`) or Layer objects.
      weights: also give the gradients of the chosen layers' trainable weights.
      tape: the `tf.GradientTape` the forward pass runs under (the outputs are watched on it).
      activations: the `gradients()` result also carries the layer outputs (forward values), which
        `summary.gradients` writes beside the gradients (source "activation").
      per_example: also compute each example's own gradient norm from the same backward pass
        (`cap.per_example_norms`, and `.per_example` of every `gradients()` result); the loss must be the
        batch mean (docs/PER_EXAMPLE.md).

    Returns:
      A `Capture`, a context manager: run the model inside it, then call `cap.gradients(tape, target)` for a
      `GradientMap` {layer path: d(target)/d(output)} whose `variable_gradients` are the gradients of
      `model.trainable_variables` to apply.

    Raises:
      TypeError: `model` is not a Keras model or layer, or `layers` holds something else than names,
        patterns or layers.
      ValueError: a name or pattern in `layers` matches no layer of `model` (the message lists them).

    Example:

    ```python
    import tensorflow as tf, keras, tb_layergrad

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="hidden"), keras.layers.Dense(1)],
                             name="mlp")
    optimizer = keras.optimizers.SGD(0.1)
    x, y = tf.random.normal([16, 4]), tf.random.normal([16, 1])
    writer = tf.summary.create_file_writer("/tmp/layergrad_example/capture")
    for step in range(3):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = cap.gradients(tape, loss)  # grads["mlp/hidden"]: dL/d(output of hidden), [16, 8]
        optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
        with writer.as_default(step=step):
            tb_layergrad.summary.gradients(grads)
    ```
    """
    return Capture(model, layers=layers, weights=weights, tape=tape, activations=activations, per_example=per_example)
