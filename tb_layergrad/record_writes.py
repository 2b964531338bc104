"""Write the histogram and stats records of many gradients, in one op where it can.

Why: on a small model, a logged step's cost is mostly how many ops it runs and
how they are scheduled, not the reading of its tensors. Through
`tf.summary.write` every record is a WriteSummary op with its tag and metadata
constants, an identity and a slice of the batched reductions, all inside a
`tf.cond`. Where the fused kernel is built (`fused_kernel`) and the default
writer is a plain TensorFlow summary writer, one op computes and writes the
histogram, stats and first-non-finite records of all 16/32-bit float tensors
of a step (`write_fused`), and can take the recording condition as an input.
The rest take `reductions` and `tf.summary.write`. The records are the same
either way (docs/FORMAT.md); only their order within a step may differ.
"""
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import fused_kernel, metadata, reductions, summary_state


def fused_writer() -> Optional[tf.Tensor]:
    """The default writer's resource, if the fused write op can write to it (else None)."""
    if fused_kernel.write_op() is None:
        return None
    return summary_state.default_writer_resource()


def fusable(tensor: Any) -> bool:
    """Can the fused op reduce this tensor (a 16- or 32-bit float tensor or array)?"""
    dtype = getattr(tensor, "dtype", None)  # a Python list has none: TensorFlow's path converts it
    return dtype is not None and tf.as_dtype(dtype) in fused_kernel.DTYPES


def _serialized(info: metadata.SeriesInfo, description: str) -> Tuple[str, bytes]:
    return info.tag, metadata.create_summary_metadata(info, description).SerializeToString()


def write_fused(
    writer: tf.Tensor,
    record: Any,
    series: Sequence[metadata.SeriesInfo],
    tensors: Sequence[tf.Tensor],
    buckets: int,
    step: tf.Tensor,
    description: str = "",
    flush: bool = False,
    track_nonfinite: bool = True,
) -> tf.Tensor:
    """ONE op: when `record` holds, every tensor's histogram, stats and first-non-finite records; returns `record`.

    `series`: each tensor's stats series (the other kinds differ only in kind);
    every tensor must be `fusable`; `writer` from `fused_writer()` (or a
    writer's resource); `step`: int64 scalar; `flush`: flush the writer after;
    `track_nonfinite`: keep and write the `first_nonfinite` records.
    """
    kinds = [
        [_serialized(dataclasses.replace(info, kind=kind), text) for info in series]
        # first_nonfinite without the description, as nonfinite.write_first_nonfinite writes it
        for kind, text in ((metadata.KIND_HISTOGRAM, description), (metadata.KIND_STATS, description), (metadata.KIND_FIRST_NONFINITE, ""))
    ]
    if not track_nonfinite:
        kinds[2] = []
    return fused_kernel.write_histograms_and_stats(writer, record, step, tensors, buckets, *kinds, flush=flush)


def write_histograms_and_stats(
    series: Sequence[metadata.SeriesInfo],
    tensors: Sequence[tf.Tensor],
    buckets: int,
    step: tf.Tensor,
    description: str = "",
    track_nonfinite: bool = True,
) -> List[Tuple[metadata.SeriesInfo, tf.Tensor]]:
    """Write each tensor's histogram and stats records to the default writer, where recording is on.

    `series`: the stats series of each tensor; `step`: an int64 scalar. Returns
    the (stats series, stats) of the tensors whose first-non-finite records
    are still to be kept (`nonfinite.write_first_nonfinite`): with
    `track_nonfinite`, the fused op keeps those of the tensors it writes itself.
    """
    given = [tf.convert_to_tensor(t) for t in tensors]
    writer = fused_writer()
    fused = [i for i, x in enumerate(given) if writer is not None and fusable(x)]
    if fused:
        write_fused(
            writer, tf.constant(True), [series[i] for i in fused], [given[i] for i in fused], buckets, step, description,
            track_nonfinite=track_nonfinite,
        )
    rest = [i for i in range(len(given)) if i not in set(fused)]
    tracked = []
    for i, (hist, stats) in zip(rest, reductions.histograms_and_stats([given[i] for i in rest], buckets) if rest else []):
        info = series[i]
        hist_info = dataclasses.replace(info, kind=metadata.KIND_HISTOGRAM)
        tf.summary.write(hist_info.tag, hist, step=step, metadata=metadata.create_summary_metadata(hist_info, description))
        tf.summary.write(info.tag, stats, step=step, metadata=metadata.create_summary_metadata(info, description))
        tracked.append((info, stats))
    return tracked
