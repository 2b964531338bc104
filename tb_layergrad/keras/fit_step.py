"""Internal: the train step `GradientLogger` runs inside `model.fit()`: the model's own, observed.

Why observed, not copied. The step fit() runs is the model's `train_step`,
unmodified: Keras' own (Keras 3 or tf_keras, whatever the version) or the
model's override. While it runs (traces, in graph mode and XLA), an
observation is active (`step_observation`): the layer hooks of `Capture` (and
`TimestepProbe`) are installed, every `tf.GradientTape` the step enters has
the outputs computed under it watched on it, and every `tape.gradient(loss,
weights)` call that asks for trainable weights is answered by ONE call for
(weights, layer outputs, probes) whose weight part goes back to the step
unchanged: one target per such call (a GAN's discriminator, then generator; a
persistent tape's every call). Watch-style capture adds no op to the forward pass, so training
stays bitwise what it is without the callback; identity-style capture
(custom gradients) would not (docs/FIT.md).

The step counts the batch (`batch_count.advance`: the step written at is the
count of batches trained) and computes the logging flag from it (a tensor).
What it logs is one plan
(`tb_layergrad.summary.plan`), written by the one write step
(`summary.write.write_step`), in one of three places (`FitStep._with_records`):
in the step itself, behind the flag (graph mode without XLA); or handed out
of the step in the logs under PAYLOAD_KEY and written by the callback
(XLA and eager: the gradients, unreduced; several replicas: the merged
records, encoded by `replica_payload`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.gradient_map import GradientMap
from tb_layergrad.capturing.layer_capture import Capture
from tb_layergrad.capturing.rnn_probe import TapeWithExtraSources, TimestepProbe
from tb_layergrad.capturing.targets import target_value
from tb_layergrad.distribute.merge import merge_in_replica, merge_per_example, replica_context
from tb_layergrad.keras import nonfinite_check, replica_payload, step_messages, tape_observer
from tb_layergrad.keras.batch_count import BatchCount, advance, logged
from tb_layergrad.keras.model_facts import model_train_step
from tb_layergrad.keras.neutral_read import neutral_inputs, neutral_read
from tb_layergrad.keras.step_observation import StepObservation
from tb_layergrad.summary import per_example_write
from tb_layergrad.summary import plan as plans
from tb_layergrad.summary.conditions import when
from tb_layergrad.summary.write import reduced_plan, write_step, write_step_checked

PAYLOAD_KEY = "__tb_layergrad__"


def _unscale(g: Any, scale: Optional[tf.Tensor]) -> Any:
    if g is None or scale is None:
        return g
    dt = tf.float32 if g.dtype in (tf.float16, tf.bfloat16, tf.float32) else g.dtype
    return tf.cast(g, dt) / tf.cast(scale, dt)


@dataclasses.dataclass
class StepConfig:
    layers: Any
    weights: bool
    timesteps: Any  # False, True, or a layer spec
    targets: Dict[str, Callable]
    max_elements: int
    update_freq: Union[int, str]  # an int N (step % N == 0) or "epoch" (batch_count.logged)
    xla: bool
    activations: bool = False  # also the layer outputs' forward values (source "activation")
    on_nonfinite: str = "log"  # "stop" and "raise" need every step's finiteness flags in Python
    per_example: bool = False  # each example's own gradient norms of the loss (kind `examples`) and the noise scale
    input_target: Optional[str] = None  # the name of the step's tapes w.r.t. inputs only (None: not logged)


class FitStep:
    """Builds the observing train_step for one fit() call; remembers the plan it logs."""

    def __init__(self, model: Any, kind: str, config: StepConfig, count: BatchCount, writer: Any = None):
        self.model = model
        #: the batches trained (the step written at), advanced by this step
        self.count = count
        self.kind = kind
        self.config = config
        #: the summary writer the step writes to itself (see `writes_in_step`); None: hand records to Python.
        self.writer = writer
        #: the model's own train step, run unmodified inside the observation (read before the callback
        #: sets its own as the model's instance attribute).
        self.inner = model_train_step(model)
        #: the structure of the plan handed out of the step (no tensors), set when the step is traced or run.
        self.plan: Optional[plans.Plan] = None
        #: (rank, dtype) of each tensor of that plan, to decode several replicas' payload.
        self.layout: Dict[str, Tuple[int, tf.DType]] = {}
        #: the series whose finiteness every step checks, in the order of the flags it hands out.
        self.checked: List[metadata.SeriesInfo] = []
        #: the target of the step's first logged tape ("loss" for a standard step), whose series the check reads
        self.main_target = metadata.DEFAULT_TARGET
        #: the first non-finite step and its flags, kept by the step that writes itself (the first such step is
        #: written in full, logged or not)
        self.first_nonfinite = nonfinite_check.FirstNonfinite()

    def _step_and_flag(self) -> Tuple[tf.Tensor, tf.Tensor]:
        step = advance(self.count.variable)  # this batch's position: Keras' TensorBoard batch step
        return step, logged(step, self.config.update_freq, self.count.epoch_last)

    # -- the observed step ------------------------------------------------------
    def train_step(self, data: Any) -> Any:
        """The model's own train step, observed (module docstring), then this step's records."""
        step, log = self._step_and_flag()
        cfg = self.config
        cap = Capture(
            self.model, layers=cfg.layers, weights=cfg.weights, activations=cfg.activations, per_example=cfg.per_example
        )
        probe = (
            TimestepProbe(self.model, None if cfg.timesteps is True else cfg.timesteps)
            if cfg.timesteps is not False
            else None
        )
        seen = StepObservation(self, cap, probe)
        with contextlib.ExitStack() as scope:
            scope.callback(seen.stop_aux)  # also when the step raises
            scope.callback(seen.remove_hooks)
            scope.enter_context(tape_observer.observing(seen))
            seen.install_hooks()
            logs = self.inner(data)
        seen.name_targets()
        if seen.tape is None:
            raise RuntimeError(
                f"{type(self.model).__name__}.train_step entered no tf.GradientTape: GradientLogger logs the gradients "
                "a train step computes with one. Capture inside your step with tb_layergrad.capture instead."
            )
        if cfg.targets and seen.logged and not any(t.values for t in seen.logged):
            raise RuntimeError(
                f"GradientLogger(targets=...): {type(self.model).__name__}.train_step did not call the model itself "
                "(`self(x)`) inside a GradientTape it differentiates weights with, and targets are functions of that "
                "call's prediction: call the model inside such a tape, or drop targets="
            )
        step_messages.warn_about(self.model, seen)
        if not seen.logged:
            return logs
        self.main_target = seen.logged[0].name
        main, auxiliary = self._plan(cap, probe, seen, step)
        return self._with_records(logs, step, log, main, auxiliary)

    # -- auxiliary backward passes (logged steps only) --------------------------
    def aux_tape(self, persistent: bool = False) -> Optional[Any]:
        """A tape that records a step's tape's forward pass again, for the targets' backward passes.

        `persistent`: the step's tape is, and each of its gradient calls asks this one again.
        """
        n = len(self.config.targets)
        if not n:
            return None
        tape = tf.GradientTape(persistent=persistent or n > 1)
        tape._layergrad_own = True  # not one of the step's tapes (tape_observer)
        return tape

    # -- targets ---------------------------------------------------------------
    def target_values(self, y_pred: Any, scale: Optional[tf.Tensor]) -> Dict[str, tf.Tensor]:
        out = {}
        for name, fn in self.config.targets.items():
            value = target_value(name, fn, y_pred)
            if scale is not None:  # same protection against float16 underflow as the loss
                value = value * tf.cast(scale, value.dtype)
            out[name] = value
        return out

    # -- the records ------------------------------------------------------------
    def _plan(
        self, cap: Capture, probe: Optional[TimestepProbe], seen: StepObservation, step: tf.Tensor
    ) -> Tuple[plans.Plan, Optional[Callable[[], plans.Plan]]]:
        """(what every step computes, what only a written step computes) of this step's records.

        The first part holds each logged tape's gradients as the step's own
        gradient call returned them (`_own_weights`), the loss's with its
        activations, value and per-timestep norms, unscaled, replicas merged:
        the loss's part is what the finiteness check of every step looks at.
        The second (None when empty) holds the auxiliary backward passes, each
        extra target's; a function, so that where the step writes itself it
        runs inside the recording condition, on written steps only.
        """
        eps_sources = dict(probe.sources) if probe is not None else {}
        first, *others = seen.logged
        name = first.name
        loss_map = self._own_weights(first.gmap, step)
        main = self._target_plan(name, loss_map, first.eps_grads, probe, seen.scale, forward=True)
        # Each tape's per-example norms, unscaled as its gradients are; the plan that holds a group writes its
        # `examples` record, the weights' plan the noise scale.
        ctx = replica_context()
        examples = plans.Plan()
        for tape, scale in [(first, seen.scale)] + [(o, None) for o in others]:
            per_example = tape.gmap.per_example
            if ctx is not None:  # several replicas: every replica's norms, in global batch order, at every step
                per_example = merge_per_example(per_example, ctx)
            examples = examples + plans.Plan(
                per_example=per_example_write.from_norms(per_example, tape.name, tape.gmap, scale)
            )
        main = dataclasses.replace(main, per_example=examples.per_example)
        for other in others:  # each further tape of the step: its own target (its loss's value, no activations)
            other_map = self._own_weights(other.gmap, step)
            main = main + self._target_plan(other.name, other_map, {}, None, None, forward=False, with_value=True)
        for inputs in seen.input_logged:  # tapes w.r.t. inputs only, asked for by targets=: no weights, no scale
            main = main + self._target_plan(inputs.name, inputs.gmap, {}, None, None, forward=False, with_value=True)
        with_values = [t for t in seen.logged if t.values]  # the tapes under which the model's own call ran
        if not with_values:
            return main, None

        def auxiliary() -> plans.Plan:
            plan = examples
            for k, tape in enumerate(with_values, start=1):  # targets=: on each such tape, the k-th as "name#k"
                is_first = tape is first
                eps = eps_sources if is_first else {}
                for target_name, value in tape.values.items():
                    name = target_name if k == 1 else f"{target_name}#{k}"
                    wrapped = TapeWithExtraSources(tape.aux, list(eps.values()))
                    tmap = cap.tape_gradients(wrapped, value, name, watched_on=tape.aux, per_example=False)
                    teps = dict(zip(eps.keys(), wrapped.extra_gradients))
                    plan = plan + self._target_plan(
                        name,
                        tmap,
                        teps,
                        probe if is_first else None,
                        seen.scale if is_first else None,
                        forward=False,
                        with_value=True,
                    )
            return plan

        return main, auxiliary

    def _own_weights(self, gmap: GradientMap, marker: tf.Tensor) -> GradientMap:
        """`gmap` with each weight's gradient as the step's gradient call returned it, read neutrally.

        The records read the very tensors the optimizer applies (no second
        backward pass: one would read forward tensors from the recording
        condition, which changes what grappler merges in the forward pass); in a
        graph each through `neutral_read`, so that reading it changes no rewrite
        of the update. Under XLA the tensors leave the compiled step as they are
        (docs/DESIGN.md, "XLA neutrality").
        """
        if self.config.xla:
            return gmap
        weights = {p: gmap.entry(p) for p in gmap if gmap.entry(p).source == metadata.SOURCE_WEIGHT}
        read = {p: dataclasses.replace(e, value=neutral_read(e.value, marker)) for p, e in weights.items()}
        return gmap.with_entries({p: read.get(p, gmap.entry(p)) for p in gmap})

    def _target_plan(
        self,
        target: str,
        gmap: GradientMap,
        eps_grads: Dict[str, Any],
        probe: Optional[TimestepProbe],
        scale: Optional[tf.Tensor],
        forward: bool,
        with_value: bool = False,
    ) -> plans.Plan:
        """One target's records; `forward`: also the step's activations and the target's value; `with_value`: its value only."""
        cfg = self.config
        entries = {p: dataclasses.replace(gmap.entry(p), value=_unscale(gmap[p], scale)) for p in gmap}
        value = _unscale(gmap.target_value, scale) if (forward or with_value) else None
        acts = {p: gmap.activation_entry(p) for p in gmap.activations} if forward else None
        unscaled = GradientMap(entries, target, [], activations=acts, target_value=value)
        eps = {}
        if probe is not None:
            for key, source in probe.sources.items():
                g = eps_grads.get(key)
                eps[key] = tf.zeros_like(source) if g is None else _unscale(g, scale)
        ctx = replica_context()
        merged = merge_in_replica(unscaled, ctx, eps) if ctx is not None else None
        plan = plans.from_gradients(
            merged.gradients if merged else unscaled, target, cfg.max_elements, captured_dtypes=True
        )
        timesteps = merged.timesteps if merged is not None else eps
        steps = tuple(
            plans.timesteps(
                key,
                target=target,
                index=probe.layer_index(key),
                max_elements=cfg.max_elements,
                dtype=probe.sources[key].dtype.name,
                gradient=value,
            )
            for key, value in timesteps.items()
        )
        return dataclasses.replace(plan, timesteps=steps)

    def writes_in_step(self) -> bool:
        """Does the compiled step write its records itself?

        Yes in graph mode without XLA: handing the gradients to Python and calling a
        second compiled function there costs more than the reductions (docs/DESIGN.md,
        "Benchmark notes"). Not under XLA (see `_with_records`),
        not eagerly (the callback writes then), not with several replicas (the records
        cross Keras' reduction of the step's outputs).
        """
        return self.writer is not None and not self.config.xla and not tf.executing_eagerly()

    def _with_records(
        self,
        logs: Any,
        step: tf.Tensor,
        log: tf.Tensor,
        main: plans.Plan,
        auxiliary: Optional[Callable[[], plans.Plan]],
    ) -> Any:
        """Check this step for NaN/Inf; write its records in the step, or hand them out in the logs (module docstring).

        Every step hands out the finiteness flags of `main`'s series (the
        callback's `on_nonfinite` reads them); a step is written when it is
        logged, or when it is the first at which anything is non-finite.
        Under XLA nothing is conditional on `log` in the compiled step (handing
        backward-pass tensors to a conditional moves XLA's fusion boundaries and
        the last bits of training), and the gradients leave it unreduced: XLA's
        CPU code sums a tensor in one serial chain, and `histogram_fixed_width`
        does not compile. `log` travels with the payload: with
        `steps_per_execution > 1` only some steps of an execution are logged.
        """
        ctx = replica_context()
        self.checked = nonfinite_check.checked_series(main)
        logs = dict(logs)
        if ctx is None and self.writes_in_step():
            with tf.name_scope("layergrad"):
                state = self.first_nonfinite
                record, flags = write_step_checked(main, step, log, state.none_yet(), writer=self.writer, flush=True)
                written = [record]
                if auxiliary is not None:
                    branch = self._written_auxiliary(auxiliary, record, step)
                    written.append(neutral_inputs(lambda: when(record, branch, out_of_line=False), step))
                with tf.control_dependencies(written):
                    state.remember(step, flags)
            if self.config.on_nonfinite != "log":  # the callback acts at once: it needs the flags of every step
                logs[PAYLOAD_KEY] = {"step": step, "flags": flags}
            return logs
        flags = nonfinite_check.flags(main)
        if auxiliary is not None and (not tf.executing_eagerly() or bool(log) or bool(tf.reduce_any(flags))):
            main = main + auxiliary()  # XLA, several replicas: unconditional (see the callback's docstring)
        plan = reduced_plan(main, xla_safe=self.config.xla) if ctx is not None else main.prepared()
        tensors = plan.tensors()
        self.plan = plan.with_tensors({})
        self.layout = {key: (t.shape.rank, t.dtype) for key, t in tensors.items()}
        if ctx is not None:
            logs[PAYLOAD_KEY] = replica_payload.encode(step, log, tensors, flags)
        else:
            logs[PAYLOAD_KEY] = {"step": step, "log": log, "tensors": tensors, "flags": flags}
        return logs

    def _written_auxiliary(
        self, auxiliary: Callable[[], plans.Plan], record: tf.Tensor, step: tf.Tensor
    ) -> Callable[[], None]:
        """The branch that writes the auxiliary records: their backward passes inline, their writes out of line.

        Why inline: a backward pass reads forward tensors for their shape only (an
        `AddV2`'s gradient reads its operands' shapes). In the step's graph the
        optimizer drops such reads once they are dead; a function call keeps every
        tensor it is handed as a live input, and an extra reader of a `MatMul`'s
        output stops grappler's remapper from fusing it with its bias add and
        activation, which changes the forward pass's last bits. Inline, the branch's
        ops are the step's own and its dead reads go. The writes stay one call
        (`summary.conditions.cond_out_of_line`), handed the passes' results only.
        """

        def run() -> None:
            plan = auxiliary()
            when(record, lambda: write_step(plan, step, record=True, writer=self.writer, flush=True))

        return run
