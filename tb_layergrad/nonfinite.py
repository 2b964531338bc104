"""The running "first non-finite step" records (kind `first_nonfinite`, docs/FORMAT.md).

Why: TensorBoard may keep only a sample of a series' steps (a user's
`--samples_per_plugin=layergrad=N`), always including the LAST one. The step at
which a layer's gradient first held a NaN/Inf could be dropped. So, from that
step on, every logged step also writes, next to the layer's `stats`, an int64 [1]
record holding that first step: whatever sample TensorBoard keeps, its last
record names it.

The running values are kept per (default summary writer, tag), in one int64
vector `tf.Variable` per writer (a slot per tag, added on first use), by
`summary.gradients()` (custom loops, inside `tf.function` or eagerly) and by
`GradientLogger` alike, in its step or in its record writer
(`write_first_nonfinite`). Records are written only from the first
non-finite step on: a clean run gets none.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import metadata, summary_state
from tb_layergrad.graph_util import cond_out_of_line

_NAN, _POS_INF, _NEG_INF = (metadata.STAT_INDEX[k] for k in ("nan", "pos_inf", "neg_inf"))
assert (_POS_INF, _NEG_INF) == (_NAN + 1, _NAN + 2), "the non-finite counts are read as one slice"


def record_info(stats_info: metadata.SeriesInfo) -> metadata.SeriesInfo:
    """The `first_nonfinite` series that goes with a `stats` series."""
    return metadata.SeriesInfo(
        layer=stats_info.layer,
        kind=metadata.KIND_FIRST_NONFINITE,
        target=stats_info.target,
        source=stats_info.source,
        index=stats_info.index,
        dtype=stats_info.dtype,
    )


_LOCK = threading.Lock()


class _RunningFirsts:
    """The running first non-finite steps of one writer's series: one int64 vector variable, a slot per tag.

    Why one variable, not one per tag: a logged step reads them all, and each
    variable is a read op and a captured input (a Switch op) of the condition
    that stores them. Measured in isolation, this bookkeeping cost ~78 us per
    logged step for 4 series and ~1.2 ms for 200 with a variable per tag; with
    one vector (one read, one gather for any number) 66 us and 0.75 ms.
    `seen` (a bool) says whether any slot holds a step: while it is false, a
    logged step only checks its own stats for NaN/Inf (see write_first_nonfinite).
    The vector only grows (at trace time, eagerly): a function traced earlier
    keeps reading its own slots.
    """

    def __init__(self) -> None:
        self.slots: Dict[str, int] = {}
        self.variable: Any = None  # int64 [len(self.slots)]; -1: no non-finite step yet
        self.seen: Any = None  # bool []: some slot is >= 0

    def slots_of(self, tags: Sequence[str]) -> List[int]:
        """The slots of `tags`, new ones appended (initialized to -1)."""
        before = len(self.slots)
        for tag in tags:
            self.slots.setdefault(tag, len(self.slots))
        added = len(self.slots) - before
        if added or self.variable is None:
            with tf.init_scope():  # eager, also when first called while tracing a tf.function
                fresh = tf.fill([added], tf.constant(-1, tf.int64))
                if self.variable is None:
                    self.variable = _local_variable(fresh, tf.TensorShape([None]), "layergrad_first_nonfinite")
                    self.seen = _local_variable(tf.constant(False), tf.TensorShape([]), "layergrad_nonfinite_seen")
                else:
                    self.variable.assign(tf.concat([self.variable.value(), fresh], 0))
        return [self.slots[t] for t in tags]


_BY_WRITER: "weakref.WeakKeyDictionary[Any, _RunningFirsts]" = weakref.WeakKeyDictionary()
_NO_WRITER = _RunningFirsts()


def _running_firsts(tags: Sequence[str]) -> Tuple[_RunningFirsts, List[int]]:
    """(the default writer's running values, the slots of `tags` in them)."""
    writer = summary_state.default_writer()
    with _LOCK:
        try:
            table = _BY_WRITER.setdefault(writer, _RunningFirsts()) if writer is not None else _NO_WRITER
        except TypeError:  # not weak-referenceable
            table = _NO_WRITER
        slots = table.slots_of(tags)
        return table, slots


def _local_variable(initial: Any, shape: tf.TensorShape, name: str) -> Any:
    """A plain variable of this process, also under a tf.distribute strategy; a vector's length may grow.

    Why: `tf.Variable` under a strategy becomes a mirrored variable, whose
    creation is a collective under MultiWorkerMirroredStrategy (only the chief
    writes, so the other workers would never join it) and whose creation from
    replica threads tf.function refuses. Instantiating the concrete class skips
    the strategy's variable creator. Only the process that writes reads it.
    """
    from tensorflow.python.ops import resource_variable_ops  # the class tf.Variable builds by default

    return resource_variable_ops.ResourceVariable(initial, trainable=False, name=name, shape=shape)


def write_first_nonfinite(entries: Sequence[Tuple[metadata.SeriesInfo, Any]], step: Any, description: str = "") -> None:
    """Update the running first non-finite step of each (stats series, stats) and write those there are.

    To be called where the stats records are written (inside `summary`'s
    recording condition, or `GradientLogger`'s writer), eagerly or in a
    `tf.function`, once per logged step for all series, behind ONE condition.
    Why: a logged step of a clean run (no NaN/Inf ever) should cost no more than
    a look at its own NaN/Inf counts and one flag; a condition (or an assignment)
    per series costs tens of microseconds each in a `tf.function`. Only once some
    series of the writer has a first non-finite step are the running values read,
    stored and the records written (measured in isolation, 4 series: ~105 us a
    logged step with the running values read at every step, ~22 us now).
    """
    if not entries:
        return
    table, slots = _running_firsts([info.tag for info, _ in entries])
    variable = table.variable
    step = tf.cast(step, tf.int64)
    stats = tf.stack([tf.cast(s, tf.float64) for _, s in entries])  # [T, NUM_STATS]: a few ops for all series
    counts = stats[:, _NAN : _NEG_INF + 1]  # nan, pos_inf, neg_inf
    # A clean step of a clean run: these few ops, and the condition not taken.
    needed = tf.logical_or(table.seen.value(), tf.reduce_any(counts > 0))

    def store_and_write() -> tf.Tensor:
        slots_t = tf.constant(slots, tf.int64)
        previous = tf.gather(variable.value(), slots_t)
        first = tf.where((previous < 0) & tf.reduce_any(counts > 0, axis=1), step, previous)
        variable.scatter_update(tf.IndexedSlices(first, slots_t))
        table.seen.assign(tf.logical_or(table.seen.value(), tf.reduce_any(first >= 0)))
        for i, (info, _) in enumerate(entries):
            record = record_info(info)

            def write(record=record, value=first[i : i + 1]) -> tf.Tensor:
                tf.summary.write(record.tag, value, step=step, metadata=metadata.create_summary_metadata(record, description))
                return tf.constant(True)

            if tf.executing_eagerly():
                if int(first[i]) >= 0:
                    write()
            else:
                tf.cond(first[i] >= 0, write, lambda: tf.constant(False))
        return tf.constant(True)

    cond_out_of_line(needed, store_and_write)
