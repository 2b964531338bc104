"""The step GradientLogger writes at: the count of batches the model has trained, kept by the logger.

Why not `optimizer.iterations`: it counts the updates of ONE optimizer. A
train step that applies its own optimizers (a GAN's `d_optimizer` and
`g_optimizer`), several updates per batch (a WGAN critic), or one update
every k batches (gradient accumulation) makes that count something other
than the batches trained, and a compiled optimizer the step never applies
stays at 0, so that every batch lands on one step. The count kept here is
the one Keras' `TensorBoard(update_freq=1)` writes a batch's `batch_*`
scalars at in one fit() of a new model: the batch's position, from 1.

How it is kept. An int64 variable, created once per logger, that the
observing step advances by one at every step it runs (`advance`, inside the
compiled step: with `steps_per_execution > 1` each step of an execution has
its own number). Python follows it without reading it back: Keras reports
each execution's last step index to `on_train_batch_end`, and the difference
to the previous one is the number of batches it trained; batches trained by
Keras' own train function (off-schedule with `on_nonfinite="ignore"`) are
added to the variable before the observing step runs again (`sync`).

Where it starts (`begin`, docs/FIT.md "The step"):
1. a later fit() of the same model with the same logger: where it stopped;
2. a model whose optimizers (the compiled one and those the model holds as
   attributes) have made no update: 0, a new model; a model that trains with
   Keras' own train step and one optimizer that does not skip updates:
   that optimizer's update count;
3. fit(initial_epoch=e) with a known number of steps per epoch: e x steps;
4. otherwise (a new logger on a model that has trained, e.g. restored from a
   checkpoint in a new process): the first batch of this fit() runs unlogged,
   and the optimizer that advanced exactly once per batch in it says how many
   batches came before (its update count before the batch). When none did,
   that batch raises an error that says what to pass: the count cannot be
   known, and a guess could put two batches on one step.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional

import tensorflow as tf

from tb_layergrad.keras.model_facts import update_count


def held_optimizers(model: Any) -> List[Any]:
    """The optimizers a model holds: the compiled one and those set as its attributes (a GAN's own)."""
    found: List[Any] = []
    for obj in [getattr(model, "optimizer", None), *vars(model).values()]:
        if obj is None or not (hasattr(obj, "apply_gradients") and hasattr(obj, "iterations")):
            continue
        if all(obj is not seen for seen in found):
            found.append(obj)
    return found


def _updates_once_per_batch(model: Any) -> bool:
    """Does the model train with Keras' own train step and an optimizer that updates at every batch?

    Keras' own step (no override: the method comes from Keras' module) applies the
    compiled optimizer once per batch, unless it skips overflowing steps (loss scaling).
    """
    step = getattr(type(model), "train_step", None)
    root = getattr(step, "__module__", "").split(".")[0]
    optimizer = getattr(model, "optimizer", None)
    own = "train_step" not in vars(model) and root in ("keras", "tf_keras")
    return (
        own and optimizer is not None and not hasattr(optimizer, "inner_optimizer") and len(held_optimizers(model)) == 1
    )


def _updates(optimizers: List[Any]) -> Dict[int, int]:
    return {id(o): int(tf.convert_to_tensor(update_count(o)).numpy()) for o in optimizers}


def _name(optimizer: Any, model: Any) -> str:
    for attr, value in vars(model).items():
        if value is optimizer and not attr.startswith("_"):
            return attr
    return "optimizer"


class BatchCount:
    """Batches trained by one model, as this logger counts them (module docstring)."""

    def __init__(self) -> None:
        self.model: Any = None
        #: batches trained before the next call of the train function (known in Python).
        self.count = 0
        self.variable: Optional[tf.Variable] = None  # the count the observing step advances
        self.epoch_last: Optional[tf.Variable] = None  # the last step of the current epoch ("epoch" schedule)
        self._at = 0  # the variable's value as Python knows it
        self._end_step = -1  # the last step index Keras reported in this epoch
        self._known = True
        self._first_epoch = True
        self._optimizers: List[Any] = []
        self._before: Dict[int, int] = {}

    @property
    def known(self) -> bool:
        """Is the count known before the next call (False: the next batch finds it, rule 4)?"""
        return self._known

    def begin(self, model: Any) -> None:
        """At on_train_begin: continue this logger's count of `model`, or find where it starts."""
        self._make_variables(model)
        self._first_epoch = True
        if model is self.model:
            return
        self.model, self.count, self._at = model, 0, 0
        self.variable.assign(0)
        self._optimizers = held_optimizers(model)
        self._before = _updates(self._optimizers)
        self._known = not any(self._before.values())
        if not self._known and _updates_once_per_batch(model):
            self.count = int(tf.convert_to_tensor(update_count(model.optimizer)).numpy())
            self._known = True

    def epoch_begin(self, epoch: int, steps: Optional[int]) -> None:
        """At on_epoch_begin: rule 3 for the first epoch of a fit(); the last step of this epoch."""
        self._end_step = -1
        if self._first_epoch and not self._known and epoch > 0 and steps:
            self.count = epoch * int(steps)
            self._known = True
        self._first_epoch = False
        self.epoch_last.assign(self.count + int(steps) if steps else -1)

    def sync(self) -> None:
        """Before the observing step runs: bring the variable to the count (Keras' own function ran)."""
        if self._at != self.count:
            self.variable.assign(self.count)
            self._at = self.count

    def batch_end(self, end_step: int, observed: bool) -> None:
        """At on_train_batch_end: the call trained `end_step - previous` batches; `observed`: ours ran."""
        ran = max(1, int(end_step) - self._end_step)
        self._end_step = int(end_step)
        if not self._known:
            self._find_start(ran)
        self.count += ran
        if observed:
            self._at += ran

    def _find_start(self, ran: int) -> None:
        after = _updates(self._optimizers)
        once = [self._before[k] for k in after if after[k] - self._before[k] == ran]
        if not once:
            seen = ", ".join(
                f"{_name(o, self.model)}: {self._before[id(o)]} -> {after[id(o)]}" for o in self._optimizers
            )
            raise RuntimeError(
                "GradientLogger cannot tell how many batches this model trained before this fit(): none of its "
                f"optimizers made exactly one update per batch in its first batch ({seen}), so its update count "
                "cannot stand for the batch count, and a guess could write two batches at one step. Pass "
                "fit(initial_epoch=...) (the count then starts at initial_epoch x steps per epoch), or log the "
                "whole training with one GradientLogger (a later fit() continues its count)."
            )
        self.count = max(once)
        self._known = True

    def warn_unlogged_first_batch(self) -> None:
        warnings.warn(
            "GradientLogger: this model has trained before and this logger has not counted its batches: the first "
            "batch of this fit() runs unlogged, to learn the count from the optimizer that updates once per batch "
            "(fit(initial_epoch=...) avoids this)",
            RuntimeWarning,
            stacklevel=3,
        )

    def _make_variables(self, model: Any) -> None:
        if self.variable is not None:
            return
        strategy = getattr(model, "distribute_strategy", None)
        scope = strategy.scope() if strategy is not None else tf.init_scope()
        with scope, tf.init_scope():
            # One step of several replicas advances it once (as Keras' optimizer iterations).
            self.variable = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="layergrad_batches",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            self.epoch_last = tf.Variable(
                -1,
                dtype=tf.int64,
                trainable=False,
                name="layergrad_epoch_last",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )


def advance(variable: tf.Variable) -> tf.Tensor:
    """Inside the observing step: count this batch; returns its step (the count after it)."""
    with tf.control_dependencies([variable.assign_add(1, read_value=False)]):
        return tf.identity(variable.read_value())


def logged(step: tf.Tensor, update_freq: Any, epoch_last: tf.Variable) -> tf.Tensor:
    """bool tensor: is `step` on the schedule (`update_freq`: an int N, or "epoch")?"""
    if update_freq == "epoch":
        return tf.equal(step, epoch_last.read_value())
    return tf.equal(tf.math.floormod(step, update_freq), 0)
