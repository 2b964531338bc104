"""Summary ops: write gradients as records this plugin's tab can find.

`gradient()` is the low-level op, the analogue of `tf.summary.histogram` for
one tensor; `gradients()` writes a whole `Capture.gradients(...)` result. Both
write to the default `tf.summary` writer, at `step` or at the default step, and
respect `tf.summary.record_if` (nothing is computed when nothing is recorded).

Under a multi-replica `tf.distribute` strategy they write the GLOBAL batch,
once (docs/DISTRIBUTED.md): inside `strategy.run` they merge the replicas first
(`replicas="gather"`: all-gather the tensors; `replicas="stats"`: all-reduce
only the statistics), every step, since collectives cannot run inside the
recording condition; in cross-replica context, on what `strategy.run`
returned, they `strategy.gather` on recorded steps only.

Example:
    writer = tf.summary.create_file_writer("logs/run1")
    with writer.as_default(step=optimizer.iterations):
        tb_layergrad.summary.gradients(grads)

With a `tf.function` train step, enter the writer around the Python loop (or
call `writer.set_as_default(step=...)` once), not inside the step: leaving a
`with writer.as_default():` block inside a `tf.function` flushes the event
file at every call (0.05-0.1 ms a step here), logged or not.
"""
from __future__ import annotations

import dataclasses
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import distribute, metadata, nonfinite, record_writes, reductions, replica_stats
from tb_layergrad.graph_util import cond_out_of_line, no_autograph
from tb_layergrad.gradient_map import Entry, GradientMap


__all__ = ["gradient", "gradients", "timesteps"]


def _resolve_step(step: Any) -> Any:
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


def _recording() -> Optional[Any]:
    """Are summaries recorded now (a default writer, record_if true)? None if statically not; else a bool or tensor."""
    should = tf.summary.should_record_summaries()
    static = should if isinstance(should, bool) else tf.get_static_value(should)
    if static is not None and not bool(static):
        return None  # statically off (no writer, e.g. a non-chief worker): nothing to trace
    return should


def _when_recording(fn, should: Any, out_of_line: bool = True) -> Any:
    """Run `fn` only if `should` (from `_recording()`) holds.

    Inside, recording is statically on: otherwise every `tf.summary.write` in
    `fn` would add its own condition on the same predicate (a few tens of
    microseconds each per step in a `tf.function`). `out_of_line`: the branch
    as one function call (graph_util.cond_out_of_line); not for a branch that
    gathers replicas (collectives over PerReplica values must stay inline).
    """

    def write():
        with tf.summary.record_if(True):
            fn()
        return tf.constant(True)

    if isinstance(should, bool):
        return write() if should else tf.constant(False)
    if not out_of_line and not tf.executing_eagerly():
        return tf.cond(should, write, lambda: tf.constant(False))
    return cond_out_of_line(should, write)


def _info(name: str, kind: str, target: str, source: str, index: int, dtype: str) -> metadata.SeriesInfo:
    return metadata.SeriesInfo(layer=name, kind=kind, target=target, source=source, index=int(index), dtype=dtype)


def _write(info: metadata.SeriesInfo, tensor: tf.Tensor, step: Any, description: str = "") -> None:
    tf.summary.write(info.tag, tensor, step=step, metadata=metadata.create_summary_metadata(info, description))


def _read_step(step: Any) -> tf.Tensor:
    """`step` as an int64 tensor, read once for all the records of a step.

    Why: `tf.summary.write` converts its `step` argument at every call; a
    `tf.Variable` step (the default step of `writer.as_default(step=...)`) would
    be read twice per record, ops a logged step runs for nothing. Any integer
    dtype is taken (`tf.constant(3)` is int32, which `tf.summary.write` refuses);
    a float step is refused earlier (`_resolve_step`), not silently truncated.
    """
    if getattr(step, "dtype", None) is None:
        return tf.convert_to_tensor(step, tf.int64)
    return tf.cast(step, tf.int64)


@no_autograph
def gradient(
    name: str,
    data: Optional[tf.Tensor],
    step: Any = None,
    buckets: int = 30,
    *,
    max_elements: int = 0,
    target: str = metadata.DEFAULT_TARGET,
    source: str = metadata.SOURCE_OUTPUT,
    layer_index: int = -1,
    elements: int = -1,
    description: str = "",
    replicas: str = "gather",
) -> tf.Tensor:
    """Write the histogram and statistics of one gradient tensor.

    Unlike `gradients()`, it keeps no state across steps: no `first_nonfinite`
    records (docs/FORMAT.md).

    Args:
      name: the layer (or tensor) path, e.g. "my_model/minimalrnn".
      data: the gradient; None records "no gradient" (the target does not
        depend on this tensor) instead of failing.
      step: the training step; defaults to the default summary step.
      buckets: number of histogram buckets.
      max_elements: when > 0, also write the raw gradient, bounded to this many
        elements (see `reductions.bounded_tensor` for the rule).
      target: name of the scalar differentiated ("loss" unless told otherwise).
      source: "output" for a layer output, "weight" for a variable.
      layer_index: the layer's position in the model, for ordering in the tab.
      elements: element count to report when `data` is None (-1 if unknown).
      replicas: inside `strategy.run` with several replicas, how `data` (this
        replica's shard) is merged into the global batch before writing:
        "gather" (a layer output is all-gathered along axis 0, a weight
        gradient summed) or "stats" (only statistics cross replicas).

    Returns:
      A boolean scalar tensor: True if something was written.
    """
    step = _resolve_step(step)
    distribute.check_mode(replicas)
    records = None
    ctx = distribute.replica_context()
    if ctx is not None and data is not None:
        entry = Entry(data, source, layer_index, elements)
        merged = _merge_in_replica(GradientMap({name: entry}, target), replicas, buckets, max_elements)
        data, elements, records = merged[0][1].gradient, merged[0][1].elements, merged[0][2]
    elif ctx is not None:
        elements = elements * ctx.num_replicas_in_sync if source == metadata.SOURCE_OUTPUT and elements >= 0 else elements
    series = _series_for(name, data, buckets, max_elements, target, source, layer_index, elements, description)
    with tf.name_scope("layergrad"):
        return _write_when_recording([(series, records)], buckets, step, track_nonfinite=False)


@dataclasses.dataclass(frozen=True)
class _Series:
    """One gradient's series, validated when the op is traced; its records are written when recording."""

    stats: metadata.SeriesInfo
    data: Optional[tf.Tensor]
    elements: int
    max_elements: int
    description: str

    def kind(self, kind: str) -> metadata.SeriesInfo:
        return dataclasses.replace(self.stats, kind=kind)


def _series_for(name, data, buckets, max_elements, target, source, layer_index, elements, description="") -> _Series:
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    if max_elements < 0:
        raise ValueError(f"max_elements must be >= 0, got {max_elements}")
    dtype = "" if data is None else tf.as_dtype(getattr(data, "dtype", tf.float32)).name
    stats = _info(name, metadata.KIND_STATS, target, source, layer_index, dtype)
    return _Series(stats, data, elements, max_elements, description)


def _write_series(items: Sequence[Tuple[_Series, Any]], buckets: int, step: tf.Tensor, track_nonfinite: bool) -> None:
    """Write the records of each (series, its (histogram, stats) if already reduced, else None) at `step`.

    To be run where recording is on. The gradients not reduced yet are reduced
    and written together (`record_writes`). `track_nonfinite`: keep the
    running first NaN/Inf step of each present gradient (docs/FORMAT.md),
    behind one condition.
    """
    fresh = [series for series, reduced in items if series.data is not None and reduced is None]
    tracked: List[Tuple[metadata.SeriesInfo, tf.Tensor]] = []
    for description in dict.fromkeys(series.description for series in fresh):  # one batch per description (one, in practice)
        batch = [series for series in fresh if series.description == description]
        tracked.extend(
            record_writes.write_histograms_and_stats(
                [series.stats for series in batch], [series.data for series in batch], buckets, step, description,
                track_nonfinite,
            )
        )
    for series, reduced in items:
        if series.data is None or reduced is not None:
            hist, stats = reductions.no_gradient_records(series.elements, buckets) if series.data is None else reduced
            _write(series.kind(metadata.KIND_HISTOGRAM), hist, step, series.description)
            _write(series.stats, stats, step, series.description)
            if series.data is not None:
                tracked.append((series.stats, stats))
        _write_raw(series, step)
    if track_nonfinite:
        nonfinite.write_first_nonfinite(tracked, step)


def _write_raw(series: _Series, step: tf.Tensor) -> None:
    """The bounded raw gradient, when asked for (`max_elements`)."""
    if series.max_elements > 0 and series.data is not None:
        raw = reductions.bounded_tensor(series.data, series.max_elements)
        _write(series.kind(metadata.KIND_TENSOR), raw, step, series.description)


def _write_when_recording(items: Sequence[Tuple[_Series, Any]], buckets: int, step: Any, track_nonfinite: bool = True) -> tf.Tensor:
    """Write `items` ([(series, reduced or None)]) if summaries are recorded; True if written.

    Where it can (`record_writes.fused_writer()`, a gradient of a 16/32-bit
    float type not reduced yet), ONE op writes the records and takes the
    recording condition as an input; a `tf.cond` is built only for the rest
    (no gradient, already reduced, other dtypes, raw tensors). Why: a condition
    costs a function call, and its branch waits for every gradient it reads
    (an MLP's training step: 1.087x through a condition, 1.055x without;
    docs/PERFORMANCE.md).
    """
    should = _recording()
    if should is None:
        return tf.constant(False)
    writer = record_writes.fused_writer()
    direct = [
        series for series, reduced in items
        if writer is not None and reduced is None and series.data is not None and record_writes.fusable(series.data)
    ]
    rest = [(series, reduced) for series, reduced in items if not any(series is d for d in direct)]
    raw = [series for series in direct if series.max_elements > 0]
    written = []
    if direct:
        step_now = _read_step(step)
        record = tf.constant(should) if isinstance(should, bool) else should
        for description in dict.fromkeys(series.description for series in direct):
            batch = [series for series in direct if series.description == description]
            written.append(
                record_writes.write_fused(
                    writer, record, [series.stats for series in batch], [series.data for series in batch], buckets,
                    step_now, description, track_nonfinite=track_nonfinite,
                )
            )
    if rest or raw:

        def write_rest() -> None:
            step_now = _read_step(step)
            _write_series(rest, buckets, step_now, track_nonfinite)
            for series in raw:
                _write_raw(series, step_now)

        written.append(_when_recording(write_rest, should))
    if not written:
        return tf.constant(False)
    return written[0] if len(written) == 1 else tf.reduce_any(tf.stack(written))


@no_autograph
def gradients(
    grads: Mapping[str, Any],
    step: Any = None,
    buckets: int = 30,
    *,
    max_elements: int = 0,
    target: Optional[str] = None,
    replicas: str = "gather",
    strategy: Any = None,
) -> tf.Tensor:
    """Write every entry of a `Capture.gradients(...)` result (or a plain dict).

    For a plain dict, every entry is taken as a layer output, in dict order.
    `target` overrides the target name the result carries. One recording
    condition guards the whole step: when nothing is recorded (record_if
    false, no writer), no reduction runs at all. From the first logged step
    at which an entry holds a NaN/Inf on, it also writes that step (kind
    `first_nonfinite`, kept per default writer and tag), so that sampling by
    TensorBoard cannot hide it.

    Under a multi-replica strategy the global batch is written, once
    (`replicas`: "gather" or "stats", see the module docstring and
    docs/DISTRIBUTED.md). Inside `strategy.run` the merge runs at every step
    (collectives cannot run in the recording condition); call this
    unconditionally and pick steps with `tf.summary.record_if`. In
    cross-replica context, `strategy` is the strategy that ran them (default:
    the one in scope).
    """
    step = _resolve_step(step)
    distribute.check_mode(replicas)
    grads = distribute.per_replica_map(grads)
    if not isinstance(grads, GradientMap):
        grads = GradientMap(
            {path: Entry(g, metadata.SOURCE_OUTPUT, i) for i, (path, g) in enumerate(dict(grads).items())},
            metadata.DEFAULT_TARGET,
        )
    target_name = target or grads.target
    ctx = distribute.replica_context()
    if ctx is not None:
        items = _merge_in_replica(grads, replicas, buckets, max_elements)
    elif distribute.holds_distributed_values(grads):
        if replicas == "stats":
            raise ValueError(
                'replicas="stats" merges inside strategy.run (replica context); these gradients were returned '
                "from strategy.run: write them there, or use the default replicas=\"gather\" here"
            )
        if strategy is None and not tf.distribute.has_strategy():
            raise ValueError(
                "these gradients come from strategy.run (PerReplica values): pass strategy=... or write them "
                "under `with strategy.scope():`"
            )
        items = None  # gathered inside the recording condition: on recorded steps only
    else:
        items = [(path, grads.entry(path), None) for path in grads]

    def series_for(items_) -> list:
        return [
            (_series_for(path, e.gradient, buckets, max_elements, target_name, e.source, e.index, e.elements), records)
            for path, e, records in items_
        ]

    with tf.name_scope("layergrad"):
        if items is not None:
            return _write_when_recording(series_for(items), buckets, step)
        should = _recording()
        if should is None:
            return tf.constant(False)

        def gather_and_write() -> None:  # cross-replica: gather now, on a recorded step
            merged = distribute.merge(grads, strategy)
            _write_series(series_for([(p, merged.entry(p), None) for p in merged]), buckets, _read_step(step), True)

        return _when_recording(gather_and_write, should, out_of_line=False)


def _merge_in_replica(grads: GradientMap, mode: str, buckets: int, max_elements: int) -> list:
    """[(path, merged Entry, records or None)] for replica context: the collectives run here, unconditionally."""
    if mode == "gather":
        merged = distribute.merge(grads)
        return [(p, merged.entry(p), None) for p in merged]
    if max_elements > 0:
        raise ValueError(
            'max_elements > 0 writes raw gradients, which needs the full tensors: use replicas="gather"'
        )
    ctx = distribute.replica_context()
    n = ctx.num_replicas_in_sync
    # Weight gradients are partial sums (not shards): sum them first (small, and what the optimizer does).
    weights = [p for p in grads if grads[p] is not None and grads.entry(p).source == metadata.SOURCE_WEIGHT]
    outputs = [p for p in grads if grads[p] is not None and grads.entry(p).source == metadata.SOURCE_OUTPUT]
    try:
        summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [grads[p] for p in weights]) if weights else []
        records = replica_stats.merged_histograms_and_stats([grads[p] for p in outputs], buckets, ctx)
    except RuntimeError as e:
        raise distribute._merge_call_error(e) from e  # noqa: SLF001
    summed_by_path = dict(zip(weights, summed))
    by_path = dict(zip(outputs, records))
    out = []
    for p in grads:
        e = grads.entry(p)
        if p in summed_by_path:
            e = dataclasses.replace(e, gradient=summed_by_path[p])
        elif p not in by_path and e.source == metadata.SOURCE_OUTPUT and e.elements >= 0:
            e = dataclasses.replace(e, elements=e.elements * n)
        out.append((p, e, by_path.get(p)))
    return out


@no_autograph
def timesteps(name: str, norms: tf.Tensor, step: Any = None, *, target: str = metadata.DEFAULT_TARGET, layer_index: int = -1) -> tf.Tensor:
    """Write a per-timestep gradient norm vector [T] for an RNN layer."""
    step = _resolve_step(step)
    norms = tf.cast(tf.reshape(norms, [-1]), tf.float64)

    def write() -> None:
        _write(_info(name, metadata.KIND_TIMESTEPS, target, metadata.SOURCE_OUTPUT, layer_index, "float64"), norms, _read_step(step))

    with tf.name_scope("layergrad"):
        should = _recording()
        return tf.constant(False) if should is None else _when_recording(write, should)
