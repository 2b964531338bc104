"""What a writer's file remembers across steps, kept where the writes happen (docs/FORMAT.md).

Two things, each per (default summary writer, tag), in one int64 vector variable per writer (a slot per tag,
added on first use), so that a `tf.function` asks at run time, not at trace time:
- each series' running first NaN/Inf step: the records of kind `first_nonfinite`. Why: TensorBoard may keep
  only a sample of a series' steps (a user's `--samples_per_plugin=layergrad=N`), always including the LAST
  one, so the step at which a layer's gradient first held a NaN/Inf could be dropped; from that step on, every
  logged step also writes, next to the layer's `stats`, an int64 record holding that first step. This is the
  one tracker: every write of a step (`write.write_step`, whichever backend computed the records) reads and
  stores it here. Not to be mixed up with where a run's first NaN/Inf was born (`tb_layergrad.nonfinite_origin`).
- which version-2 tags already carry their metadata: only a tag's first record does. Why: a version-2 tag's
  metadata holds its layer list, as large as a step's statistics; TensorBoard's loaders keep the first
  metadata they see for a tag, as they do for TensorFlow's own v1 `FileWriter`, which strips it from later
  records. A group's steps are cut into blocks, a tag each (`GroupInfo.tag_at`): the slot of a group tag holds
  the first step of the block whose tag last got the metadata (-1: none yet). A writer this module cannot tell
  apart from others gets the metadata on every record: lost metadata would hide a run.

The default writer itself is read from TensorFlow's summary state, which has no public getter (stable since
TF 2.0; if it ever moves, callers fall back to coarser keying and per-record writes, they do not fail).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops  # the class tf.Variable builds by default

from tb_layergrad import metadata


def default_writer() -> Any:
    """The writer `tf.summary` writes to now (None if none, or unknown)."""
    try:
        from tensorflow.python.ops import summary_ops_v2  # private: where it is missing, callers fall back

        return summary_ops_v2._summary_state.writer  # noqa: SLF001
    except Exception:  # noqa: BLE001 - a missing private attribute: callers fall back
        return None


def writer_resource(writer: Any) -> Optional[Any]:
    """`writer`'s resource handle, when it is a plain TensorFlow summary writer.

    None for no writer, a no-op writer (`tf.summary.create_noop_writer`), a
    DTensor writer (its records need a mesh layout) or anything unknown: what
    `tf.summary.write` does for those is left to it.
    """
    if writer is None or getattr(writer, "_mesh", None) is not None:
        return None
    handle = getattr(writer, "_resource", None)
    return handle if getattr(handle, "dtype", None) == tf.resource else None


def default_writer_resource() -> Optional[Any]:
    """The default writer's resource handle (see `writer_resource`)."""
    return writer_resource(default_writer())


# -- the running first non-finite steps ------------------------------------------------------------
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


def running_firsts(tags: Sequence[str], writer: Any = None) -> Tuple[_RunningFirsts, List[int]]:
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
    writer = default_writer() if writer is None else writer
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
    return resource_variable_ops.ResourceVariable(initial, trainable=False, name=name, shape=shape)


def running(infos: Sequence[metadata.SeriesInfo], writer: Any = None) -> Tuple[Any, tf.Tensor, tf.Tensor]:
    """(variable, slots, their running first steps now) of these stats series of `writer`, for the fused write op.

    The op applies the rule itself (kernel/src/write_records.cc) and `store`
    puts its answer back.
    """
    table, slots = running_firsts([info.tag for info in infos], writer)
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


# -- which tags carry their metadata --------------------------------------------------------------
_METADATA_BY_WRITER: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


class Pending:
    """The metadata state of some group tags of one writer, for the blocks holding one step."""

    def __init__(self, groups: Sequence[metadata.GroupInfo], step: Any, writer: Any = None) -> None:
        writer = default_writer() if writer is None else writer
        self._table: Optional[Any] = None
        self.slots: Optional[tf.Tensor] = None
        step = tf.cast(step, tf.int64)
        #: [n] int64: the first step of each group's block at `step` (its tag is `{group.tag}/{first}`).
        self.firsts = tf.stack([block_start(g, step) for g in groups]) if groups else tf.zeros([0], tf.int64)
        if writer is not None:
            try:
                weakref.ref(writer)
            except TypeError:
                writer = None
        if writer is None or not groups:
            self.needed = tf.ones([len(groups)], tf.bool)  # unknown writer: every record carries it
            return
        table, slots = running_values(_METADATA_BY_WRITER, None, [g.tag for g in groups], writer)
        self._table = table
        self.slots = tf.constant(slots, tf.int64)
        self._stored = tf.gather(table.variable.value(), self.slots)
        self.needed = tf.not_equal(self._stored, self.firsts)

    def store(self, written: Any) -> None:
        """Remember the tags whose record carried the metadata (`written` [n] bool)."""
        if self._table is None:
            return
        at = tf.where(tf.convert_to_tensor(written), self.firsts, self._stored)
        self._table.variable.scatter_update(tf.IndexedSlices(at, self.slots))


def block_start(group: metadata.GroupInfo, step: tf.Tensor) -> tf.Tensor:
    """The first step of `group`'s block holding `step` (`metadata.block_start`, in TensorFlow)."""
    steps = tf.constant(group.block_steps, tf.int64)
    return tf.math.floordiv(step, steps) * steps


def tag_at(group: metadata.GroupInfo, first: tf.Tensor) -> Any:
    """`group`'s tag for the block starting at `first`: a string eagerly, a string tensor in a graph."""
    if tf.executing_eagerly():
        return f"{group.tag}/{int(first)}"
    return tf.strings.join([group.tag, tf.strings.as_string(first)], separator="/")


def serialized_if(needed: Any, serialized: bytes) -> Any:
    """The metadata of a record: `serialized` where `needed` (a bool tensor) holds, else none (b"")."""
    if tf.executing_eagerly():
        return serialized if bool(needed) else b""
    return tf.where(needed, tf.constant(serialized), tf.constant(b""))
