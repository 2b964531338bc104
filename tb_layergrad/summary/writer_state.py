"""The default `tf.summary` writer, which TensorFlow has no public getter for.

Why: the first-non-finite tracker keeps its running values per writer
(`first_nonfinite`), and the fused write op (`backend`) writes to the writer's
resource itself. The state object read here has been stable since TF 2.0; if
it ever moves, callers fall back (coarser keying, per-record writes), they do
not fail.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf


def default_writer() -> Any:
    """The writer `tf.summary` writes to now (None if none, or unknown)."""
    try:
        from tensorflow.python.ops import summary_ops_v2

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
