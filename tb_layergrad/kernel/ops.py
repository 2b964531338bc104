"""The kernel's two ops, called from Python: what they take, in a few named parts.

`histograms_and_stats` computes the records of several tensors; `write_histograms_and_stats`
also writes them to a summary writer, in groups (docs/FORMAT.md, format version 2), when its
`Condition` holds. Both raise RuntimeError where the kernel is not available
(`loader.unavailable_reason()`); `tb_layergrad.summary.backend` decides whether to call them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad.kernel import loader

Series = Tuple[Tuple[str, bytes], ...]  # (tag, serialized SummaryMetadata): one per group


@dataclasses.dataclass(frozen=True)
class Condition:
    """When the write op writes, and what.

    `record`: a bool scalar, write this step; `step`: int64 scalar; `histograms`: a bool (scalar), write the
    histogram records too (a step at which a tensor holds a NaN/Inf always gets them); `record_if_nonfinite`:
    None, or a bool scalar: then an unrecorded step's tensors are checked for a NaN/Inf too, and written after
    all when one holds one and it is true; `flush`: flush the writer after writing.
    """

    record: Any
    step: Any
    histograms: Any = True
    record_if_nonfinite: Any = None
    flush: bool = False


@dataclasses.dataclass(frozen=True)
class Groups:
    """How the tensors are written: consecutive groups of `sizes`, each one record per kind.

    Per group and kind, the (tag, serialized metadata) of its records (`first_nonfinite` empty: those
    records are not written); `block_steps` (one per group): each of the group's tags gets
    `/{first step of the block of that many steps holding step}`.
    """

    sizes: Tuple[int, ...]
    block_steps: Tuple[int, ...]
    histogram: Series
    stats: Series
    first_nonfinite: Series = ()


class Written(NamedTuple):
    """What the write op did: `written` (bool scalar); `first_steps` [T] the running first non-finite steps
    with this step applied; `nonfinite` [T] which tensors held a NaN/Inf (all false when nothing was
    recorded or checked); `metadata_written` [3 * groups] which (histogram, stats, first_nonfinite) record of
    each group carried its metadata; `stats` [T, 12] each tensor's stats as written (zeros when not)."""

    written: tf.Tensor
    first_steps: tf.Tensor
    nonfinite: tf.Tensor
    metadata_written: tf.Tensor
    stats: tf.Tensor


def histograms_and_stats(tensors: Sequence[tf.Tensor], buckets: int) -> Tuple[tf.Tensor, tf.Tensor]:
    """([T, buckets, 3], [T, NUM_STATS]) float64 of float16/bfloat16/float32 tensors, by the kernel."""
    fn = loader.op()
    if fn is None:
        raise RuntimeError(f"the fused kernel is not available: {loader.unavailable_reason()}")
    return fn(list(tensors), buckets=buckets)


class Running(NamedTuple):
    """What the write op reads of the state kept across steps: `first_steps` int64 [T], each tensor's first step
    with a NaN/Inf so far (-1: none); `with_metadata` [3 * groups] bool, which of each group's (histogram,
    stats, first_nonfinite) records carries its metadata."""

    first_steps: tf.Tensor
    with_metadata: tf.Tensor


def write_histograms_and_stats(
    writer: tf.Tensor,
    tensors: Sequence[tf.Tensor],
    buckets: int,
    groups: Groups,
    condition: Condition,
    running: Optional[Running] = None,
    op: Any = None,
) -> Written:
    """When `condition` holds, write each group's records to `writer` (a summary writer's resource handle).

    The records are those `tf.summary.write` would write (docs/FORMAT.md). `running`: default, no first
    non-finite step yet and the metadata with every record. `op`: the write op's function (default:
    `loader.write_op()`). One op, on the CPU, where the writer lives.
    """
    op = op if op is not None else loader.write_op()
    if op is None:
        raise RuntimeError(f"the fused kernel is not available: {loader.unavailable_reason()}")
    if running is None:
        running = Running(tf.fill([len(tensors)], tf.constant(-1, tf.int64)), tf.ones([3 * len(groups.sizes)], tf.bool))
    check = condition.record_if_nonfinite is not None
    with tf.device("cpu:0"):
        out = op(
            writer,
            condition.record,
            condition.record_if_nonfinite if check else tf.constant(False),
            tf.convert_to_tensor(condition.histograms, tf.bool),
            condition.step,
            running.first_steps,
            running.with_metadata,
            list(tensors),
            buckets=buckets,
            histogram_tags=[t for t, _ in groups.histogram],
            histogram_metadata=[m for _, m in groups.histogram],
            stats_tags=[t for t, _ in groups.stats],
            stats_metadata=[m for _, m in groups.stats],
            first_nonfinite_tags=[t for t, _ in groups.first_nonfinite],
            first_nonfinite_metadata=[m for _, m in groups.first_nonfinite],
            flush=condition.flush,
            check=check,
            group_sizes=list(groups.sizes),
            block_steps=list(groups.block_steps),
        )
    return Written(*out)
