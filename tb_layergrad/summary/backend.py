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

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.kernel import fused as kernel
from tb_layergrad.kernel.fused import Condition, Groups, Running, Written
from tb_layergrad.statistics import reductions
from tb_layergrad.summary import writer_state
from tb_layergrad.summary.plan import Plan, Series

_KINDS = (metadata.KIND_HISTOGRAM, metadata.KIND_STATS, metadata.KIND_FIRST_NONFINITE)


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


def fused_groups(groups: Sequence[Tuple[Series, ...]], resource: Optional[tf.Tensor]) -> List[bool]:
    """Which of these (target, source) groups the fused write op writes, given `fused_writer()`'s answer.

    A whole group or none of it, so that a group is one record whichever path writes it: every series
    unreduced, 16/32-bit float data, more than one value (a target's value is written as stats alone).
    """
    if resource is None:
        return [False] * len(groups)
    return [all(s.reduced is None and not s.stats_only and _fusable(s.data) for s in g) for g in groups]


def write_fused(
    resource: tf.Tensor, plan: Plan, groups: Sequence[Tuple[Series, ...]], condition: Condition, writer: Any = None
) -> Written:
    """ONE op: when `condition` holds, the histogram, stats and first-non-finite records of `groups` of `plan`.

    The running first steps are the one tracker's (`writer_state`), those of `writer` (the writer
    `resource` belongs to; default: the default writer): read before the op, which applies the rule, and
    stored after it; so is which tags already carry their metadata.
    """
    infos = [metadata.GroupInfo.of(metadata.KIND_STATS, [s.info for s in members]) for members in groups]
    pending = writer_state.Pending([g.with_kind(k) for g in infos for k in _KINDS], condition.step, writer)
    records = Groups(
        sizes=tuple(len(members) for members in groups),
        block_steps=tuple(g.block_steps for g in infos),
        histogram=_series(infos, metadata.KIND_HISTOGRAM, plan.description),
        stats=_series(infos, metadata.KIND_STATS, plan.description),
        first_nonfinite=_series(infos, metadata.KIND_FIRST_NONFINITE, "") if plan.track_nonfinite else (),
    )
    flat = [s for members in groups for s in members]
    if plan.track_nonfinite:
        variable, slots, firsts = writer_state.running([s.info for s in flat], writer)
    else:
        firsts = tf.fill([len(flat)], tf.constant(-1, tf.int64))
    running = Running(firsts, pending.needed)
    out = kernel.write_histograms_and_stats(resource, [s.data for s in flat], plan.buckets, records, condition, running)
    if plan.track_nonfinite:
        writer_state.store(variable, slots, out.first_steps)
    pending.store(out.metadata_written)
    return out


def _series(groups: Sequence[metadata.GroupInfo], kind: str, description: str) -> Tuple[Tuple[str, bytes], ...]:
    """(tag, serialized metadata) of each group's records of `kind` (the first_nonfinite ones: no description)."""
    return tuple(
        (g.with_kind(kind).tag, metadata.create_group_metadata(g.with_kind(kind), description).SerializeToString())
        for g in groups
    )


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
