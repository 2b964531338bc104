"""One write step: a plan's records into the summary writer, on recorded steps only.

Every path that writes (the custom loop's `summary.gradients`, the `fit()`
step, its record writer, the distributed paths) ends in `write_step`. It asks
`backend` once which tensors the fused write op takes; that op writes them with
the recording condition as an input, and one out-of-line condition writes the
rest with TensorFlow's ops. Both keep the running first NaN/Inf steps in the
one tracker, `first_nonfinite`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, List, Optional, Tuple

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.statistics import reductions
from tb_layergrad.summary import backend, first_nonfinite, per_example_write, tag_metadata
from tb_layergrad.summary import plan as plans
from tb_layergrad.summary.graph import cond_out_of_line, write_if
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


def recording() -> Optional[Any]:
    """Are summaries recorded now (a default writer, record_if true)? None if statically not; else a bool or tensor."""
    should = tf.summary.should_record_summaries()
    static = should if isinstance(should, bool) else tf.get_static_value(should)
    if static is not None and not bool(static):
        return None  # statically off (no writer, e.g. a non-chief worker): nothing to trace
    return should


def when(should: Any, fn: Callable[[], None], out_of_line: bool = True) -> tf.Tensor:
    """Run `fn` only if `should` holds, with recording statically on inside; True if it ran.

    Why statically on: otherwise every `tf.summary.write` in `fn` would add its
    own condition on the same predicate. `out_of_line`: the branch as one
    function call (`cond_out_of_line`); not for a branch that gathers replicas
    (collectives over PerReplica values must stay inline).
    """

    def run() -> tf.Tensor:
        with tf.summary.record_if(True):
            fn()
        return tf.constant(True)

    if isinstance(should, bool):
        return run() if should else tf.constant(False)
    if not out_of_line and not tf.executing_eagerly():
        return tf.cond(should, run, lambda: tf.constant(False))
    return cond_out_of_line(should, run)


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
    return _write_step(plan, step, record, writer, flush, None, histograms)[0]


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
    return _write_step(plan, step, record, writer, flush, record_if_nonfinite, histograms)


def _write_step(
    plan: Plan, step: Any, record: Any, writer: Any, flush: bool, record_if_nonfinite: Any, histograms: Any = True
) -> Tuple[tf.Tensor, tf.Tensor]:
    checking = record_if_nonfinite is not None
    present = [s for s in plan.series if s.present]
    should = recording() if record is None else record
    if should is None:
        return tf.constant(False), tf.zeros([len(present)], tf.bool)
    resource = backend.fused_writer(writer)
    fused, group_sizes = _fused_series(plan, resource)
    rest = [s for s in plan.series if all(s is not f for f in fused)]
    entered = writer.as_default if writer is not None else contextlib.nullcontext
    written: List[tf.Tensor] = []
    flag_of: dict = {}
    fused_stats: dict = {}  # id(series) -> its stats [12] as the fused op wrote them
    if checking:  # the small rest first: a NaN there makes the fused op write too (the step is written in full)
        for s in rest:
            if s.present:
                flag_of[id(s)] = series_nonfinite(s)
        if flag_of:
            elsewhere = tf.reduce_any(tf.stack(list(flag_of.values())))
            should = tf.logical_or(should, tf.logical_and(elsewhere, record_if_nonfinite))
    # The per-example rows in a condition of their own, beside the fused op rather than after it (`rows_ahead`).
    ahead = per_example_write.rows_ahead(plan, should, final=not checking)
    if fused:
        condition = tf.constant(should) if isinstance(should, bool) else should
        done, nonfinite, stats = backend.write_fused(
            resource,
            condition,
            read_step(step),
            [s.info for s in fused],
            [s.data for s in fused],
            plan.buckets,
            plan.description,
            flush=flush,
            track_nonfinite=plan.track_nonfinite,
            writer=writer,
            record_if_nonfinite=record_if_nonfinite,
            group_sizes=group_sizes,
            histograms=histograms,
        )
        written.append(done)
        flag_of.update(zip(map(id, fused), tf.unstack(nonfinite, len(fused))))
        if plan.per_example is not None:  # the noise scale reads the batch gradients' norms from them
            fused_stats.update(zip(map(id, fused), tf.unstack(stats, len(fused))))
    if checking:
        flags = tf.stack([flag_of[id(s)] for s in present]) if present else tf.zeros([0], tf.bool)
        should = tf.logical_or(should, tf.logical_and(tf.reduce_any(flags), record_if_nonfinite))
    else:
        flags = tf.zeros([len(present)], tf.bool)
    if rest or plan.timesteps or any(s.wants_raw for s in fused) or plan.per_example is not None:

        def write_rest() -> None:
            with entered():
                at = read_step(step)
                _write_with_ops(plan, rest, fused, at, histograms)
                per_example_write.write(plan, at, plan.description, fused_stats, ahead)

        written.append(when(should, write_rest))
    if not written:
        return tf.constant(False), flags
    return (written[0] if len(written) == 1 else tf.reduce_any(tf.stack(written))), flags


def _fused_series(plan: Plan, resource: Any) -> Tuple[List[Series], List[int]]:
    """The series the fused write op takes, and (format version 2) the sizes of their groups.

    Version 1: every unreduced 16/32-bit float series. Version 2: whole groups
    (one record per (target, source)) whose every series is one, so that a
    group is one record whichever path writes it.
    """

    def fusable(s: Series) -> bool:
        return s.data is not None and s.reduced is None and not s.stats_only

    if plan.format_version < 2:
        unreduced = [s for s in plan.series if fusable(s)]
        return [unreduced[i] for i in backend.fused_part(resource, [s.data for s in unreduced])], []
    chosen = [
        g
        for g in plans.groups(plan.series)
        if all(map(fusable, g)) and len(backend.fused_part(resource, [s.data for s in g])) == len(g)
    ]
    return [s for g in chosen for s in g], [len(g) for g in chosen]


def series_nonfinite(s: Series) -> tf.Tensor:
    """Does this series hold a NaN/Inf (its data, or its merged stats)?"""
    if s.reduced is not None:
        return first_nonfinite.nonfinite_flags([s.reduced[1]])[0]
    return tf.logical_not(tf.reduce_all(tf.math.is_finite(s.data)))


def _write_with_ops(
    plan: Plan, rest: List[Series], fused: List[Series], step: tf.Tensor, histograms: Any = True
) -> None:
    """What the fused op did not write, with `tf.summary.write`; then the first-non-finite tracker.

    `histograms`: write the histogram records too (a step with a NaN/Inf in these series gets them anyway).
    """
    reduced = reduced_plan(dataclasses.replace(plan, series=tuple(rest)))
    records = [
        (s, *(s.reduced if s.present else reductions.no_gradient_records(s.elements, plan.buckets)))
        for s in reduced.series
    ]
    if records and not (isinstance(histograms, bool) and histograms):
        present = [stat for s, _, stat in records if s.present]
        if present:  # a NaN/Inf: the step is written in full
            histograms = tf.logical_or(histograms, tf.reduce_any(first_nonfinite.nonfinite_flags(present)))
    if plan.format_version >= 2:
        ordered, sizes = _write_groups(records, step, plan.description, histograms)
        stat_of = {id(s): stat for s, _, stat in records}
        tracked = [s.info for s in ordered]  # every row of a group, a "no gradient" one never non-finite
        flags = (
            None
            if not ordered
            else tf.logical_and(
                first_nonfinite.nonfinite_flags([stat_of[id(s)] for s in ordered]),
                tf.constant([s.present for s in ordered]),
            )
        )
    else:
        tracked, stats, sizes = [], [], ()
        for s, hist, stat in records:
            if not s.stats_only:
                write_if(
                    histograms,
                    lambda s=s, hist=hist: _write(s.of_kind(metadata.KIND_HISTOGRAM), hist, step, plan.description),
                )
            _write(s.info, stat, step, plan.description)
            if s.present:
                tracked.append(s.info)
                stats.append(stat)
        flags = first_nonfinite.nonfinite_flags(stats) if stats else None
    for s in reduced.series:
        _write_raw(s, step, plan.description)
    for s in fused:
        _write_raw(s, step, plan.description)
    for t in reduced.timesteps:
        _write(t.info, t.norms, step)
        if t.raw is not None:
            _write(t.raw_info, t.raw, step)
    if plan.track_nonfinite and tracked:
        first_nonfinite.track(tracked, flags, step, group_sizes=sizes)


def _write_groups(
    records: List[Tuple[Series, Any, Any]], step: tf.Tensor, description: str, histograms: Any = True
) -> Tuple[List[Series], List[int]]:
    """Format version 2: each (target, source) group's histogram counts and stats as one record each.

    Returns the series in the order written, and the group sizes (for the tracker).
    """
    by_series = {id(s): (hist, stat) for s, hist, stat in records}
    ordered: List[Series] = []
    sizes: List[int] = []
    for members in plans.groups(tuple(s for s, _, _ in records)):
        group = metadata.GroupInfo.of(metadata.KIND_STATS, [s.info for s in members])
        kinds = [metadata.KIND_STATS] if members[0].stats_only else [metadata.KIND_HISTOGRAM, metadata.KIND_STATS]
        tags = [group.with_kind(k) for k in kinds]
        pending = tag_metadata.Pending(tags, step)
        written = []
        for i, g in enumerate(tags):
            serialized = tag_metadata.serialized_if(
                pending.needed[i], metadata.create_group_metadata(g, description).SerializeToString()
            )
            tag = tag_metadata.tag_at(g, pending.firsts[i])
            if g.kind == metadata.KIND_STATS:
                value = tf.stack([tf.cast(by_series[id(s)][1], tf.float64) for s in members])
                tf.summary.write(tag, value, step=step, metadata=serialized)
                written.append(tf.constant(True))
            else:
                counts = tf.stack([tf.cast(by_series[id(s)][0], tf.float64)[:, 2] for s in members])
                write_if(
                    histograms,
                    lambda tag=tag, counts=counts, serialized=serialized: _write_counts(tag, counts, step, serialized),
                )
                written.append(tf.convert_to_tensor(histograms, tf.bool))
        pending.store(tf.stack(written))
        ordered.extend(members)
        sizes.append(len(members))
    return ordered, sizes


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
        raw = s.raw if s.raw is not None else reductions.bounded_tensor(s.data, s.max_elements)
        _write(s.of_kind(metadata.KIND_TENSOR), raw, step, description)


def reduced_plan(plan: Plan, xla_safe: bool = False) -> Plan:
    """`plan` with every present series reduced to (histogram, stats), and its small records computed.

    Where the records must be finished inside a step, e.g. before they cross
    replicas (`tb_layergrad.keras`); `xla_safe` inside an XLA-compiled step.
    """
    plan = plan.prepared()
    todo = [i for i, s in enumerate(plan.series) if s.data is not None and s.reduced is None]
    if not todo:
        return plan
    records = backend.reduce([plan.series[i].data for i in todo], plan.buckets, xla_safe)
    series = list(plan.series)
    for i, result in zip(todo, records):  # the gradient is not needed any more: only the records leave
        series[i] = dataclasses.replace(series[i], data=None, reduced=result)
    return dataclasses.replace(plan, series=tuple(series))
