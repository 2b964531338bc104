"""What GradientLogger says about a train step it observed, in terms true inside `fit()`.

Why a module: a custom step can do what Keras' own never does (compute a model's
outputs before it opens its tape, differentiate inside a `tf.cond`), and the user
needs to know what is then not logged and what to change in the step, not how to
call `capture()`, which a step inside fit() does not call.
"""

from __future__ import annotations

import warnings
from typing import Any


def warn_about(model: Any, seen: Any) -> None:
    """One warning per case, at the step's first run (its trace in graph mode)."""
    step = f"{type(model).__name__}.train_step"
    outside = seen.outside_tapes()
    if outside and seen.logged:
        shown = ", ".join(outside[:6]) + (f" and {len(outside) - 6} more" if len(outside) > 6 else "")
        warnings.warn(
            f"GradientLogger: {step} computed the outputs of {shown} outside its GradientTapes, so no gradient the "
            "step computes reaches them and they are not logged. To log them, compute them inside the "
            "`with tf.GradientTape()` block of the loss they feed (the gradients the step asks for stay the same).",
            RuntimeWarning,
            stacklevel=3,
        )
    if seen.in_control_flow:
        warnings.warn(
            f"GradientLogger: {step} made {seen.in_control_flow} gradient() call(s) of trainable weights inside a "
            "tf.cond or tf.while_loop (e.g. a loop over tf.range): their gradients cannot leave that branch and are "
            "not logged. A Python loop (`for _ in range(n)`) is unrolled and each of its calls is logged.",
            RuntimeWarning,
            stacklevel=3,
        )
    # the targets of a tape are computed at its first call: a persistent tape's later calls are under a tape that did
    called = {id(t.aux) for t in seen.logged if t.values}
    without = [t.name for t in seen.logged if not t.values and id(t.aux) not in called]
    if seen.fit_step.config.targets and len(without) < len(seen.logged) and without:
        warnings.warn(
            f"GradientLogger(targets=...): {step} did not call the model itself under the tapes of "
            f"{', '.join(without)}, so the targets (functions of the model's prediction) are not computed for "
            "them; they are for the tapes under which it did",
            RuntimeWarning,
            stacklevel=3,
        )
    asked = seen.fit_step.config.input_target
    if asked is not None and seen.logged and not seen.input_logged:
        warnings.warn(
            f"GradientLogger(targets={{{asked!r}: 'inputs'}}): {step} differentiated no tape with respect to inputs "
            "only (such as a gradient penalty's), so nothing is logged as that target",
            RuntimeWarning,
            stacklevel=3,
        )
    if not seen.logged and not seen.in_control_flow:
        warnings.warn(
            f"GradientLogger: {step} asked its GradientTapes for no gradient of a trainable weight (a model "
            "without trainable weights?); nothing is logged for this step",
            RuntimeWarning,
            stacklevel=3,
        )
