"""Which version-2 tags already carry their metadata in a writer's file: only a tag's first record does.

Why: a version-2 tag's metadata holds its layer list (docs/FORMAT.md), as
large as a step's statistics; TensorBoard's loaders keep the first metadata
they see for a tag, as they do for TensorFlow's own v1 `FileWriter`, which
strips it from later records. So the writer writes it with the first record
of each tag and leaves it out after that.

A group's steps are cut into blocks, a tag each (`GroupInfo.tag_at`): the
state is per writer (a new writer is a new file, which needs the metadata
again) and group tag, and lives where the writes happen: an int64 vector
variable, a slot per group tag, holding the first step of the block whose tag
last got the metadata (-1: none yet), like the running first non-finite steps
(`nonfinite_tracker`), so that a `tf.function` asks at run time, not at trace
time. A writer this module cannot tell apart from others gets the metadata on
every record: lost metadata would hide a run.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional, Sequence

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.summary import nonfinite_tracker, writer_state

_BY_WRITER: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


class Pending:
    """The metadata state of some group tags of one writer, for the blocks holding one step."""

    def __init__(self, groups: Sequence[metadata.GroupInfo], step: Any, writer: Any = None) -> None:
        writer = writer_state.default_writer() if writer is None else writer
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
        table, slots = nonfinite_tracker.running_values(_BY_WRITER, None, [g.tag for g in groups], writer)
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


__all__ = ["Pending", "block_start", "serialized_if", "tag_at"]
