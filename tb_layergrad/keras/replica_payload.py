"""Internal: carry the step's records through Keras' cross-replica reduction of train_step outputs, bit for bit.

Why: under a strategy, Keras 3 reduces whatever `train_step` returns
(`reduce_per_replica(..., "auto")` in keras/src/backend/tensorflow/trainer.py):
the elementwise MEAN over replicas of the stacked local results
(MirroredStrategy), or `strategy.reduce("MEAN", v, axis=0)` under
MultiWorkerMirroredStrategy, which also averages over the value's first axis.
Every replica holds the same (merged) records, but a float mean of N equal
values is not always that value (N=3: x+x+x rounds), and the axis-0 mean would
collapse a histogram. So each record travels as its float64 bits, as int64
halves ([1, ..., 2], values < 2**32): the mean of equal integers is exact
(integer division, or float64 for MultiWorker's true division: sums stay below
2**53), and the leading axis of 1 absorbs the axis-0 mean. `decode` undoes it.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import tensorflow as tf


def encode_tensor(t: tf.Tensor) -> tf.Tensor:
    """float record -> int64 [1, *shape, 2] holding its float64 bits."""
    bits = tf.bitcast(tf.cast(t, tf.float64), tf.int32)  # [*shape, 2]
    return tf.cast(bits, tf.int64)[tf.newaxis]


def encode(step: tf.Tensor, log: tf.Tensor, records: Dict[str, tf.Tensor], flags: tf.Tensor) -> Dict[str, Any]:
    """The step, its logging flag, its finished records and its finiteness flags, as integers Keras' mean leaves unchanged.

    The flags come from the merged records, so every replica holds the same.
    """
    return {
        "step": tf.reshape(tf.cast(step, tf.int64), [1]),
        "log": tf.reshape(tf.cast(log, tf.int64), [1]),
        "flags": tf.cast(flags, tf.int64)[tf.newaxis],
        "records": {tag: encode_tensor(t) for tag, t in records.items()},
        "encoded": tf.ones([1], tf.int64),
    }


def _ints(value: Any) -> np.ndarray:
    a = np.asarray(value)
    return np.rint(a).astype(np.int64) if a.dtype.kind == "f" else a.astype(np.int64)


def decode_tensor(value: Any, rank: int, dtype: Any) -> np.ndarray:
    a = _ints(value)
    if a.ndim == rank + 2:  # the leading axis survived (MirroredStrategy); MultiWorker's mean removed it
        a = a[0]
    if a.ndim != rank + 1 or a.shape[-1] != 2:
        raise ValueError(f"internal: an encoded record has shape {a.shape}, expected rank {rank} + [2]")
    return np.ascontiguousarray(a.astype(np.int32)).view(np.float64)[..., 0].astype(dtype)


def decode(payload: Dict[str, Any], layout: Dict[str, Tuple[int, tf.DType]]) -> Dict[str, Any]:
    """The payload as the single-replica path returns it: step, log, tensors, flags.

    `layout`: each record's (rank, dtype) in the step (`FitStep.layout`).
    """
    return {
        "step": int(_ints(payload["step"]).reshape(-1)[0]),
        "log": bool(_ints(payload["log"]).reshape(-1)[0]),
        "flags": _ints(payload["flags"]).reshape(-1) > 0,
        "tensors": {
            key: tf.constant(decode_tensor(v, layout[key][0], layout[key][1].as_numpy_dtype))
            for key, v in payload["records"].items()
        },
    }
