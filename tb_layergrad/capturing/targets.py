"""Extra targets: the gradient of something other than the loss, e.g. one output unit.

A target is a function of the model's prediction `y_pred` (the structure the
model returns) that gives ONE VALUE PER EXAMPLE: shape [batch] (or [batch, 1]),
or a scalar. The differentiated scalar is the SUM of those values over the
batch (not the mean, unlike most losses):

    targets = {"class_3": lambda y_pred: y_pred[:, 3]}
    # differentiated: T = sum_b y_pred[b, 3]

so dT/d(layer output)[b] is the gradient of example b's own value (examples
do not interact in a forward pass without batch statistics; with BatchNorm in
training mode they do, and the sum is still what is differentiated).

Cost: each target is one more backward pass (roughly the cost of the loss's
backward pass, without the optimizer update). `GradientLogger` runs it only
on logged steps (inside a `tf.cond`).

Custom training loop (with this module's `target_values` and `target_gradients`):

    with tf.GradientTape(persistent=True) as tape:          # persistent: several targets
        with tb_layergrad.capture(model, tape=tape) as cap:
            y_pred = model(x, training=True)
        loss = loss_fn(y, y_pred)
        values = target_values(targets, y_pred)                  # inside the tape
    grads = cap.gradients(tape, loss)                        # the loss (and weight grads)
    per_target = target_gradients(cap, tape, values)         # {name: GradientMap}
    del tape
    optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
    with writer.as_default(step=optimizer.iterations):
        tb_layergrad.summary.gradients(grads)
        for g in per_target.values():
            tb_layergrad.summary.gradients(g)                # target = its name

(`cap.gradients(tape, value, name="class_3")` on a persistent tape is the same
thing for one target.)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

import tensorflow as tf

from tb_layergrad import metadata

__all__ = ["validate_targets", "target_value", "target_values", "target_gradients"]

TargetFn = Callable[[Any], Any]


def validate_targets(targets: Optional[Mapping[str, TargetFn]]) -> Dict[str, TargetFn]:
    """Check names and callables; returns a plain ordered dict (empty for None)."""
    if targets is None:
        return {}
    if not isinstance(targets, Mapping):
        raise TypeError(
            "targets must be a dict {name: function of y_pred}, e.g. "
            "{'class_3': lambda y_pred: y_pred[:, 3]}; got " + type(targets).__name__
        )
    out: Dict[str, TargetFn] = {}
    for name, fn in targets.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"target names must be non-empty strings without '/', got {name!r}")
        if name == metadata.DEFAULT_TARGET:
            raise ValueError(f"target name {name!r} is reserved for the training loss")
        if not callable(fn):
            raise TypeError(f"target {name!r} must be a function of y_pred, got {type(fn).__name__}")
        out[name] = fn
    return out


def _batch_size(y_pred: Any) -> Any:
    for t in tf.nest.flatten(y_pred):
        if t is not None and getattr(t, "shape", None) is not None and t.shape.rank:
            return t.shape[0] if t.shape[0] is not None else tf.shape(t)[0]
    return None


def check_target_shape(name: str, value: Any, batch: Any) -> None:
    """Raise a ValueError unless `value` is a scalar, [batch] or [batch, 1]."""
    shape = value.shape
    ok = shape.rank == 0
    if shape.rank in (1, 2) and (shape.rank == 1 or shape[1] == 1):
        ok = shape[0] is None or not isinstance(batch, int) or shape[0] == batch
    if not ok:
        raise ValueError(
            f"target {name!r} must give one value per example (shape [batch] or [batch, 1]) or a scalar; "
            f"got shape {shape.as_list() if shape.rank is not None else None} for a batch of {batch}. "
            "Select one unit, e.g. lambda y_pred: y_pred[:, 3], or reduce the other axes yourself."
        )


def target_value(name: str, fn: TargetFn, y_pred: Any) -> tf.Tensor:
    """The differentiated scalar of one target: sum over the batch of fn(y_pred), in float32 or wider."""
    value = tf.convert_to_tensor(fn(y_pred))
    check_target_shape(name, value, _batch_size(y_pred))
    if not (value.dtype.is_floating or value.dtype.is_complex):
        raise ValueError(f"target {name!r} must be floating point (differentiable), got {value.dtype.name}")
    if value.dtype in (tf.float16, tf.bfloat16):
        value = tf.cast(value, tf.float32)
    return tf.reduce_sum(value)


def target_values(targets: Mapping[str, TargetFn], y_pred: Any) -> Dict[str, tf.Tensor]:
    """{name: scalar} for every target; call it inside the GradientTape."""
    return {name: target_value(name, fn, y_pred) for name, fn in validate_targets(targets).items()}


def target_gradients(capture: Any, tape: Any, values: Mapping[str, Any]) -> Dict[str, Any]:
    """{name: GradientMap} of each target value, one backward pass each.

    `tape` must be persistent when it also differentiates the loss or several
    targets (`Capture.gradients` raises a clear error otherwise). The maps carry `.target == name`, so `summary.gradients` writes
    each as its own series.
    """
    return {name: capture.gradients(tape, value, name=name) for name, value in values.items()}
