"""Internal: the finiteness check of every fit() step, and what it says when something is non-finite.

Why every step: a NaN is born at one step, and a schedule (`update_freq`)
would miss it or show it only steps later, when every layer is NaN and its
origin is lost. The check is one flag per series of the loss's records
(activations, output gradients, the loss's value), computed in the step; the
first step at which one is set is written in full, logged or not, and its
flags say where it was born (`tb_layergrad.nonfinite_origin`, the rules the
tab applies to the written records).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tb_layergrad import metadata, nonfinite_origin
from tb_layergrad.summary import writer_state
from tb_layergrad.summary.conditions import cond_out_of_line
from tb_layergrad.summary.plan import Plan
from tb_layergrad.summary.write import series_nonfinite

MODES = ("log", "stop", "raise")


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


class FirstNonfinite:
    """Where the step that writes itself keeps the first non-finite step of a run and its flags.

    Why variables, read by Python only when asked: with `on_nonfinite="log"`
    nothing needs the answer during training, and handing the flags out of
    every step costs more than the check itself (docs/DESIGN.md). The step
    reads `step` (is this the first?) and stores both behind a condition that
    is taken once per run.
    """

    def __init__(self) -> None:
        with tf.init_scope():
            self.step = writer_state.local_variable(
                tf.constant(-1, tf.int64), tf.TensorShape([]), "layergrad_first_nonfinite_step"
            )
            self.flags = writer_state.local_variable(
                tf.zeros([0], tf.bool), tf.TensorShape([None]), "layergrad_first_nonfinite_flags"
            )

    def none_yet(self) -> tf.Tensor:
        return self.step.value() < 0

    def remember(self, step: tf.Tensor, nonfinite: tf.Tensor) -> tf.Tensor:
        """In the step, after its records: the first time anything is non-finite, keep the step and its flags."""

        def store() -> tf.Tensor:
            self.step.assign(tf.cast(step, tf.int64))
            self.flags.assign(nonfinite)
            return tf.constant(True)

        return cond_out_of_line(tf.logical_and(tf.reduce_any(nonfinite), self.none_yet()), store)

    def read(self) -> Optional[Tuple[int, np.ndarray]]:
        """(step, flags) once a step was non-finite, else None (eagerly)."""
        step = int(self.step.numpy())
        return None if step < 0 else (step, self.flags.numpy())


def origin(
    infos: Sequence[metadata.SeriesInfo], nonfinite: Any, step: Optional[int], target: str = metadata.DEFAULT_TARGET
) -> Optional[nonfinite_origin.Origin]:
    """Where it was born, from one step's flags (`flags`) of these series; `target`: the step's first loss."""
    bad = np.asarray(nonfinite, dtype=bool).reshape(-1)

    def seen(source: str) -> List[nonfinite_origin.Seen]:
        return [
            nonfinite_origin.Seen(i.layer, i.index, bool(b))
            for i, b in zip(infos, bad)
            if i.source == source and i.target in (target, metadata.ACTIVATION_TARGET)
        ]

    targets = [bool(b) for i, b in zip(infos, bad) if i.source == metadata.SOURCE_TARGET and i.target == target]
    activations = seen(metadata.SOURCE_ACTIVATION)
    return nonfinite_origin.locate(
        step,
        target=target,
        target_nonfinite=targets[0] if targets else None,
        activations=activations if activations else None,
        outputs=seen(metadata.SOURCE_OUTPUT),
        weights=seen(metadata.SOURCE_WEIGHT),
    )
