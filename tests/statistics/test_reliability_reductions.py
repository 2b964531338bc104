"""Property tests of the reductions and the summary ops.

Random shapes, dtypes (float16, bfloat16, float32, float64), values mixing NaN/+-Inf, zeros, empty
tensors, a single unique value, magnitudes near the dtype's max (sums of squares overflow) and tiny
ones (squares underflow), in six ways of running: eager and inside `tf.function`, each with the
fused kernel (`fused_kernel`), TensorFlow's fast path without it (`xla_safe=False`) and the general
path (`xla_safe=True`); the general path also under XLA.

The reference is computed here with numpy/`math` in float64 with an overflow-safe scaling, so it is
right even where a naive float64 sum of squares overflows. Rules checked (docs/FORMAT.md, "Numerical
limits"):
- counts (elements, nan, pos_inf, neg_inf, zeros, histogram total) are exact;
- min/max are exact; mean, std, norm, mean_abs are within a bound set by the compute dtype's epsilon;
- a moment is +-Inf only if its true value does not fit in float64 (only `norm` can), never NaN
  when there is a finite element;
- histogram edges are finite, ordered, `right[i] == left[i+1]`, first = min, last = max; counts
  equal numpy's over those edges except for elements within rounding of an edge;
- TensorFlow's CPU kernels flush subnormal numbers to zero, so the reference does the same in the
  compute dtype (a subnormal counts as a zero).

A crash (TensorFlow kernels can segfault) cannot be reported by hypothesis: run with
`RELIABILITY_TRACE=/tmp/cases.txt` and the last line of that file is the input that crashed.

Example counts are kept moderate (`EXAMPLES`) so this file runs in well under a minute on 2 cores;
`RELIABILITY_EXAMPLES_SCALE=10` multiplies them for a longer hunt.
"""

from __future__ import annotations

import collections
import contextlib
import os
import zlib
from typing import Dict

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tb_layergrad import metadata, summary
from tb_layergrad.statistics import reductions

S = metadata.STAT_INDEX
SCALE = int(os.environ.get("RELIABILITY_EXAMPLES_SCALE", "1"))
EXAMPLES = {
    "eager-kernel": 150 * SCALE,
    "function-kernel": 60 * SCALE,
    "eager-fast": 150 * SCALE,
    "eager-general": 150 * SCALE,
    "function-fast": 60 * SCALE,
    "function-general": 60 * SCALE,
    "xla-general": 15 * SCALE,
    "summary-op": 25 * SCALE,
}
DTYPES = {"float16": tf.float16, "bfloat16": tf.bfloat16, "float32": tf.float32, "float64": tf.float64}
BUCKETS = [1, 2, 7, 30]  # few: each is one more trace in the tf.function modes


# -- inputs -----------------------------------------------------------------------------------------


def _specials(dtype_name: str):
    info = np.finfo(np.float32 if dtype_name == "bfloat16" else dtype_name)
    big, tiny = float(info.max), float(info.tiny)
    return [
        0.0,
        -0.0,
        1.0,
        -1.0,
        float("nan"),
        float("inf"),
        float("-inf"),
        big,
        -big,
        big / 2,
        -big / 3,
        big * 0.999,
        tiny,
        -tiny,
        tiny * 3,
        float(info.eps),
        1e-3,
        65504.0 if dtype_name == "float16" else 1e30,
    ]


@st.composite
def tensors(draw):
    """(dtype name, numpy float64/float32 values that the dtype holds exactly, shape)."""
    name = draw(st.sampled_from(list(DTYPES)))
    width = {"float16": 16, "bfloat16": 32, "float32": 32, "float64": 64}[name]
    rank = draw(st.integers(0, 3))
    if rank == 0:
        shape = ()
    else:
        # sampled_from: uniform, where integers() would favour 0 (an empty tensor) heavily.
        dims = st.sampled_from([1, 2, 3, 4, 5, 0]) if rank > 1 else st.sampled_from(list(range(1, 301)) + [0])
        shape = tuple(draw(st.lists(dims, min_size=rank, max_size=rank)))
    kind = draw(st.sampled_from(["floats", "specials", "unique", "narrow", "huge", "tiny", "normal"]))
    np_dtype = {16: np.float16, 32: np.float32, 64: np.float64}[width]
    if kind == "floats":  # hypothesis' own float generator: edge values, subnormals, NaN, Inf
        elements = st.floats(width=width, allow_nan=True, allow_infinity=True, allow_subnormal=True)
        x = draw(hnp.arrays(np_dtype, shape, elements=elements))
    elif kind == "specials":
        x = draw(hnp.arrays(np_dtype, shape, elements=st.sampled_from(_specials(name))))
    elif kind == "unique":
        value = draw(st.sampled_from(_specials(name) + [3.25, -7.5e-3]))
        x = np.full(shape, value, np_dtype)
    else:
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        info = np.finfo(np.float32 if name == "bfloat16" else np_dtype)
        base = rng.normal(size=shape)
        with np.errstate(over="ignore"):  # float16 'tiny' * 2**40 overflows to inf: wanted
            if kind == "narrow":  # one large offset, a tiny spread: catastrophic cancellation
                x = (1000.0 + base * 1e-2).astype(np_dtype)
            elif kind == "huge":  # near the max: sums of squares and spans overflow
                x = (np.clip(base, -1.0, 1.0) * float(info.max) * 0.99).astype(np_dtype)
            elif kind == "tiny":  # squares underflow (and some elements are subnormal)
                x = (base * float(info.tiny) * 2.0 ** draw(st.integers(0, 40))).astype(np_dtype)
            else:
                x = (base * 10.0 ** draw(st.integers(-6, 6))).astype(np_dtype)
        if x.size and draw(st.booleans()):  # sprinkle NaN / Inf
            flat = x.reshape(-1)
            for _ in range(draw(st.integers(1, 3))):
                flat[draw(st.integers(0, x.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    x = np.asarray(x)
    if name == "bfloat16":  # what the tensor really holds after rounding to bfloat16
        x = tf.cast(tf.constant(x.astype(np.float32)), tf.bfloat16)
    else:
        x = tf.constant(x)
    return name, x


# -- the reference ----------------------------------------------------------------------------------


def marked(mode: str, *rest):
    """A parameter set of `mode`; the fused kernel's modes are marked `kernel` (skipped where it cannot be built)."""
    return pytest.param(mode, *rest, marks=[pytest.mark.kernel] if mode.endswith("kernel") else [])


# -- the four ways of running -----------------------------------------------------------------------

_FUNCTIONS: Dict[tuple, object] = {}


def run(fused_kernel, mode: str, x: tf.Tensor, buckets: int):
    """`kernel`: the fused kernel (float64 still on TensorFlow's fast path); `fast`: TensorFlow's ops
    without it; `general`: the masked path (`xla_safe=True`). `fused_kernel`: the fixture, its switch."""
    xla_safe = mode.endswith("general")
    if mode.endswith("kernel"):
        assert fused_kernel.missing() is None, f"the fused kernel did not build: {fused_kernel.missing()}"
    with fused_kernel.off() if mode.endswith("fast") else contextlib.nullcontext():
        if mode.startswith("eager"):
            return reductions.histogram_and_stats(x, buckets, xla_safe=xla_safe)
        key = (mode, x.dtype, buckets)
        if key not in _FUNCTIONS:  # one trace per dtype and bucket count: shapes are left unknown
            spec = tf.TensorSpec(None, x.dtype)
            fn = lambda t: reductions.histogram_and_stats(t, buckets, xla_safe=xla_safe)  # noqa: E731
            _FUNCTIONS[key] = tf.function(fn, input_signature=[spec], jit_compile=mode.startswith("xla") or None)
        return _FUNCTIONS[key](x)  # traced on the first call: inside the `off()` above


def _property(reference_checks, fused_kernel, mode: str, tally: collections.Counter):
    @seed(zlib.crc32(mode.encode()))  # reproducible, and different inputs in each mode
    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=tensors(), buckets=st.sampled_from(BUCKETS))
    def prop(case, buckets):
        _, x = case
        _count(tally, x)
        if os.environ.get("RELIABILITY_TRACE"):
            with open(os.environ["RELIABILITY_TRACE"], "a") as f:
                print(
                    "CASE",
                    x.dtype.name,
                    x.shape,
                    buckets,
                    repr(tf.cast(x, tf.float64).numpy().reshape(-1).tolist()),
                    file=f,
                )
        hist, stats = run(fused_kernel, mode, x, buckets)
        reference_checks.check_stats(stats.numpy(), x, mode)
        reference_checks.check_histogram(hist.numpy(), x, buckets, mode)

    return prop


def _count(tally: collections.Counter, x: tf.Tensor) -> None:
    v = tf.cast(x, tf.float64).numpy()
    tally["cases"] += 1
    tally[x.dtype.name] += 1
    tally["empty"] += v.size == 0
    tally["with_nan_or_inf"] += bool((~np.isfinite(v)).any())


def _run_property(reference_checks, reliability_fixtures, fused_kernel, mode: str) -> None:
    tally: collections.Counter = collections.Counter()
    _property(reference_checks, fused_kernel, mode, tally)()
    reliability_fixtures.record("reductions", f"generated tensors: {mode}", tally.pop("cases"), **tally)


@pytest.mark.parametrize(
    "mode",
    [
        marked(m)
        for m in ("eager-kernel", "function-kernel", "eager-fast", "eager-general", "function-fast", "function-general")
    ],
)
@pytest.mark.slow
def test_reductions_property(mode, reference_checks, reliability_fixtures, fused_kernel):
    _run_property(reference_checks, reliability_fixtures, fused_kernel, mode)


@pytest.mark.slow
def test_reductions_property_under_xla(reference_checks, reliability_fixtures, fused_kernel):
    _run_property(reference_checks, reliability_fixtures, fused_kernel, "xla-general")


def test_summary_op_property(tmp_path_factory, reference_checks, reliability_fixtures, tb_reading):
    """`summary.gradient` writes exactly what the reductions compute, with the right metadata."""

    @settings(
        max_examples=EXAMPLES["summary-op"],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=tensors(), buckets=st.sampled_from(BUCKETS), step=st.integers(0, 2**63 - 1))
    def prop(case, buckets, step):
        name, x = case
        _count(tally, x)
        logdir = tmp_path_factory.mktemp("summary_prop")
        writer = tf.summary.create_file_writer(str(logdir / "run"))
        with writer.as_default():
            assert bool(summary.histogram_and_stats("m/<b>ä</b>", x, step=step, buckets=buckets, max_elements=16))
        writer.close()
        recs = tb_reading.read_all(str(logdir))["run"]
        kinds = {info.kind: (info, datums) for info, datums in recs.values()}
        assert {"histogram", "stats", "tensor"} <= set(kinds)
        for info, datums in kinds.values():
            assert info.layer == "m/<b>ä</b>" and info.dtype == name
            assert [d.step for d in datums] == [step]
        reference_checks.check_stats(kinds["stats"][1][0].numpy, x, "summary")
        reference_checks.check_histogram(kinds["histogram"][1][0].numpy, x, buckets, "summary")
        raw = kinds["tensor"][1][0].numpy
        assert raw.dtype == np.float32 and 0 < raw.size <= 16 or x.shape.num_elements() == 0

    tally: collections.Counter = collections.Counter()
    prop()
    reliability_fixtures.record(
        "reductions", "generated tensors: summary op, written and read back", tally.pop("cases"), **tally
    )


# Inputs the properties above found failing before the fixes (kept as fixed examples).
REGRESSIONS = [
    # tiny float64 range: histogram_fixed_width's bucket width flushed to 0 -> NaN index -> SIGSEGV
    ("float64", [2.3e-308, 2.5e-308, 2.4e-308], 30),
    ("bfloat16", [1.7014118346046923e38], 1),  # float32 sum of squares overflowed: norm inf
    ("bfloat16", [1.1754943508222875e-38], 1),  # square underflowed: norm 0
    ("float32", [1e-23, 2e-23], 4),  # a vanishing gradient read as norm 0, std 0
    ("float32", [3e38, 3e38, -1e38], 4),  # mean/std/norm inf; span overflow put 3e38 in bucket 1
    ("float64", [1e300, -1e300, 1e308], 4),  # std, norm inf
    ("float64", [-1.7e308, 1.7e308, 0.0], 3),  # hi - lo overflows float64: edges must stay finite
    ("bfloat16", [1.4693679385278594e-39], 1),  # XLA: a subnormal counted as non-zero but min 0
    ("float64", [2.7975902817924e-309], 1),  # fast path: counted as a zero, but min/max kept it
    ("float64", [4.54e-308, -5.69e-308, 9.3e-309, -1.26e-308, -1.0e-308], 7),  # bucket width flushed to 0
    ("float64", [2.2250738585072014e-308, 1.7976931348623157e308], 1),  # first edge lost lo (scaled to 0)
]


XLA_REGRESSIONS = [
    ("bfloat16", [1.4693679385278594e-39]),
    ("float64", [-1.7e308, 1.7e308, 0.0]),
    ("float64", [1e300, -1e300, 1e308]),
]  # where XLA behaves differently


@pytest.mark.parametrize(
    "mode,dtype,values,buckets",
    [
        marked(mode, *case)
        for case in REGRESSIONS
        for mode in ("eager-kernel", "eager-fast", "eager-general", "function-fast", "xla-general")
        if not mode.startswith("xla") or case[:2] in XLA_REGRESSIONS
    ],  # an XLA compile takes ~1 s
)
@pytest.mark.slow
def test_found_inputs(mode, dtype, values, buckets, reference_checks, fused_kernel):
    x = tf.cast(tf.constant(values, tf.float64 if dtype == "float64" else tf.float32), DTYPES[dtype])
    hist, stats = run(fused_kernel, mode, x, buckets)
    reference_checks.check_stats(stats.numpy(), x, mode)
    reference_checks.check_histogram(hist.numpy(), x, buckets, mode)


def test_counts_stay_exact_past_float32_integers():
    """2**24 + 1 elements: the fast path kept its count in float32, which rounds it to 2**24."""
    n = 2**24 + 1
    two_values = tf.concat([tf.zeros([n - 1], tf.float16), tf.ones([1], tf.float16)], 0)
    hist, stats = reductions.histogram_and_stats(two_values, 4)
    assert stats.numpy()[S["elements"]] == n and stats.numpy()[S["zeros"]] == n - 1
    assert hist.numpy()[:, 2].sum() == n
    hist, stats = reductions.histogram_and_stats(tf.zeros([n], tf.float16), 4)  # one unique value
    assert stats.numpy()[S["elements"]] == n and hist.numpy()[-1, 2] == n


@pytest.mark.parametrize("mode", ["eager-fast", "function-fast", "eager-general", "function-general"])
@pytest.mark.parametrize("value", [0.1, 1 / 3, -3.7, 2.5e-30])
def test_one_unique_value_is_its_own_mean_with_std_zero(mode, value, fused_kernel):
    """A tensor of one unique value (a step's scalar target value is one) has that value as its mean and std 0,
    exactly: not a rounded sum's, and without leaving the fast path (the one path of a batch)."""
    for shape in ([], [7], [3, 5]):
        x = tf.fill(shape, tf.constant(value, tf.float32))
        hist, stats = run(fused_kernel, mode, x, 30)
        stats = stats.numpy()
        assert stats[S["mean"]] == np.float32(value) and stats[S["std"]] == 0.0, (mode, shape, stats)
        assert stats[S["min"]] == stats[S["max"]] == np.float32(value)
        assert hist.numpy()[-1, 2] == max(1, int(np.prod(shape))) and hist.numpy()[:-1, 2].sum() == 0
