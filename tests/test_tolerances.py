"""tests/tolerances.py: its bounds hold for the summation orders the CPUs use, against exact sums (math.fsum)."""

from __future__ import annotations

import math

import numpy as np
import pytest


def lane_sum(x: np.ndarray, lanes: int) -> np.float32:
    """A float32 sum as `#pragma omp simd reduction` / a vectorized reduce does it: `lanes` running
    sums (8 for AVX2, 16 for AVX-512), then the lanes added pairwise."""
    acc = np.zeros(lanes, np.float32)
    for start in range(0, x.size, lanes):
        part = x[start : start + lanes]
        acc[: part.size] += part  # float32 adds, lane by lane
    while acc.size > 1:
        acc = acc[0::2] + acc[1::2]
    return acc[0]


def blocked(x: np.ndarray, lanes: int, block: int = 256) -> float:
    """float32 within blocks (lane sums), float64 across: the fused kernel's sum of x."""
    return math.fsum(float(lane_sum(x[i : i + block], lanes)) for i in range(0, x.size, block))


@pytest.mark.parametrize("shift", [0.0, 3.0])
def test_any_order_bound_holds_for_the_lane_orders_of_avx2_and_avx512(shift, tolerances):
    rng = np.random.default_rng(7)
    x = (rng.normal(size=4096) + shift).astype(np.float32)
    exact = math.fsum(x.astype(np.float64))
    abs_sum = float(np.abs(x.astype(np.float64)).sum())
    sums = {lanes: lane_sum(x, lanes) for lanes in (1, 4, 8, 16)}
    for lanes, s in sums.items():
        assert abs(float(s) - exact) <= tolerances.sum_atol(np.float32, x.size, abs_sum), lanes
    assert sums[8] != sums[16]  # AVX2's and AVX-512's orders round differently: no bitwise equality
    for lanes in (8, 16):  # the kernel's blocks of 256 in float32, float64 across
        assert abs(blocked(x, lanes) - exact) <= tolerances.blocked_sum_atol(
            abs_sum, x.size, 256, np.float32, np.float64
        )


def test_dot_product_bound(tolerances):
    rng = np.random.default_rng(8)
    a, b = rng.normal(size=(2, 512)).astype(np.float32)
    exact = math.fsum((a.astype(np.float64) * b.astype(np.float64)).tolist())
    magnitude = float(np.abs(a.astype(np.float64) * b).sum())
    for lanes in (1, 8, 16):
        got = lane_sum((a * b).astype(np.float32), lanes)  # products rounded once, then summed
        assert abs(float(got) - exact) <= tolerances.matmul_rtol(np.float32, a.size) * magnitude


def test_gamma(tolerances):
    assert tolerances.unit_roundoff(np.float32) == 2.0**-24 and tolerances.unit_roundoff(np.float64) == 2.0**-53
    assert tolerances.gamma(0, np.float32) == 0.0
    assert tolerances.gamma(3, np.float32) + tolerances.gamma(5, np.float32) <= tolerances.gamma(
        8, np.float32
    )  # a chain: lengths add
    with pytest.raises(ValueError):
        tolerances.gamma(2**24, np.float32)


def test_approx_or_none(tolerances):
    assert tolerances.approx_or_none(None, rel=1e-3) is None
    assert 1.0005 == tolerances.approx_or_none(1.0, rel=1e-3)
    assert 1.01 != tolerances.approx_or_none(1.0, rel=1e-3)
