"""Which computes a step's records: the fused kernel or TensorFlow's ops. Decided here, and only here.

The records are the same either way (docs/FORMAT.md; the kernel is tested
against `statistics.reductions`); only the cost differs. The fused kernel
(`tb_layergrad.kernel`) reads 16/32-bit floats on the CPU and is used where it
was built; its write op also writes the records to a plain TensorFlow summary
writer itself, taking the recording condition as an input, so that a logged
step needs no condition around its records (docs/DESIGN.md, "One write step").
Everything else (float64 and integer data, XLA, a writer the op cannot
write to) takes `statistics.reductions` and `tf.summary.write`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import kernel, metadata
from tb_layergrad.statistics import reductions
from tb_layergrad.summary import first_nonfinite, tag_metadata, writer_state


def _fusable(tensor: Any) -> bool:
    """Can the kernel read this tensor (a 16- or 32-bit float tensor or array)?"""
    dtype = getattr(tensor, "dtype", None)  # a Python list has none: TensorFlow's path converts it
    return dtype is not None and tf.as_dtype(dtype) in kernel.DTYPES


def fused_writer(writer: Any = None) -> Optional[tf.Tensor]:
    """The resource the fused write op writes to (`writer`, default: the default writer), or None.

    None where the op is not available here or the writer is not a plain
    TensorFlow summary writer (`writer_state.writer_resource`).
    """
    if kernel.write_op() is None:
        return None
    return writer_state.writer_resource(writer_state.default_writer() if writer is None else writer)


def fused_part(resource: Optional[tf.Tensor], tensors: Sequence[Any]) -> List[int]:
    """The positions of `tensors` the fused write op takes, given `fused_writer()`'s answer."""
    return [] if resource is None else [i for i, t in enumerate(tensors) if _fusable(t)]


def write_fused(
    resource: tf.Tensor,
    record: Any,
    step: tf.Tensor,
    infos: Sequence[metadata.SeriesInfo],
    tensors: Sequence[Any],
    buckets: int,
    description: str = "",
    flush: bool = False,
    track_nonfinite: bool = True,
    writer: Any = None,
    record_if_nonfinite: Any = None,
    group_sizes: Sequence[int] = (),
    histograms: Any = True,
) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """ONE op: when `record` holds, each tensor's histogram, stats and first-non-finite records.

    Returns (written, nonfinite [T], stats [T, 12]: each tensor's stats as written, zeros
    when nothing was). The running first steps are the one
    tracker's (`first_nonfinite`), those of `writer` (the writer `resource`
    belongs to; default: the default writer): read before the op, which
    applies the rule, and stored after it. `record_if_nonfinite` (a bool, or
    None): the op also checks an unrecorded step's tensors for a NaN/Inf and
    writes them after all when one holds one and it is true
    (`kernel.write_histograms_and_stats`). `group_sizes` (format version 2):
    consecutive groups of `infos` (one target and source each), each written
    as one record per kind, its metadata in its tags' first records only
    (`tag_metadata`). `histograms` (a bool, or a bool tensor): write the
    histograms too (a step with a NaN/Inf gets them anyway).
    """
    if group_sizes:
        groups = [metadata.GroupInfo.of(metadata.KIND_STATS, part) for part in _split(infos, group_sizes)]
        series = {
            kind: [
                (g.with_kind(kind).tag, metadata.create_group_metadata(g.with_kind(kind), text).SerializeToString())
                for g in groups
            ]
            for kind, text in (
                (metadata.KIND_HISTOGRAM, description),
                (metadata.KIND_STATS, description),
                (metadata.KIND_FIRST_NONFINITE, ""),
            )
        }
        kinds = (metadata.KIND_HISTOGRAM, metadata.KIND_STATS, metadata.KIND_FIRST_NONFINITE)
        pending = tag_metadata.Pending([g.with_kind(k) for g in groups for k in kinds], step, writer)
    else:
        series = {
            kind: [
                (info.tag, metadata.create_summary_metadata(info, text).SerializeToString())
                for info in (dataclasses.replace(info, kind=kind) for info in infos)
            ]
            for kind, text in (
                (metadata.KIND_HISTOGRAM, description),
                (metadata.KIND_STATS, description),
                (metadata.KIND_FIRST_NONFINITE, ""),
            )  # no description, as first_nonfinite.track
        }
        pending = None
    if track_nonfinite:
        variable, slots, firsts = first_nonfinite.running(infos, writer)
        first_series = series[metadata.KIND_FIRST_NONFINITE]
    else:
        firsts, first_series = tf.fill([len(infos)], tf.constant(-1, tf.int64)), []
    written, after, nonfinite, metadata_written, stats = kernel.write_histograms_and_stats(
        resource,
        record,
        step,
        list(tensors),
        buckets,
        series[metadata.KIND_HISTOGRAM],
        series[metadata.KIND_STATS],
        firsts,
        first_series,
        flush=flush,
        record_if_nonfinite=record_if_nonfinite,
        group_sizes=group_sizes,
        with_metadata=None if pending is None else pending.needed,
        block_steps=[g.block_steps for g in groups] if group_sizes else (),
        histograms=tf.convert_to_tensor(histograms, tf.bool),
    )
    if track_nonfinite:
        first_nonfinite.store(variable, slots, after)
    if pending is not None:
        pending.store(metadata_written)
    return written, nonfinite, stats


def _split(items: Sequence[Any], sizes: Sequence[int]) -> List[Sequence[Any]]:
    out, begin = [], 0
    for size in sizes:
        out.append(items[begin : begin + size])
        begin += size
    return out


def reduce(tensors: Sequence[Any], buckets: int, xla_safe: bool = False) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """(histogram [buckets, 3], stats) of each tensor: the kernel's op for those it reads, TensorFlow's otherwise.

    `xla_safe`: inside an XLA-compiled function, where the kernel cannot run.
    """
    given = [tf.convert_to_tensor(t) for t in tensors]
    out: List[Optional[Tuple[tf.Tensor, tf.Tensor]]] = [None] * len(given)
    fused = [] if xla_safe or kernel.op() is None else [i for i, x in enumerate(given) if _fusable(x)]
    if fused:
        hist, stats = kernel.histograms_and_stats([given[i] for i in fused], buckets)
        for i, h, s in zip(fused, tf.unstack(hist, len(fused)), tf.unstack(stats, len(fused))):
            out[i] = (h, s)
    rest = [i for i, result in enumerate(out) if result is None]
    if rest:
        for i, result in zip(rest, reductions.histograms_and_stats([given[i] for i in rest], buckets, xla_safe)):
            out[i] = result
    return out  # type: ignore[return-value]
