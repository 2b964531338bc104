"""tb_layergrad.reader.downsample against a brute-force numpy reference (one bin at a time)."""

from __future__ import annotations

import numpy as np
import pytest

from tb_layergrad.reader import anomalies, downsample

N = 100_000
NAN_ROW = 61_234  # a NaN step inside a bin (not a bin's first or last step)


def reference(steps, columns, bins, start, end):
    """Per non-empty bin, by brute force: (first, last, count, min, max, any non-finite) of each column."""
    span = end - start + 1
    out = []
    for b in range(bins):
        lo_step = start + span * b / bins
        hi_step = start + span * (b + 1) / bins
        rows = np.flatnonzero((steps >= lo_step) & (steps < hi_step) & (steps >= start) & (steps <= end))
        if not rows.size:
            continue
        vals = columns[:, rows]
        finite = np.isfinite(vals)
        mins = [float(v[f].min()) if f.any() else np.nan for v, f in zip(vals, finite)]
        maxs = [float(v[f].max()) if f.any() else np.nan for v, f in zip(vals, finite)]
        out.append((int(steps[rows[0]]), int(steps[rows[-1]]), len(rows), mins, maxs, list((~finite).any(axis=1))))
    return out


def long_series(seed: int = 0):
    rng = np.random.default_rng(seed)
    steps = np.arange(N, dtype=np.int64) * 3 + 7  # not starting at 0, not unit spaced
    columns = np.stack(
        [
            np.exp(rng.normal(size=N)),  # a norm-like positive column
            rng.normal(size=N) * 1e-3,  # a signed one
        ]
    )
    columns[0, NAN_ROW] = np.nan
    columns[1, NAN_ROW + 5] = np.inf
    return steps, columns


def check(binned, ref):
    assert len(binned) == len(ref)
    for b, (first, last, count, mins, maxs, bad) in enumerate(ref):
        assert (binned.first[b], binned.last[b], binned.count[b]) == (first, last, count)
        np.testing.assert_array_equal(binned.lo[:, b], mins)  # exact: min/max pick a value, no arithmetic
        np.testing.assert_array_equal(binned.hi[:, b], maxs)
        assert list(binned.not_finite[:, b]) == bad


@pytest.mark.parametrize("bins", [1, 7, 1000])
def test_bins_of_a_100000_step_series_match_brute_force(bins):
    steps, columns = long_series()
    binned = downsample.downsample(steps, columns, bins, recorded=np.ones(columns.shape, bool))
    assert len(binned) == bins
    check(binned, reference(steps, columns, bins, int(steps[0]), int(steps[-1])))


def test_the_nan_step_is_flagged_in_its_bin_and_kept_exactly():
    steps, columns = long_series()
    flags = np.where(np.isfinite(columns), 0, anomalies.NONFINITE).astype(np.uint8)
    binned = downsample.downsample(steps, columns, 800, flags=flags, recorded=np.ones(columns.shape, bool))
    b = int(np.searchsorted(binned.last, steps[NAN_ROW]))
    assert binned.first[b] < steps[NAN_ROW] < binned.last[b]  # inside the bin, not at its edge
    assert binned.not_finite[0, b] and binned.flags[0, b] == anomalies.NONFINITE
    rows = (steps >= binned.first[b]) & (steps <= binned.last[b])
    assert binned.hi[0, b] == np.nanmax(columns[0, rows]) and binned.lo[0, b] == np.nanmin(columns[0, rows])
    assert list(binned.kept) == [NAN_ROW, NAN_ROW + 5]


def test_a_range_is_binned_alone_and_empty_bins_are_left_out():
    steps, columns = long_series()
    start, end = int(steps[NAN_ROW - 100]), int(steps[NAN_ROW + 100])
    binned = downsample.downsample(steps, columns, 50, start, end, recorded=np.ones(columns.shape, bool))
    check(
        binned,
        reference(steps[NAN_ROW - 150 : NAN_ROW + 150], columns[:, NAN_ROW - 150 : NAN_ROW + 150], 50, start, end),
    )
    sparse = downsample.downsample(np.array([0, 1, 1000]), np.array([[1.0, 2.0, 3.0]]), 10)
    assert list(sparse.first) == [0, 1000] and list(sparse.last) == [1, 1000] and list(sparse.hi[0]) == [2.0, 3.0]


def test_missing_values_are_not_non_finite_ones():
    steps = np.arange(10)
    columns = np.array([[1.0, np.nan, np.nan, 4, 5, 6, 7, 8, 9, 10]])
    recorded = np.ones_like(columns, bool)
    recorded[0, 2] = False  # step 2: no record; step 1: a NaN value
    binned = downsample.downsample(steps, columns, 5, recorded=recorded)
    assert list(binned.not_finite[0]) == [True, False, False, False, False]
    binned = downsample.downsample(steps, columns, 5)  # default: NaN means missing
    assert list(binned.not_finite[0]) == [False] * 5 and list(binned.recorded[0]) == [True, True, True, True, True]
    only_missing = downsample.downsample(steps, columns, 10)
    assert not only_missing.recorded[0, 2] and np.isnan(only_missing.hi[0, 2])


def test_kept_steps_are_onsets_and_bounded_with_the_most_serious_first():
    steps = np.arange(20)
    flags = np.zeros((2, 20), np.uint8)
    flags[0, :] = anomalies.DEAD  # dead all along: one onset
    flags[1, 5:9] = anomalies.VANISHING
    flags[1, 12] = anomalies.NONFINITE
    flags[1, 14] = anomalies.NONFINITE
    binned = downsample.downsample(steps, np.ones((2, 20)), 4, flags=flags)
    assert list(binned.kept) == [0, 5, 12, 14]
    assert list(binned.flags[1]) == [0, anomalies.VANISHING, anomalies.NONFINITE, 0]
    bounded = downsample.downsample(steps, np.ones((2, 20)), 4, flags=flags, keep_limit=2)
    assert list(bounded.kept) == [12, 14]


def test_run_flags_are_the_rules_on_the_whole_run():
    steps = np.arange(30)
    table = np.zeros((30, 12))
    from tb_layergrad.reader import series

    S = {name: i for i, name in enumerate(series.STORED_STATS)}
    table[:, S["elements"]] = 100
    table[:, S["norm"]] = 1.0
    table[20, S["nan"]] = 2
    flags, rec = downsample.run_flags([(steps, table)], steps[10:])
    assert rec.all() and flags[0, 10] == anomalies.NONFINITE and flags[0].sum() == anomalies.NONFINITE


def test_steps_near_2_to_the_63_do_not_overflow():
    top = 2**63 - 1
    steps = np.array([top - 9, top - 5, top], dtype=np.int64)
    binned = downsample.downsample(steps, np.array([[1.0, 2.0, 3.0]]), 2)
    assert list(binned.first) == [top - 9, top] and list(binned.last) == [top - 5, top]
    wide = downsample.downsample(np.array([0, 2**62, top], dtype=np.int64), np.array([[1.0, 2.0, 3.0]]), 2)
    assert list(wide.first) == [0, 2**62] and list(wide.last) == [0, top]
