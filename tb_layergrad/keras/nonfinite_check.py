"""Internal: the finiteness check of every fit() step, and what it says when something is non-finite.

Why every step: a NaN is born at one step, and a schedule (`every_n_steps`)
would miss it or show it only steps later, when every layer is NaN and its
origin is lost. The check is one flag per series of the loss's records
(activations, output gradients, the loss's value), computed in the step; the
first step at which one is set is written in full, logged or not, and its
flags say where it was born (`tb_layergrad.nonfinite_origin`, the rules the
tab applies to the written records).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tb_layergrad import metadata, nonfinite_origin
from tb_layergrad.summary import first_nonfinite
from tb_layergrad.summary.plan import Plan
from tb_layergrad.summary.write import series_nonfinite

MODES = ("log", "stop", "raise")


class NonFiniteError(FloatingPointError):
    """Raised by `GradientLogger(on_nonfinite="raise")` after the step at which a NaN/Inf first appeared."""

    def __init__(self, origin: nonfinite_origin.Origin):
        super().__init__(origin.line)
        self.origin = origin


def check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"on_nonfinite must be one of {MODES}, got {mode!r}")
    return mode


def checked_series(plan: Plan) -> List[metadata.SeriesInfo]:
    """The series of `plan` the check looks at, in the order of `flags`."""
    return [s.info for s in plan.series if s.present]


def flags(plan: Plan) -> tf.Tensor:
    """bool [n]: which of `checked_series(plan)` holds a NaN/Inf at this step (where the step hands its tensors out)."""
    out = [series_nonfinite(s) for s in plan.series if s.present]
    return tf.stack(out) if out else tf.zeros([0], tf.bool)


def seen_variable() -> Any:
    """A bool variable: has a written step held a NaN/Inf? (one per callback's step)."""
    with tf.init_scope():
        return first_nonfinite.local_variable(tf.constant(False), tf.TensorShape([]), "layergrad_nonfinite_seen")


def remember(seen: Any, nonfinite: tf.Tensor) -> Any:
    return seen.assign(tf.logical_or(seen.value(), tf.reduce_any(nonfinite)))


def origin(infos: Sequence[metadata.SeriesInfo], nonfinite: Any, step: Optional[int]) -> Optional[nonfinite_origin.Origin]:
    """Where it was born, from one step's flags (`flags`) of these series."""
    bad = np.asarray(nonfinite, dtype=bool).reshape(-1)

    def seen(source: str) -> List[nonfinite_origin.Seen]:
        return [nonfinite_origin.Seen(i.layer, i.index, bool(b)) for i, b in zip(infos, bad)
                if i.source == source and i.target in (metadata.DEFAULT_TARGET, metadata.ACTIVATION_TARGET)]

    targets = [bool(b) for i, b in zip(infos, bad) if i.source == metadata.SOURCE_TARGET]
    activations = seen(metadata.SOURCE_ACTIVATION)
    return nonfinite_origin.locate(
        step,
        target=metadata.DEFAULT_TARGET,
        target_nonfinite=targets[0] if targets else None,
        activations=activations if activations else None,
        outputs=seen(metadata.SOURCE_OUTPUT),
        weights=seen(metadata.SOURCE_WEIGHT),
    )
