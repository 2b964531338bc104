"""Gradients of the GLOBAL batch under `tf.distribute` (MirroredStrategy, MultiWorkerMirroredStrategy).

Why: under a strategy every replica holds the gradients of its own shard of the
batch, and TensorFlow records summaries in replica context on replica 0 only, so
a naive write logs a fraction of the batch, silently. This module merges the
per-replica results into what one device would have computed on the whole batch:

- layer outputs: concatenated along the batch axis, in replica order (the order
  `experimental_distribute_dataset` splits a global batch in);
- weights: SUMMED over replicas. That is the global gradient when each replica's
  loss is scaled so that the replica losses sum to the global loss
  (`tf.nn.compute_average_loss(..., global_batch_size=...)`; Keras' fit() does
  it); it is also what the optimizer applies.

`merge()` works in replica context (inside `strategy.run`: `all_gather` /
`all_reduce`, which cannot run inside a `tf.cond`, so every step) and in
cross-replica context on what `strategy.run` returned (`strategy.gather` /
`strategy.reduce`, which may run on logged steps only). `merge_in_replica()`
is the one merge every writer uses inside `strategy.run` (`summary.gradients`,
the `fit()` step).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.gradient_map import Entry, GradientMap
from tb_layergrad.capturing.per_example_map import PerExampleNorms


def replica_context() -> Optional[Any]:
    """The ReplicaContext when running inside `strategy.run` with more than one replica, else None."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync <= 1:
        return None
    return ctx


def num_replicas() -> int:
    """Replicas in sync of the current strategy (1 without one)."""
    return int(tf.distribute.get_strategy().num_replicas_in_sync)


def _is_distributed(value: Any) -> bool:
    return isinstance(value, tf.distribute.DistributedValues)


def per_replica_map(grads: Any) -> Any:
    """`strategy.run` returns a GradientMap as ONE PerReplica (tf.distribute does not look inside it):
    turn that into a GradientMap of PerReplica gradients. Anything else is returned as is."""
    if not _is_distributed(grads):
        return grads
    maps = tuple(grads.values)  # this worker's replicas, in order (as experimental_local_results)
    if not maps or not isinstance(maps[0], GradientMap):
        return grads
    from tensorflow.python.distribute.values import PerReplica  # what strategy.run builds; no public constructor

    def regroup(values: List[Any]) -> Any:
        return values[0] if len(values) == 1 or values[0] is None else PerReplica(tuple(values))

    first = maps[0]
    entries = {p: dataclasses.replace(first.entry(p), value=regroup([m[p] for m in maps])) for p in first}
    var_grads = [regroup([m.variable_gradients[i] for m in maps]) for i in range(len(first.variable_gradients))]
    value = None if first.target_value is None else regroup([m.target_value for m in maps])
    acts = {
        p: dataclasses.replace(first.activation_entry(p), value=regroup([m.activations[p] for m in maps]))
        for p in first.activations
    }
    return GradientMap(entries, first.target, var_grads, activations=acts, target_value=value)


def holds_distributed_values(grads: Any) -> bool:
    """True for a GradientMap/dict that `strategy.run` returned (PerReplica gradients)."""
    if _is_distributed(grads):
        return True
    values = grads.values() if hasattr(grads, "values") else []
    return any(_is_distributed(v) for v in values) or any(
        _is_distributed(v) for v in getattr(grads, "variable_gradients", [])
    )


def _as_map(grads: Any) -> GradientMap:
    if isinstance(grads, GradientMap):
        return grads
    entries = {p: Entry(g, metadata.SOURCE_OUTPUT, i) for i, (p, g) in enumerate(dict(grads).items())}
    return GradientMap(entries, metadata.DEFAULT_TARGET)


def _check_batch_major(path: str, g: Any) -> None:
    if g.shape.rank == 0:
        raise ValueError(
            f"{path}: a scalar layer-output gradient has no batch axis to gather replicas along; "
            "leave this layer out of capture(layers=...) under a multi-replica strategy"
        )


def _merge_call_error(e: RuntimeError) -> RuntimeError:
    if "merge_call" in str(e):
        return RuntimeError(
            "tb_layergrad merges gradients across replicas with collective ops, which TensorFlow cannot run "
            "inside a tf.cond / Python `if` on a tensor in replica context. Call summary.gradients (or "
            "distribute.merge) unconditionally at every step and choose the logged steps with "
            "tf.summary.record_if(...) instead; or return the gradients from strategy.run and write them in "
            "cross-replica context, where the gather runs on logged steps only."
        )
    return e


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def merge(grads: Any, strategy: Any = None) -> GradientMap:
    """The global batch's GradientMap from per-replica gradients (see the module docstring).

    The summary ops merge by themselves; this is for reading the merged gradients in your own code.
    In replica context (inside `strategy.run`, more than one replica) layer outputs are all-gathered along
    axis 0 and weight gradients all-reduced (SUM); every replica gets the same result, and its
    `variable_gradients` stay this replica's (what an optimizer expects there). In cross-replica context, on
    what `strategy.run` returned, the same with `strategy.gather` / `strategy.reduce`, and
    `variable_gradients` are summed. With one replica or no strategy, `grads` comes back unchanged; merging
    a merged map again is a no-op (its `replicas` says how many it covers).

    Args:
      grads: a `GradientMap` (`cap.gradients(tape, loss)`) or a dict layer path -> gradient, per replica;
        or what `strategy.run` returned.
      strategy: in cross-replica context outside `strategy.scope()`, the strategy that ran the step.

    Returns:
      The merged `GradientMap`.

    Raises:
      ValueError: PerReplica values without a strategy in scope or given; a scalar layer-output gradient
        (no batch axis to gather along).
      RuntimeError: called inside a `tf.cond` in replica context (collectives cannot run there).

    Example:

    ```python
    import tensorflow as tf, tb_layergrad

    strategy = tf.distribute.get_strategy()  # e.g. a MirroredStrategy
    merged = tb_layergrad.distribute.merge({"model/dense": tf.ones([4, 2])}, strategy)
    print(merged.replicas, merged["model/dense"].shape)
    ```
    """
    gmap = _as_map(per_replica_map(grads))
    if gmap.replicas > 1:
        return gmap
    ctx = replica_context()
    if ctx is not None:
        try:
            return _merge_in_replica(gmap, ctx)
        except RuntimeError as e:
            raise _merge_call_error(e) from e
    if holds_distributed_values(gmap):
        strategy = strategy if strategy is not None else tf.distribute.get_strategy()
        if strategy.num_replicas_in_sync <= 1 and not tf.distribute.has_strategy():
            raise ValueError(
                "these gradients come from strategy.run but no strategy is in scope: pass "
                "merge(grads, strategy=strategy) or call it under `with strategy.scope()`"
            )
        return _merge_cross_replica(gmap, strategy)
    return gmap


def _merged_entries(gmap: GradientMap, gather: Callable, reduce_sum: Callable, n: int) -> dict:
    outputs = [p for p in gmap if gmap[p] is not None and gmap.entry(p).source == metadata.SOURCE_OUTPUT]
    weights = [p for p in gmap if gmap[p] is not None and gmap.entry(p).source == metadata.SOURCE_WEIGHT]
    gathered = gather([gmap[p] for p in outputs]) if outputs else []
    summed = reduce_sum([gmap[p] for p in weights]) if weights else []
    merged = dict(zip(outputs, gathered))
    merged.update(zip(weights, summed))
    entries = {}
    for p in gmap:
        e = gmap.entry(p)
        if p in merged:
            entries[p] = dataclasses.replace(e, value=merged[p])
        elif e.source == metadata.SOURCE_OUTPUT and e.elements >= 0:  # "no gradient": count the whole batch
            entries[p] = dataclasses.replace(e, elements=e.elements * n)
        else:
            entries[p] = e
    return entries


def _merge_in_replica(gmap: GradientMap, ctx: Any) -> GradientMap:
    n = ctx.num_replicas_in_sync
    for p in gmap:
        if gmap[p] is not None and gmap.entry(p).source == metadata.SOURCE_OUTPUT:
            _check_batch_major(p, gmap[p])
    for p, a in gmap.activations.items():
        _check_batch_major(p, a)
    entries = _merged_entries(gmap, lambda ts: ctx.all_gather(ts, axis=0), lambda ts: _sum(ctx, ts), n)
    acts = _gathered_activations(gmap, lambda ts: ctx.all_gather(ts, axis=0))
    return GradientMap(
        entries,
        gmap.target,
        gmap.variable_gradients,
        replicas=n,
        activations=acts,
        target_value=_summed_target(gmap, ctx),
        per_example=merge_per_example(gmap.per_example, ctx),
    )


def merge_per_example(per_example: Optional[PerExampleNorms], ctx: Any) -> Optional[PerExampleNorms]:
    """Inside `strategy.run`: every replica's per-example norms, in global batch order (all-gathered along axis 0).

    Each replica's capture took its own batch for B while its loss is its share of the global loss (the
    replicas' losses sum to it: the assumption under which weight gradients are summed, module docstring):
    its norms came out divided by the replica count, which is put back here. Which paths have no numbers,
    and why, is the same on every replica (the same model and step).
    """
    if per_example is None:
        return None
    n = ctx.num_replicas_in_sync
    paths = [p for p, v in per_example.items() if v is not None]
    gathered = ctx.all_gather([per_example[p] for p in paths], axis=0) if paths else []
    norms = {p: None for p in per_example}
    norms.update({p: g * tf.cast(n, g.dtype) for p, g in zip(paths, gathered)})
    return PerExampleNorms(norms, per_example.unsupported, per_example.coupled_by)


def _gathered_activations(gmap: GradientMap, gather: Callable) -> Dict[str, Entry]:
    """The layer outputs (forward values) of the global batch: gathered along axis 0, as their gradients are."""
    paths = list(gmap.activations)
    values = gather([gmap.activations[p] for p in paths]) if paths else []
    return {p: dataclasses.replace(gmap.activation_entry(p), value=v) for p, v in zip(paths, values)}


def _summed_target(gmap: GradientMap, ctx: Any) -> Any:
    """The global step's target: the SUM of the replicas' (the gradients are summed, so each replica's target is
    its share, e.g. `tf.nn.compute_average_loss` or Keras' loss scaled for distribution); None if not known."""
    if gmap.target_value is None:
        return None
    return _sum(ctx, [gmap.target_value])[0]


def _sum(ctx: Any, tensors: List[Any]) -> List[Any]:
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tensors)


@dataclasses.dataclass(frozen=True)
class Merged:
    """The global batch's gradients, as `merge_in_replica` leaves them for the records.

    `gradients`: layer outputs (and activations) gathered, weights summed (`merge`);
    `timesteps`: per RNN probe, dL/dh_t gathered along the batch.
    """

    gradients: GradientMap
    timesteps: Dict[str, Any]


def merge_in_replica(gmap: GradientMap, ctx: Any, timesteps: Optional[Dict[str, Any]] = None) -> Merged:
    """Inside `strategy.run`, at every step: `merge()`, plus the per-timestep gradients gathered along the batch.

    Every replica gets the same result. The one merge every writer uses in replica context
    (`summary.gradients`, the `fit()` step).
    """
    timesteps = dict(timesteps or {})
    keys = [k for k, g in timesteps.items() if g is not None]
    try:
        gathered = ctx.all_gather([timesteps[k] for k in keys], axis=0) if keys else []
        return Merged(_merge_in_replica(gmap, ctx), dict(zip(keys, gathered)))
    except RuntimeError as e:
        raise _merge_call_error(e) from e


def _merge_cross_replica(gmap: GradientMap, strategy: Any) -> GradientMap:
    n = strategy.num_replicas_in_sync
    sum_op = tf.distribute.ReduceOp.SUM

    def gather(ts: List[Any]) -> List[Any]:
        return [strategy.gather(t, axis=0) for t in ts]

    def reduce_sum(ts: List[Any]) -> List[Any]:
        return [strategy.reduce(sum_op, t, axis=None) for t in ts]

    entries = _merged_entries(gmap, gather, reduce_sum, n)
    var_grads = [None if g is None else strategy.reduce(sum_op, g, axis=None) for g in gmap.variable_gradients]
    value = None if gmap.target_value is None else strategy.reduce(sum_op, gmap.target_value, axis=None)
    return GradientMap(
        entries, gmap.target, var_grads, replicas=n, activations=_gathered_activations(gmap, gather), target_value=value
    )
