"""GradientLogger's arguments: checked before training, and a warning for one that would have no effect.

Why warn: an option that silently does nothing in a combination (the noise
scale of `per_example=True` needs the weight gradients) leaves a user
looking for records that will never be written.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import tensorflow as tf

from tb_layergrad import logger_arguments
from tb_layergrad.capturing.layer_capture import Capture
from tb_layergrad.capturing.rnn_probe import TimestepProbe
from tb_layergrad.capturing.targets import check_target_shape, validate_targets
from tb_layergrad.keras import model_facts, train_functions

#: the `targets=` value that asks for the step's tapes that differentiate inputs only (a gradient penalty's)
INPUT_TAPES = "inputs"


def targets(value: Optional[Mapping[str, Any]]) -> Tuple[Dict[str, Callable], Optional[str]]:
    """`targets=` split: ({name: fn(y_pred)}, the name given to the tapes w.r.t. inputs, or None).

    A value is a function of the prediction, or the string "inputs" (at most one name).
    """
    if not isinstance(value, Mapping):
        return validate_targets(value), None  # None -> {}, anything else -> its TypeError
    strings = {name: v for name, v in value.items() if isinstance(v, str)}
    for name, v in strings.items():
        if v != INPUT_TAPES:
            raise ValueError(
                f"targets={{{name!r}: {v!r}}}: a target is a function of y_pred, or {INPUT_TAPES!r} to log the "
                "step's tapes that differentiate inputs only (a gradient penalty's)"
            )
    if len(strings) > 1:
        raise ValueError(
            f"targets: {sorted(strings)} all ask for {INPUT_TAPES!r}; give those tapes one name "
            f"(e.g. {{'gradient_penalty': {INPUT_TAPES!r}}}): several in one step are numbered name#2, name#3, ..."
        )
    functions = validate_targets({n: v for n, v in value.items() if n not in strings})
    if strings:
        name = next(iter(strings))
        validate_targets({name: len})  # the same rules for the name as for any target
        return functions, name
    return functions, None


def warn_without_effect(weights: bool, per_example: bool, input_target: Optional[str] = None) -> None:
    """One warning per option that changes nothing in this combination."""
    if per_example and input_target is not None:
        warnings.warn(
            f"GradientLogger(per_example=True, targets={{{input_target!r}: 'inputs'}}): per-example norms are of "
            "a loss that is the mean over the batch; the tapes w.r.t. inputs differentiate a sum of the "
            f"model's outputs, so {input_target!r} gets none (every tape that trains weights does)",
            UserWarning,
            stacklevel=3,
        )
    logger_arguments.warn_without_effect(weights, per_example, stacklevel=4)


def check_model(
    model: Any, layers: Any, weights: bool, timesteps: Any, targets: Dict[str, Callable], update_freq: Any
) -> str:
    """Raise before training what can be known then (flavor, replicas, layers, targets); returns the flavor."""
    kind = model_facts.check_supported(model)
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and strategy.num_replicas_in_sync > 1 and kind != "keras":
        raise ValueError(
            f"GradientLogger supports {strategy.num_replicas_in_sync} replicas ({type(strategy).__name__}) "
            "with Keras 3 only, not tf_keras; capture in a custom loop (tb_layergrad.distribute) instead"
        )
    Capture(model, layers=layers, weights=weights)  # unknown layers raise here
    if timesteps is not False:
        TimestepProbe(model, None if timesteps is True else timesteps)
    check_targets_statically(model, targets)
    spe = train_functions.steps_per_execution(model)
    n = update_freq
    if spe > 1 and n != "epoch" and n % spe and not train_functions.step_writes_itself(model):
        warnings.warn(
            f"steps_per_execution={spe}: Keras returns only the last step of each execution, so a step logged "
            f"by update_freq={n} that is not the last of its execution is lost; use a multiple of {spe} "
            "(or jit_compile=False: then the step writes every logged step itself)",
            RuntimeWarning,
            stacklevel=4,
        )
    return kind


def check_targets_statically(model: Any, targets: Dict[str, Callable]) -> None:
    """Try each target on a zero y_pred when the output shape is known (Functional/Sequential)."""
    if not targets:
        return
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        return
    if not outputs or len(outputs) != 1:
        return
    shape = list(outputs[0].shape)
    if any(d is None for d in shape[1:]):
        return
    dtype = getattr(outputs[0], "dtype", "float32")
    dtype = getattr(dtype, "name", dtype)
    y_pred = tf.zeros([2] + shape[1:], dtype=dtype)
    for name, fn in targets.items():
        try:
            value = tf.convert_to_tensor(fn(y_pred))
        except Exception as e:  # noqa: BLE001 - re-raised with context
            raise ValueError(f"target {name!r} failed on a y_pred of shape {[None] + shape[1:]}: {e}") from e
        check_target_shape(name, value, 2)
