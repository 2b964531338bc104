"""Per-example Frobenius norms of weight gradients that are sums of outer products, without forming them
per example when that is dearer.

Why: a layer that applies one weight to many positions t of an example (a Dense on every token, a
convolution on every patch) has, for example i, the weight gradient G_i = Σ_t a_it δ_itᵀ (a: the
layer's input at t, δ: the gradient at its pre-activation). Its norm needs no per-example backward
pass, only a and δ, which one ordinary backward pass already yields. Two ways to get ‖G_i‖²:

  explicit:  form G_i (p x q) and sum its squares                cost ∝ T·p·q + p·q, memory B·p·q
  ghost:     Σ_{t,s} (a_t·a_s)(δ_t·δ_s) from two T x T Grams      cost ∝ T²·(p+q) + T², memory B·T²

The rule (`use_ghost`): the cheaper of the two, counting each way's products and the result it
squares and sums (p·q against T², the part that is memory traffic rather than arithmetic: at equal
products the explicit way's result is at least 4 times the Grams', and measured slower);
explicit when T is not known when tracing (explicit memory does not grow with T). With T = 1 both
are ‖a‖·‖δ‖, computed as such. Layers that read the same input (a Transformer's query, key and
value) build the same input Gram: the graph optimizer keeps one.

All arithmetic is float32 at least (float64 inputs stay float64); every function returns the norm
of the *given* δ: the caller scales by the batch size to undo a batch-mean loss.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Outer:
    """G_i = Σ_t a[i, t] ⊗ d[i, t]; a: [B, T, p], d: [B, T, q]."""

    a: Any
    d: Any


@dataclasses.dataclass(frozen=True)
class Blocks:
    """G_i = [G_i^(1); ...; G_i^(K)], each block an `Outer` with the same d: ‖G_i‖² = Σ_k ‖G_i^(k)‖².

    A convolution's kernel gradient by kernel offset k: the input window that offset multiplies at every
    output position, against δ. Its blocks together are the patches' `Outer`, without the patches: no
    [B, T, k²·C] tensor is gathered, and each block is one [C, T] x [T, q] product per example.
    """

    blocks: Tuple[Outer, ...]


@dataclasses.dataclass(frozen=True)
class Lookup:
    """An embedding table's gradient: G_i[v] = Σ_{t: ids[i, t] = v} d[i, t]; ids: [B, T] ints, d: [B, T, q].

    A repeated id within one example adds its δs into ONE row, so the norm is not Σ_t ‖d_t‖ but
    sqrt(Σ_{t,s} [ids_t = ids_s] (d_t·d_s)): the ghost norm whose input Gram is "same id".
    """

    ids: Any
    d: Any


@dataclasses.dataclass(frozen=True)
class Summed:
    """G_i = Σ_t v[i, t]; v: [B, T, k] (a bias, a LayerNormalization scale or offset)."""

    v: Any


Factor = Any  # Outer | Blocks | Lookup | Summed


def _float(t: Any) -> Any:
    t = tf.convert_to_tensor(t)
    return t if t.dtype in (tf.float32, tf.float64) else tf.cast(t, tf.float32)


def _static(n: Any) -> Optional[int]:
    return None if n is None else int(n)


def use_ghost(tokens: Optional[int], p: Optional[int], q: Optional[int]) -> bool:
    """The cheaper of the two for T tokens, p inputs, q outputs (see the module docstring)."""
    if tokens is None or p is None or q is None:
        return False
    return tokens * tokens * (p + q + 1) < p * q * (tokens + 1)


def concat(factors: Sequence[Factor]) -> Factor:
    """One factor for a layer called several times in a pass: its calls' positions side by side.

    The weight gradient of a shared layer is the sum over its calls, i.e. over all their positions.
    """
    first = factors[0]
    if len(factors) == 1:
        return first
    if isinstance(first, Blocks):  # the same kernel offsets in every call: block k of each call side by side
        return Blocks(tuple(concat([f.blocks[k] for f in factors]) for k in range(len(first.blocks))))
    if isinstance(first, Outer):
        return Outer(tf.concat([_float(f.a) for f in factors], 1), tf.concat([_float(f.d) for f in factors], 1))
    if isinstance(first, Lookup):
        return Lookup(tf.concat([f.ids for f in factors], 1), tf.concat([_float(f.d) for f in factors], 1))
    return Summed(tf.concat([_float(f.v) for f in factors], 1))


def squared_norm(factor: Factor) -> Any:
    """‖G_i‖² for every example i: a [B] tensor."""
    if isinstance(factor, Summed):
        v = _float(factor.v)
        if _static(v.shape[1]) == 1:  # the same ops as an Outer's δ term of one position: one computation of both
            return tf.reduce_sum(tf.square(v), axis=[1, 2])
        return tf.reduce_sum(tf.square(tf.reduce_sum(v, axis=1)), axis=-1)
    if isinstance(factor, Blocks):
        return tf.add_n([squared_norm(block) for block in factor.blocks])
    if isinstance(factor, Lookup):
        d = _float(factor.d)
        same = tf.cast(tf.equal(factor.ids[:, :, None], factor.ids[:, None, :]), d.dtype)
        return tf.maximum(tf.reduce_sum(same * tf.matmul(d, d, transpose_b=True), axis=[1, 2]), 0)
    a, d = _float(factor.a), _float(factor.d)
    if a.dtype != d.dtype:
        a, d = tf.cast(a, tf.float64), tf.cast(d, tf.float64)
    tokens, p, q = _static(a.shape[1]), _static(a.shape[2]), _static(d.shape[2])
    if tokens == 1:
        return tf.reduce_sum(tf.square(a), axis=[1, 2]) * tf.reduce_sum(tf.square(d), axis=[1, 2])
    if use_ghost(tokens, p, q):
        gram = tf.matmul(a, a, transpose_b=True) * tf.matmul(d, d, transpose_b=True)
        return tf.maximum(tf.reduce_sum(gram, axis=[1, 2]), 0)  # Σ of a PSD's entries: >= 0 but for rounding
    g = tf.matmul(a, d, transpose_a=True)  # [B, p, q]
    return tf.reduce_sum(tf.square(g), axis=[1, 2])


def norm(factors: List[Factor]) -> Any:
    """‖Σ over `factors`‖ per example, for the factors of ONE variable (a shared layer's calls)."""
    return tf.sqrt(squared_norm(concat(factors)))
