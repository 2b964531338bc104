"""The JAX reductions against plain numpy in float64: the statistics within derived bounds, the histogram's
counts exactly those of the float64 edges every writer computes (`metadata.histogram_edges`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tb_layergrad import metadata
from tb_layergrad.jax import reductions

K = 30


def _edge_counts(x: np.ndarray, k: int = K) -> np.ndarray:
    """Counts of the finite elements against the written edges: [left_i, left_i+1), the last closed."""
    flat = np.asarray(x, np.float64).reshape(-1)
    fin = flat[np.isfinite(flat)]
    if not fin.size:
        return np.zeros(k, np.int64)
    left, _ = metadata.histogram_edges(float(fin.min()), float(fin.max()), k)
    index = np.searchsorted(np.asarray(left), fin, side="right") - 1
    return np.bincount(np.clip(index, 0, k - 1), minlength=k)


def _cases():
    rng = np.random.RandomState(7)
    with_nonfinite = rng.randn(4, 250).astype(np.float32)
    with_nonfinite[0, 3], with_nonfinite[1, 4], with_nonfinite[2, 5] = np.nan, np.inf, -np.inf
    near_max = (rng.rand(300).astype(np.float32) * 2 - 1) * np.float32(3e38)
    # Each float64 edge inside [lo, hi], the float32 values nearest it and one step either side: where a bucket
    # found in float32 would differ from the float64 edges' if it were rounded the wrong way.
    left, _ = metadata.histogram_edges(-1.0, 1.3, K)
    near = np.asarray(left[1:], np.float64).astype(np.float32)
    at_edges = np.concatenate(
        [[-1.0, 1.3], near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))]
    ).astype(np.float32)
    return {
        "at_edges": at_edges,
        "normal": rng.randn(3, 7, 11).astype(np.float32),
        "nonfinite": with_nonfinite,
        "one_value": np.full((5, 3), 0.25, np.float32),
        "all_nan": np.full(6, np.nan, np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "near_float32_max": near_max,
        "tiny": (rng.randn(200) * 1e-30).astype(np.float32),
        "float16": (rng.randn(500) * 10).astype(np.float16),
        "with_zeros": np.maximum(rng.randn(400), 0).astype(np.float32),
        # min = -max puts the middle edge at lo + 15 * width = 0.0 with two roundings, as every writer computes
        # it; one rounding (a multiply-add) leaves it a hair off 0.0, which moves the elements that are 0.0.
        "symmetric": np.array([-3.0, 0.0, 0.0, 3.0, 1.0, -2.5], np.float32),
        "float16_span": np.array([-65504.0, 0.0, 65504.0, 1.0, -3.0], np.float16),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_statistics_and_histogram_match_numpy(name, numpy_reference, tolerances):
    x = _cases()[name]
    stats, counts = jax.jit(lambda a: reductions.records([a], K))(jnp.asarray(x))
    stats, counts = np.asarray(stats)[0], np.asarray(counts)[0]
    assert stats.dtype == np.float64
    want = numpy_reference.numpy_stats(x)
    for field in ("elements", "nan", "pos_inf", "neg_inf", "zeros", "no_gradient"):
        assert stats[metadata.STAT_INDEX[field]] == want[field], field
    np.testing.assert_array_equal(counts, _edge_counts(x))
    fin = np.asarray(x, np.float64).reshape(-1)
    fin = fin[np.isfinite(fin)]
    if not fin.size:
        assert np.isnan(stats[[metadata.STAT_INDEX[f] for f in ("min", "max", "mean", "std", "mean_abs")]]).all()
        assert stats[metadata.STAT_INDEX["norm"]] == 0
        return
    assert stats[metadata.STAT_INDEX["min"]] == want["min"] and stats[metadata.STAT_INDEX["max"]] == want["max"]
    n = fin.size
    big = float(np.abs(fin).max())
    # Sums carried in float32 (the compute dtype of 16- and 32-bit data), in any order: gamma(n - 1) of the
    # magnitudes; the numpy reference rounds in float64 (negligible beside it), std takes two such sums.
    rtol = tolerances.TWO_SIDES * tolerances.sum_rtol(np.float32, n)
    assert abs(stats[metadata.STAT_INDEX["norm"]] - want["norm"]) <= rtol * want["norm"]
    assert abs(stats[metadata.STAT_INDEX["mean_abs"]] - want["mean_abs"]) <= rtol * want["mean_abs"]
    assert abs(stats[metadata.STAT_INDEX["mean"]] - want["mean"]) <= rtol * want["mean_abs"]
    assert abs(stats[metadata.STAT_INDEX["std"]] - want["std"]) <= 2 * rtol * big


def test_several_tensors_are_reduced_each_on_its_own():
    a, b = np.arange(12, dtype=np.float32), -np.ones(3, np.float32)
    stats, counts = reductions.records([jnp.asarray(a), jnp.asarray(b)], K)
    assert stats.shape == (2, len(metadata.STAT_FIELDS)) and counts.shape == (2, K)
    np.testing.assert_array_equal(np.asarray(counts), [_edge_counts(a), _edge_counts(b)])
    assert np.asarray(stats)[1, metadata.STAT_INDEX["mean"]] == -1


def test_the_model_stays_in_32_bits():
    """Float64 is on for the reductions only: a value computed after them is JAX's default float32."""

    def step(x):
        reductions.records([x], K)
        return x * 2.0

    assert jax.jit(step)(jnp.ones(3)).dtype == jnp.float32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int32"])
def test_the_step_check_finds_exactly_the_tensors_with_a_nan_or_inf(dtype):
    """`step_outputs.nonfinite` (run at every step, compiled): True exactly where numpy finds a NaN/Inf, each kind
    at the start, middle and end; never for finite values that a sum would overflow (the dtype's largest, many
    times) or for an empty tensor."""
    from tb_layergrad.jax import step_outputs

    def group(*tensors):
        return step_outputs.Group(
            "loss", metadata.SOURCE_OUTPUT, ["t"] * len(tensors), [0] * len(tensors), list(tensors)
        )

    with jax.enable_x64(dtype == "float64"):
        dt = jnp.dtype(dtype)
        big = float(jnp.finfo(dt).max) if jnp.issubdtype(dt, jnp.floating) else int(jnp.iinfo(dt).max)
        finite = np.full(1000, big, np.float64)
        finite[::2] = -big
        cases = [(finite, False), (np.zeros(0), False), (np.arange(7.0), False)]
        if jnp.issubdtype(dt, jnp.floating):
            for bad in (np.nan, np.inf, -np.inf):
                for at in (0, 500, 999):
                    x = finite.copy()
                    x[at] = bad
                    cases.append((x, True))
        check = jax.jit(lambda *ts: step_outputs.nonfinite([group(*ts)]))
        for values, want in cases:
            x = jnp.asarray(values, dt)
            assert bool(check(x)) == want == (not np.all(np.isfinite(np.asarray(x, np.float64)))), (values[:3], want)
            assert bool(check(jnp.zeros(3, dt), x)) == want  # any tensor of the step
        weights = step_outputs.Group("loss", metadata.SOURCE_WEIGHT, ["w"], [0], [jnp.asarray([np.nan], jnp.float32)])
        assert not bool(step_outputs.nonfinite([weights]))  # weight gradients are not checked (the docstring's)
