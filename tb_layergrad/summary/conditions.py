"""When a step's records are written: whether summaries are recorded now, and conditions whose untaken branch
costs nothing, which keep a step's records off unlogged steps."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import tensorflow as tf


def recording() -> Optional[Any]:
    """Are summaries recorded now (a default writer, record_if true)? None if statically not; else a bool or tensor."""
    should = tf.summary.should_record_summaries()
    static = should if isinstance(should, bool) else tf.get_static_value(should)
    if static is not None and not bool(static):
        return None  # statically off (no writer, e.g. a non-chief worker): nothing to trace
    return should


def when(should: Any, fn: Callable[[], None], out_of_line: bool = True) -> tf.Tensor:
    """Run `fn` only if `should` holds, with recording statically on inside; True if it ran.

    Why statically on: otherwise every `tf.summary.write` in `fn` would add its
    own condition on the same predicate. `out_of_line`: the branch as one
    function call (`cond_out_of_line`); not for a branch that gathers replicas
    (collectives over PerReplica values must stay inline).
    """

    def run() -> tf.Tensor:
        with tf.summary.record_if(True):
            fn()
        return tf.constant(True)

    if isinstance(should, bool):
        return run() if should else tf.constant(False)
    if not out_of_line and not tf.executing_eagerly():
        return tf.cond(should, run, lambda: tf.constant(False))
    return cond_out_of_line(should, run)


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
