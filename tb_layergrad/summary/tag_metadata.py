"""Which version-2 tags already carry their metadata in a writer's file: only a tag's first record does.

Why: a version-2 tag's metadata holds its layer list (docs/FORMAT.md), as
large as a step's statistics; TensorBoard's loaders keep the first metadata
they see for a tag, as they do for TensorFlow's own v1 `FileWriter`, which
strips it from later records. So the writer writes it with the first record
of each tag and leaves it out after that.

The state is per writer (a new writer is a new file, which needs the metadata
again) and lives where the writes happen: an int64 vector variable, a slot per
tag, holding the step the metadata was written at (-1: not yet), like the
running first non-finite steps (`first_nonfinite`), so that a `tf.function`
asks at run time, not at trace time. A writer this module cannot tell apart
from others gets the metadata on every record: lost metadata would hide a run.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad.summary import first_nonfinite, writer_state

_BY_WRITER: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


class Pending:
    """The metadata state of some tags of one writer, read once for a step."""

    def __init__(self, tags: Sequence[str], writer: Any = None) -> None:
        writer = writer_state.default_writer() if writer is None else writer
        self._table: Optional[Any] = None
        self.slots: Optional[tf.Tensor] = None
        if writer is not None:
            try:
                weakref.ref(writer)
            except TypeError:
                writer = None
        if writer is None or not tags:
            self.needed = tf.ones([len(tags)], tf.bool)  # unknown writer: every record carries it
            return
        table, slots = first_nonfinite.running_values(_BY_WRITER, None, tags, writer)
        self._table = table
        self.slots = tf.constant(slots, tf.int64)
        self.needed = tf.gather(table.variable.value(), self.slots) < 0

    def store(self, written: Any, step: Any) -> None:
        """Remember the tags whose record carried the metadata (`written` [n] bool) at `step`."""
        if self._table is None:
            return
        at = tf.where(tf.convert_to_tensor(written), tf.cast(step, tf.int64), tf.constant(-1, tf.int64))
        self._table.variable.scatter_max(tf.IndexedSlices(at, self.slots))


def serialized_if(needed: Any, serialized: bytes) -> Any:
    """The metadata of a record: `serialized` where `needed` holds, else none (b"")."""
    if isinstance(needed, bool):
        return serialized if needed else b""
    if tf.executing_eagerly():
        return serialized if bool(needed) else b""
    return tf.where(needed, tf.constant(serialized), tf.constant(b""))


def pending(tags: Sequence[str], writer: Any = None) -> Pending:
    return Pending(tags, writer)


__all__ = ["Pending", "pending", "serialized_if"]
