"""What one forward pass must keep for per-example norms, and turning it into `PerExampleNorms`.

Why a separate object: `Capture` records layer outputs for every use; per-example norms also need,
for the layers with a rule, each call's input and the tensor whose gradient is δ (the pre-activation,
seen by `PreactivationObserver`, or the output), and they need to know which calls mixed the
examples. This object holds that, names the extra tensors `Capture.gradients` differentiates in its
ONE `tape.gradient` call, and assembles the norms from the results.

Scaling: the loss is taken to be the batch mean L = (1/B) Σ ℓ_i, so ∇ℓ_i = B · (example i's part of
∇L). Every norm here is B times the norm of the batch gradient's example-i part.

Coupling (BatchNormalization in training mode): the gradient of L w.r.t. anything that feeds such a
layer mixes the examples' losses, so B · dL/dy_i is not ∇_{y_i} ℓ_i. Every path whose outputs were
recorded before such a call returned (in call order, which is conservative: a parallel branch that
ran earlier is flagged too) and every weight of a layer first called before it gets no number, with
the reason.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad.capturing import ghost_norm, per_example
from tb_layergrad.capturing.layer_tree import trainable_weights
from tb_layergrad.capturing.per_example_map import COUPLED_REASON, Deferred, PerExampleNorms, PerGraph
from tb_layergrad.capturing.per_example_rules import Rule, Unsupported, couples_examples, rule_for, short_name
from tb_layergrad.capturing.preactivation import PreactivationObserver


@dataclasses.dataclass
class Observed:
    """One call of a layer that has a rule."""

    node: Any
    seq: int  # how many layer outputs had been recorded before this call's own
    inputs: Any
    delta_source: Optional[Any]  # the pre-activation (or the output); None: not observed


def _is_float(t: Any) -> bool:
    return isinstance(t, tf.Tensor) and t.dtype.is_floating


class PerExamplePass:
    """Per-example bookkeeping of one `Capture` (see the module docstring)."""

    def __init__(self, nodes: Sequence[Any], weights: bool):
        self.weights = weights
        self.rules: Dict[int, Tuple[Optional[Rule], Optional[str]]] = {}
        if weights:
            for node in nodes:
                if trainable_weights(node.layer):
                    self.rules[node.index] = rule_for(node.layer)
        self.calls: List[Observed] = []
        self.coupled: List[Tuple[int, str]] = []  # (records existing when the call returned, path)

    def reset(self) -> None:
        self.calls.clear()
        self.coupled.clear()

    # -- during the forward pass --------------------------------------------------------------
    def observer_for(self, node: Any) -> Optional[PreactivationObserver]:
        """An observer to put in place of `layer.activation`, for layers whose rule needs δ there."""
        rule, _ = self.rules.get(node.index, (None, None))
        activation = getattr(node.layer, "activation", None)
        if rule is None or not rule.delta_at_preactivation or not callable(activation):
            return None
        return PreactivationObserver(activation)

    def observe(
        self,
        node: Any,
        seq: int,
        args: Sequence[Any],
        kwargs: Dict[str, Any],
        out: Any,
        preactivation: Optional[Any],
        records_now: int,
    ) -> None:
        """After one call of `node`'s layer: keep what its rule needs, note a coupling call."""
        if couples_examples(node.layer, args, kwargs):
            self.coupled.append((records_now, node.path))
        rule, _ = self.rules.get(node.index, (None, None))
        if rule is None:
            return
        inputs = args[0] if args else kwargs.get("inputs")
        source = preactivation if rule.delta_at_preactivation else (out if _is_float(out) else None)
        self.calls.append(Observed(node, seq, inputs, source if _is_float(source) else None))

    def note_coupling(self, node: Any, args: Sequence[Any], kwargs: Dict[str, Any], records_now: int) -> None:
        """For a layer watched only for coupling (not chosen in `layers=`)."""
        if couples_examples(node.layer, args, kwargs):
            self.coupled.append((records_now, node.path))

    def sources(self) -> List[Any]:
        """The extra tensors to differentiate: each observed call's δ source (a placeholder where none)."""
        return [c.delta_source for c in self.calls if c.delta_source is not None]

    # -- after the backward pass --------------------------------------------------------------
    def norms(
        self,
        outputs: Sequence[Tuple[str, int, Any]],
        weights: Sequence[Tuple[str, Any, Any, Any]],
        source_grads: Sequence[Any],
    ) -> PerExampleNorms:
        """Assemble the result.

        outputs: (key, seq, gradient or None) per recorded output.
        weights: (path, variable, owner node, batch gradient or None) per weight entry.
        source_grads: the gradients of `sources()`, in that order.
        """
        boundary = max((b for b, _ in self.coupled), default=0)
        coupled_by = tuple(dict.fromkeys(p for _, p in self.coupled))
        coupled_reason = f"{COUPLED_REASON} {', '.join(coupled_by)} (batch statistics in training mode)"
        norms: Dict[str, Any] = {}
        unsupported: Dict[str, str] = {}
        for key, seq, g in outputs:
            norms[key] = None
            if g is None:
                continue
            if seq < boundary:
                unsupported[key] = coupled_reason
            elif g.shape.rank == 0:
                unsupported[key] = "a scalar output has no batch axis"
            else:
                norms[key] = Deferred(functools.partial(_squared_rows, g), _batch_size(g), tf.shape(g)[0])
        deltas = self._deltas(source_grads)
        factors = _FactorMemo(self, deltas)
        for path, var, owner, g in weights:
            norms[path] = None
            if g is None:
                continue
            value = self._weight_norm(var, owner, deltas, factors, boundary, coupled_reason)
            if isinstance(value, str):
                unsupported[path] = value
            else:
                norms[path] = value
        return PerExampleNorms(norms, unsupported, coupled_by)

    def _deltas(self, source_grads: Sequence[Any]) -> Dict[int, Any]:
        with_source = [c for c in self.calls if c.delta_source is not None]
        return {id(c): g for c, g in zip(with_source, source_grads)}

    def _weight_norm(
        self, var: Any, owner: Any, deltas: Dict[int, Any], factors: "_FactorMemo", boundary: int, coupled_reason: str
    ) -> Any:
        """The deferred [B] norms of one variable, or the reason there are none."""
        if owner.index not in self.rules:
            return f"layer {owner.path} is not captured: include it in layers= for its per-example norms"
        calls = [c for c in self.calls if c.node is owner]
        # A call the target does not depend on (one outside the tape of this target, in a step with several) adds
        # nothing to its weight gradient: its δ has no gradient. The norms are of the calls that do.
        connected = [c for c in calls if c.delta_source is None or deltas.get(id(c)) is not None]
        calls = connected or calls
        if calls and min(c.seq for c in calls) < boundary:
            return coupled_reason
        rule, reason = self.rules[owner.index]
        if rule is None:
            return str(reason)
        if not calls:
            return f"layer {owner.path} was not called inside the capture"
        role = short_name(var)
        if role not in rule.roles:
            return f"{type(owner.layer).__name__} variable {role!r} has no per-example rule (e.g. LoRA)"
        per_call = factors.get(rule, owner, calls)
        if isinstance(per_call, str):
            return per_call
        if any(role not in f for f in per_call):
            return f"no factor for {role!r}"

        def build() -> Any:
            return ghost_norm.squared_norm(ghost_norm.concat([f[role] for f in factors.get(rule, owner, calls)]))

        first = deltas[id(calls[0])]
        return Deferred(build, _batch_size(first), tf.shape(first)[0])

    @staticmethod
    def _factors(rule: Rule, owner: Any, calls: List[Observed], deltas: Dict[int, Any]) -> Any:
        """Each call's factors, or a reason (a call whose δ was not observed)."""
        result = []
        for c in calls:
            if c.delta_source is None:
                where = "pre-activation" if rule.delta_at_preactivation else "output"
                return (
                    f"{type(owner.layer).__name__}'s {where} was not observed in the forward pass (its call "
                    "does not end with `activation` applied once)"
                )
            delta = deltas.get(id(c))
            if delta is None:
                return "the target does not depend on this layer's δ"
            try:
                result.append(per_example.factors(rule, owner.layer, c.inputs, delta))
            except Unsupported as e:
                return str(e)
            except (TypeError, ValueError) as e:  # an input the rule cannot take (ragged, sparse, unknown rank)
                return f"{type(owner.layer).__name__}: the rule cannot take this call's input ({type(e).__name__}: {e})"
        return result


class _FactorMemo:
    """Each layer's per-call factors, made once per graph.

    Why per graph: the norms are built where they are read (`Deferred`), usually inside the writers'
    recording condition; a layer's variables (kernel and bias) share its factors there. Whether a layer's
    factors can be made at all is decided when the norms are assembled: in a graph those trial ops have
    no consumer and are pruned; eagerly they are the factors themselves, kept (so eagerly a convolution's
    patches are made at every step, logged or not).
    """

    def __init__(self, owner_pass: "PerExamplePass", deltas: Dict[int, Any]):
        self._pass = owner_pass
        self._deltas = deltas
        self._made = PerGraph()

    def get(self, rule: Rule, owner: Any, calls: List[Observed]) -> Any:
        """The factors (or the reason there are none), made in the current graph and remembered."""
        return self._made.get(owner.index, lambda: self._pass._factors(rule, owner, calls, self._deltas))  # noqa: SLF001


def _squared_rows(g: Any) -> Any:
    """Σ of squares of each example's slice of `g` [B, ...]: a [B] tensor."""
    g = _float(g)
    if g.shape.rank == 2:
        return tf.reduce_sum(tf.square(g), axis=1)
    flat = tf.reshape(g, [per_example.batch_count(g), -1])  # any rank, known or not
    return tf.reduce_sum(tf.square(flat), axis=1)


def _float(t: Any) -> Any:
    return t if t.dtype in (tf.float32, tf.float64) else tf.cast(t, tf.float32)


def _batch_size(g: Any) -> Any:
    dtype = tf.float32 if g.dtype != tf.float64 else tf.float64
    count = per_example.batch_count(g)
    return tf.constant(float(count), dtype) if isinstance(count, int) else tf.cast(count, dtype)
