"""Test tolerances derived from the dtype and the reduction length (docs/DESIGN.md, "Tolerances").

One model for all of them: a floating-point sum of n terms, added in ANY order and
any tree shape (sequential, pairwise, SIMD lanes of any width then combined, blocked
and threaded), errs by at most

    |fl(sum x) - sum x| <= gamma(n - 1) * sum |x|,   gamma(k) = k u / (1 - k u)

(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. 4.4 and §4.3:
every term passes through at most n - 1 additions whatever the order), u the unit
roundoff of the dtype the sum is carried in (2**-24 for float32, 2**-53 for float64).
A dot product of length k (one element of a matmul or convolution) is a sum of k
products: gamma(k) * sum |a_i b_i| (eq. 3.5). We use this worst-case form, not the
tighter pairwise bound (~ log2(n) u), because the order is not ours to choose:
oneDNN and XLA pick blocking and vector width per CPU at run time (AVX2: 8 float32
lanes, AVX-512: 16), Eigen and XLA split reductions into blocks and threads, and
grappler/XLA fusion change which ops are merged. Only the any-order bound holds on
every x86-64 CPU TensorFlow supports.

Two implementations that each satisfy the bound may differ by twice it (`TWO_SIDES`).
A chain of reductions (a forward pass then backprop) accumulates, to first order, the
sum of the gammas of its steps: gamma(k1) + gamma(k2) <= gamma(k1 + k2) (Higham,
lemma 3.3), so a chain is bounded by gamma of its total reduction length.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

import numpy as np
import pytest

TWO_SIDES = 2  # both the tested path and the reference round, each within the bound


def unit_roundoff(dtype) -> float:
    """u = eps / 2: the largest relative error of one correctly rounded operation."""
    return float(np.finfo(_np_dtype(dtype)).eps) / 2


def gamma(k: int, dtype) -> float:
    """gamma(k) = k u / (1 - k u): the bound of k successive roundings (Higham, lemma 3.1)."""
    ku = max(int(k), 0) * unit_roundoff(dtype)
    if ku >= 1:
        raise ValueError(f"gamma({k}) is unbounded in {dtype}: k u = {ku}")
    return ku / (1 - ku)


def sum_atol(dtype, n: int, abs_sum: float) -> float:
    """Absolute error bound of a sum of n terms in any order: gamma(n - 1) * sum |x|."""
    return gamma(max(int(n) - 1, 0), dtype) * float(abs_sum)


def sum_rtol(dtype, n: int, cond: float = 1.0) -> float:
    """Relative error bound of a sum of n terms in any order: gamma(n - 1) * sum|x| / |sum x|.

    `cond` = sum|x| / |sum x| (1 for terms of one sign, as squares or counts).
    """
    return gamma(max(int(n) - 1, 0), dtype) * float(cond)


def matmul_rtol(dtype, k: int) -> float:
    """Bound of one matmul/convolution element of contraction length k, relative to sum |a_i b_i|."""
    return gamma(int(k), dtype)


def chain_rtol(dtype, lengths: Iterable[int]) -> float:
    """First-order bound of a chain of reductions of the given lengths (forward, then backprop)."""
    return gamma(sum(int(k) for k in lengths), dtype)


def blocked_sum_atol(abs_sum: float, n: int, block: int, inner, outer, outer_terms: Optional[int] = None) -> float:
    """A sum carried in `inner` within blocks of `block` terms, then in `outer` across the blocks.

    Each block errs by gamma(block - 1, inner) times its own sum |x|; the block sums (at most
    (1 + that) times sum |x| in magnitude) are added in `outer` with gamma(outer_terms - 1, outer),
    outer_terms = the number of blocks unless some elements are added in `outer` one by one.
    Any order inside the blocks and across them.
    """
    inner_err = gamma(max(min(int(block), int(n)) - 1, 0), inner)
    terms = max(math.ceil(int(n) / int(block)), 1) if outer_terms is None else int(outer_terms)
    return (inner_err + gamma(max(terms - 1, 0), outer) * (1 + inner_err)) * float(abs_sum)


def histogram_edge_atol(top: float) -> float:
    """Two computations of the float64 edges lo + i (hi - lo) / k: hi - lo, / k, i x and + lo round
    4 times, on magnitudes <= 2 top (top = max |edge|); an edge near 0 cancels: absolute."""
    return TWO_SIDES * gamma(4, np.float64) * 2 * float(top)


def approx_or_none(expected: Optional[float], rel: float, abs: float = 0.0):
    """`pytest.approx(expected, ...)` for a number; None itself for None (pytest 9 refuses approx(None))."""
    if expected is None:
        return None
    return pytest.approx(expected, rel=rel, abs=abs)


def reduction_path_length(model, x, target_terms: int, other: int = 0) -> int:
    """An upper bound of the total reduction length along any path from the target back to a gradient.

    Each kernel of shape (..., c_in, c_out) contracts prod(shape[:-1]) terms forward and
    prod(shape[:-2]) * c_out in backprop; an RNN (x of rank 3) applies its kernels once per
    timestep, one after the other; the weight gradients sum over every position (batch x
    timesteps) and the target over `target_terms` terms; `other`: further reductions on the path
    (batch statistics, pooling).
    """
    steps = int(x.shape[1]) if len(x.shape) == 3 else 1
    length = int(np.prod(x.shape[:-1])) + int(target_terms) + int(other)
    for v in model.trainable_variables:
        shape = [int(d) for d in v.shape]
        if len(shape) >= 2:
            length += steps * (int(np.prod(shape[:-1])) + int(np.prod(shape[:-2])) * shape[-1])
    return length


def assert_same_float32_math(got, want, length: int, err_msg: str = "", magnitude=None) -> None:
    """Both sides compute the same float32 math, ops in other orders (eager kernels vs grappler's fused
    ones vs XLA's; oneDNN and XLA block by the CPU's vector width, AVX2 vs AVX-512): each within
    chain_rtol(float32, length) of the exact value, relative to the magnitudes combined, which the
    tensor's largest element stands for (an element that cancels to ~0 keeps the absolute error).

    `magnitude`: the magnitudes combined, where the caller knows them and the largest element does not
    stand for them: a tensor whose exact value is 0 (every element cancels, e.g. the bias gradient of a
    layer followed by batch normalization) holds only rounding, so its largest element says nothing;
    its sum |terms| does (a scalar, or an array broadcast against `want`)."""
    got, want = np.asarray(got), np.asarray(want)
    rtol = TWO_SIDES * chain_rtol(np.float32, [length])
    if magnitude is None:
        np.testing.assert_allclose(
            got, want, rtol=rtol, atol=rtol * float(np.max(np.abs(want), initial=0.0)), err_msg=err_msg
        )
        return
    bound = rtol * np.broadcast_to(np.maximum(np.abs(want), magnitude), want.shape)
    beyond = ~(np.abs(got.astype(np.float64) - want) <= bound)
    assert not beyond.any(), (
        f"{err_msg} {int(beyond.sum())}/{want.size} elements beyond the bound: got {got[beyond]}, want {want[beyond]}, "
        f"bound {bound[beyond]}"
    )


def _np_dtype(dtype):
    name = getattr(dtype, "name", None)  # tf.DType, np.dtype
    if isinstance(name, str) and name == "bfloat16":
        raise ValueError("bfloat16: pass the dtype the sum is carried in (float32)")
    return np.dtype(name if isinstance(name, str) else dtype)
