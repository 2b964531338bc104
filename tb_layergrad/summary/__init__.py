"""Summary ops: write gradients as records this plugin's tab can find.

`gradient()` is the low-level op, the analogue of `tf.summary.histogram` for
one tensor; `gradients()` writes a whole `Capture.gradients(...)` result
(with the target's value and, for `capture(activations=True)`, the layer
outputs beside the gradients); `activations()` writes layer outputs (forward
values); `timesteps()` an RNN layer's per-timestep gradient norms. They write to the
default `tf.summary` writer, at `step` or at the default step, and respect
`tf.summary.record_if` (nothing is computed when nothing is recorded).

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
file at every call, logged or not.

Modules (the write pipeline, in the order data passes): `plan` (what a step
writes), `write` (`write_step`: the one way records are written), `backend`
(fused kernel or TensorFlow's ops, decided once), `first_nonfinite` (the one
tracker of the first NaN/Inf step), `writer_state`, `graph`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import tensorflow as tf

from tb_layergrad import distribute, metadata
from tb_layergrad.capturing.gradient_map import Entry, GradientMap
from tb_layergrad.capturing.per_example_map import PerExampleNorms
from tb_layergrad.summary import per_example_plan
from tb_layergrad.summary import plan as plans
from tb_layergrad.summary.write import read_step, recording, resolve_step, when, write_step

__all__ = ["activations", "gradient", "gradients", "timesteps"]

_NO_REPLICAS = (
    "per-example records of gradients returned from strategy.run are not written: write "
    "them inside strategy.run (replica context: every replica's norms are gathered), or pass per_example=False"
)


def _replica_plan(
    gmap: GradientMap,
    replicas: str,
    buckets: int,
    max_elements: int,
    ctx: Any,
    target: str,
    format_version: int = metadata.FORMAT_VERSION,
) -> plans.Plan:
    """Inside `strategy.run`: the global batch's plan, the collectives run here, unconditionally."""
    if replicas == "stats" and max_elements > 0:
        raise ValueError('max_elements > 0 writes raw gradients, which needs the full tensors: use replicas="gather"')
    merged = distribute.merge_in_replica(gmap, replicas, buckets, ctx)
    plan = plans.from_gradients(merged.gradients, target, max_elements, buckets, format_version=format_version)
    examples = per_example_plan.from_norms(merged.gradients.per_example, target, merged.gradients)
    per_example_plan.check_format(format_version, examples)
    return dataclasses.replace(plans.with_merged_records(plan, merged.reduced), per_example=examples)


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
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
    format_version: int = metadata.FORMAT_VERSION,
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
    step = resolve_step(step)
    distribute.check_mode(replicas)
    one = plans.series(
        name, data, target=target, source=source, index=layer_index, elements=elements, max_elements=max_elements
    )
    plan = plans.Plan(
        (one,),
        buckets=plans.check_buckets(buckets),
        description=description,
        track_nonfinite=False,
        format_version=plans.check_format_version(format_version),
    )
    ctx = distribute.replica_context()
    if ctx is not None:
        entry = Entry(data, source, layer_index, elements)
        merged = _replica_plan(GradientMap({name: entry}, target), replicas, buckets, max_elements, ctx, target)
        plan = dataclasses.replace(plan, series=merged.series)
    with tf.name_scope("layergrad"):
        return write_step(plan, step)


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def gradients(
    grads: Mapping[str, Any],
    step: Any = None,
    buckets: int = 30,
    *,
    max_elements: int = 0,
    target: Optional[str] = None,
    replicas: str = "gather",
    strategy: Any = None,
    format_version: int = metadata.FORMAT_VERSION,
    histograms: Any = True,
    per_example: Any = None,
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
    the one in scope). `format_version`: 2 (default: all layers of a
    (target, source) in one record per step) or 1 (a record per layer, kept
    for one release), docs/FORMAT.md. `histograms` (a bool or bool tensor):
    False writes the statistics alone (e.g. `histograms=step % 100 == 0`),
    except at a step where an entry holds a NaN/Inf, written in full.

    `per_example`: each example's own gradient norms (docs/PER_EXAMPLE.md),
    written as `examples` records beside the `stats` of every output and weight
    group of the target, at the same steps, and for the target "loss" the
    gradient noise scale as TensorBoard scalars (docs/FORMAT.md, "Per-example
    records"). None (default): those `grads` carries (`capture(...,
    per_example=True)`); a `PerExampleNorms` or a mapping path -> [batch]
    norms: these; False: none. Format version 2 only. Inside `strategy.run`
    every replica's norms are gathered, in global batch order; on what
    `strategy.run` returned, not yet (a clear error).
    """
    step = resolve_step(step)
    distribute.check_mode(replicas)
    plans.check_buckets(buckets)
    plans.check_format_version(format_version)
    if (
        isinstance(grads, tf.distribute.DistributedValues)
        and per_example is not False
        and any(getattr(g, "per_example", None) is not None for g in grads.values)
    ):
        raise ValueError(_NO_REPLICAS)  # regrouping the replicas' maps would drop them silently
    grads = distribute.per_replica_map(grads)
    if not isinstance(grads, GradientMap):
        grads = GradientMap(
            {path: Entry(g, metadata.SOURCE_OUTPUT, i) for i, (path, g) in enumerate(dict(grads).items())},
            metadata.DEFAULT_TARGET,
        )
    target_name = target or grads.target
    if per_example is not None:  # given (or refused) here: in place of what the map carries
        given = (
            per_example
            if per_example is False or isinstance(per_example, PerExampleNorms)
            else PerExampleNorms(dict(per_example))
        )
        grads = grads.with_entries({p: grads.entry(p) for p in grads})  # a copy: the caller's map is left alone
        grads.per_example = None if given is False else given
    examples = per_example_plan.from_norms(grads.per_example, target_name, grads)
    per_example_plan.check_format(format_version, examples)
    ctx = distribute.replica_context()
    if examples is not None and ctx is None and distribute.holds_distributed_values(grads):
        raise ValueError(_NO_REPLICAS)
    with tf.name_scope("layergrad"):
        if ctx is not None:
            return write_step(
                _replica_plan(grads, replicas, buckets, max_elements, ctx, target_name, format_version),
                step,
                histograms=histograms,
            )
        if not distribute.holds_distributed_values(grads):
            plan = plans.from_gradients(grads, target_name, max_elements, buckets, format_version=format_version)
            return write_step(dataclasses.replace(plan, per_example=examples), step, histograms=histograms)
        if replicas == "stats":
            raise ValueError(
                'replicas="stats" merges inside strategy.run (replica context); these gradients were returned '
                'from strategy.run: write them there, or use the default replicas="gather" here'
            )
        if strategy is None and not tf.distribute.has_strategy():
            raise ValueError(
                "these gradients come from strategy.run (PerReplica values): pass strategy=... or write them "
                "under `with strategy.scope():`"
            )
        should = recording()
        if should is None:
            return tf.constant(False)

        def gather_and_write() -> None:  # cross-replica: gather now, on a recorded step only
            merged = distribute.merge(grads, strategy)
            plan = plans.from_gradients(merged, target_name, max_elements, buckets, format_version=format_version)
            write_step(plan, read_step(step), record=True, histograms=histograms)

        return when(should, gather_and_write, out_of_line=False)


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def activations(
    values: Mapping[str, Any],
    step: Any = None,
    buckets: int = 30,
    *,
    max_elements: int = 0,
    description: str = "",
    replicas: str = "gather",
    format_version: int = metadata.FORMAT_VERSION,
) -> tf.Tensor:
    """Write the histogram and statistics of layer outputs: the forward values (source "activation").

    `values`: `cap.activations()` (layer path -> output; its layers keep their
    model positions), a `GradientMap` from a capture made with
    `activations=True`, or a plain dict (positions in dict order). The
    records are those of gradients (docs/FORMAT.md) with source "activation";
    like `gradients()`, one recording condition guards the step, and the
    first step at which an output holds a NaN/Inf is kept in `first_nonfinite`
    records. To write gradients and activations of one pass together, capture
    with `activations=True` and call `gradients()` alone. Inside `strategy.run`
    with several replicas, the global batch's outputs are written, merged as
    layer-output gradients are (`replicas`: "gather" or "stats").
    `format_version`: as `gradients()`.

    Example:
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = loss_fn(y, model(x))
        with writer.as_default(step=step):
            tb_layergrad.summary.activations(cap.activations())
    """
    step = resolve_step(step)
    plans.check_buckets(buckets)
    plans.check_format_version(format_version)
    distribute.check_mode(replicas)
    if replicas == "stats" and max_elements > 0:
        raise ValueError('max_elements > 0 writes raw values, which needs the full tensors: use replicas="gather"')
    if isinstance(values, GradientMap):
        entries = {p: values.activation_entry(p) for p in values.activations}
    else:
        indexes = getattr(values, "indexes", {})
        values = {p: tf.convert_to_tensor(v) for p, v in dict(values).items()}
        entries = {
            p: Entry(v, metadata.SOURCE_ACTIVATION, indexes.get(p, i), dtype=v.dtype.name)
            for i, (p, v) in enumerate(values.items())
        }
    forward = GradientMap({}, metadata.DEFAULT_TARGET, activations=entries)
    ctx = distribute.replica_context()
    with tf.name_scope("layergrad"):
        if ctx is not None:  # several replicas: the global batch's outputs (gathered, or merged records)
            merged = distribute.merge_in_replica(forward, replicas, buckets, ctx)
            forward, reduced = merged.gradients, merged.reduced
        else:
            reduced = {}
        plan = plans.Plan(
            plans.forward_series(forward, max_elements=max_elements),
            buckets=buckets,
            description=description,
            format_version=format_version,
        )
        return write_step(plans.with_merged_records(plan, reduced), step)


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def timesteps(
    name: str, norms: tf.Tensor, step: Any = None, *, target: str = metadata.DEFAULT_TARGET, layer_index: int = -1
) -> tf.Tensor:
    """Write a per-timestep gradient norm vector [T] for an RNN layer."""
    step = resolve_step(step)
    plan = plans.Plan(timesteps=(plans.timesteps(name, target=target, index=layer_index, norms=norms),))
    with tf.name_scope("layergrad"):
        return write_step(plan, step)
