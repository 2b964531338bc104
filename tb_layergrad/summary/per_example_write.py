"""A step's per-example records (kind `examples`) and, for the loss, the gradient noise scale scalars.

What a plan carries of them is a `PerExample` beside its series (`from_norms`, from a `PerExampleNorms`, the
capture's, or a plain mapping path -> [B] norms): only each path's [B] norms, or why it has none. Why beside
the series, not as series: an `examples` record is one per (target, source) group of `stats`, with the very
same layer list, so the rows are laid out at write time from the groups the step writes.

`write` is called by `write.write_step` inside the recorded branch, with the default
writer entered: the records exist exactly at the steps the `stats` of the same
groups are written (docs/FORMAT.md, "Per-example records"). The rows and the noise scale
come from `statistics.per_example_records`; this module only lays them out per group and writes them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

from tb_layergrad import metadata
from tb_layergrad.capturing import per_example_map
from tb_layergrad.capturing.gradient_map import GradientMap
from tb_layergrad.capturing.per_example_map import PerExampleNorms
from tb_layergrad.statistics import per_example_records
from tb_layergrad.summary import plan as plans
from tb_layergrad.summary import writer_state
from tb_layergrad.summary.conditions import value_out_of_line, write_one_of

# The scalars' tags (docs/FORMAT.md): the Scalars dashboard shows them too.
NOISE_SCALE_TAG = metadata.NOISE_SCALE_TAGS["noise_scale"]
TRACE_TAG = metadata.NOISE_SCALE_TAGS["trace"]
SIGNAL_TAG = metadata.NOISE_SCALE_TAGS["signal"]
COVERAGE_TAG = metadata.NOISE_SCALE_TAGS["coverage"]


# -- what a plan carries ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PerExample:
    """One target's per-example norms for one step, as a plan carries them."""

    target: str
    norms: Tuple[Tuple[str, Any], ...]  # (path, [B] float tensor or a `Deferred`) for every path with numbers
    status: Tuple[Tuple[str, int], ...]  # (path, EXAMPLE_UNSUPPORTED or EXAMPLE_COUPLED) for paths without
    elements: Tuple[Tuple[str, int], ...] = ()  # (weight path, parameter count): the noise scale's coverage
    parameters: int = 0  # trainable parameters the target depends on (coverage's denominator); 0: the weights'

    def norm_of(self, path: str) -> Any:
        """The path's norms as held (a tensor or a `Deferred`: `per_example_map.squared` reads either), or None."""
        return dict(self.norms).get(path)

    def status_of(self, path: str) -> Optional[int]:
        return dict(self.status).get(path)

    def batch_size(self) -> Optional[tf.Tensor]:
        """The number of examples (int32 scalar), from the first path with numbers; None when none has."""
        for _, norm in self.norms:
            return per_example_map.batch_of(norm)
        return None

    # -- a flat dict of tensors and back: how it leaves a compiled step (with `Plan.tensors`) --------
    def tensors(self) -> Dict[str, Any]:
        """Every path's norms built now (they leave the step as they are)."""
        return {f"{self.target}|examples|{path}": per_example_map.materialized(norm) for path, norm in self.norms}

    def with_tensors(self, tensors: Mapping[str, Any]) -> "PerExample":
        norms = tuple((path, tensors.get(f"{self.target}|examples|{path}")) for path, _ in self.norms)
        return dataclasses.replace(self, norms=norms)


def from_norms(
    per_example: Any,
    target: str,
    gmap: Optional[GradientMap] = None,
    scale: Any = None,
    parameters: Optional[int] = None,
) -> Optional[PerExample]:
    """The plan's view of `per_example` (a `PerExampleNorms` or a mapping path -> [B] norms), or None.

    `gmap`: the gradients of the same pass, for the weights' parameter counts
    and the trainable parameters (`parameters`, when not given: the sizes of
    its `variable_gradients` that are not None). `scale`: a loss scale to
    divide the norms by (mixed precision: they carry it, as the gradients do).
    """
    if per_example is None or per_example is False:
        return None
    if not isinstance(per_example, PerExampleNorms):
        per_example = PerExampleNorms(dict(per_example))
    norms = []
    inverse = None if scale is None else 1.0 / tf.cast(scale, tf.float32)
    for path, entry in per_example.entries().items():  # deferred ones stay so: built where they are written
        if entry is None:
            continue
        norms.append((path, entry if inverse is None else per_example_map.scaled(entry, inverse)))
    status = tuple(
        (path, metadata.EXAMPLE_COUPLED if per_example.is_coupled(path) else metadata.EXAMPLE_UNSUPPORTED)
        for path in per_example.unsupported
    )
    elements: Tuple[Tuple[str, int], ...] = ()
    if gmap is not None:
        elements = tuple(
            (p, int(gmap.entry(p).elements))
            for p in gmap
            if gmap.entry(p).source == metadata.SOURCE_WEIGHT and gmap.entry(p).elements >= 0
        )
        if parameters is None:
            parameters = trainable_parameters(gmap)
    return PerExample(target, tuple(norms), status, elements, int(parameters or 0))


def trainable_parameters(gmap: GradientMap) -> int:
    """The parameters of the trainable variables the target depends on (0 when the map does not carry them)."""
    total = 0
    for g in gmap.variable_gradients:
        if g is None:
            continue
        shape = (
            g.dense_shape
            if isinstance(g, tf.IndexedSlices)
            else tf.shape(g)
            if g.shape.num_elements() is None
            else None
        )
        if shape is None:
            total += int(g.shape.num_elements())
        else:
            try:
                total += int(tf.get_static_value(tf.reduce_prod(shape)))
            except TypeError:  # not known while tracing: the coverage falls back to the weight entries' total
                return 0
    return total


# -- how it is written ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RowsAhead:
    """The `examples` rows of a step, computed in a recording condition of their own (`rows_ahead`)."""

    table: tf.Tensor  # float64 [members, WIDTH] (zeros where `condition` did not hold)
    condition: tf.Tensor  # the recording condition they were computed under
    final: bool  # it is the write's own condition (else the write may also happen where it did not hold)
    target: str = metadata.DEFAULT_TARGET  # the per-example target they are of


def _chosen(plan: "plans.Plan", spec: Optional[PerExample]) -> List[List["plans.Series"]]:
    """The output/weight groups of the per-example target `spec`: those that get an `examples` record."""
    if spec is None:
        return []
    return [
        members
        for members in plans.groups(plan.series)
        if members[0].info.target == spec.target and members[0].info.source in metadata.GRADIENT_SOURCES
    ]


def rows_ahead(plan: "plans.Plan", should: Any, final: bool = True) -> Optional[RowsAhead]:
    """The rows (and the per-example norms they are made of) under recording condition `should`, in a branch of
    their own; None where there is nothing to gain (no per-example data, eagerly, a condition known now).

    Why apart from the branch that writes: that one also reads what the fused write op returns (the stats the
    noise scale takes ‖G_B‖² from), so it starts only once that op has read every gradient. The norms need
    only the layers' inputs and δs: in a condition of their own they are computed beside that op, not after it.
    `final`: `should` is the condition the records are written under (not when a NaN can still force a write).
    """
    spec = next((spec for spec in plan.examples() if _chosen(plan, spec)), None)  # the first target's only
    chosen = _chosen(plan, spec)
    if not chosen or isinstance(should, bool) or tf.executing_eagerly():
        return None
    members = [s for group in chosen for s in group]
    table = value_out_of_line(
        should,
        lambda: _rows(members, spec, spec.batch_size()),
        lambda: tf.zeros([len(members), per_example_records.WIDTH], tf.float64),
    )
    return RowsAhead(table, should, final, spec.target)


def write(
    plan: "plans.Plan",
    step: tf.Tensor,
    description: str = "",
    fused_stats: Optional[Dict[int, Any]] = None,
    ahead: Optional[RowsAhead] = None,
) -> None:
    """The `examples` record of each output/weight group of each per-example target of `plan`, then the noise scale.

    `fused_stats`: series tag -> the stats [12] the fused write op wrote this step for that series: the
    noise scale takes the batch gradient's norm from them rather than reading the gradient again. `ahead`:
    the rows already computed (`rows_ahead`); where its condition did not hold (a step written for a NaN
    only), they are computed here.

    Why everything at once: the groups share the batch, so all their rows come from one
    `exact_rows_from_squares` call and their tags' metadata state from one `Pending`: a few ops per step where
    a group each would be a few dozen.
    """
    for spec in plan.examples():
        rows_ahead = ahead if ahead is not None and ahead.target == spec.target else None
        _write_target(plan, spec, step, description, fused_stats, rows_ahead)


def _write_target(
    plan: "plans.Plan",
    spec: PerExample,
    step: tf.Tensor,
    description: str,
    fused_stats: Optional[Dict[int, Any]],
    ahead: Optional[RowsAhead],
) -> None:
    """`write` for one per-example target."""
    chosen = _chosen(plan, spec)
    if not chosen:
        return
    batch = spec.batch_size()
    members = [s for group in chosen for s in group]
    if ahead is None:
        table = _rows(members, spec, batch)
    elif ahead.final:
        table = ahead.table
    else:
        table = tf.cond(ahead.condition, lambda: ahead.table, lambda: _rows(members, spec, batch))
    infos = [metadata.GroupInfo.of(metadata.KIND_EXAMPLES, [s.info for s in group]) for group in chosen]
    pending = writer_state.Pending(infos, step)
    begin = 0
    for i, (group, info) in enumerate(zip(chosen, infos)):
        rows = table[begin : begin + len(group)]
        serialized = writer_state.serialized_if(
            pending.needed[i], metadata.create_group_metadata(info, description).SerializeToString()
        )
        tf.summary.write(writer_state.tag_at(info, pending.firsts[i]), rows, step=step, metadata=serialized)
        if group[0].info.source == metadata.SOURCE_WEIGHT and spec.target == metadata.DEFAULT_TARGET:
            _write_noise_scale(group, rows, spec, batch, step, fused_stats or {})
        begin += len(group)
    pending.store(tf.ones([len(infos)], tf.bool))


def _rows(members: Sequence["plans.Series"], spec: PerExample, batch: Optional[tf.Tensor]) -> tf.Tensor:
    """float64 [len(members), WIDTH]: each layer's row, the numbers of all computed together (`exact_rows_from_squares`).

    A layer with norms: its numbers; one the target does not depend on (no gradient, no reason given):
    zeros, every example's gradient being 0; else the status of why there are none, NaN.
    """
    exact, status_rows, order = [], [], []
    for s in members:
        path = s.info.layer
        norm = spec.norm_of(path)
        status = spec.status_of(path)
        if norm is None and status is None and not s.present and batch is not None:
            norm = tf.zeros([batch], tf.float32)
        if norm is not None:
            order.append(("exact", len(exact)))
            exact.append(per_example_map.squared(norm))
        else:
            examples = float("nan") if batch is None else tf.cast(batch, tf.float64)
            order.append(("status", len(status_rows)))
            status_rows.append(
                per_example_records.status_row(examples, metadata.EXAMPLE_UNSUPPORTED if status is None else status)
            )
    parts = []
    if exact:
        # Each path's unscaled squares and its scale, multiplied in float64 (`per_example_map.squared`).
        widest = tf.float64 if any(sq.dtype == tf.float64 for sq, _ in exact) else tf.float32
        squares = tf.cast(tf.stack([tf.reshape(tf.cast(sq, widest), [-1]) for sq, _ in exact]), tf.float64)
        scales = tf.cast(tf.stack([tf.cast(c, widest) for _, c in exact]), tf.float64)
        parts.append(per_example_records.exact_rows_from_squares(squares * tf.square(scales)[:, None]))
    if status_rows:
        parts.append(tf.stack(status_rows))
    table = tf.concat(parts, 0) if len(parts) > 1 else parts[0]
    if all(kind == "exact" for kind, _ in order):
        return table  # already in the members' order
    offset = {"exact": 0, "status": len(exact)}
    return tf.gather(table, [offset[kind] + i for kind, i in order])


_NONFINITE_COLUMNS = [metadata.STAT_INDEX[k] for k in ("nan", "pos_inf", "neg_inf")]


def _batch_squares(series: Sequence["plans.Series"], fused_stats: Dict[int, Any]) -> tf.Tensor:
    """float64 [n]: ‖G_B‖² of each variable, from the stats its records carry (the fused op's, or merged
    ones) where there are some, all of them in a few ops; else from its gradient."""
    stats_of = [fused_stats.get(s.info.tag, None if s.reduced is None else s.reduced[1]) for s in series]
    with_stats = [i for i, st in enumerate(stats_of) if st is not None]
    parts, order = [], []
    if with_stats:
        table = tf.cast(tf.stack([stats_of[i] for i in with_stats]), tf.float64)  # [m, 12]
        # The stats' norm is of the finite elements: a NaN/Inf anywhere makes ‖G_B‖² NaN, as a sum would.
        nonfinite = tf.reduce_sum(tf.gather(table, _NONFINITE_COLUMNS, axis=1), axis=1) > 0
        norms = table[:, metadata.STAT_INDEX["norm"]]
        parts.append(tf.where(nonfinite, tf.constant(float("nan"), tf.float64), tf.square(norms)))
        order += with_stats
    rest = [i for i, st in enumerate(stats_of) if st is None]
    if rest:
        parts.append(tf.stack([_squared_from_gradient(series[i]) for i in rest]))
        order += rest
    joined = tf.concat(parts, 0) if len(parts) > 1 else parts[0]
    if order == sorted(order):
        return joined
    return tf.gather(joined, [order.index(i) for i in range(len(series))])


def _squared_from_gradient(s: "plans.Series") -> tf.Tensor:
    if s.data is None:
        raise ValueError(f"{s.info.layer}: neither a gradient nor its stats")
    g = tf.convert_to_tensor(s.data)  # an IndexedSlices densified: repeated rows add up first
    # One fused kernel (Σ g² / 2) in the gradient's own float type: the per-example norms it is set against
    # are float32 anyway, and a float64 copy of a large weight gradient at every logged step was most of
    # the noise scale's cost.
    return 2.0 * tf.cast(
        tf.nn.l2_loss(g if g.dtype in (tf.float32, tf.float64) else tf.cast(g, tf.float32)), tf.float64
    )


def _write_noise_scale(
    weights: Sequence["plans.Series"],
    rows: tf.Tensor,
    spec: PerExample,
    batch: Optional[tf.Tensor],
    step: tf.Tensor,
    fused_stats: Dict[int, Any],
) -> None:
    """B_simple, trace, signal and coverage over the weights with exact per-example norms (docs/FORMAT.md).

    `rows`: the weight group's `examples` rows, whose `sum_sq` column is Σ_i ‖g_{i,v}‖² of each variable.
    """
    at = [i for i, s in enumerate(weights) if spec.norm_of(s.info.layer) is not None and s.present]
    covered = [weights[i] for i in at]
    sizes = dict(spec.elements)
    covered_parameters = sum(sizes.get(s.info.layer, 0) for s in covered)
    total = spec.parameters or sum(sizes.get(s.info.layer, 0) for s in weights)
    coverage = covered_parameters / total if total > 0 else 0.0
    _scalar(COVERAGE_TAG, tf.constant(coverage, tf.float64), step)
    if not covered or batch is None:
        return
    sum_sq = tf.gather(rows[:, metadata.EXAMPLE_INDEX["sum_sq"]], at)
    estimate = per_example_records.noise_scale(sum_sq, _batch_squares(covered, fused_stats), batch)
    # Finite together (the same S, |G_B|^2 and B); B_simple only with them (its finiteness implies theirs), never
    # where a weight is coupled: 0 writes nothing, 1 trace and signal, 2 also B_simple. One switch for all three.
    both = tf.logical_and(tf.math.is_finite(estimate.trace), tf.math.is_finite(estimate.signal))
    coupled = any(spec.status_of(s.info.layer) == metadata.EXAMPLE_COUPLED for s in weights)
    usable = tf.logical_and(both, tf.logical_and(estimate.signal > 0, tf.math.is_finite(estimate.b_simple)))
    usable = tf.logical_and(usable, not coupled)
    index = tf.cast(both, tf.int32) + tf.cast(usable, tf.int32)

    def trace_and_signal() -> None:
        _scalar(TRACE_TAG, estimate.trace, step)
        _scalar(SIGNAL_TAG, estimate.signal, step)

    def all_three() -> None:
        trace_and_signal()
        _scalar(NOISE_SCALE_TAG, estimate.b_simple, step)

    write_one_of(index, [lambda: None, trace_and_signal, all_three])


def _scalar(tag: str, value: tf.Tensor, step: tf.Tensor) -> None:
    """A standard TensorBoard scalar (plugin `scalars`), under `tag` as given (no name scope added)."""
    meta = scalar_metadata.create_summary_metadata(display_name=tag, description="")
    tf.summary.write(tag, tf.cast(value, tf.float32), step=step, metadata=meta)


__all__: List[str] = ["COVERAGE_TAG", "NOISE_SCALE_TAG", "SIGNAL_TAG", "TRACE_TAG", "write"]
