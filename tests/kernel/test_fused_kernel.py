"""The fused reduction kernel (tb_layergrad/kernel/src/records.cc, histograms_and_stats.cc): the same records, one op.

Its numbers are checked against the independent numpy reference of the reduction property tests
(`test_reliability_reductions`, which also runs its generated tensors through the kernel) and against
the TensorFlow path; here: chunks (NaN, Inf and subnormal numbers in a later chunk of a large tensor),
one op per step in a graph, the build cache, and the fallback when the kernel cannot be built.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.kernel import cache as kernel_cache
from tb_layergrad.kernel import fused as fused_kernel
from tb_layergrad.statistics import reductions
from tb_layergrad.summary import write

S = metadata.STAT_INDEX
KERNEL_BLOCK = 256  # kBlock in tb_layergrad/kernel/src/records.cc: float32 partial sums of x and |x|
pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module", autouse=True)
def kernel_built():
    assert fused_kernel.op() is not None, f"the fused kernel did not build here: {fused_kernel.unavailable_reason()}"


def _big_with_specials() -> np.ndarray:
    """Four chunks of the kernel (2**15 elements each) and a rest; the specials all in later chunks."""
    rng = np.random.default_rng(11)
    x = (rng.normal(size=140_001) * 3).astype(np.float32)
    x[x < -2] = 0.0  # many exact zeros, like a ReLU's gradient
    x[40_000] = np.nan
    x[70_000] = np.inf
    x[100_000] = -np.inf
    x[130_000] = 1e-40  # subnormal: counts as a zero
    x[130_001] = -3e-39
    x[139_999] = 50.0  # the maximum, last chunk
    return x


def _block_sum_overflows(rng) -> np.ndarray:
    """Finite, but a float32 sum of one block of 256 in the second chunk overflows: that chunk is summed in float64."""
    x = rng.normal(size=40_000).astype(np.float32)
    x[35_000:35_002] = 2e38
    return x


def _cases() -> list:
    rng = np.random.default_rng(5)
    return [
        rng.normal(size=(128, 256)).astype(np.float32),
        np.maximum(rng.normal(size=(128, 10)), 0).astype(np.float32),
        _big_with_specials(),
        np.zeros((5, 5), np.float32),
        np.full((7,), -0.5, np.float32),
        np.array([np.nan, np.nan], np.float32),
        np.array([np.inf, 2.0], np.float32),
        np.array([], np.float32),
        np.array([3e38, -3e38, 1.0], np.float32),  # the span overflows float32: indices in float64
        np.array([1e-23, 2e-23, 0.0], np.float32),
        _block_sum_overflows(rng),
        (rng.normal(size=500) + 1e4).astype(np.float32),
        rng.normal(size=(3, 4, 5)).astype(np.float16),
        np.array([65504.0, -65504.0, np.nan, 6e-8], np.float16),
    ] + [tf.cast(tf.constant(rng.normal(size=300), tf.float32), tf.bfloat16)]


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.slow
def test_kernel_records_match_the_reference_and_the_tensorflow_path(graph, reference_checks, tolerances, monkeypatch):
    tensors = [tf.constant(a) if isinstance(a, np.ndarray) else a for a in _cases()]
    run = tf.function if graph else (lambda f: f)
    fused = run(lambda ts: write.reduce(ts, 30))(tensors)
    with monkeypatch.context() as env:
        env.setenv(kernel_cache.ENV_SWITCH, "0")
        plain = run(lambda ts: write.reduce(ts, 30))(tensors)
    for t, (hist, stats), (p_hist, p_stats) in zip(tensors, fused, plain):
        hist, stats = hist.numpy(), stats.numpy()
        reference_checks.check_stats(stats, t, "kernel")
        reference_checks.check_histogram(hist, t, 30, "kernel")
        where = f"{t.dtype.name} {t.shape}"
        counts = ("elements", "nan", "pos_inf", "neg_inf", "zeros")
        np.testing.assert_array_equal([stats[S[c]] for c in counts], [p_stats.numpy()[S[c]] for c in counts], where)
        # The same float64 edges (TensorFlow's batched path may round them apart) ...
        atol = tolerances.histogram_edge_atol(np.max(np.abs(hist[:, :2]), initial=0.0))
        np.testing.assert_allclose(hist[:, :2], p_hist.numpy()[:, :2], rtol=0, atol=atol, err_msg=where)
        if hist[:, 2].sum() and stats[S["max"]] > stats[S["min"]] and np.isfinite(stats[S["max"]] - stats[S["min"]]):
            lo, hi = stats[S["min"]], stats[S["max"]]  # ... exactly lo + i * (hi - lo) / k
            np.testing.assert_array_equal(hist[:, 0], [lo] + [lo + i * ((hi - lo) / 30) for i in range(1, 30)], where)
        # Moments: float64 sums here, float32 there, in orders that differ by CPU: each within its
        # derived bound of the independent reference (check_stats), hence within their sum of each other.
        reference_checks.check_stats(p_stats.numpy(), t, "tensorflow path")
        assert hist[:, 2].sum() == p_hist.numpy()[:, 2].sum(), where


def test_big_tensor_counts_every_chunk(tolerances):
    x = _big_with_specials()
    ((hist, stats),) = write.reduce([tf.constant(x)], 30)
    stats = stats.numpy()
    assert (stats[S["nan"]], stats[S["pos_inf"]], stats[S["neg_inf"]]) == (1, 1, 1)
    finite = x[np.isfinite(x)].astype(np.float64)
    finite[np.abs(finite) < np.finfo(np.float32).tiny] = 0.0
    assert stats[S["zeros"]] == np.sum(finite == 0)
    assert stats[S["max"]] == 50.0 and stats[S["min"]] == finite.min()
    n, f64, u64 = finite.size, np.float64, tolerances.unit_roundoff(np.float64)
    mean, std, abs_sum = finite.mean(), finite.std(), np.abs(finite).sum()
    # The kernel's sum of x (records.cc): float32 within blocks of KERNEL_BLOCK (clean chunks; the
    # lane count of `omp simd` follows -march=native: 8 on AVX2, 16 on AVX-512, so the order differs
    # by CPU), float64 across blocks and chunks and, element by element, in chunks holding NaN, Inf or
    # subnormals. Any order: blocked_sum_atol, at most n float64 additions. numpy's float64 sum, any
    # order: sum_atol. Each side's division by n rounds once more.
    sum_err = tolerances.blocked_sum_atol(
        abs_sum, n, KERNEL_BLOCK, np.float32, f64, outer_terms=n
    ) + tolerances.sum_atol(f64, n, abs_sum)
    mean_atol = sum_err / n + tolerances.TWO_SIDES * u64 * abs(mean)
    np.testing.assert_allclose(stats[S["mean"]], mean, rtol=0, atol=mean_atol)
    # The centred sum of squares, float64 on both sides, about means up to mean_atol apart: the
    # shift adds (mean error)^2 to the variance exactly; the n-term float64 sum of positive terms
    # (and the subtraction and the square) rounds within gamma(n + 2) of it; sqrt halves that.
    var_atol = mean_atol**2 + tolerances.TWO_SIDES * tolerances.gamma(n + 2, f64) * (std**2 + mean_atol**2)
    np.testing.assert_allclose(stats[S["std"]], std, rtol=0, atol=var_atol / std + tolerances.TWO_SIDES * u64 * std)
    # Squares of float32 numbers are exact in float64; their n-term float64 sum (positive terms) is
    # within gamma(n - 1) on each side; sqrt halves that and rounds once.
    np.testing.assert_allclose(
        stats[S["norm"]],
        np.sqrt(np.sum(finite**2)),
        rtol=tolerances.TWO_SIDES * (tolerances.sum_rtol(f64, n) / 2 + u64),
    )
    assert hist.numpy()[:, 2].sum() == finite.size


# The records of a step larger than the kernel's one-thread limit (kParallelMinElements in records.cc), in a
# process with `threads` intra-op threads: tensors with NaN, Inf, subnormals and a float16 one, saved to a file.
_THREADS_CODE = """
import sys
import numpy as np, tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from tb_layergrad.kernel import fused
rng = np.random.default_rng(3)
big = (rng.normal(size=700_001) * 3).astype(np.float32)
big[big < -2] = 0.0
big[[40_000, 300_000, 500_000, 650_000]] = [np.nan, np.inf, -np.inf, 1e-40]
xs = [big, rng.normal(size=(784, 256)).astype(np.float32) * 1e-3, rng.normal(size=(256,)).astype(np.float32),
      rng.normal(size=(300, 300)).astype(np.float16)]
hist, stats = fused.histograms_and_stats([tf.constant(x) for x in xs], 30)
np.savez(sys.argv[2], hist=hist.numpy(), stats=stats.numpy())
"""


@pytest.mark.slow
def test_records_do_not_depend_on_the_number_of_threads(tmp_path):
    """Fixed chunks, merged in their order (records.cc): one thread and several give the same bits."""
    files = {n: tmp_path / f"threads{n}.npz" for n in (1, 4)}
    runs = {
        n: subprocess.Popen([sys.executable, "-c", _THREADS_CODE, str(n), str(f)], stderr=subprocess.PIPE, text=True)
        for n, f in files.items()
    }
    for run in runs.values():
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
    one, several = (np.load(files[n]) for n in (1, 4))
    assert one["stats"][0, S["nan"]] == 1 and one["stats"][0, S["zeros"]] > 0  # the specials were read
    np.testing.assert_array_equal(one["stats"], several["stats"])
    np.testing.assert_array_equal(one["hist"], several["hist"])


def test_a_step_reduces_every_tensor_in_one_op(monkeypatch):
    tensors = [tf.random.normal([128, 256]), tf.random.normal([128, 10]), tf.random.normal([4], dtype=tf.float64)]
    fn = tf.function(lambda ts: write.reduce(ts, 30))
    graph = fn.get_concrete_function(tensors).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count(fused_kernel.OP_NAME) == 1
    # The float64 tensor takes TensorFlow's path (the kernel reads 16- and 32-bit floats only).
    result = fn(tensors)
    assert len(result) == 3
    with monkeypatch.context() as env:
        env.setenv(kernel_cache.ENV_SWITCH, "0")
        alone = reductions.histogram_and_stats(tensors[2], 30)
    np.testing.assert_array_equal(result[2][1].numpy(), alone[1].numpy())


def test_build_is_cached_per_source_and_tensorflow():
    first = fused_kernel.build()
    mtime = first.stat().st_mtime_ns
    assert fused_kernel.build() == first
    assert first.stat().st_mtime_ns == mtime  # not rebuilt
    assert tf.__version__ and first.name.startswith("histograms_and_stats-")


def test_a_broken_compiler_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setenv(fused_kernel.ENV_CACHE, str(tmp_path))
    with pytest.raises(RuntimeError, match="failed"):
        fused_kernel.build(compiler="/bin/false")
    assert not list(tmp_path.glob("*.so"))  # nothing half-written is left to be loaded


@pytest.mark.slow
def test_without_the_kernel_the_records_are_the_same(tmp_path):
    """A machine without a compiler (or TB_LAYERGRAD_FUSED=0) gets TensorFlow's ops and the same records."""
    code = (
        "import numpy as np, tensorflow as tf\n"
        "from tb_layergrad.kernel import fused as fused_kernel\nfrom tb_layergrad.statistics import reductions\n"
        "h, s = reductions.histogram_and_stats(tf.constant([1.0, 2.0, float('nan'), 4.0]), 3)\n"
        "print(fused_kernel.op() is None, '|', fused_kernel.unavailable_reason(), '|', s.numpy()[:5].tolist(), h.numpy()[:, 2].tolist())\n"
    )
    env = dict(os.environ, CXX="/nonexistent/c++", PATH="/nonexistent", **{fused_kernel.ENV_CACHE: str(tmp_path)})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    unavailable, reason, numbers = out.stdout.strip().splitlines()[-1].split(" | ")
    assert unavailable == "True" and "no C++ compiler" in reason
    assert "TensorFlow ops are used instead" in out.stderr
    assert numbers == "[4.0, 1.0, 0.0, 0.0, 0.0] [1.0, 1.0, 1.0]"

    env = dict(os.environ, **{kernel_cache.ENV_SWITCH: "0"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].split(" | ")[:2] == ["True", f"{kernel_cache.ENV_SWITCH}=0"]


def test_the_switch_is_read_each_time_a_step_is_traced(monkeypatch):
    """`TB_LAYERGRAD_FUSED=0` set after the kernel was loaded (a notebook, a comparison in one process) takes effect
    for the next traced step, and unset brings the kernel back: what a step uses is what the user set."""
    available = fused_kernel.op() is not None
    step = lambda: tf.function(lambda t: write.reduce([t], 30)).get_concrete_function(tf.ones([8]))  # noqa: E731

    def fused_ops(concrete) -> int:
        return [op.type for op in concrete.graph.get_operations()].count(fused_kernel.OP_NAME)

    assert fused_ops(step()) == (1 if available else 0)
    monkeypatch.setenv(kernel_cache.ENV_SWITCH, "0")
    assert fused_kernel.op() is None and fused_kernel.unavailable_reason() == f"{kernel_cache.ENV_SWITCH}=0"
    assert fused_ops(step()) == 0
    monkeypatch.delenv(kernel_cache.ENV_SWITCH)
    assert (fused_kernel.op() is not None) == available
    assert fused_ops(step()) == (1 if available else 0)


def test_the_host_build_computes_the_kernels_statistics_bit_for_bit():
    """kernel/host_records (inside JAX's step) runs the same loops (src/records_core.h) without TensorFlow: the
    same stats bits on every case above; its counts are those of the written float64 edges, which the kernel's
    float32 index may put an element next to an edge on either side of (docs/FORMAT.md), so only their sum is
    the same here (tests/kernel/test_host_records.py checks them exactly)."""
    from tb_layergrad.kernel import host_records

    tensors = [tf.constant(a) if isinstance(a, np.ndarray) else a for a in _cases()]
    hist, stats = fused_kernel.histograms_and_stats(tensors, 30)
    host_stats, host_counts = host_records.records([t.numpy() for t in tensors], 30)
    np.testing.assert_array_equal(host_stats, stats.numpy())
    np.testing.assert_array_equal(host_counts.sum(axis=1), hist.numpy()[:, :, 2].sum(axis=1))
