"""A condition whose untaken branch costs nothing: how a step's records are kept off unlogged steps."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf


def cond_out_of_line(pred: tf.Tensor, true_fn: Callable[[], tf.Tensor]) -> tf.Tensor:
    """`tf.cond(pred, true_fn, lambda: False)` whose true branch is ONE function call when untaken.

    Why: inside a `tf.function` a condition is lowered to Switch/Merge, and the
    executor still visits every op of the untaken branch, at every step that logs
    nothing (docs/DESIGN.md, "One write step"). A branch that is a single call
    op costs nothing then; taken, the call is one function call. Eagerly it is a
    plain `if`; under a tf.distribute strategy an inline `tf.cond` (a function
    traced in a replica thread cannot capture that replica's tensors). `true_fn`
    returns a boolean scalar.
    """
    return value_out_of_line(pred, true_fn, lambda: tf.constant(False))


def value_out_of_line(pred: tf.Tensor, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    """`tf.cond(pred, true_fn, false_fn)` whose true branch is ONE function call (see `cond_out_of_line`);
    `false_fn` gives what an untaken step yields instead (cheap: constants of the same structure)."""
    if tf.executing_eagerly():
        return true_fn() if bool(pred) else false_fn()
    if tf.distribute.has_strategy():
        return tf.cond(pred, true_fn, false_fn)
    call = tf.function(true_fn, autograph=False, experimental_attributes={"_noinline": True})
    return tf.cond(pred, call, false_fn)


def write_if(condition: Any, write: Callable[[], None]) -> None:
    """`write()` where `condition` (a bool, or a bool tensor) holds: a plain `if` eagerly or for a Python bool,
    an inline `tf.cond` in a graph (a few summary writes: no branch worth putting out of line)."""
    if isinstance(condition, bool) or tf.executing_eagerly():
        if bool(condition):
            write()
        return

    def run() -> tf.Tensor:
        write()
        return tf.constant(True)

    tf.cond(condition, run, lambda: tf.constant(False))


def write_one_of(index: Any, writes: Sequence[Callable[[], None]]) -> None:
    """`writes[index]()` (an int32 scalar tensor, or an int): ONE `tf.switch_case` in a graph where nested
    `write_if`s would be one condition each, for writes that are each other's extensions."""
    if isinstance(index, int) or tf.executing_eagerly():
        writes[int(index)]()
        return

    def branch(write: Callable[[], None]) -> Callable[[], tf.Tensor]:
        def run() -> tf.Tensor:
            write()
            return tf.constant(True)

        return run

    tf.switch_case(index, [branch(w) for w in writes])
