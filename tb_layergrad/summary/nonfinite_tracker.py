"""Each series' first non-finite step, kept running: the records of kind `first_nonfinite` (docs/FORMAT.md).

Not to be mixed up with where a run's first NaN/Inf was born (`tb_layergrad.nonfinite_origin`): this module
only remembers, per series, the first logged step at which it held a NaN/Inf, and writes it.

Why: TensorBoard may keep only a sample of a series' steps (a user's
`--samples_per_plugin=layergrad=N`), always including the LAST one. The step at
which a layer's gradient first held a NaN/Inf could be dropped. So, from that
step on, every logged step also writes, next to the layer's `stats`, an int64 [1]
record holding that first step: whatever sample TensorBoard keeps, its last
record names it.

The running values are kept per (default summary writer, tag), in one int64
vector `tf.Variable` per writer (a slot per tag, added on first use). This is
the one tracker: every write of a step (`write.write_step`, whichever backend
computed the records) hands it which series held a NaN/Inf (`track`). Records
are written only from the first non-finite step on: a clean run gets none.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.summary import writer_state
from tb_layergrad.summary.graph import cond_out_of_line, write_if

_NONFINITE_COUNTS = [metadata.STAT_INDEX[k] for k in ("nan", "pos_inf", "neg_inf")]


_LOCK = threading.Lock()


class _RunningFirsts:
    """The running first non-finite steps of one writer's series: one int64 vector variable, a slot per tag.

    Why one variable, not one per tag: a logged step reads them all, and each
    variable is a read op and a captured input (a Switch op) of the condition
    that stores them; one vector is one read and one gather for any number of
    series (docs/DESIGN.md, "One first-non-finite tracker").
    `seen` (a bool) says whether any slot holds a step: while it is false, a
    logged step only looks at its own non-finite flags (see `track`).
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
                    self.variable = local_variable(fresh, tf.TensorShape([None]), "layergrad_first_nonfinite")
                    self.seen = local_variable(tf.constant(False), tf.TensorShape([]), "layergrad_nonfinite_seen")
                else:
                    self.variable.assign(tf.concat([self.variable.value(), fresh], 0))
        return [self.slots[t] for t in tags]


_BY_WRITER: "weakref.WeakKeyDictionary[Any, _RunningFirsts]" = weakref.WeakKeyDictionary()
_NO_WRITER = _RunningFirsts()


def _running_firsts(tags: Sequence[str], writer: Any = None) -> Tuple[_RunningFirsts, List[int]]:
    """(`writer`'s running values (default: the default writer's), the slots of `tags` in them)."""
    return running_values(_BY_WRITER, _NO_WRITER, tags, writer)


def running_values(
    registry: "weakref.WeakKeyDictionary[Any, _RunningFirsts]",
    fallback: _RunningFirsts,
    tags: Sequence[str],
    writer: Any = None,
) -> Tuple[_RunningFirsts, List[int]]:
    """(`writer`'s int64 vector in `registry` (default: the default writer's), the slots of `tags` in it).

    `fallback`: the vector used when the writer is unknown or not weak-referenceable.
    """
    writer = writer_state.default_writer() if writer is None else writer
    with _LOCK:
        try:
            table = registry.setdefault(writer, _RunningFirsts()) if writer is not None else fallback
        except TypeError:  # not weak-referenceable
            table = fallback
        slots = table.slots_of(tags)
        return table, slots


def local_variable(initial: Any, shape: tf.TensorShape, name: str) -> Any:
    """A plain variable of this process, also under a tf.distribute strategy; a vector's length may grow.

    Why: `tf.Variable` under a strategy becomes a mirrored variable, whose
    creation is a collective under MultiWorkerMirroredStrategy (only the chief
    writes, so the other workers would never join it) and whose creation from
    replica threads tf.function refuses. Instantiating the concrete class skips
    the strategy's variable creator. Only the process that writes reads it.
    """
    from tensorflow.python.ops import resource_variable_ops  # the class tf.Variable builds by default

    return resource_variable_ops.ResourceVariable(initial, trainable=False, name=name, shape=shape)


def running(infos: Sequence[metadata.SeriesInfo], writer: Any = None) -> Tuple[Any, tf.Tensor, tf.Tensor]:
    """(variable, slots, their running first steps now) of these stats series of `writer`, for the fused write op.

    The op applies the rule itself (kernel/src/write_records.cc) and `store`
    puts its answer back.
    """
    table, slots = _running_firsts([info.tag for info in infos], writer)
    slots_t = tf.constant(slots, tf.int64)
    return table.variable, slots_t, tf.gather(table.variable.value(), slots_t)


def store(variable: Any, slots: tf.Tensor, firsts: tf.Tensor) -> None:
    """Put the running first steps back, as a maximum.

    Why a maximum: a step only ever moves from -1 to a step, and replicas that
    record nothing hand back what they read; a plain assignment from one of
    them could undo another's update.
    """
    variable.scatter_max(tf.IndexedSlices(firsts, slots))


def nonfinite_flags(stats: Sequence[Any]) -> tf.Tensor:
    """[T] bool: which of these stats records count a NaN or an Inf."""
    counts = tf.gather(tf.stack([tf.cast(x, tf.float64) for x in stats]), _NONFINITE_COUNTS, axis=1)
    return tf.reduce_any(counts > 0, axis=1)


def track(infos: Sequence[metadata.SeriesInfo], nonfinite: tf.Tensor, step: Any, group_sizes: Sequence[int]) -> None:
    """Update the running first non-finite step of each stats series and write those there are.

    `nonfinite` [T] bool: which series held a NaN/Inf at this step. To be
    called where the step's records are written (the default writer is the
    one they go to), eagerly or in a `tf.function`, once per logged step for
    all series, behind ONE condition. Why: a logged step of a clean run (no
    NaN/Inf ever) should cost no more than a look at its flags and one
    variable; a condition (or an assignment) per series costs a call each in a
    `tf.function` (docs/DESIGN.md, "One first-non-finite tracker").
    `group_sizes`: `infos` are consecutive groups of these sizes (one target
    and source each), each written as one int64 [L] record (docs/FORMAT.md).
    """
    if not infos:
        return
    table, slots = _running_firsts([info.tag for info in infos])
    variable = table.variable
    step = tf.cast(step, tf.int64)
    nonfinite = tf.convert_to_tensor(nonfinite)
    # A clean step of a clean run: these few ops, and the condition not taken.
    needed = tf.logical_or(table.seen.value(), tf.reduce_any(nonfinite))

    def store_and_write() -> tf.Tensor:
        slots_t = tf.constant(slots, tf.int64)
        previous = tf.gather(variable.value(), slots_t)
        first = tf.where((previous < 0) & nonfinite, step, previous)
        variable.scatter_update(tf.IndexedSlices(first, slots_t))
        table.seen.assign(tf.logical_or(table.seen.value(), tf.reduce_any(first >= 0)))
        _write_groups(infos, group_sizes, first, step)
        return tf.constant(True)

    cond_out_of_line(needed, store_and_write)


def _write_groups(
    infos: Sequence[metadata.SeriesInfo], sizes: Sequence[int], first: tf.Tensor, step: tf.Tensor
) -> None:
    from tb_layergrad.summary import tag_metadata  # it builds on this module's per-writer vectors

    begin = 0
    for size in sizes:
        group = metadata.GroupInfo.of(metadata.KIND_FIRST_NONFINITE, infos[begin : begin + size])
        values = first[begin : begin + size]
        begin += size

        def write(group=group, values=values) -> tf.Tensor:
            pending = tag_metadata.Pending([group], step)
            serialized = metadata.create_group_metadata(group).SerializeToString()
            tf.summary.write(
                tag_metadata.tag_at(group, pending.firsts[0]),
                values,
                step=step,
                metadata=tag_metadata.serialized_if(pending.needed[0], serialized),
            )
            pending.store(tf.constant([True]))
            return tf.constant(True)

        write_if(tf.reduce_any(values >= 0), write)
