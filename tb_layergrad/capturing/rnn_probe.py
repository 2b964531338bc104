"""Per-timestep gradients of an RNN, inside a compiled step, without unrolling.

What is measured. For an RNN layer whose cell returns `(output, new_states)`
and whose output *is* one of its new states (SimpleRNN: h; GRU: h; LSTM: h of
`[h, c]`; the `MinimalRNNCell` of the seed question: its output), let h_t be
the cell output at timestep t. `timestep_probe` reports, for every t,

    dL/dh_t  (shape [batch, units]), the TOTAL derivative,

i.e. through the layer's output at t (when `return_sequences=True`, or at the
last step) AND through the recurrence (h_t is the state step t+1 reads). For
an LSTM the perturbed state is h, not the cell state c: the result is the
derivative w.r.t. h_t with c_t held fixed, which is the `dh` that
backpropagation through time carries from step to step; paths that reach the
loss only through c_t (c_t -> c_{t+1}) are those of c, not of h_t, and are not
part of it. By contrast, the gradient w.r.t. the output *sequence* of a
`return_sequences=True` layer (what `capture()` gives for the layer) is only
the direct path; it equals this total at the last step only.

How. A zero tensor eps [batch, T, units] is created next to the layer's
input and concatenated to it on the feature axis; while the layer runs, the
cell's `call` is wrapped (an instance attribute, removed afterwards): it
splits its input back into (x_t, eps_t), calls the real cell on x_t, and
returns `output + eps_t`, also in place of every new state that *is* the
output tensor. Since eps is zero, the forward values do not change; and
`tape.gradient(loss, eps)[:, t]` is dL/dh_t by the chain rule. The loop stays
a `tf.while_loop` (no unrolling), in eager, `tf.function` and XLA alike.

Conventions:
- Index t is the index of the INPUT timestep: with `go_backwards=True`, h_t is
  the state after the cell consumed input t (the loop walks t = T-1 ... 0).
- Masked timesteps keep the previous state, so their eps has no effect:
  dL/dh_t is 0 there.
- tf_keras (Keras 2) LSTM/GRU normally run a fused kernel that never calls the
  cell; while probed they run their generic cell loop (same math; the last
  bits of the result may differ from the fused kernel). Keras 3 LSTM/GRU use
  the cell loop on CPU anyway; while probed, cuDNN is switched off.

Example (custom training loop):

    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap, \\
                tb_layergrad.timestep_probe(model, tape=tape) as probe:
            loss = loss_fn(y, model(x, training=True))
    grads, per_step = probe.gradients(tape, loss, capture=cap)  # ONE backward pass
    optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
    with writer.as_default(step=optimizer.iterations):
        tb_layergrad.summary.gradients(grads)
        for path, g in per_step.items():              # g: [batch, T, units]
            tb_layergrad.summary.timesteps(path, tf.norm(tf.cast(g, tf.float64), axis=[0, 2]))
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.layer_hooks import LayerHooks, restore_instance_attribute, set_instance_attribute
from tb_layergrad.capturing.layer_tree import LayerNode, LayerTree, is_layer

__all__ = ["TimestepProbe", "timestep_probe", "timestep_norms", "rnn_nodes", "TapeWithExtraSources"]

LayerSpec = Union[None, str, Any, Sequence[Union[str, Any]]]


def _is_rnn_layer(layer: Any) -> bool:
    return any(cls.__name__ == "RNN" for cls in type(layer).__mro__) and is_layer(getattr(layer, "cell", None))


def _is_tf_keras(layer: Any) -> bool:
    return type(layer).__module__.split(".")[0] == "tf_keras"


def rnn_nodes(tree: LayerTree, spec: LayerSpec = None) -> List[LayerNode]:
    """The RNN layers of `tree` chosen by `spec` (None or True: all of them), in model order."""
    candidates = [n for n in tree.layers if not n.in_loop and _is_rnn_layer(n.layer)]
    if spec is None or spec is True:
        return candidates
    chosen = tree.select(spec)
    not_rnn = [n.path for n in chosen if not _is_rnn_layer(n.layer)]
    if not_rnn:
        names = ", ".join(n.path for n in candidates) or "none"
        raise ValueError(
            f"per-timestep gradients need RNN layers (keras.layers.RNN, SimpleRNN, LSTM, GRU...); "
            f"{', '.join(not_rnn)} is not one. RNN layers of this model: {names}"
        )
    return chosen


def _units(cell: Any) -> int:
    """Size of the cell output (the state that is the output)."""
    size = getattr(cell, "output_size", None)
    if size is None:
        size = cell.state_size
    if isinstance(size, (list, tuple)):
        size = size[0]
    if hasattr(size, "as_list"):  # TensorShape
        dims = size.as_list()
        if len(dims) != 1 or dims[0] is None:
            raise ValueError(f"per-timestep gradients support cells with a 1-D output, got output size {size}")
        size = dims[0]
    try:
        return int(size)
    except (TypeError, ValueError):
        raise ValueError(f"cannot read the output size of cell {cell.name!r} (output_size / state_size)") from None


def timestep_norms(grad: tf.Tensor, time_axis: int = 1) -> tf.Tensor:
    """L2 norm over everything but the time axis: float64 [T] (the `timesteps` record)."""
    g = tf.cast(grad, tf.float64)
    rank = g.shape.rank
    axes = [a for a in range(rank) if a != time_axis]
    return tf.sqrt(tf.reduce_sum(tf.square(g), axis=axes))


class TapeWithExtraSources:
    """A stand-in for a GradientTape whose `gradient()` also differentiates `extra` tensors.

    `Capture.gradients(tape, ...)` makes exactly one `tape.gradient` call; passing
    this wrapper instead of the tape adds the probe's eps tensors to that very call
    (a non-persistent tape allows only one). The extra gradients land in
    `.extra_gradients`.
    """

    def __init__(self, tape: Any, extra: Sequence[Any]):
        self._tape = tape
        self._extra = list(extra)
        self.extra_gradients: Optional[List[Any]] = None

    @property
    def _persistent(self) -> bool:
        return getattr(self._tape, "_persistent", False)

    def watch(self, tensor: Any) -> None:
        self._tape.watch(tensor)

    def gradient(
        self, target: Any, sources: Any, output_gradients: Any = None, unconnected_gradients: Any = None
    ) -> Any:
        kwargs = {}
        if output_gradients is not None:
            kwargs["output_gradients"] = output_gradients
        if unconnected_gradients is not None:
            kwargs["unconnected_gradients"] = unconnected_gradients
        grads, extra = self._tape.gradient(target, (sources, self._extra), **kwargs)
        self.extra_gradients = list(extra)
        return grads


class _Probe:
    __slots__ = ("node", "call", "eps", "time_major")

    def __init__(self, node: LayerNode, call: int, eps: Any, time_major: bool):
        self.node, self.call, self.eps, self.time_major = node, call, eps, time_major

    @property
    def key(self) -> str:
        return self.node.path if self.call == 1 else f"{self.node.path}#{self.call}"


class TimestepProbe(LayerHooks):
    """Context manager returned by `timestep_probe()`; see the module docstring."""

    _what = "probe"

    def __init__(self, model: Any, layers: LayerSpec = None, *, tape: Any = None):
        self.tree = LayerTree(model)
        nodes = rnn_nodes(self.tree, layers)
        if not nodes:
            raise ValueError(f"model {model.name!r} has no RNN layer for per-timestep gradients")
        super().__init__(model, nodes, tape)
        self._probes: List[_Probe] = []

    def _start_pass(self) -> None:
        self._probes.clear()

    def _install(self, node: LayerNode) -> None:
        layer = node.layer
        if _is_tf_keras(layer):
            original = layer.call

            def call_with_probe(inputs, *args, **kwargs):
                time_major = bool(getattr(layer, "time_major", False))
                return self._run(node, original, inputs, args, kwargs, time_major, "_could_use_gpu_kernel")

            call_with_probe.__wrapped__ = original
            self._hook(layer, "call", call_with_probe)
        else:
            original = layer.inner_loop

            def inner_loop_with_probe(sequences, *args, **kwargs):
                return self._run(node, original, sequences, args, kwargs, False, "use_cudnn")

            inner_loop_with_probe.__wrapped__ = original
            self._hook(layer, "inner_loop", inner_loop_with_probe)

    def _run(
        self, node: LayerNode, original: Any, inputs: Any, args: tuple, kwargs: dict, time_major: bool, fused_flag: str
    ) -> Any:
        if not isinstance(inputs, tf.Tensor) or not self._belongs_to_this_pass(inputs):
            # Keras' symbolic passes (shape inference), nested/ragged inputs: run unprobed.
            if isinstance(inputs, tf.RaggedTensor):
                raise ValueError(f"per-timestep gradients do not support ragged inputs ({node.path})")
            return original(inputs, *args, **kwargs)
        layer = node.layer
        cell = layer.cell
        units = _units(cell)
        if inputs.shape.rank != 3:
            raise ValueError(
                f"per-timestep gradients need a [batch, time, features] input, got {inputs.shape} ({node.path})"
            )
        features = inputs.shape[-1]
        if features is None:
            features = tf.shape(inputs)[-1]
        eps_shape = tf.concat([tf.shape(inputs)[:2], [units]], axis=0)
        eps = tf.zeros(eps_shape, dtype=inputs.dtype)
        eps = tf.ensure_shape(eps, inputs.shape[:2].concatenate([units]))
        for tape in self._tapes:
            tape.watch(eps)
        call = self._next_call(node)
        with self._lock:
            self._probes.append(_Probe(node, call, eps, time_major))
        augmented = tf.concat([inputs, eps], axis=-1)

        cell_original = cell.call

        def cell_call_with_probe(cell_inputs, states, *cargs, **ckwargs):
            x_t = cell_inputs[..., :features]
            eps_t = cell_inputs[..., features:]
            output, new_states = cell_original(x_t, states, *cargs, **ckwargs)
            probed = output + tf.cast(eps_t, output.dtype)
            replaced = [0]

            def swap(s):
                if s is output:
                    replaced[0] += 1
                    return probed
                return s

            new_states = tf.nest.map_structure(swap, new_states)
            if not replaced[0]:
                raise ValueError(
                    f"the cell of {node.path!r} ({type(cell).__name__}) returns an output that is not one of its "
                    "states; per-timestep gradients need a cell whose output is (one of) its new states, "
                    "like SimpleRNN, GRU, LSTM (h) or a cell returning (output, [output])"
                )
            return probed, new_states

        cell_call_with_probe.__wrapped__ = cell_original
        saved = [set_instance_attribute(cell, "call", cell_call_with_probe)]
        if getattr(layer, fused_flag, None) not in (None, False):
            saved.append(set_instance_attribute(layer, fused_flag, False))
        try:
            return original(augmented, *args, **kwargs)
        finally:
            for one in reversed(saved):
                restore_instance_attribute(one)

    # -- results ---------------------------------------------------------------
    @property
    def sources(self) -> Dict[str, Any]:
        """key -> the zero eps tensor [batch, T, units] fed to that layer call, in model order."""
        return {p.key: p.eps for p in self._ordered()}

    def _ordered(self) -> List[_Probe]:
        return sorted(self._probes, key=lambda p: (p.node.index, p.call))

    def layer_index(self, key: str) -> int:
        for p in self._probes:
            if p.key == key:
                return p.node.index
        return -1

    def wrap_tape(self, tape: Any) -> TapeWithExtraSources:
        """A tape stand-in that adds the probes to the next `gradient()` call (see TapeWithExtraSources)."""
        if not self._probes:
            raise RuntimeError("no RNN layer ran inside `with timestep_probe(...)`: call the model inside the context")
        return TapeWithExtraSources(tape, [p.eps for p in self._ordered()])

    def collect(self, wrapped: TapeWithExtraSources) -> Dict[str, Any]:
        """key -> dL/dh [batch, T, units] from a `wrap_tape()` stand-in that was used."""
        if wrapped.extra_gradients is None:
            raise RuntimeError("the wrapped tape was not used for a gradient() call yet")
        out = {}
        for p, g in zip(self._ordered(), wrapped.extra_gradients):
            if g is not None and p.time_major:
                g = tf.transpose(g, [1, 0, 2])
            out[p.key] = g
        return out

    def gradients(
        self, tape: Any, target: Any, capture: Any = None, name: str = metadata.DEFAULT_TARGET
    ) -> Tuple[Any, Dict[str, Any]]:
        """ONE backward pass for the layer outputs (of `capture`, if given) and every timestep.

        Returns (GradientMap or None, {key: dL/dh_t as [batch, T, units]}). Without
        `capture`, the first element is None and the tape computes only the probes.
        """
        wrapped = self.wrap_tape(tape)
        if capture is not None:
            gmap = capture.gradients(wrapped, target, name=name)
        else:
            target = tf.convert_to_tensor(target)
            if target.shape.rank != 0:
                raise ValueError(f"target must be a scalar, got shape {target.shape}")
            wrapped.gradient(target, [])
            gmap = None
        return gmap, self.collect(wrapped)


def timestep_probe(model: Any, layers: LayerSpec = None, *, tape: Any = None) -> TimestepProbe:
    """Probe the RNN layers of `model` for the per-timestep gradients dL/dh_t, without unrolling.

    dL/dh_t is the TOTAL derivative through the output at t and through the recurrence, for every timestep t,
    in eager code, `tf.function` and XLA alike (the method and its conventions: the module docstring).

    Args:
      model: any Keras model (Keras 3 or tf_keras) holding `RNN` layers (custom cells included).
      layers: None for every RNN layer, or names / glob patterns / layers.
      tape: the GradientTape the forward pass runs under (the probes are watched on it).

    Returns:
      A `TimestepProbe`, a context manager: run the model inside it (and inside `capture()`), then
      `probe.gradients(tape, loss, capture=cap)` gives `(grads, per_step)` from ONE backward pass: the
      `GradientMap` of `cap.gradients`, and {RNN layer path: dL/dh_t of shape [batch, T, units]}.

    Raises:
      ValueError: the model has no RNN layer, a cell's output is not 1-D, or the input is ragged.

    Example:

    ```python
    import tensorflow as tf, keras, tb_layergrad

    model = keras.Sequential([keras.Input((5, 1)), keras.layers.SimpleRNN(3, name="rnn"), keras.layers.Dense(1)],
                             name="m")
    x, y = tf.random.normal([2, 5, 1]), tf.zeros([2, 1])
    writer = tf.summary.create_file_writer("/tmp/layergrad_example/timesteps")
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap, tb_layergrad.timestep_probe(model, tape=tape) as probe:
            loss = tf.reduce_mean(tf.square(model(x) - y))
    grads, per_step = probe.gradients(tape, loss, capture=cap)  # per_step["m/rnn"]: [2, 5, 3]
    with writer.as_default(step=0):
        tb_layergrad.summary.gradients(grads)
        for path, g in per_step.items():
            tb_layergrad.summary.timesteps(path, tf.norm(tf.cast(g, tf.float64), axis=[0, 2]))  # one norm per t
    ```
    """
    return TimestepProbe(model, layers, tape=tape)
