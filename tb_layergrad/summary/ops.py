"""Internal: what the public summary ops do, with the parameters a user does not choose.

`tb_layergrad.summary` keeps the public ops to what a user decides (the name, the data, the
step, the buckets...). What a capture knows and a user does not (a layer's position in the
model, the element count of a missing gradient) and how a step's data is turned into a plan
(a plain dict, a `GradientMap`, replicas) live here; tests and fixtures that need a layer's
position call `write_tensor` and `write_timesteps` directly.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from typing import Any, Mapping, Optional, Set

import tensorflow as tf

from tb_layergrad import distribute, metadata
from tb_layergrad.capturing.gradient_map import Entry, GradientMap
from tb_layergrad.capturing.per_example_map import PerExampleNorms
from tb_layergrad.distribute.merge import holds_distributed_values, merge_in_replica, per_replica_map, replica_context
from tb_layergrad.summary import per_example_write
from tb_layergrad.summary import plan as plans
from tb_layergrad.summary.conditions import recording, when
from tb_layergrad.summary.write import read_step, resolve_step, write_step

_NO_REPLICAS = (
    "per-example records of gradients returned from strategy.run are not written: write "
    "them inside strategy.run (replica context: every replica's norms are gathered), or pass per_example=False"
)
_WARNED: Set[str] = set()
_INSIDE = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(tf.__file__))


def warn_once(key: str, message: str) -> None:
    """A `UserWarning` the first time `key` is met in this process: an option with no effect here.

    It names the user's line that called the op (the first frame outside this package and TensorFlow).
    """
    if key in _WARNED:
        return
    _WARNED.add(key)
    frame, level = sys._getframe(0), 1  # noqa: SLF001 - this frame, which calls warnings.warn, is level 1
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


def write_series(one: plans.Series, step: Any, buckets: int, description: str) -> tf.Tensor:
    """`summary.histogram_and_stats` of the series `one` (`plans.series`): no running state across steps."""
    step = resolve_step(step)
    plan = plans.Plan((one,), buckets=plans.check_buckets(buckets), description=description, track_nonfinite=False)
    ctx = replica_context()
    if ctx is not None:  # several replicas: the global batch's tensor
        info = one.info
        entry = Entry(one.data, info.source, info.index, one.elements)
        merged = merge_in_replica(GradientMap({info.layer: entry}, info.target), ctx)
        gathered = plans.from_gradients(merged.gradients, info.target, one.max_elements, buckets)
        plan = dataclasses.replace(plan, series=gathered.series)
    with tf.name_scope("layergrad"):
        return write_step(plan, step)


def write_tensor(
    name: str, data: Any, step: Any = None, buckets: int = 30, *, index: int = -1, elements: int = -1, **options: Any
) -> tf.Tensor:
    """`summary.histogram_and_stats` with the layer's position `index` and, for `data` None, its element count
    `elements`; `options`: its other keyword arguments."""
    description = options.pop("description", "")
    options.setdefault("target", metadata.DEFAULT_TARGET)
    return write_series(plans.series(name, data, index=index, elements=elements, **options), step, buckets, description)


def write_timesteps(
    name: str, norms: tf.Tensor, step: Any = None, *, target: str = metadata.DEFAULT_TARGET, index: int = -1
) -> tf.Tensor:
    """`summary.timesteps`, with the layer's position `index`."""
    step = resolve_step(step)
    plan = plans.Plan(timesteps=(plans.timesteps(name, target=target, index=index, norms=norms),))
    with tf.name_scope("layergrad"):
        return write_step(plan, step)


def gradient_map(grads: Any, per_example: Any) -> GradientMap:
    """`grads` as a GradientMap (a plain dict: every entry a layer output, in dict order), with `per_example`
    (None: what it carries; False: none; a `PerExampleNorms` or a mapping path -> [B] norms) in place."""
    if (
        isinstance(grads, tf.distribute.DistributedValues)
        and per_example is not False
        and any(getattr(g, "per_example", None) is not None for g in grads.values)
    ):
        raise ValueError(_NO_REPLICAS)  # regrouping the replicas' maps would drop them silently
    grads = per_replica_map(grads)
    if not isinstance(grads, GradientMap):
        grads = GradientMap(
            {path: Entry(g, metadata.SOURCE_OUTPUT, i) for i, (path, g) in enumerate(dict(grads).items())},
            metadata.DEFAULT_TARGET,
        )
    if per_example is None:
        return grads
    given = (
        per_example
        if per_example is False or isinstance(per_example, PerExampleNorms)
        else PerExampleNorms(dict(per_example))
    )
    grads = grads.with_entries({p: grads.entry(p) for p in grads})  # a copy: the caller's map is left alone
    grads.per_example = None if given is False else given
    return grads


def write_gradient_map(
    grads: GradientMap, step: Any, buckets: int, max_elements: int, target: str, strategy: Any, histograms: Any
) -> tf.Tensor:
    """`summary.gradients` once its arguments are checked: in replica context, on one device, or on what
    `strategy.run` returned (cross-replica context)."""
    examples = per_example_write.from_norms(grads.per_example, target, grads)
    _warn_without_effect(grads, examples, strategy)
    ctx = replica_context()
    if examples is not None and ctx is None and holds_distributed_values(grads):
        raise ValueError(_NO_REPLICAS)
    if ctx is not None:  # the collectives run here, unconditionally: the global batch's plan
        merged = merge_in_replica(grads, ctx).gradients
        plan = plans.from_gradients(merged, target, max_elements, buckets)
        examples = per_example_write.from_norms(merged.per_example, target, merged)
        return write_step(dataclasses.replace(plan, per_example=examples), step, histograms=histograms)
    if not holds_distributed_values(grads):
        plan = plans.from_gradients(grads, target, max_elements, buckets)
        return write_step(dataclasses.replace(plan, per_example=examples), step, histograms=histograms)
    if strategy is None and not tf.distribute.has_strategy():
        raise ValueError(
            "these gradients come from strategy.run (PerReplica values): pass strategy=... or write them "
            "under `with strategy.scope():`"
        )
    should = recording()
    if should is None:
        return tf.constant(False)

    def gather_and_write() -> None:  # cross-replica: gather now, on a recorded step only
        plan = plans.from_gradients(distribute.merge(grads, strategy), target, max_elements, buckets)
        write_step(plan, read_step(step), record=True, histograms=histograms)

    return when(should, gather_and_write, out_of_line=False)


def _warn_without_effect(grads: GradientMap, examples: Optional[per_example_write.PerExample], strategy: Any) -> None:
    if strategy is not None and not holds_distributed_values(grads):
        warn_once(
            "strategy",
            "summary.gradients(strategy=...) has no effect here: these gradients are not what strategy.run "
            "returned (PerReplica values); leave strategy out",
        )
    weights = any(grads.entry(p).source == metadata.SOURCE_WEIGHT for p in grads)
    if examples is not None and examples.target == metadata.DEFAULT_TARGET and not weights:
        warn_once(
            "noise_scale",
            "per-example norms without weight gradients: their `examples` records are written, but no gradient "
            "noise scale (it needs the batch gradients of the weights): capture with weights=True to get it",
        )


def activation_map(values: Mapping[str, Any]) -> GradientMap:
    """`summary.activations`' `values` as a GradientMap holding activations only."""
    if isinstance(values, GradientMap):
        entries = {p: values.activation_entry(p) for p in values.activations}
    else:
        indexes = getattr(values, "indexes", {})
        values = {p: tf.convert_to_tensor(v) for p, v in dict(values).items()}
        entries = {
            p: Entry(v, metadata.SOURCE_ACTIVATION, indexes.get(p, i), dtype=v.dtype.name)
            for i, (p, v) in enumerate(values.items())
        }
    return GradientMap({}, metadata.DEFAULT_TARGET, activations=entries)


def write_activations(forward: GradientMap, step: Any, buckets: int, max_elements: int, description: str) -> tf.Tensor:
    """`summary.activations` once its arguments are checked; several replicas: the global batch's outputs."""
    ctx = replica_context()
    if ctx is not None:
        forward = merge_in_replica(forward, ctx).gradients
    plan = plans.Plan(
        plans.forward_series(forward, max_elements=max_elements), buckets=buckets, description=description
    )
    return write_step(plan, step)
