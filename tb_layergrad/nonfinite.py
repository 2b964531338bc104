"""The running "first non-finite step" records (kind `first_nonfinite`, docs/FORMAT.md).

Why: TensorBoard may keep only a sample of a series' steps (a user's
`--samples_per_plugin=layergrad=N`), always including the LAST one. The step at
which a layer's gradient first held a NaN/Inf could be dropped. So, from that
step on, every logged step also writes, next to the layer's `stats`, an int64 [1]
record holding that first step: whatever sample TensorBoard keeps, its last
record names it.

Two writers keep the running value:
- `summary.gradients()` (custom loops, inside `tf.function` or eagerly): one int64
  `tf.Variable` per (default summary writer, tag), created on first use
  (`write_first_nonfinite`).
- `FirstNonfiniteTracker` (plain Python, for writers that see the stats as numpy
  arrays, such as `GradientLogger._write`).
Records are written only from the first non-finite step on: a clean run gets none.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Optional, Tuple

import numpy as np

from tb_layergrad import metadata

_NAN, _POS_INF, _NEG_INF = (metadata.STAT_INDEX[k] for k in ("nan", "pos_inf", "neg_inf"))


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


class FirstNonfiniteTracker:
    """Running first non-finite step per series, for a writer that holds the stats as numpy.

        tracker = FirstNonfiniteTracker()
        ...at every logged step, after writing a stats record:
        extra = tracker.update(info, stats_array, step)
        if extra is not None:
            info2, value = extra
            tf.summary.write(info2.tag, value, step=step, metadata=metadata.create_summary_metadata(info2))
    """

    def __init__(self) -> None:
        self._first: Dict[str, int] = {}

    def update(self, info: metadata.SeriesInfo, stats: Any, step: int) -> Optional[Tuple[metadata.SeriesInfo, np.ndarray]]:
        """The record to write at `step` (None while the series has been finite)."""
        if info.kind != metadata.KIND_STATS:
            return None
        s = np.asarray(stats, dtype=np.float64).reshape(-1)
        first = self._first.get(info.tag)
        if first is None and s.size > _NEG_INF and (s[_NAN] + s[_POS_INF] + s[_NEG_INF]) > 0:
            first = self._first[info.tag] = int(step)
        if first is None:
            return None
        return record_info(info), np.asarray([first], dtype=np.int64)

    def first(self, tag: str) -> Optional[int]:
        return self._first.get(tag)


# -- in-graph (summary.gradients) ------------------------------------------------------------------

_LOCK = threading.Lock()
_BY_WRITER: "weakref.WeakKeyDictionary[Any, Dict[str, Any]]" = weakref.WeakKeyDictionary()
_NO_WRITER: Dict[str, Any] = {}


def _default_writer() -> Any:
    """The writer `tf.summary` writes to now (None if unknown).

    TensorFlow has no public getter; the state object has been stable since TF 2.0.
    Without it, the running values are per process and tag rather than per writer.
    """
    try:
        from tensorflow.python.ops import summary_ops_v2

        return summary_ops_v2._summary_state.writer  # noqa: SLF001
    except Exception:  # noqa: BLE001 - a missing private attribute only coarsens the keying
        return None


def _variable(tag: str) -> Any:
    import tensorflow as tf

    writer = _default_writer()
    with _LOCK:
        try:
            table = _BY_WRITER.setdefault(writer, {}) if writer is not None else _NO_WRITER
        except TypeError:  # not weak-referenceable
            table = _NO_WRITER
        var = table.get(tag)
        if var is None:
            with tf.init_scope():  # an eager variable, also when first called while tracing a tf.function
                var = _local_variable(tf.constant(-1, tf.int64))
            table[tag] = var
    return var


def _local_variable(initial: Any) -> Any:
    """A plain variable of this process, also under a tf.distribute strategy.

    Why: `tf.Variable` under a strategy becomes a mirrored variable, whose
    creation is a collective under MultiWorkerMirroredStrategy (only the chief
    writes, so the other workers would never join it) and whose creation from
    replica threads tf.function refuses. Instantiating the concrete class skips
    the strategy's variable creator. Only the process that writes reads it.
    """
    from tensorflow.python.ops import resource_variable_ops  # the class tf.Variable builds by default

    return resource_variable_ops.ResourceVariable(initial, trainable=False, name="layergrad_first_nonfinite")


def write_first_nonfinite(stats_info: metadata.SeriesInfo, stats: Any, step: Any, description: str = "") -> None:
    """Update the running first non-finite step of a stats series and write it if there is one.

    To be called where the stats record is written (inside `summary`'s recording
    condition), eagerly or in a `tf.function`.
    """
    import tensorflow as tf

    var = _variable(stats_info.tag)
    info = record_info(stats_info)
    step = tf.cast(step, tf.int64)
    nonfinite = (stats[_NAN] + stats[_POS_INF] + stats[_NEG_INF]) > 0
    first = tf.where(tf.logical_and(var < 0, nonfinite), step, var.read_value())
    var.assign(first)

    def write() -> tf.Tensor:
        tf.summary.write(
            info.tag, tf.reshape(first, [1]), step=step,
            metadata=metadata.create_summary_metadata(info, description),
        )
        return tf.constant(True)

    if tf.executing_eagerly():
        if int(first) >= 0:
            write()
    else:
        tf.cond(first >= 0, write, lambda: tf.constant(False))
