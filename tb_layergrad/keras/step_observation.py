"""What one run of the model's own train step shows GradientLogger: its tape, its loss, its gradient call.

`StepObservation` is the `tape_observer.Observation` of one step: the layer
hooks go on for the forward pass and come off when the model's own call
returns; the first tape the step enters is adopted (the layer outputs are
watched on it); its first `gradient()` call is answered by ONE real call for
the step's sources, the layer outputs and the RNN probes (`_CombinedCall`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.gradient_map import GradientMap
from tb_layergrad.capturing.layer_capture import Capture
from tb_layergrad.capturing.layer_hooks import restore_instance_attribute, set_instance_attribute
from tb_layergrad.capturing.rnn_probe import TimestepProbe
from tb_layergrad.keras import tape_observer
from tb_layergrad.keras.model_facts import loss_scale


class StepObservation(tape_observer.Observation):
    """What one run of the model's train step shows: its tape, its loss, its gradient call."""

    def __init__(self, fit_step: Any, cap: Capture, probe: Optional[TimestepProbe]):
        super().__init__()
        self.fit_step, self.cap, self.probe = fit_step, cap, probe
        self.aux: Optional[Any] = None  # a second tape for targets and shadow weights (FitStep._aux_tape)
        self._aux_recording = False
        self.y_pred: Any = None  # the model's output in this pass (targets only, see _keeping_prediction)
        self.gmap: Optional[GradientMap] = None
        self.eps_grads: Dict[str, Any] = {}
        self.scale: Optional[tf.Tensor] = None
        self.values: Dict[str, tf.Tensor] = {}
        self.target: Any = None
        self._hooks: Optional[contextlib.ExitStack] = None

    def install_hooks(self) -> None:
        """The layer hooks of Capture (and TimestepProbe) and the model's, for this step's forward pass."""
        hooks = contextlib.ExitStack()
        hooks.enter_context(self.cap)
        if self.probe is not None:
            hooks.enter_context(self.probe)
        hooks.enter_context(_watching_the_model_call(self.fit_step.model, self))
        self._hooks = hooks

    def remove_hooks(self) -> None:
        """Right after the forward pass, so that no other replica's forward runs through them.

        Why: MirroredStrategy runs the replicas' steps in threads that take turns at
        each cross-replica call (a metric update, the optimizer's all-reduce); hooks
        left on the layers past the forward pass would see another replica's outputs.
        """
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.close()

    def adopt(self, tape: Any) -> None:
        self.cap.watch_with(tape)
        if self.probe is not None:
            self.probe.watch_with(tape)
        aux = self.fit_step.aux_tape()
        if aux is not None:
            # Records from here to the gradient call: the forward pass, the loss and
            # its scaling (tf_keras scales inside minimize(), after the step's `with`).
            aux.__enter__()
            self.aux, self._aux_recording = aux, True
            self.cap.watch_with(aux)
            if self.probe is not None:
                self.probe.watch_with(aux)

    def stop_aux(self) -> None:
        if self._aux_recording:
            self._aux_recording = False
            self.aux.__exit__(None, None, None)

    def answer(
        self, tape: Any, target: Any, sources: Any, args: tuple, kwargs: Dict[str, Any], gradient: Callable
    ) -> Any:
        fit_step = self.fit_step
        self.scale = loss_scale(fit_step.kind, fit_step.model.optimizer)  # read before the update
        if fit_step.config.targets:
            if self.y_pred is None:
                raise RuntimeError("GradientLogger(targets=...): the model was not called inside its train step's tape")
            self.values = fit_step.target_values(self.y_pred, self.scale)  # still on the aux tape
        self.target = target  # the loss as the step differentiates it (scaled, with loss scaling)
        self.remove_hooks()  # a step that never called the model itself (e.g. only its sub-models)
        self.stop_aux()  # before the backward pass: the aux tape must not record it
        eps = list(self.probe.sources.values()) if self.probe is not None else []
        combined = _CombinedCall(tape, gradient, sources, eps, args, kwargs)
        self.gmap = self.cap.gradients(combined, target, name=metadata.DEFAULT_TARGET)
        if eps:
            self.eps_grads = dict(zip(self.probe.sources.keys(), combined.extra_gradients))
        return combined.source_gradients


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
        self, tape: Any, gradient: Callable, sources: Any, extra: List[Any], args: tuple, kwargs: Dict[str, Any]
    ):
        self._tape, self._gradient, self._sources, self._extra = tape, gradient, sources, extra
        self._args, self._kwargs = args, kwargs
        self.source_gradients: Any = None
        self.extra_gradients: List[Any] = []

    def watch(self, tensor: Any) -> None:
        self._tape.watch(tensor)

    def gradient(self, target: Any, requested: Any) -> Any:
        # (variables, outputs), and with per_example=True a third part: the δ sources of the per-example rules.
        variables, outputs, *deltas = requested
        got, output_grads, extra, *delta_grads = self._gradient(
            self._tape, target, (self._sources, list(outputs), self._extra, *deltas), *self._args, **self._kwargs
        )
        self.source_gradients, self.extra_gradients = got, list(extra)
        by_id = {id(s): g for s, g in zip(tf.nest.flatten(self._sources), tf.nest.flatten(got))}
        return ([by_id.get(id(v)) for v in variables], output_grads, *delta_grads)


@contextlib.contextmanager
def _watching_the_model_call(model: Any, seen: StepObservation) -> Iterator[None]:
    """When the model's own call returns: keep its output (targets are functions of it), remove the hooks.

    Same hook as `Capture`'s on layers: an instance attribute `call`, removed afterwards.
    """
    original = model.call
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()

    def call_and_watch(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        first = next(iter(tf.nest.flatten(out)), None)
        ours = isinstance(first, tf.Tensor) and (
            hasattr(first, "numpy") if graph is None else getattr(first, "graph", None) is graph
        )
        if seen.y_pred is None and ours:
            seen.y_pred = out
            seen.remove_hooks()
        return out

    call_and_watch.__wrapped__ = original  # keeps inspect.signature() truthful
    saved = set_instance_attribute(model, "call", call_and_watch)
    try:
        yield
    finally:
        restore_instance_attribute(saved)
