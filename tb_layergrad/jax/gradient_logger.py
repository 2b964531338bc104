"""`GradientLogger` on JAX: the gradients of Keras' own fit() step, written without TensorFlow.

The step is observed, never copied: the chosen layers' outputs pass through an identity whose backward rule
keeps dL/d(output) (`layer_outputs`, `step_trace`), the loss through one that keeps its value, and the
optimizer's `stateless_apply`, which receives exactly the weight gradients the step computed, is where the
step's records are reduced and handed out as outputs of the step (`step_outputs`), once the backward pass is
complete.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import keras
import numpy as np

from tb_layergrad import logger_arguments, metadata, nonfinite_origin
from tb_layergrad.capturing.layer_tree import LayerTree
from tb_layergrad.jax import example_norms, step_outputs
from tb_layergrad.jax.layer_outputs import LayerOutputs
from tb_layergrad.jax.step_trace import StepTrace
from tb_layergrad.writer.event_writer import EventWriter
from tb_layergrad.writer.step_records import GroupStep

#: The arguments of TensorFlow's `GradientLogger` that the JAX one does not implement yet, their defaults, and why.
NOT_YET_ON_JAX = {
    "timesteps": (
        False,
        "Keras' RNN layers run their cell inside a `lax.scan` on JAX, where dL/dh_t needs a perturbation threaded "
        "through the scan's carry; not built yet",
    ),
}
_MISSING = object()
# The logs' key prefix under which a step hands out its records (taken out before Keras' loop sees the logs).
_HANDED = "_tb_layergrad_handed_"


class GradientLogger(keras.callbacks.Callback):
    """Log the gradients Keras computes inside `model.fit()` on JAX, per layer output, to TensorBoard.

    The same callback, arguments and records as on TensorFlow (docs/FIT.md), written without TensorFlow:
    d(loss)/d(layer output) and, with `weights=True`, d(loss)/d(weight) of the step fit() runs, the loss
    itself, and with `activations=True` the layer outputs, to `log_dir/train`. The step of a record is the
    count of batches the optimizer applied, from 1, continuing across fit() calls. Training is bitwise
    unchanged. Every step is checked for a NaN/Inf (loss, output gradients, activations when recorded): the
    first step with one is written in full, and where it was born is `self.nonfinite`.

    Not yet on JAX (refused before training, saying why; docs/FIT.md "On JAX"): `timesteps`, loss scaling
    (mixed float16).

    Example:

    ```python
    import numpy as np, keras, tb_layergrad

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.random.rand(64, 4), np.random.rand(64, 1)
    model.fit(x, y, batch_size=16, epochs=2,
              callbacks=[tb_layergrad.GradientLogger("/tmp/logs/run1", update_freq=2, weights=True)])
    ```

    Args:
        log_dir: the directory of the TensorBoard logs (records go to `log_dir/train`), or a
            `keras.callbacks.TensorBoard` callback whose `log_dir` to follow.
        layers: `None` for every layer, or layer names, full paths, glob patterns or `Layer` objects.
        update_freq: `"batch"` or an integer N: log every N-th batch trained (step % N == 0); `"epoch"`: the last
            batch of each epoch (fit() must know the steps per epoch).
        weights: also log d(loss)/d(weight) for the weights of the chosen layers.
        activations: also log the layer outputs themselves (source "activation").
        max_elements: when > 0, also log each raw tensor, bounded to this many elements (kind `tensor`).
        targets: `{name: fn(y_pred)}`, one value per example (or a scalar): the sum over the batch is
            differentiated by its own backward pass of the step's forward pass, on written steps only.
        per_example: also log, per layer output and per weight of a layer with an exact rule, the distribution
            over the batch of each example's own loss gradient norm (kind `examples`) and, with `weights=True`,
            the gradient noise scale (docs/PER_EXAMPLE.md).
        timesteps: not yet on JAX; only its default is accepted.
        on_nonfinite: at the first step with a NaN/Inf: "log" (write it, go on), "stop" (write it, print
            where it was born, end fit() after that step), "raise" (write it, raise
            `tb_layergrad.NonFiniteError`), or "ignore" (no check at every step). "stop" and "raise" wait
            for each step's records at its end.

    Raises:
        NotImplementedError: an argument that works on TensorFlow only, so far (before training).
        ValueError: an argument out of its range; an unknown layer or a model without an optimizer (at
            `on_train_begin`).
        tb_layergrad.NonFiniteError: with `on_nonfinite="raise"`.
    """

    def __init__(
        self,
        log_dir: Any,
        layers: Any = None,
        update_freq: Union[int, str] = 1,
        weights: bool = False,
        activations: bool = False,
        timesteps: Any = False,
        targets: Optional[Mapping[str, Union[Callable, str]]] = None,
        per_example: bool = False,
        max_elements: int = 0,
        on_nonfinite: str = "log",
    ):
        super().__init__()
        given = {"timesteps": timesteps}
        refused = [(name, value) for name, value in given.items() if value not in (NOT_YET_ON_JAX[name][0], None)]
        if refused:
            why = "; ".join(f"{name}={value!r}: {NOT_YET_ON_JAX[name][1]}" for name, value in refused)
            raise NotImplementedError(
                f"GradientLogger on JAX does not support {why}. They work with KERAS_BACKEND=tensorflow. On JAX: "
                "layers, update_freq, weights, activations, max_elements, targets, per_example, on_nonfinite "
                '(docs/FIT.md, "On JAX").'
            )
        self.on_nonfinite = logger_arguments.on_nonfinite(on_nonfinite)
        update_freq = logger_arguments.update_freq(update_freq)
        self._log_dir = logger_arguments.log_dir(log_dir)
        self.layers = layers
        self.update_freq = update_freq
        self.weights = bool(weights)
        self.activations = bool(activations)
        self.max_elements = logger_arguments.max_elements(max_elements)
        self.targets = _checked_targets(targets)
        self.per_example = bool(per_example)
        logger_arguments.warn_without_effect(self.weights, self.per_example)
        self._epoch: Optional[tuple] = None  # update_freq="epoch": (batch count before this fit(), steps per epoch)
        self._handed: Optional[step_outputs.HandedSteps] = None  # the steps' records, read as they finish
        self._layouts: List[step_outputs.Layout] = []  # how each trace's handed arrays read (by the logs' key)
        self._writer: Optional[EventWriter] = None
        self._trace: Optional[StepTrace] = None
        self._host_step = 0  # on_nonfinite="ignore": the batches trained so far, counted as the step counts them
        self._installed: Optional[Dict[str, Any]] = None
        self._nonfinite: Optional[nonfinite_origin.Origin] = None
        self._acted = False  # has "stop" or "raise" acted on the first NaN/Inf?
        self._examples: Optional[Dict[int, example_norms.WeightRow]] = None  # per_example: the weight rows
        self._sizes: Dict[str, int] = {}  # per_example: each weight's parameter count, by path
        self._parameters = 0  # per_example: all trainable parameters (the noise scale's coverage)

    @property
    def log_dir(self) -> str:
        return logger_arguments.resolve_log_dir(self._log_dir)

    @property
    def run_dir(self) -> str:
        return os.path.join(self.log_dir, "train")

    @property
    def nonfinite(self) -> Optional[nonfinite_origin.Origin]:
        """Where the first NaN/Inf of this callback's training was born (`nonfinite_origin.Origin`), or None.

        Known once that step's callback has run (at the latest when fit() returns).
        """
        return self._nonfinite

    # -- install / restore -------------------------------------------------------
    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        self._restore()
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("GradientLogger needs a compiled model (model.compile(optimizer=..., loss=...))")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise NotImplementedError(
                "GradientLogger on JAX does not support loss scaling (a LossScaleOptimizer, mixed_float16) yet: "
                "Keras skips the update of a step whose scaled gradients overflow and leaves the optimizer's "
                "update count where it was, and on JAX the step number is read from that count inside the "
                "compiled step (it has no counter of its own there), so the batch after an overflow would be "
                "written under the skipped step's number. It works with KERAS_BACKEND=tensorflow, which counts "
                "batches in a variable of its own"
            )
        self._epoch = None
        if self.update_freq == "epoch":
            steps = (self.params or {}).get("steps")
            if not steps:
                raise ValueError(
                    "GradientLogger(update_freq='epoch') on JAX writes the last batch of each epoch, decided inside "
                    "the compiled step: fit() must know the steps per epoch (pass steps_per_epoch=, or data of "
                    "known length)"
                )
            self._epoch = (int(np.asarray(optimizer.iterations)), int(steps))
        self._handed = step_outputs.HandedSteps(self._take)
        self._layouts = []
        tree = LayerTree(model)
        nodes = tree.select(self.layers)
        _refuse_rematerialised_containers(tree, nodes)
        if self._writer is None or self._writer.closed or self._writer.run_dir != self.run_dir:
            self._writer = EventWriter(self.run_dir)
        iterations = [i for i, v in enumerate(optimizer.variables) if v is optimizer.iterations]
        weights = self._weight_rows(tree, nodes, model.trainable_variables) if self.weights else {}
        trainable = len(model.trainable_variables)
        saved = {
            "train_step": model.__dict__.get("train_step", _MISSING),
            "stateless_apply": optimizer.__dict__.get("stateless_apply", _MISSING),
            "stateless_compute_loss": model.__dict__.get("stateless_compute_loss", _MISSING),
        }
        chosen = {n.index for n in nodes}
        watch = [n for n in tree.nodes if n.index not in chosen and n.layer is not model]
        outputs = LayerOutputs(nodes, lambda: self._trace, self.per_example, watch)
        self._examples = self._weight_examples(tree, outputs, model, weights) if self.per_example else None
        ids = ([id(v) for v in model.trainable_variables], [id(v) for v in model.non_trainable_variables])
        self._installed = {"saved": saved, "outputs": outputs, "optimizer": optimizer, "model": model}
        step_fn = model.train_step
        apply_fn = optimizer.stateless_apply
        loss_fn = model.stateless_compute_loss

        def train_step(state: Any, data: Any) -> Any:
            trace, self._trace = StepTrace(), None
            trace.inputs = (state, data)
            self._trace = trace
            try:
                logs, state = step_fn(state, data)
            finally:
                self._trace = None
            if trace.handed is None:
                return logs, state
            logs = {} if logs is None else logs  # Keras' loop reads None as no logs
            if not isinstance(logs, Mapping):
                raise TypeError(
                    "GradientLogger on JAX: the train step returned logs of type "
                    f"{type(logs).__name__}; Keras' fit() expects a dict of metrics (the step's records leave it "
                    "beside them)"
                )
            layout, arrays = trace.handed  # leaves the step beside its logs; `model.train_function` takes it out
            self._layouts.append(layout)
            return {**logs, f"{_HANDED}{len(self._layouts) - 1}": arrays}, state

        def stateless_compute_loss(*args: Any, **kwargs: Any) -> Any:
            loss, variables = loss_fn(*args, **kwargs)
            if self._trace is not None and kwargs.get("training", True):
                loss = self._trace.observe_target(metadata.DEFAULT_TARGET, loss)
            return loss, variables

        def stateless_apply(optimizer_variables: Any, grads: Any, trainable_variables: Any) -> Any:
            trace = self._trace
            if trace is not None and trace.applied:
                warnings.warn(
                    "GradientLogger on JAX: this train step applies gradients more than once (a GAN's?); only the "
                    "first application is logged, and its layer gradients may hold a later differentiation's",
                    stacklevel=2,
                )
                trace = None
            if trace is not None and iterations:
                trace.applied = True
                step = jnp.asarray(optimizer_variables[iterations[0]]).astype(jnp.int32) + 1
                every = len(grads) == trainable
                more = (
                    (lambda: self._target_groups(trace, model, list(trainable_variables), weights)) if every else list
                )
                values = _variable_values(ids, trainable_variables, trace) if self.per_example else {}
                self._emit(trace, step, list(grads), weights if every else {}, more, values)
            return apply_fn(optimizer_variables, grads, trainable_variables)

        try:
            object.__setattr__(model, "train_step", train_step)
            object.__setattr__(model, "stateless_compute_loss", stateless_compute_loss)
            object.__setattr__(optimizer, "stateless_apply", stateless_apply)
            model.make_train_function(force=True)
            self._train_function(model, optimizer, step_fn, train_step)
        except BaseException:
            self._restore()
            raise

    def _train_function(self, model: Any, optimizer: Any, step_fn: Callable, train_step: Callable) -> None:
        """`model.train_function` runs one batch at a time through the observing step and takes each step's
        handed records out of its logs (to `HandedSteps`), so that Keras' loop and callbacks see its own logs.

        Why one batch per call: with `steps_per_execution` Keras returns the last batch's logs only. With
        `on_nonfinite="ignore"`, where nothing is looked at between written steps, those run Keras' own train
        function, untouched: chosen per batch by the step counted on the host (the optimizer's update count when
        fit() begins, plus the batches since), between Keras' own (built from the step `step_fn` the logger
        found) and the observing one, which still decides from its own count whether it writes (docs/DESIGN.md,
        "The cost of a step that is not written on JAX").
        """
        written = model.train_function
        untouched = None
        if self.on_nonfinite == "ignore":
            object.__setattr__(model, "train_step", step_fn)
            try:
                model.make_train_function(force=True)
                untouched = model.train_function
            finally:
                object.__setattr__(model, "train_step", train_step)
        self._host_step = int(np.asarray(optimizer.iterations))

        def train_function(state: Any, iterator: Any) -> Any:
            """One execution: `steps_per_execution` batches (fewer at the data's end), each by its own step."""
            logs = None
            for i in range(max(1, int(getattr(model, "steps_per_execution", 1) or 1))):
                try:
                    data = next(iterator)
                except StopIteration:
                    if i == 0:
                        raise
                    break
                self._host_step += 1
                chosen = written if untouched is None or bool(self._logged(self._host_step)) else untouched
                logs, state = chosen(state, iter([data]))
                logs = self._hand_over(logs)
            return logs, state

        model.train_function = train_function

    def _hand_over(self, logs: Any) -> Any:
        """`logs` without the arrays the step handed out, which go to `HandedSteps` (read as the step finishes)."""
        if not isinstance(logs, Mapping):
            return logs
        kept = {}
        for key, value in logs.items():
            if not (isinstance(key, str) and key.startswith(_HANDED)):
                kept[key] = value
            elif self._handed is not None:
                self._handed.put(self._layouts[int(key[len(_HANDED) :])], value)
        return kept

    def _weight_examples(
        self, tree: LayerTree, outputs: LayerOutputs, model: Any, weights: Dict[int, tuple]
    ) -> Dict[int, example_norms.WeightRow]:
        """Position in `model.trainable_variables` -> its `WeightRow`; the parameter counts the noise scale's
        coverage needs (each weight's, and all trainable parameters', as TensorFlow's)."""
        variables = model.trainable_variables
        by_index = {n.index: n for n in tree.nodes}
        self._sizes = {path: int(np.prod(variables[i].shape)) for i, (path, _) in weights.items()}
        self._parameters = sum(int(np.prod(v.shape)) for v in variables)
        return {
            i: example_norms.WeightRow(variables[i], by_index[owner], outputs.rules.get(owner))
            for i, (_, owner) in weights.items()
        }

    @staticmethod
    def _weight_rows(tree: LayerTree, nodes: List[Any], variables: List[Any]) -> Dict[int, tuple]:
        """Position in `model.trainable_variables` -> (variable path, owner's position), for the chosen layers.

        Read before training: inside the step, `self.model` would make Keras write the state of the batch
        before back into the variables (a callback's `model` syncs JAX state), which the epoch's end then
        keeps instead of the last batch's.
        """
        owners = tree.variable_paths()
        chosen = {n.index for n in nodes}
        rows = {}
        for i, var in enumerate(variables):
            path, owner = owners.get(id(var), (getattr(var, "path", var.name), tree.root))
            if owner.index in chosen or any(path.startswith(n.path + "/") for n in nodes):
                rows[i] = (path, owner.index)
        return rows

    def _target_groups(
        self, trace: StepTrace, model: Any, trainable: List[Any], weights: Dict[int, tuple]
    ) -> List[step_outputs.Group]:
        """Each of `targets`: its own backward pass of the step's forward pass (the same weights, state and
        batch, so the same dropout masks), traced on the written steps only; its groups as the loss's."""
        if not self.targets or trace.inputs is None:
            return []
        state, data = trace.inputs
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        non_trainable = state[1]
        groups: List[step_outputs.Group] = []
        for name, fn in self.targets.items():
            seen = StepTrace()

            def value_of(variables: List[Any], fn: Callable = fn, seen: StepTrace = seen) -> Any:
                outer, self._trace = self._trace, seen
                try:
                    y_pred, _ = model.stateless_call(variables, non_trainable, x, training=True)
                finally:
                    self._trace = outer
                return jnp.sum(_one_per_example(name, fn(y_pred), y_pred))

            value, grads = jax.value_and_grad(value_of)(trainable)
            outputs = [s for s in seen.outputs() if s.cotangent is not None]
            groups.append(
                step_outputs.Group(
                    name,
                    metadata.SOURCE_OUTPUT,
                    [s.key for s in outputs],
                    [s.index for s in outputs],
                    [s.cotangent for s in outputs],
                    max_elements=self.max_elements,
                )
            )
            rows = [(i, path, owner) for i, (path, owner) in sorted(weights.items())]
            groups.append(
                step_outputs.Group(
                    name,
                    metadata.SOURCE_WEIGHT,
                    [path for _, path, _ in rows],
                    [owner for _, _, owner in rows],
                    [grads[i] for i, _, _ in rows],
                    max_elements=self.max_elements,
                )
            )
            groups.append(step_outputs.Group(name, metadata.SOURCE_TARGET, [name], [-1], [value], histogram=False))
        return groups

    def _emit(
        self,
        trace: StepTrace,
        step: jax.Array,
        grads: List[Any],
        weights: Dict[int, tuple],
        more: Callable[[], List[step_outputs.Group]] = list,
        values: Optional[Dict[int, Any]] = None,
    ) -> None:
        outputs = [s for s in trace.outputs() if s.cotangent is not None]
        batch = next((int(s.cotangent.shape[0]) for s in outputs if s.cotangent.ndim), 0)
        examples = self.per_example and batch > 0
        groups = [
            step_outputs.Group(
                metadata.DEFAULT_TARGET,
                metadata.SOURCE_OUTPUT,
                [s.key for s in outputs],
                [s.index for s in outputs],
                [s.cotangent for s in outputs],
                max_elements=self.max_elements,
                examples=(lambda: example_norms.output_rows(outputs, trace.coupled)) if examples else None,
                batch=batch,
            )
        ]
        if trace.target is not None and trace.target.value is not None:
            t = trace.target
            groups.append(step_outputs.Group(t.key, metadata.SOURCE_TARGET, [t.key], [-1], [t.value], histogram=False))
        if self.activations:
            seen = [s for s in trace.outputs() if s.value is not None]
            groups.append(
                step_outputs.Group(
                    metadata.ACTIVATION_TARGET,
                    metadata.SOURCE_ACTIVATION,
                    [s.key for s in seen],
                    [s.index for s in seen],
                    [s.value for s in seen],
                    max_elements=self.max_elements,
                )
            )
        if weights:
            rows = [(i, path, owner) for i, (path, owner) in sorted(weights.items()) if grads[i] is not None]
            described = self._examples or {}

            def weight_rows() -> List[Any]:
                return example_norms.weight_rows(
                    [described[i] for i, _, _ in rows], trace.calls, trace.seen, trace.coupled, values or {}
                )

            groups.append(
                step_outputs.Group(
                    metadata.DEFAULT_TARGET,
                    metadata.SOURCE_WEIGHT,
                    [path for _, path, _ in rows],
                    [owner for _, _, owner in rows],
                    [grads[i] for i, _, _ in rows],
                    max_elements=self.max_elements,
                    examples=weight_rows if examples else None,
                    batch=batch,
                )
            )
        write = self._logged(step)
        if self.on_nonfinite != "ignore":
            write = write | step_outputs.nonfinite(groups)
        trace.handed = step_outputs.hand_out(step, write, groups, more=more)

    def _logged(self, step: Any) -> Any:
        """Is `step` (a traced or a host number) on the schedule of `update_freq`?"""
        if self._epoch is not None:
            start, steps = self._epoch
            return (step - start) % steps == 0
        return step % self.update_freq == 0

    def _drain(self) -> None:
        """Every step trained so far has run and its records are taken (raises what went wrong in taking them)."""
        if self._handed is not None:
            self._handed.wait()

    def _take(self, step: int, records: List[GroupStep]) -> None:
        """A written step's records (on `HandedSteps`' thread): the first NaN/Inf located, then to the writer."""
        logged = bool(self._logged(step))
        bad = any(r.group.source != metadata.SOURCE_WEIGHT and r.stats[:, 1:4].sum() > 0 for r in records)
        if bad and self._nonfinite is None:
            self._nonfinite = _origin(step, records, self.activations)
        elif not logged:
            return  # a later non-finite step off the schedule: only the first is written
        if self._writer is not None and not self._writer.closed:
            self._writer.write(step, records, scalars=self._noise_scale(records))

    def _noise_scale(self, records: List[GroupStep]) -> Dict[str, float]:
        """The loss's noise scale scalars from its weight group's records (docs/FORMAT.md), or none."""
        for r in records:
            group = r.group
            if (group.target, group.source) != (metadata.DEFAULT_TARGET, metadata.SOURCE_WEIGHT):
                continue
            if r.examples is None or not len(r.examples):
                return {}
            sizes = [self._sizes.get(layer, 0) for layer in group.layers]
            coupled = bool(np.any(r.examples[:, metadata.EXAMPLE_INDEX["status"]] == metadata.EXAMPLE_COUPLED))
            return example_norms.noise_scale(r.stats, r.examples, sizes, self._parameters, coupled)
        return {}

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        """ "stop" and "raise" act after the step with the first NaN/Inf: its callback must have run by now."""
        if self.on_nonfinite not in ("stop", "raise") or self._installed is None or self._acted:
            return
        self._drain()
        if self._nonfinite is None:
            return
        self._acted = True
        if self.on_nonfinite == "raise":
            self._restore()
            raise nonfinite_origin.NonFiniteError(self._nonfinite)
        print(f"GradientLogger: {self._nonfinite.line}; stopping training (on_nonfinite='stop')", flush=True)
        self._installed["model"].stop_training = True

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._writer is not None:
            self._drain()
            self._writer.flush()

    def on_train_end(self, logs: Any = None) -> None:
        self._restore()

    def restore(self) -> None:
        """Put the model back as it was before fit() (done automatically when training ends)."""
        self._restore()

    def close(self) -> None:
        """Close the event file now; a later fit() opens a new one."""
        self._restore()
        if self._writer is not None:
            self._writer.close()

    def _restore(self) -> None:
        installed, self._installed = self._installed, None
        if installed is None:
            return
        handed, self._handed = self._handed, None
        try:
            if handed is not None:
                handed.wait()  # every step has run and its records are taken: nothing arrives after the flush
        finally:
            if handed is not None:
                handed.close()
            model, optimizer, saved = installed["model"], installed["optimizer"], installed["saved"]
            installed["outputs"].restore()
            for owner, name in (
                (model, "train_step"),
                (model, "stateless_compute_loss"),
                (optimizer, "stateless_apply"),
            ):
                if saved[name] is _MISSING:
                    owner.__dict__.pop(name, None)
                else:
                    object.__setattr__(owner, name, saved[name])
            model.make_train_function(force=True)
            if self._writer is not None:
                self._writer.flush()


def _refuse_rematerialised_containers(tree: LayerTree, nodes: List[Any]) -> None:
    """A model or sub-model built inside `keras.RematScope` runs its layers inside one `jax.checkpoint`, whose
    backward pass is a trace of its own: their gradients cannot be handed out of it. Layers rematerialised one
    by one are observed after their checkpoint (`layer_outputs`)."""
    for container in tree.nodes:
        mode = getattr(getattr(container.layer, "_remat_mode", None), "mode", None)
        if mode in (None, "activations") or not container.children:
            continue
        inside = [n.path for n in nodes if n.path.startswith(container.path + "/")]
        if inside:
            raise NotImplementedError(
                f"GradientLogger on JAX cannot observe {inside[0]}: {container.path!r} is rematerialised as a whole "
                f"(keras.RematScope(mode={mode!r}) around the model), so its layers run inside one jax.checkpoint "
                "whose backward pass their gradients cannot leave. Build the model outside the RematScope and its "
                "layers inside it (each layer rematerialised on its own): that is observed, training unchanged."
            )


def _checked_targets(targets: Any) -> Dict[str, Callable]:
    """{name: fn(y_pred)}, each a function (the TensorFlow room's "inputs" needs a tape; refused, saying so)."""
    if targets is None:
        return {}
    if not isinstance(targets, Mapping):
        raise TypeError(f"targets must be a dict {{name: fn(y_pred)}}, got {type(targets).__name__}")
    out = {}
    for name, fn in targets.items():
        if not isinstance(name, str) or not name or name in (metadata.DEFAULT_TARGET, metadata.ACTIVATION_TARGET):
            raise ValueError(
                f"a target's name must be a non-empty string other than 'loss' and 'forward', got {name!r}"
            )
        if not callable(fn):
            raise NotImplementedError(
                f"GradientLogger on JAX does not support targets={{{name!r}: {fn!r}}}: on JAX a target is a function "
                "of the model's prediction (a `tf.GradientTape` w.r.t. inputs, 'inputs', works with "
                "KERAS_BACKEND=tensorflow)"
            )
        out[name] = fn
    return out


def _one_per_example(name: str, value: Any, y_pred: Any) -> Any:
    """`value` if it is one value per example ([batch] or [batch, 1]) or a scalar; else a ValueError (traced,
    before any update)."""
    value = jnp.asarray(value)
    leaves = jax.tree_util.tree_leaves(y_pred)
    batch = leaves[0].shape[0] if leaves and leaves[0].ndim else None
    if value.ndim == 0 or value.shape in ((batch,), (batch, 1)):
        return value
    raise ValueError(
        f"target {name!r} must give one value per example ([batch] or [batch, 1]) or a scalar; it gives shape "
        f"{tuple(value.shape)} for a batch of {batch}"
    )


def _variable_values(ids: tuple, trainable: Sequence[Any], trace: StepTrace) -> Dict[int, Any]:
    """id(variable) -> the value the step's forward pass read: the trainable ones the optimizer receives, the
    others from the state the step received (what a layer's per-example re-call needs). `ids`: the ids of
    the model's trainable and non-trainable variables, read before training."""
    values = dict(zip(ids[0], trainable))
    if trace.inputs is not None:
        values.update(zip(ids[1], trace.inputs[0][1]))
    return values


def _origin(step: int, records: List[GroupStep], activations: bool) -> Optional[nonfinite_origin.Origin]:
    """Where the NaN/Inf of this step was born, by the rules the tab applies to the written records."""
    columns = [metadata.STAT_INDEX[name] for name in ("nan", "pos_inf", "neg_inf")]
    seen: Dict[str, List[nonfinite_origin.Seen]] = {}
    for r in records:
        bad = r.stats[:, columns].sum(axis=1) > 0
        seen[r.group.source] = [
            nonfinite_origin.Seen(layer, index, bool(b))
            for layer, index, b in zip(r.group.layers, r.group.indexes, bad)
        ]
    target = seen.get(metadata.SOURCE_TARGET)
    return nonfinite_origin.locate(
        step,
        target=metadata.DEFAULT_TARGET,
        target_nonfinite=target[0].nonfinite if target else None,
        activations=seen.get(metadata.SOURCE_ACTIVATION) if activations else None,
        outputs=seen.get(metadata.SOURCE_OUTPUT, []),
        weights=seen.get(metadata.SOURCE_WEIGHT, []),
    )
