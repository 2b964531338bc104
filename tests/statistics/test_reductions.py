"""The statistics and histograms of a tensor (`statistics/reductions`): the eager, XLA, all-finite and general
paths, and many tensors at once, each against the independent float64 reference and against each other."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.statistics import reductions

S = metadata.STAT_INDEX


def edge_atol(tolerances, hist: np.ndarray) -> float:
    return tolerances.histogram_edge_atol(float(np.max(np.abs(hist[:, :2]), initial=0.0)))


@pytest.mark.slow
def test_reductions_compile_under_xla(reference_checks, tolerances):
    a = tf.random.normal([1000])
    eager = reductions.histogram_and_stats(a, 30)
    xla = tf.function(lambda t: reductions.histogram_and_stats(t, 30, xla_safe=True), jit_compile=True)(a)
    counts = tf.function(
        lambda t: reductions.histograms_and_stats([t], 30, xla_safe=True, edges=False)[0][0], jit_compile=True
    )(a)
    np.testing.assert_array_equal(counts.numpy(), xla[0].numpy()[:, 2])
    # Each against the independent reference (its sums in another order under XLA).
    for name, (hist, stats) in (("eager", eager), ("xla", xla)):
        reference_checks.check_stats(stats.numpy(), a, name)
        reference_checks.check_histogram(hist.numpy(), a, 30, name)
    np.testing.assert_allclose(
        xla[0].numpy()[:, :2], eager[0].numpy()[:, :2], rtol=0, atol=edge_atol(tolerances, eager[0].numpy())
    )


def test_general_path_under_xla_keeps_the_written_edges(tolerances):
    """min = -max: the middle edge is 0.0 as every writer computes it (the product rounded, then the sum), also
    where XLA would fuse the two into one multiply-add, so the elements that are 0.0 stay in their bucket."""
    a = tf.constant([-3.0, 0.0, 0.0, 3.0, 1.0, -2.5, 0.2, -0.2])
    left = np.asarray(metadata.histogram_edges(-3.0, 3.0, 30)[0])
    for jit in (False, True):
        hist = tf.function(lambda t: reductions.histogram_and_stats(t, 30, xla_safe=True)[0], jit_compile=jit)(a)
        hist = hist.numpy()
        assert hist[15, 0] == 0.0 and hist[14, 1] == 0.0, f"jit_compile={jit}"
        # The other edges within their bound of the written ones (a division may become a product by 1 / k).
        np.testing.assert_allclose(hist[:, 0], left, rtol=0, atol=edge_atol(tolerances, hist))
        want, _ = np.histogram(a.numpy().astype(np.float64), bins=np.append(hist[:, 0], hist[-1, 1]))
        np.testing.assert_array_equal(hist[:, 2], want, err_msg=f"jit_compile={jit}")


@pytest.mark.parametrize("shift", [0.0, 1e4])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16])
@pytest.mark.slow
def test_fast_path_equals_general_path(shift, dtype, reference_checks, tolerances):
    """The all-finite fast path and the masked general path agree."""
    rng = np.random.default_rng(3)
    a = tf.cast(tf.constant(rng.normal(size=5000) * 2 + (shift if dtype != tf.float16 else 10.0)), dtype)
    fast_h, fast_s = tf.function(lambda t: reductions.histogram_and_stats(t, 30))(a)
    gen_h, gen_s = tf.function(lambda t: reductions.histogram_and_stats(t, 30, xla_safe=True))(a)
    for name, stats in (("fast", fast_s), ("general", gen_s)):
        reference_checks.check_stats(stats.numpy(), a, name)  # float32 sums in different orders: each within its bound
    np.testing.assert_allclose(
        fast_h.numpy()[:, :2], gen_h.numpy()[:, :2], rtol=0, atol=edge_atol(tolerances, gen_h.numpy())
    )
    edges = np.append(fast_h.numpy()[:, 0], fast_h.numpy()[-1, 1])
    want, _ = np.histogram(tf.cast(a, tf.float64).numpy(), bins=edges)
    np.testing.assert_array_equal(gen_h.numpy()[:, 2], want)  # exact against the float64 edges
    # The fast path buckets in float32: an element within rounding of an edge may change side.
    assert np.abs(fast_h.numpy()[:, 2] - want).sum() <= 2
    assert fast_h.numpy()[:, 2].sum() == 5000


def _mixed_tensors():
    rng = np.random.default_rng(5)
    return [
        rng.normal(size=(64, 33)).astype(np.float32),
        np.zeros((5, 5), np.float32),  # one unique value: zero
        np.full((7,), 0.5, np.float32),  # one unique value: takes the general path (|mean| >> std)
        np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32),
        np.array([], np.float32),
        rng.normal(size=100),  # float64: its own batch
        (rng.normal(size=50) + 1e4).astype(np.float32),
        rng.normal(size=(3, 4)).astype(np.float16),
        np.array([1e-23, 2e-23], np.float32),  # tiny: general path
    ]


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("with_nan", [False, True])
@pytest.mark.slow
def test_many_tensors_at_once_equal_one_at_a_time(graph, with_nan, numpy_reference, tolerances):
    """histograms_and_stats (one path choice for all, scalar work batched) gives each tensor's own numbers."""
    arrays = _mixed_tensors()
    if not with_nan:  # every tensor on the fast path: the batched branch
        arrays = [a for i, a in enumerate(arrays) if i in (0, 1, 5, 7)]
    tensors = [tf.constant(a) for a in arrays]
    run = tf.function if graph else (lambda f: f)
    together = run(lambda ts: reductions.histograms_and_stats(ts, 7))(tensors)
    assert len(together) == len(arrays)
    # What the write path takes: each histogram's counts alone, the same numbers.
    counts_only = run(lambda ts: reductions.histograms_and_stats(ts, 7, edges=False))(tensors)
    for (hist, stats), (counts, same_stats) in zip(together, counts_only):
        np.testing.assert_array_equal(counts.numpy(), hist.numpy()[:, 2])
        np.testing.assert_array_equal(same_stats.numpy(), stats.numpy())
    for a, t, (hist, stats) in zip(arrays, tensors, together):
        one_h, one_s = run(lambda x: reductions.histogram_and_stats(x, 7))(t)
        np.testing.assert_array_equal(hist.numpy()[:, 2], one_h.numpy()[:, 2])
        np.testing.assert_allclose(
            hist.numpy()[:, :2], one_h.numpy()[:, :2], rtol=0, atol=edge_atol(tolerances, one_h.numpy())
        )  # graph rewrites
        np.testing.assert_array_equal(stats.numpy(), one_s.numpy())
        want = numpy_reference.numpy_stats(a)
        for name in ("elements", "nan", "pos_inf", "neg_inf", "zeros"):
            assert stats.numpy()[S[name]] == want[name], (a.dtype, a.shape, name)
        assert hist.numpy()[:, 2].sum() == want["elements"] - want["nan"] - want["pos_inf"] - want["neg_inf"]
