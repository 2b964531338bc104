"""What one run of the model's own train step shows GradientLogger: its tapes, their gradient calls, their losses.

`StepObservation` is the `tape_observer.Observation` of one step: the layer
hooks are on for the step; every tape the step enters is adopted (the layer
outputs computed while it records are watched on it); every `gradient()` call
on such a tape that asks for at least one trainable weight of the model is
answered by ONE real call for the step's sources, the layer outputs watched on
that tape and (first target) the RNN probes (`_CombinedCall`), and becomes one
target (`LoggedTape`), named after what it differentiates (`target_name`).
Which weights are the model's is read when a call is answered, not before the
step: a model built by its first step (a `Sequential` without `Input`, a
subclassed model) has its weights by then.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.gradient_map import GradientMap
from tb_layergrad.capturing.layer_capture import Capture
from tb_layergrad.capturing.layer_hooks import hook, unhook
from tb_layergrad.capturing.layer_tree import LayerTree, trainable_weights
from tb_layergrad.capturing.rnn_probe import TimestepProbe
from tb_layergrad.keras import tape_observer
from tb_layergrad.keras.model_facts import loss_scale


@dataclasses.dataclass
class LoggedTape:
    """One gradient() call of the step that differentiated trainable weights: one target of the step's records."""

    name: str
    gmap: GradientMap  # its weight entries are the tensors the step's gradient call returned
    aux: Optional[Any]  # the tape that recorded its forward pass again (for `targets=`), or None
    eps_grads: Dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the `targets=` values (scaled like the loss) from the model's own call under this tape, on `aux`; {} if none
    values: Dict[str, Any] = dataclasses.field(default_factory=dict)
    asked: frozenset = frozenset()  # id() of the model's trainable weights it asked for


class StepObservation(tape_observer.Observation):
    """What one run of the model's train step shows: its tapes, their losses, their gradient calls."""

    def __init__(self, fit_step: Any, cap: Capture, probe: Optional[TimestepProbe]):
        super().__init__()
        self.fit_step, self.cap, self.probe = fit_step, cap, probe
        self.y_pred: Any = None  # the model's first output in this pass (targets only, see _watching_the_model_call)
        self.y_preds: Dict[int, Any] = {}  # id(step's tape) -> the model's first output while that tape recorded
        self.recording: List[Any] = []  # the step's tapes that record now (entered, not left)
        self.scale: Optional[tf.Tensor] = None
        self.values: Dict[str, tf.Tensor] = {}
        #: the gradient() calls that differentiated trainable weights, in the order the step made them
        self.logged: List[LoggedTape] = []
        #: the calls that differentiated inputs only (a gradient penalty's), when `targets=` asks for them
        self.input_logged: List[LoggedTape] = []
        #: calls that asked for trainable weights inside a tf.cond / tf.while_loop (not logged)
        self.in_control_flow = 0
        self._aux: Dict[int, Any] = {}  # id(step's tape) -> its aux tape while that one records
        self._aux_done: Dict[int, Any] = {}  # id(step's tape) -> its aux tape, stopped at its tape's first call
        self._hooks: Optional[contextlib.ExitStack] = None
        self._graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        self._trainable: set = set()
        self._owners: Dict[int, tuple] = {}
        self._know_weights()

    def _know_weights(self) -> None:
        """(Re)read the model's trainable weights and their owners: those built so far in this step too."""
        self._trainable = {id(v) for v in trainable_weights(self.fit_step.model)}
        self._owners = self.cap.tree.variable_paths()

    def install_hooks(self) -> None:
        """The layer hooks of Capture (and TimestepProbe) and the model's, for this step's forward passes."""
        hooks = contextlib.ExitStack()
        hooks.enter_context(self.cap)
        if self.probe is not None:
            hooks.enter_context(self.probe)
        hooks.enter_context(_watching_the_model_call(self.fit_step.model, self))
        self._hooks = hooks

    def remove_hooks(self) -> None:
        """At the end of the step (also when it raises).

        Several replicas: MirroredStrategy runs the replicas' steps in threads that take
        turns at each cross-replica call (a metric update, the optimizer's all-reduce);
        each replica's hooks are its thread's own (`layer_hooks.hook`), so every tape of
        every replica is observed, each replica seeing its own outputs only.
        """
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.close()

    def adopt(self, tape: Any) -> None:
        first = tape is self.tape
        self.recording.append(tape)
        self.cap.watch_with(tape)
        if first and self.probe is not None:
            self.probe.watch_with(tape)
        aux = self.fit_step.aux_tape(persistent=getattr(tape, "_persistent", False))
        if aux is not None:
            # Records from here to the gradient call: the forward pass, the loss and
            # its scaling (tf_keras scales inside minimize(), after the step's `with`).
            aux.__enter__()
            self._aux[id(tape)] = aux
            self.cap.watch_with(aux)
            if first and self.probe is not None:
                self.probe.watch_with(aux)

    def leave(self, tape: Any) -> None:
        # Its aux tape records on, to the gradient call (tf_keras scales the loss after the step's `with`).
        self.cap.unwatch(tape)
        self.recording = [t for t in self.recording if t is not tape]

    def _stop_aux(self, tape: Any) -> Optional[Any]:
        """Stop `tape`'s aux tape (at its first gradient call); later calls of a persistent tape get the same one."""
        aux = self._aux.pop(id(tape), None)
        if aux is not None:
            aux.__exit__(None, None, None)
            self.cap.unwatch(aux)
            self._aux_done[id(tape)] = aux
            return aux
        return self._aux_done.get(id(tape))

    def stop_aux(self) -> None:
        for aux in list(self._aux.values()):
            aux.__exit__(None, None, None)
        self._aux.clear()

    def answer(
        self, tape: Any, target: Any, sources: Any, args: tuple, kwargs: Dict[str, Any], gradient: Callable
    ) -> Any:
        flat = tf.nest.flatten(sources)
        if any(id(s) not in self._trainable and _is_variable(s) for s in flat):
            self._know_weights()  # weights built by the forward pass of this step (its first run or trace)
        asked = frozenset(id(s) for s in flat if id(s) in self._trainable)
        here = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        wanted = asked or self.fit_step.config.input_target is not None
        if not wanted:
            return gradient(tape, target, sources, *args, **kwargs)  # e.g. a gradient penalty's tape, not asked for
        if here is not self._graph:  # inside tf.cond / tf.while_loop: its tensors cannot leave that branch
            self.in_control_flow += 1
            return gradient(tape, target, sources, *args, **kwargs)
        if not asked:
            return self._answer_for_inputs(tape, target, sources, args, kwargs, gradient)
        fit_step, first = self.fit_step, not self.logged
        if first:
            self.scale = loss_scale(fit_step.kind, fit_step.model.optimizer)  # read before the update
        values = {}
        if fit_step.config.targets and id(tape) in self.y_preds and id(tape) in self._aux:  # still on the aux tape
            values = fit_step.target_values(self.y_preds[id(tape)], self.scale if first else None)
            if first:
                self.values = values
        aux = self._stop_aux(tape)  # before the backward pass: the aux tape must not record it
        eps = list(self.probe.sources.values()) if first and self.probe is not None else []
        # Its value: what the call differentiates. A loss per example (keras.io's SimCLR) or a list of losses
        # is summed by tape.gradient, weighted by `output_gradients` if given; a scalar loss is itself.
        weighted = args or kwargs.get("output_gradients") is not None
        value = target if _is_scalar(target) and not weighted else _differentiated_sum(target, args, kwargs)
        combined = _CombinedCall(tape, gradient, sources, eps, args, kwargs, target=None if value is target else target)
        name = self._numbered(target_name(self.cap.tree, self._owners, asked, self._trainable), self.logged)
        gmap = self.cap.tape_gradients(combined, value, name, watched_on=tape)
        variables = {self._owners[id(s)][0]: s for s in flat if id(s) in self._owners}
        gmap = gmap.with_entries(
            {p: gmap.entry(p) for p in gmap if gmap.entry(p).source != metadata.SOURCE_WEIGHT or p in variables}
        )
        eps_grads = dict(zip(self.probe.sources.keys(), combined.extra_gradients)) if eps else {}
        self.logged.append(LoggedTape(name, gmap, aux, eps_grads, values, asked))
        return combined.source_gradients

    def _answer_for_inputs(
        self, tape: Any, target: Any, sources: Any, args: tuple, kwargs: Dict[str, Any], gradient: Callable
    ) -> Any:
        """A tape that differentiates inputs only (a gradient penalty's), asked for by `targets=`: one target.

        Its one gradient call also gives the layer outputs recorded under it; what
        is differentiated is the sum of its target (times `output_gradients`, if
        given), as `tape.gradient` does: that sum is the target's value.
        """
        self._stop_aux(tape)  # nothing of it is differentiated again (no weight was asked for)
        combined = _CombinedCall(tape, gradient, sources, [], args, kwargs, target=target)
        name = self._numbered(self.fit_step.config.input_target, self.input_logged)
        value = _differentiated_sum(target, args, kwargs)
        gmap = self.cap.tape_gradients(combined, value, name, watched_on=tape, per_example=False)
        gmap = gmap.with_entries({p: gmap.entry(p) for p in gmap if gmap.entry(p).source != metadata.SOURCE_WEIGHT})
        self.input_logged.append(LoggedTape(name, gmap, None))
        return combined.source_gradients

    def name_targets(self) -> None:
        """Name each call again once the step has run, from the weights the model then has.

        A call is named when it is answered too (it must be, to be numbered), but a
        step that builds its weights (its first run or trace) may build some after
        that call: asking for all the weights built so far is not asking for all of
        the model's, and the name must be the one every later step gives it.
        """
        self._know_weights()
        named: List[LoggedTape] = []
        for tape in self.logged:
            tape.name = self._numbered(target_name(self.cap.tree, self._owners, tape.asked, self._trainable), named)
            named.append(tape)

    @staticmethod
    def _numbered(base: str, before: List[LoggedTape]) -> str:
        """`base`, or `base#k` for the k-th call of this step that gets it."""
        taken = sum(1 for t in before if t.name.split("#")[0] == base)
        return base if not taken else f"{base}#{taken + 1}"

    def outside_tapes(self) -> List[str]:
        """Keys of the outputs the step computed while no tape of it recorded (no gradient of it reaches them).

        Only of layers that hold trainable weights: a frozen teacher run outside the tape
        (a Distiller) is not something to log.
        """
        return [r.key for r in self.cap.records_watched_on(None) if trainable_weights(r.node.layer)]


def target_name(tree: LayerTree, owners: Dict[int, tuple], asked: frozenset, trainable: set) -> str:
    """What a gradient call differentiates, as a target's name (docs/FIT.md, "Custom `train_step`").

    "loss" when it asks for every trainable weight of the model. Otherwise the
    deepest sub-model or composite layer (one with layers of its own) that owns
    all the weights it asks for: a leaf layer's weights name the group it is in,
    never the layer (an encoder of one Dense is "encoder", not its Dense). Where
    that is the model itself, the top-level layers or sub-models that own them,
    in model order, joined by "+" (the model's own name for its own weights).
    From the layer tree alone: the same in graph, eager and XLA, run after run.
    """
    if asked >= trainable:
        return metadata.DEFAULT_TARGET
    nodes = [owners[i][1] for i in asked if i in owners]
    if not nodes:
        return metadata.DEFAULT_TARGET
    parts = [n.path.split("/") for n in nodes]
    common = parts[0]
    for p in parts[1:]:
        common = common[: next((k for k, (a, b) in enumerate(zip(common, p)) if a != b), min(len(common), len(p)))]
    by_path = {n.path: n for n in tree.nodes}
    while len(common) > 1 and not by_path["/".join(common)].children:
        common = common[:-1]  # a leaf layer: the group it is in
    if len(common) > 1:
        return common[-1]
    groups = {}
    for node, p in zip(nodes, parts):
        top = by_path["/".join(p[:2])] if len(p) > 1 else node  # the root's own weight: the root
        groups[top.index] = top.name
    return "+".join(groups[i] for i in sorted(groups))


def _is_scalar(target: Any) -> bool:
    """One scalar tensor (not a list of one): what the step differentiates is then the target itself."""
    return not tf.nest.is_nested(target) and getattr(target, "shape", None) is not None and target.shape.rank == 0


def _is_variable(source: Any) -> bool:
    """A variable (tf or Keras), not a tensor: only variables can be weights of the model."""
    return isinstance(source, tf.Variable) or hasattr(source, "assign_sub") and not isinstance(source, tf.Tensor)


class _CombinedCall:
    """The tape `Capture.gradients` is given: its one call becomes the step's own call, extended.

    The step asked for `sources`; Capture asks for (model variables, layer
    outputs). ONE real call is made for (sources, layer outputs, extra): the
    step gets its part exactly as the real method returns it, and Capture gets
    each model variable's gradient picked from it by identity (None for a
    variable the step did not ask for).
    """

    _persistent = False

    def __init__(
        self,
        tape: Any,
        gradient: Callable,
        sources: Any,
        extra: List[Any],
        args: tuple,
        kwargs: Dict[str, Any],
        target: Any = None,
    ):
        self._tape, self._gradient, self._sources, self._extra = tape, gradient, sources, extra
        self._args, self._kwargs = args, kwargs
        self._target = target  # the step's own target, differentiated as given (else the one Capture passes)
        self.source_gradients: Any = None
        self.extra_gradients: List[Any] = []

    def watch(self, tensor: Any) -> None:
        self._tape.watch(tensor)

    def gradient(self, target: Any, requested: Any) -> Any:
        # (variables, outputs), and with per_example=True a third part: the δ sources of the per-example rules.
        variables, outputs, *deltas = requested
        target = target if self._target is None else self._target
        got, output_grads, extra, *delta_grads = self._gradient(
            self._tape, target, (self._sources, list(outputs), self._extra, *deltas), *self._args, **self._kwargs
        )
        self.source_gradients, self.extra_gradients = got, list(extra)
        by_id = {id(s): g for s, g in zip(tf.nest.flatten(self._sources), tf.nest.flatten(got))}
        return ([by_id.get(id(v)) for v in variables], output_grads, *delta_grads)


def _differentiated_sum(target: Any, args: tuple, kwargs: Dict[str, Any]) -> tf.Tensor:
    """The scalar `tape.gradient(target, ..., output_gradients=w)` differentiates: sum(target * w), or sum(target)."""
    weights = kwargs.get("output_gradients", args[0] if args else None)
    targets = tf.nest.flatten(target)
    weights = [None] * len(targets) if weights is None else tf.nest.flatten(weights)
    terms = [tf.reduce_sum(t if w is None else t * tf.cast(w, t.dtype)) for t, w in zip(targets, weights)]
    return terms[0] if len(terms) == 1 else tf.add_n(terms)


@contextlib.contextmanager
def _watching_the_model_call(model: Any, seen: StepObservation) -> Iterator[None]:
    """When the model's own call returns: keep its output (targets are functions of it).

    Same hook as `Capture`'s on layers: the calling thread's `call`, removed afterwards.
    """
    original = model.call
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()

    def call_and_watch(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        first = next(iter(tf.nest.flatten(out)), None)
        ours = isinstance(first, tf.Tensor) and (
            hasattr(first, "numpy") if graph is None else getattr(first, "graph", None) is graph
        )
        if ours:
            seen.y_pred = out if seen.y_pred is None else seen.y_pred
            for tape in seen.recording:
                seen.y_preds.setdefault(id(tape), out)
        return out

    call_and_watch.__wrapped__ = original  # keeps inspect.signature() truthful
    installed = hook(model, "call", call_and_watch)  # this thread's (replica's) own, as the layers' hooks
    try:
        yield
    finally:
        unhook(installed)
