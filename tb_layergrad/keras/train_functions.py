"""The train functions GradientLogger installs in fit(): the observing step compiled once, and the record writer.

Keras' own train function runs every step that logs nothing; the observing one
(`BuiltStep.logging_fn`) runs the executions that contain a logged step, and is
kept for the next fit() while nothing it depends on changed.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import tensorflow as tf

from tb_layergrad.keras.fit_step import FitStep, StepConfig
from tb_layergrad.summary import plan as plans
from tb_layergrad.summary.write import write_step


def record_writer(writer: Any, plan: plans.Plan) -> Callable:
    """One compiled function that writes a step's plan handed to Python (`plan`: its structure).

    Used where the step cannot write itself (XLA, eager, several replicas; see
    `FitStep.writes_in_step`). Why one function: written eagerly, each record
    costs its own Python and op dispatch, and a logged step has several
    records per layer. Under `writer.as_default()`, which flushes on exit:
    the records of the steps before a crash are on disk.
    """

    @tf.function(reduce_retracing=True, autograph=False)  # library code: autograph only slows tracing
    def write(step: tf.Tensor, tensors: Dict[str, tf.Tensor], histograms: tf.Tensor) -> tf.Tensor:
        with writer.as_default(), tf.summary.record_if(True):
            write_step(plan.with_tensors(tensors), step, record=True, histograms=histograms)
        return tf.constant(True)

    return write


class BuiltStep:
    """The capturing train function of one fit(), kept so the next fit() need not compile it again.

    Valid while the model is the same, Keras' own train function is the same
    object (a `compile()` in between resets it), the configuration is unchanged
    and so is the writer (a step that writes itself holds it; `close()` opens a
    new one for the next fit()).
    """

    def __init__(self, model: Any, keras_fn: Callable, config: "StepConfig", fit_step: "FitStep", logging_fn: Callable):
        self.model, self.keras_fn, self.config, self.fit_step, self.logging_fn = (
            model,
            keras_fn,
            config,
            fit_step,
            logging_fn,
        )
        self.run_eagerly = bool(getattr(model, "run_eagerly", False))
        self.traced = False

    def fits(self, model: Any, keras_fn: Callable, config: "StepConfig", writer: Any) -> bool:
        same_mode = bool(getattr(model, "run_eagerly", False)) == self.run_eagerly
        same_writer = writer is self.fit_step.writer  # a step that writes itself holds its writer
        return model is self.model and keras_fn is self.keras_fn and config == self.config and same_mode and same_writer


def step_writes_itself(model: Any) -> bool:
    """Will the capturing step write its records itself (`FitStep.writes_in_step`)?"""
    strategy = getattr(model, "distribute_strategy", None)
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    return (
        replicas == 1
        and not bool(getattr(model, "jit_compile", False))
        and not bool(getattr(model, "run_eagerly", False))
    )


def steps_per_execution(model: Any) -> int:
    spe = getattr(model, "steps_per_execution", None)
    if spe is None:
        spe = getattr(model, "_steps_per_execution", None)
    try:
        return max(1, int(spe.numpy()) if hasattr(spe, "numpy") else int(spe or 1))
    except (TypeError, ValueError):
        return 1
