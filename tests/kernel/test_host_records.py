"""The fused kernel's loops built without TensorFlow (tb_layergrad/kernel/host_records.py, src/host_records.cc).

What a written JAX step reduces its tensors with, inside the step: the records against the exact reference
(`reference_checks`: counts exact, moments within their derived bounds), the histogram counts exactly those of
the written float64 edges, on the fused kernel's edge cases (NaN/Inf in later chunks, subnormals, one unique
value, magnitudes near float32's ends, float16/bfloat16/float64/integers); the same bits on any number of
threads; a failed build remembered and said once, with None for the caller's fallback; where JAX is installed,
the same bits from the FFI handler the compiled step calls. TensorFlow-free: it runs on the JAX leg too (well
under a second besides the builds).
"""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import pytest

from tb_layergrad import metadata
from tb_layergrad.kernel import cache as kernel_cache
from tb_layergrad.kernel import host_records

K = 30
CHUNK = 2**15  # kChunk in src/records_core.h: elements per unit of work
PARALLEL_MIN = 2**19  # kParallelMinElements: fewer in all, one thread

pytestmark = pytest.mark.kernel


def _big_with_specials(n: int) -> np.ndarray:
    """Several chunks; a NaN, both Infs and subnormals in later chunks, many exact zeros, the maximum last."""
    rng = np.random.default_rng(11)
    x = (rng.normal(size=n) * 3).astype(np.float32)
    x[x < -2] = 0.0
    x[[n // 4, n // 2, 3 * n // 4]] = [np.nan, np.inf, -np.inf]
    x[n - 10 : n - 8] = [1e-40, -3e-39]
    x[n - 1] = 50.0
    return x


def _at_edges(buckets: int = K) -> np.ndarray:
    """Each float64 edge of [-1, 1.3], the float32 values nearest it and one step either side."""
    left, _ = metadata.histogram_edges(-1.0, 1.3, buckets)
    near = np.asarray(left[1:], np.float64).astype(np.float32)
    up, down = np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))
    return np.concatenate([[-1.0, 1.3], near, up, down]).astype(np.float32)


def _cases() -> dict:
    rng = np.random.default_rng(5)
    block_overflow = rng.normal(size=40_000).astype(np.float32)
    block_overflow[35_000:35_002] = 2e38  # finite, but a float32 block sum overflows: that chunk in float64
    return {
        "normal": rng.normal(size=(128, 256)).astype(np.float32),
        "relu": np.maximum(rng.normal(size=(128, 10)), 0).astype(np.float32),
        "chunks_with_specials": _big_with_specials(140_001),
        "at_edges": _at_edges(),
        "at_edges_many_chunks": np.tile(_at_edges(), 2_000),
        "zeros": np.zeros((5, 5), np.float32),
        "one_value": np.full((7,), -0.5, np.float32),
        "all_nan": np.array([np.nan, np.nan], np.float32),
        "inf_and_one": np.array([np.inf, 2.0], np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "span_overflows_float32": np.array([3e38, -3e38, 1.0], np.float32),
        "near_float32_max": ((rng.random(300) * 2 - 1) * 3e38).astype(np.float32),
        "tiny": np.array([1e-23, 2e-23, 0.0], np.float32),
        "tiny_many": (rng.normal(size=200) * 1e-30).astype(np.float32),
        "block_sum_overflows": block_overflow,
        "large_mean": (rng.normal(size=500) + 1e4).astype(np.float32),
        "float16": rng.normal(size=(3, 4, 5)).astype(np.float16),
        "float16_ends": np.array([65504.0, -65504.0, np.nan, 6e-8, 0.0, -3e-5, np.inf], np.float16),
        "bfloat16": (rng.normal(size=3000) * 1e3).astype(ml_dtypes.bfloat16),
        "bfloat16_specials": np.array([np.nan, -np.inf, 1e-39, 3e38, -2.0], ml_dtypes.bfloat16),
        "float64": rng.normal(size=1000) * 1e-3,
        "float64_near_max": (rng.random(300) * 2 - 1) * 1.7e308,
        "float64_subnormal": np.array([5e-324, -1e-310, 1.0, np.nan, 2.0]),
        "int32": rng.integers(-5, 100, size=777).astype(np.int32),
        "int64_one_value": np.full(9, 7, np.int64),
        "bool": rng.random(50) > 0.5,
    }


CASES = _cases()


@pytest.fixture(scope="module", autouse=True)
def built():
    assert host_records.available(), f"the host reductions did not build here: {host_records.unavailable_reason()}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_records_match_the_reference_and_the_written_edges(name, reference_checks):
    x = CASES[name]
    stats, counts = host_records.records([x], K)
    assert stats.shape == (1, len(metadata.STAT_FIELDS)) and counts.shape == (1, K)
    reference_checks.check_stats(stats[0], x, "host records")
    np.testing.assert_array_equal(counts[0], reference_checks.edge_counts(x, K), err_msg=name)


@pytest.mark.parametrize("buckets", [1, 2, 16, 17, 31, 32, 33, 64, 100])
def test_the_buckets_are_those_of_the_written_edges_for_any_number_of_them(buckets, reference_checks):
    """Up to 32 edges are held in registers where the CPU has AVX-512, more are read from memory: either way
    (and in a block's last, partial vector) every element lands in the bucket of the written float64 edges."""
    rng = np.random.default_rng(buckets)
    edges = np.tile(_at_edges(buckets), 3)
    for x in (edges, rng.normal(size=CHUNK + 16 * 7 + 5).astype(np.float32), edges[: 16 * 3 + 9]):
        stats, counts = host_records.records([x], buckets)
        np.testing.assert_array_equal(counts[0], reference_checks.edge_counts(x, buckets), err_msg=f"{x.size}")
        reference_checks.check_stats(stats[0], x, f"{buckets} buckets, {x.size} elements")


def test_several_tensors_of_each_dtype_in_one_call_are_each_their_own(reference_checks):
    names = sorted(CASES)
    stats, counts = host_records.records([CASES[n] for n in names], K)
    for i, name in enumerate(names):
        alone_stats, alone_counts = host_records.records([CASES[name]], K)
        np.testing.assert_array_equal(stats[i], alone_stats[0], err_msg=name)
        np.testing.assert_array_equal(counts[i], alone_counts[0], err_msg=name)


def test_a_strided_view_is_read_as_its_values(reference_checks):
    x = np.arange(60, dtype=np.float32).reshape(6, 10)[:, ::3]
    stats, counts = host_records.records([x], K)
    reference_checks.check_stats(stats[0], np.ascontiguousarray(x), "strided")
    np.testing.assert_array_equal(counts[0], reference_checks.edge_counts(x, K))


def test_records_do_not_depend_on_the_number_of_threads(monkeypatch):
    """Fixed chunks, each written to its own slot and merged in order: one thread and several give the same bits
    (a step past the one-thread limit; its records on one thread are those checked above, chunk by chunk)."""
    xs = [_big_with_specials(PARALLEL_MIN + 3 * CHUNK + 7), CASES["normal"], CASES["float16"]]
    results = {}
    for threads in (1, 4):
        monkeypatch.setattr(host_records, "threads", lambda threads=threads: threads)
        results[threads] = host_records.records(xs, K)
    for one, several in zip(results[1], results[4]):
        np.testing.assert_array_equal(one, several)


def test_a_failed_build_is_said_once_and_leaves_the_fallback_to_the_caller(tmp_path, monkeypatch, caplog):
    compiler = tmp_path / "failing-c++"
    compiler.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "failing 1"; exit 0; fi\nexit 1\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv(kernel_cache.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(host_records, "_state", {})
    with caplog.at_level(logging.WARNING, logger="tb_layergrad"):
        assert host_records.records([CASES["normal"]], K) is None
        assert host_records.records([CASES["normal"]], K) is None
    assert "failed" in host_records.unavailable_reason()
    said = [r for r in caplog.records if "host reductions are not available" in r.getMessage()]
    assert len(said) == 1, caplog.text


def test_switched_off_with_the_kernels_switch(monkeypatch):
    monkeypatch.setenv(kernel_cache.ENV_SWITCH, "0")
    assert host_records.records([CASES["normal"]], K) is None
    assert host_records.unavailable_reason() == f"{kernel_cache.ENV_SWITCH}=0"


def test_the_jax_steps_ffi_call_gives_the_same_records_bit_for_bit():
    """The handler a compiled JAX step calls (src/jax_step_records.cc, `step_outputs`' way on the CPU) on every
    case above, all in one call as a step makes it, once on one thread and once with enough elements for all
    the cores: the same stats bits and counts as `records()` (held to the reference above), though XLA runs the
    step with subnormals flushed to zero; the integers and booleans widened inside the step as `records()` widens
    them."""
    jax = pytest.importorskip("jax")
    from tb_layergrad.jax import step_outputs

    assert step_outputs.reduced_by_the_loops(), host_records.step_handler_unavailable_reason()
    assert step_outputs.BUCKETS == K
    cases = [CASES[n] for n in sorted(CASES)]
    many = [*cases, np.tile(CASES["chunks_with_specials"], 4)]  # past PARALLEL_MIN: every core's thread
    assert sum(np.size(x) for x in cases) < PARALLEL_MIN <= sum(np.size(x) for x in many)
    for xs in (cases, many):
        with jax.enable_x64(True):
            stats, counts = jax.jit(lambda arrays: step_outputs._reduce(arrays))([jax.numpy.asarray(x) for x in xs])
        want_stats, want_counts = host_records.records(xs, K)
        np.testing.assert_array_equal(np.asarray(stats), want_stats)
        np.testing.assert_array_equal(np.asarray(counts), want_counts)
