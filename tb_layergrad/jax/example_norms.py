"""Per-example gradient norms on JAX (docs/PER_EXAMPLE.md): each example's own loss gradient, per layer output
and per weight of a layer with an exact rule, from what the step's own backward pass has.

Why each layer's own call, vmapped: the weight gradient of ONE example is the vector-Jacobian product of that
layer's call at that example's input with that example's part of dL/d(output), which the step's backward pass
hands out (`step_trace`). `jax.vmap` of `jax.vjp` of the layer's `call` over the batch gives all of them at
once, in one batched computation, no per-example backward pass of the model. It is exact where the call treats
each example alone: the layers `capturing.per_example_rules` names, decided as on TensorFlow (the same rows,
the same `status`), except a call that couples the examples (BatchNormalization in training), flagged and never
computed. The loss is the batch mean, so example i's part is ∇ℓ_i / B: the host multiplies the squares by B²
(`rows`), as TensorFlow's scale. Built inside the written steps' branch only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import keras
import numpy as np

from tb_layergrad import metadata
from tb_layergrad.capturing.layer_tree import LayerNode, trainable_weights
from tb_layergrad.capturing.per_example_rules import Rule, short_name
from tb_layergrad.statistics import example_rows

#: a row before the host: an example's [B] squared norms (unscaled, float32), or the status of why none
Row = Union[jax.Array, int]


@dataclasses.dataclass
class Call:
    """One call of a layer with a rule: what its per-example weight gradients need after the backward pass."""

    node: LayerNode
    key: Optional[str]  # the record key of its output (None: a structured output, no rule takes one)
    seq: int  # the position of its output among the values observed (as TensorFlow's record position)
    treedef: Any  # of its (args, kwargs)
    inputs: List[Any]  # `step_trace.Seen` of each leaf: the values the call received
    fn: Callable[..., Any]  # the layer's own call, bound (not the observing one)

    def arguments(self) -> Tuple[Any, Any]:
        return jax.tree_util.tree_unflatten(self.treedef, [s.value for s in self.inputs])


def boundary(coupled: Sequence[Tuple[int, str]]) -> int:
    """Values observed before this position were before (or are) a call that coupled the examples."""
    return max((b for b, _ in coupled), default=0)


def output_rows(outputs: Sequence[Any], coupled: Sequence[Tuple[int, str]]) -> List[Row]:
    """Each observed output's row: Σ over its non-batch axes of dL/dy_i squared, or why it has none."""
    first = boundary(coupled)
    rows: List[Row] = []
    for s in outputs:
        g = s.cotangent
        if s.seq < first:
            rows.append(metadata.EXAMPLE_COUPLED)
        elif g.ndim == 0:
            rows.append(metadata.EXAMPLE_UNSUPPORTED)
        else:
            rows.append(_squares(g))
    return rows


@dataclasses.dataclass
class WeightRow:
    """One weight of the written weight group: its variable, its owning layer, and the owner's rule."""

    variable: Any
    owner: LayerNode
    rule: Optional[Tuple[Optional[Rule], Optional[str]]]  # None: the owner is not a chosen layer


def weight_rows(
    weights: Sequence[WeightRow],
    calls: Sequence[Call],
    seen: Dict[str, Any],
    coupled: Sequence[Tuple[int, str]],
    values: Dict[int, Any],
) -> List[Row]:
    """Each weight's row, as TensorFlow decides it (`capturing/per_example_pass.py`): the squares of its
    per-example gradients summed over the owner's calls, or why there are none. `values`: id(variable) -> the
    value the step's forward pass read (trainable and not)."""
    first = boundary(coupled)
    by_owner: Dict[int, List[Call]] = {}
    for c in calls:
        if c.key is not None and seen.get(c.key) is not None and seen[c.key].cotangent is not None:
            by_owner.setdefault(c.node.index, []).append(c)
    made: Dict[int, Dict[int, jax.Array]] = {}
    rows: List[Row] = []
    for w in weights:
        owned = by_owner.get(w.owner.index, [])
        if w.rule is None:
            rows.append(metadata.EXAMPLE_UNSUPPORTED)  # the owner is not chosen in layers=
        elif owned and min(c.seq for c in owned) < first:
            rows.append(metadata.EXAMPLE_COUPLED)
        elif w.rule[0] is None or not owned or short_name(w.variable) not in w.rule[0].roles:
            rows.append(metadata.EXAMPLE_UNSUPPORTED)
        else:
            if w.owner.index not in made:
                made[w.owner.index] = _layer_squares(w.owner.layer, owned, seen, values)
            rows.append(made[w.owner.index][id(w.variable)])
    return rows


def _layer_squares(layer: Any, calls: Sequence[Call], seen: Dict[str, Any], values: Dict[int, Any]) -> Dict[int, Any]:
    """id(variable) -> [B] Σ of squares of each example's gradient of that trainable variable, over its calls."""
    variables = trainable_weights(layer)
    params = [values[id(v)] for v in variables]
    others = [(v, values[id(v)]) for v in layer.non_trainable_variables if id(v) in values]
    total: Optional[List[Any]] = None
    for c in calls:
        grads = _per_example_grads(c, variables, params, others, seen[c.key].cotangent)
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    return {id(v): _squares(g) for v, g in zip(variables, total or [])}


def _per_example_grads(call: Call, variables: List[Any], params: List[Any], others: List[Any], ct: Any) -> List[Any]:
    """[B, *shape] of each variable: the vjp of the layer's call at each example's input with its cotangent."""
    args, kwargs = call.arguments()
    batch = ct.shape[0]
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    mapped = [i for i, x in enumerate(leaves) if getattr(x, "ndim", 0) >= 1 and x.shape[0] == batch]

    def one(examples: List[Any], ct_i: Any) -> Any:
        full = list(leaves)
        for i, x in zip(mapped, examples):
            full[i] = x[None]
        a, k = jax.tree_util.tree_unflatten(treedef, full)

        def of_weights(p: List[Any]) -> Any:
            with keras.StatelessScope(state_mapping=list(zip(variables, p)) + others):
                return call.fn(*a, **k)

        out, vjp = jax.vjp(of_weights, params)
        return vjp(ct_i[None].astype(out.dtype))[0]

    return jax.vmap(one)([leaves[i] for i in mapped], ct)


def _squares(g: Any) -> jax.Array:
    """[B] float32: Σ over the non-batch axes of g squared (float32 before the squares: a float16 one overflows)."""
    g = jnp.asarray(g)
    g = g.astype(jnp.float32) if g.dtype != jnp.float64 else g
    return jnp.sum(jnp.square(g.reshape(g.shape[0], -1)), axis=1)


def split(rows: Sequence[Row]) -> Tuple[List[Any], List[int]]:
    """(the exact rows' arrays, in order; each row's status): what travels to the host, and what is known now."""
    return [r for r in rows if not isinstance(r, int)], [
        r if isinstance(r, int) else metadata.EXAMPLE_EXACT for r in rows
    ]


def table(statuses: Sequence[int], squares: Optional[np.ndarray], batch: int) -> np.ndarray:
    """float64 [rows, WIDTH] on the host: the exact rows from their squares (times B², the batch mean's scale)
    and a status row for each other."""
    exact = (
        example_rows.exact_rows_from_squares(np.asarray(squares, np.float64) * float(batch) ** 2)
        if squares is not None and len(squares)
        else np.zeros((0, example_rows.WIDTH))
    )
    out, at = [], 0
    for status in statuses:
        if status == metadata.EXAMPLE_EXACT:
            out.append(exact[at])
            at += 1
        else:
            out.append(example_rows.status_row(float(batch), status))
    return np.stack(out) if out else np.zeros((0, example_rows.WIDTH))


def noise_scale(
    stats: np.ndarray, examples: np.ndarray, sizes: Sequence[int], parameters: int, coupled: bool
) -> Dict[str, float]:
    """The noise scale's scalars of one step from the loss's weight group: its `stats` (‖G_B‖ of each), its
    `examples` rows (Σ_i ‖g_i‖² of each), each weight's parameter count and the trainable parameters in all."""
    exact = examples[:, metadata.EXAMPLE_INDEX["status"]] == metadata.EXAMPLE_EXACT
    covered = int(np.sum(np.asarray(sizes)[exact])) if len(sizes) else 0
    coverage = covered / parameters if parameters > 0 else 0.0
    if not exact.any():
        return {metadata.NOISE_SCALE_TAGS["coverage"]: coverage}
    nonfinite = stats[exact][:, [metadata.STAT_INDEX[k] for k in ("nan", "pos_inf", "neg_inf")]].sum(axis=1) > 0
    batch_sq = np.where(nonfinite, np.nan, np.square(stats[exact][:, metadata.STAT_INDEX["norm"]]))
    batch = int(examples[0, metadata.EXAMPLE_INDEX["examples"]])
    estimate = example_rows.noise_scale(examples[exact][:, metadata.EXAMPLE_INDEX["sum_sq"]], batch_sq, batch)
    return example_rows.noise_scale_scalars(estimate, coverage, coupled)
