"""One write step: a plan's records into the summary writer, on recorded steps only.

Every path that writes (the custom loop's `summary.gradients`, the `fit()`
step, its record writer, the distributed paths) ends in `write_step`, which
reads top to bottom (`_write_step`):

1. is the step recorded (`recording()`, or the caller's condition)?
2. which (target, source) groups the fused write op takes, decided once
   (`fused_groups`); the other series are "the rest";
3. with a finiteness check (`write_step_checked`), the small rest is looked
   at first: a NaN/Inf there makes the fused op write too (a step so written
   is written in full);
4. the per-example rows, in a recording condition of their own, beside the
   fused op rather than after it (`per_example_write.rows_ahead`);
5. the fused op writes its groups, the recording condition an input;
6. one out-of-line condition writes the rest with TensorFlow's ops, the raw
   tensors, the per-timestep norms and the per-example records.

Which computes the records, the fused kernel or TensorFlow's ops, is decided here, and only here
(`fused_writer`, `fused_groups`, `reduce`). The records are the same either way (docs/FORMAT.md; the kernel
is tested against `statistics.reductions`); only the cost differs. The fused kernel (`kernel.fused`) reads
16/32-bit floats on the CPU and is used where it was built; its write op also writes the records to a plain
TensorFlow summary writer itself, taking the recording condition as an input, so that a logged step needs no
condition around its records (docs/DESIGN.md, "One write step"). Everything else (float64 and integer data,
XLA, a writer the op cannot write to) takes `statistics.reductions` and `tf.summary.write`.

Both paths keep each series' running first NaN/Inf step in the one tracker
(`writer_state`); the rest writes its `first_nonfinite` records here (`track_nonfinite`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.kernel import fused as kernel
from tb_layergrad.kernel.fused import Condition, Groups, Running, Written
from tb_layergrad.statistics import reductions, special_records
from tb_layergrad.summary import per_example_write, writer_state
from tb_layergrad.summary import plan as plans
from tb_layergrad.summary.conditions import cond_out_of_line, recording, when, write_if
from tb_layergrad.summary.plan import Plan, Series


def resolve_step(step: Any) -> Any:
    """`step`, or the default summary step; an integer (a float step is refused, not truncated)."""
    if step is None:
        step = tf.summary.experimental.get_step()
        if step is None:
            raise ValueError(
                "no step given and no default step set: pass step=..., or use "
                "writer.as_default(step=...) / tf.summary.experimental.set_step(...)"
            )
    dtype = getattr(step, "dtype", None)
    if dtype is not None and not tf.as_dtype(dtype).is_integer:
        raise TypeError(f"step must be an integer, got dtype {tf.as_dtype(dtype).name}")
    return step


def read_step(step: Any) -> tf.Tensor:
    """`step` as an int64 tensor, read once for all the records of a step.

    Why: `tf.summary.write` converts its `step` argument at every call; a
    `tf.Variable` step would be read once per record. Any integer dtype is
    taken (`tf.constant(3)` is int32, which `tf.summary.write` refuses).
    """
    if getattr(step, "dtype", None) is None:
        return tf.convert_to_tensor(step, tf.int64)
    return tf.cast(step, tf.int64)


def write_step(
    plan: Plan, step: Any, record: Any = None, writer: Any = None, flush: bool = False, histograms: Any = True
) -> tf.Tensor:
    """Write `plan`'s records at `step` if the step is recorded; returns a bool scalar: written.

    `record`: None for the default writer's own condition (`tf.summary.record_if`,
    a writer set); else a bool (tensor) saying whether to write, e.g. `fit()`'s
    logging flag. `writer`: None for the default writer, else the writer to
    write to (entered around what TensorFlow's ops write, which flushes it);
    `flush`: flush after the fused op's records too. `histograms` (a bool, or
    a bool tensor): write the histogram records too; when false, the stats
    only — except at a step where a series holds a NaN/Inf, written in full.
    """
    return _write_step(plan, Condition(record, step, histograms, None, flush), writer)[0]


def write_step_checked(
    plan: Plan,
    step: Any,
    record: Any,
    record_if_nonfinite: Any,
    writer: Any = None,
    flush: bool = False,
    histograms: Any = True,
) -> Tuple[tf.Tensor, tf.Tensor]:
    """`write_step`, and a look at every present series for a NaN/Inf at every step, recorded or not.

    Returns (written, nonfinite): `nonfinite` [n] bool, one per present series
    of `plan` in its order. An unrecorded step is written after all when a
    series holds a NaN/Inf and `record_if_nonfinite` holds (GradientLogger:
    the first such step of a run is written in full). Where the fused op
    writes, it looks at the tensors itself, in the same pass.
    """
    return _write_step(plan, Condition(record, step, histograms, record_if_nonfinite, flush), writer)


class _Split(NamedTuple):
    """A plan's series by who writes them: whole (target, source) groups for the fused op, the rest not."""

    fused: Tuple[Tuple[Series, ...], ...]
    rest: Tuple[Series, ...]  # in the plan's order


def _write_step(plan: Plan, condition: Condition, writer: Any) -> Tuple[tf.Tensor, tf.Tensor]:
    """The steps of the module docstring, in order. `condition.record` None: the default writer's own."""
    present = [s for s in plan.series if s.present]
    should = recording() if condition.record is None else condition.record
    if should is None:
        return tf.constant(False), tf.zeros([len(present)], tf.bool)
    resource = fused_writer(writer)
    split = _split(plan, resource)
    checking = condition.record_if_nonfinite is not None
    rest_flags = [series_nonfinite(s) for s in split.rest if s.present] if checking else []
    should = _or_nonfinite(should, rest_flags, condition.record_if_nonfinite)
    ahead = per_example_write.rows_ahead(plan, should, final=not checking)
    written: List[tf.Tensor] = []
    fused_flags, fused_stats = None, None
    if split.fused:
        record = tf.constant(should) if isinstance(should, bool) else should
        at = dataclasses.replace(condition, record=record, step=read_step(condition.step))
        out = write_fused(resource, plan, split.fused, at, writer)
        written.append(out.written)
        fused_flags = out.nonfinite
        if plan.per_example is not None:  # the noise scale reads the batch gradients' norms from them
            fused_stats = (_tags(split.fused), out.stats)
    if checking:
        flags = _flags_in_plan_order(present, split, fused_flags, rest_flags)
        should = _or_nonfinite(should, [tf.reduce_any(flags)] if present else [], condition.record_if_nonfinite)
    else:
        flags = tf.zeros([len(present)], tf.bool)
    fused_raw = any(s.wants_raw for g in split.fused for s in g)
    if split.rest or plan.timesteps or fused_raw or plan.per_example is not None:
        # The fused stats are split by tag inside the branch: an unlogged step runs no op for them.
        written.append(
            when(should, lambda: _write_with_ops(plan, split, condition, writer, _by_tag(fused_stats), ahead))
        )
    if not written:
        return tf.constant(False), flags
    return (written[0] if len(written) == 1 else tf.reduce_any(tf.stack(written))), flags


def _by_tag(fused_stats: Optional[Tuple[List[str], tf.Tensor]]) -> Dict[str, Any]:
    """tag -> the stats [12] the fused op wrote for it, from (its tags, its [n, 12] stats); {} for none."""
    if fused_stats is None:
        return {}
    tags, stats = fused_stats
    return dict(zip(tags, tf.unstack(stats, len(tags))))


def _split(plan: Plan, resource: Any) -> _Split:
    groups = plans.groups(plan.series)
    fused = tuple(g for g, chosen in zip(groups, fused_groups(groups, resource)) if chosen)
    taken = set(_tags(fused))
    return _Split(fused, tuple(s for s in plan.series if s.info.tag not in taken))


def _tags(groups: Sequence[Sequence[Series]]) -> List[str]:
    return [s.info.tag for g in groups for s in g]


def _or_nonfinite(should: Any, flags: Sequence[tf.Tensor], record_if_nonfinite: Any) -> Any:
    """`should`, or: some of `flags` holds and `record_if_nonfinite` does (a step written for its NaN/Inf)."""
    if not flags:
        return should
    anything = flags[0] if len(flags) == 1 else tf.reduce_any(tf.stack(list(flags)))
    return tf.logical_or(should, tf.logical_and(anything, record_if_nonfinite))


def _flags_in_plan_order(
    present: Sequence[Series], split: _Split, fused_flags: Optional[tf.Tensor], rest_flags: Sequence[tf.Tensor]
) -> tf.Tensor:
    """[n] bool: which present series held a NaN/Inf, in the plan's order."""
    if not present:
        return tf.zeros([0], tf.bool)
    by_tag: Dict[str, tf.Tensor] = dict(zip([s.info.tag for s in split.rest if s.present], rest_flags))
    if fused_flags is not None:
        tags = _tags(split.fused)
        by_tag.update(zip(tags, tf.unstack(fused_flags, len(tags))))
    return tf.stack([by_tag[s.info.tag] for s in present])


def series_nonfinite(s: Series) -> tf.Tensor:
    """Does this series hold a NaN/Inf (its data, or its merged stats)?"""
    if s.reduced is not None:
        return writer_state.nonfinite_flags([s.reduced[1]])[0]
    return tf.logical_not(tf.reduce_all(tf.math.is_finite(s.data)))


# -- which path computes the records: the fused op, or TensorFlow's ops ----------------------------
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


def reduce(
    tensors: Sequence[Any], buckets: int, xla_safe: bool = False, edges: bool = True
) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """(histogram [buckets, 3], stats) of each tensor: the kernel's op for those it reads, TensorFlow's otherwise.

    `xla_safe`: inside an XLA-compiled function, where the kernel cannot run. `edges=False`: each
    histogram is its [buckets] counts alone (what is written; TensorFlow's ops then skip the edges).
    """
    given = [tf.convert_to_tensor(t) for t in tensors]
    out: List[Optional[Tuple[tf.Tensor, tf.Tensor]]] = [None] * len(given)
    fused = [] if xla_safe or kernel.op() is None else [i for i, x in enumerate(given) if _fusable(x)]
    if fused:
        hist, stats = kernel.histograms_and_stats([given[i] for i in fused], buckets)
        hist = hist if edges else hist[:, :, 2]
        for i, h, s in zip(fused, tf.unstack(hist, len(fused)), tf.unstack(stats, len(fused))):
            out[i] = (h, s)
    rest = [i for i, result in enumerate(out) if result is None]
    if rest:
        for i, result in zip(rest, reductions.histograms_and_stats([given[i] for i in rest], buckets, xla_safe, edges)):
            out[i] = result
    return out  # type: ignore[return-value]


# -- what the fused op did not write, with TensorFlow's ops ----------------------------------------
class _Record(NamedTuple):
    series: Series
    histogram: Any
    stats: Any


def _write_with_ops(
    plan: Plan,
    split: _Split,
    condition: Condition,
    writer: Any,
    fused_stats: Dict[str, Any],
    ahead: Optional[per_example_write.RowsAhead],
) -> None:
    """Inside the recorded branch: what the fused op did not write, with `tf.summary.write`."""
    entered = writer.as_default if writer is not None else contextlib.nullcontext
    with entered():
        step = read_step(condition.step)
        rest = reduced_plan(dataclasses.replace(plan, series=split.rest), edges=False)
        records = [
            _Record(s, *(s.reduced if s.present else special_records.no_gradient_records(s.elements, plan.buckets)))
            for s in rest.series
        ]
        histograms = _unless_nonfinite(records, condition.histograms)
        groups = plans.groups(records, info_of=lambda r: r.series.info)
        for members in groups:
            _write_group(members, step, plan.description, histograms)
        for s in rest.series + tuple(s for g in split.fused for s in g):
            _write_raw(s, step, plan.description)
        for t in rest.timesteps:
            _write(t.info, t.norms, step)
            if t.raw is not None:
                _write(t.raw_info, t.raw, step)
        if plan.track_nonfinite and records:
            _track([r for g in groups for r in g], [len(g) for g in groups], step)
        per_example_write.write(plan, step, plan.description, fused_stats, ahead)


def _unless_nonfinite(records: Sequence[_Record], histograms: Any) -> Any:
    """`histograms`, or true where one of the present series holds a NaN/Inf (the step is written in full)."""
    if not records or (isinstance(histograms, bool) and histograms):
        return histograms
    present = [r.stats for r in records if r.series.present]
    if not present:
        return histograms
    return tf.logical_or(histograms, tf.reduce_any(writer_state.nonfinite_flags(present)))


def _track(ordered: Sequence[_Record], sizes: Sequence[int], step: tf.Tensor) -> None:
    """The tracker's update for every row written (a "no gradient" one is never non-finite)."""
    flags = tf.logical_and(
        writer_state.nonfinite_flags([r.stats for r in ordered]),
        tf.constant([r.series.present for r in ordered]),
    )
    track_nonfinite([r.series.info for r in ordered], flags, step, group_sizes=sizes)


def _write_group(members: Sequence[_Record], step: tf.Tensor, description: str, histograms: Any) -> None:
    """One (target, source) group's histogram counts and stats, as one record each (docs/FORMAT.md)."""
    group = metadata.GroupInfo.of(metadata.KIND_STATS, [r.series.info for r in members])
    stats_only = members[0].series.stats_only
    kinds = [metadata.KIND_STATS] if stats_only else [metadata.KIND_HISTOGRAM, metadata.KIND_STATS]
    tags = [group.with_kind(k) for k in kinds]
    pending = writer_state.Pending(tags, step)
    written = []
    for i, g in enumerate(tags):
        serialized = writer_state.serialized_if(
            pending.needed[i], metadata.create_group_metadata(g, description).SerializeToString()
        )
        tag = writer_state.tag_at(g, pending.firsts[i])
        if g.kind == metadata.KIND_STATS:
            value = tf.stack([tf.cast(r.stats, tf.float64) for r in members])
            tf.summary.write(tag, value, step=step, metadata=serialized)
            written.append(tf.constant(True))
        else:
            counts = tf.stack([_counts(r.histogram) for r in members])
            write_if(
                histograms,
                lambda tag=tag, counts=counts, serialized=serialized: _write_counts(tag, counts, step, serialized),
            )
            written.append(tf.convert_to_tensor(histograms, tf.bool))
    pending.store(tf.stack(written))


def _counts(histogram: Any) -> tf.Tensor:
    """The float64 counts [k] of a histogram given as [k, 3] (left, right, count) or as its counts alone."""
    histogram = tf.cast(histogram, tf.float64)
    return histogram if histogram.shape.rank == 1 else histogram[:, 2]


_COUNT_TYPES = tuple(tf.as_dtype(name) for name, _ in metadata.COUNT_DTYPES)
_COUNT_BOUNDS = tuple(float(bound) for _, bound in metadata.COUNT_DTYPES[:-1])


def _write_counts(tag: Any, counts: tf.Tensor, step: tf.Tensor, serialized: Any) -> None:
    """Histogram counts in the narrowest unsigned type that holds the largest (metadata.COUNT_DTYPES)."""
    largest = tf.reduce_max(counts)
    which = tf.reduce_sum(tf.cast(largest >= tf.constant(_COUNT_BOUNDS, tf.float64), tf.int32))

    def writer(dtype: tf.DType):
        def write() -> tf.Tensor:
            tf.summary.write(tag, tf.cast(counts, dtype), step=step, metadata=serialized)
            return tf.constant(True)

        return write

    if tf.executing_eagerly():
        writer(_COUNT_TYPES[int(which)])()
    else:
        tf.switch_case(which, [writer(dtype) for dtype in _COUNT_TYPES])


def _write(info: metadata.SeriesInfo, tensor: Any, step: tf.Tensor, description: str = "") -> None:
    tf.summary.write(info.tag, tensor, step=step, metadata=metadata.create_summary_metadata(info, description))


def _write_raw(s: Series, step: tf.Tensor, description: str) -> None:
    if s.wants_raw:
        raw = s.raw if s.raw is not None else special_records.bounded_tensor(s.data, s.max_elements)
        _write(s.of_kind(metadata.KIND_TENSOR), raw, step, description)


def reduced_plan(plan: Plan, xla_safe: bool = False, edges: bool = True) -> Plan:
    """`plan` with every present series reduced to (histogram, stats), and its small records computed.

    Where the records must be finished inside a step, e.g. before they cross
    replicas (`tb_layergrad.keras`); `xla_safe` inside an XLA-compiled step;
    `edges=False` where they are written next, which takes the counts alone.
    """
    plan = plan.prepared()
    todo = [i for i, s in enumerate(plan.series) if s.data is not None and s.reduced is None]
    if not todo:
        return plan
    records = reduce([plan.series[i].data for i in todo], plan.buckets, xla_safe, edges)
    series = list(plan.series)
    for i, result in zip(todo, records):  # the gradient is not needed any more: only the records leave
        series[i] = dataclasses.replace(series[i], data=None, reduced=result)
    return dataclasses.replace(plan, series=tuple(series))


def track_nonfinite(
    infos: Sequence[metadata.SeriesInfo], nonfinite: tf.Tensor, step: Any, group_sizes: Sequence[int]
) -> None:
    """Update the running first non-finite step of each stats series and write those there are.

    `nonfinite` [T] bool: which series held a NaN/Inf at this step. To be
    called where the step's records are written (the default writer is the
    one they go to), eagerly or in a `tf.function`, once per logged step for
    all series, behind ONE condition. Why: a logged step of a clean run (no
    NaN/Inf ever) should cost no more than a look at its flags and one
    variable; a condition (or an assignment) per series costs a call each in a
    `tf.function` (docs/DESIGN.md, "One first-non-finite tracker").
    `group_sizes`: `infos` are consecutive groups of these sizes (one target
    and source each), each written as one int64 [L] record (docs/FORMAT.md).
    """
    if not infos:
        return
    table, slots = writer_state.running_firsts([info.tag for info in infos])
    variable = table.variable
    step = tf.cast(step, tf.int64)
    nonfinite = tf.convert_to_tensor(nonfinite)
    # A clean step of a clean run: these few ops, and the condition not taken.
    needed = tf.logical_or(table.seen.value(), tf.reduce_any(nonfinite))

    def store_and_write() -> tf.Tensor:
        slots_t = tf.constant(slots, tf.int64)
        previous = tf.gather(variable.value(), slots_t)
        first = tf.where((previous < 0) & nonfinite, step, previous)
        variable.scatter_update(tf.IndexedSlices(first, slots_t))
        table.seen.assign(tf.logical_or(table.seen.value(), tf.reduce_any(first >= 0)))
        _write_groups(infos, group_sizes, first, step)
        return tf.constant(True)

    cond_out_of_line(needed, store_and_write)


def _write_groups(
    infos: Sequence[metadata.SeriesInfo], sizes: Sequence[int], first: tf.Tensor, step: tf.Tensor
) -> None:
    begin = 0
    for size in sizes:
        group = metadata.GroupInfo.of(metadata.KIND_FIRST_NONFINITE, infos[begin : begin + size])
        values = first[begin : begin + size]
        begin += size

        def write(group=group, values=values) -> tf.Tensor:
            pending = writer_state.Pending([group], step)
            serialized = metadata.create_group_metadata(group).SerializeToString()
            tf.summary.write(
                writer_state.tag_at(group, pending.firsts[0]),
                values,
                step=step,
                metadata=writer_state.serialized_if(pending.needed[0], serialized),
            )
            pending.store(tf.constant([True]))
            return tf.constant(True)

        write_if(tf.reduce_any(values >= 0), write)
