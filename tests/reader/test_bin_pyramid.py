"""The binned answer of a whole run from power-of-two bins appended to (`reader.bin_pyramid`) is `downsample`'s.

Why: the plugin's binned `matrix` of a run being written adds each change's new rows to the bins it keeps
instead of binning every step again; nothing may tell its answer from `downsample.downsample` over the whole
run. Tables grow as the plugin's store grows them (new rows written after the others in the same memory); after
each of many generated appends (NaN and Inf values, flags that start and stop, steps with gaps), for bin counts
from one to more than the rows, every field and the kept rows' values and flags are equal; a table read anew is
binned whole.
"""

from __future__ import annotations

import numpy as np
import pytest

from tb_layergrad import metadata
from tb_layergrad.reader import anomalies, bin_pyramid, downsample, series
from tb_layergrad.reader.bin_pyramid import BinPyramids
from tb_layergrad.reader.stats_store import StatsRows, column_major

LAYERS = 3
S = metadata.STAT_INDEX
FLAG_KINDS = np.array([anomalies.NONFINITE, anomalies.VANISHING, anomalies.EXPLODING, anomalies.DEAD], np.uint8)


def _check(got, tables, flags, stat: str, bins: int, values=None) -> None:
    if values is None:
        values = np.stack([series.stat_column(t.table, stat) for t in tables])
    want = downsample.downsample(tables[0].steps, values, bins, flags=flags, recorded=np.ones(values.shape, bool))
    b, kept = got
    for field in ("first", "last", "count", "not_finite", "recorded", "flags", "kept"):
        np.testing.assert_array_equal(getattr(b, field), getattr(want, field), err_msg=field)
    np.testing.assert_array_equal(b.lo, want.lo)  # NaN where a bin has no finite value, as there
    np.testing.assert_array_equal(b.hi, want.hi)
    np.testing.assert_array_equal(kept.values, values[:, want.kept])
    np.testing.assert_array_equal(kept.flags, flags[:, want.kept])


@pytest.mark.parametrize("seed", [0, 1])
def test_bins_appended_to_equal_the_whole_runs_binning(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    made = []
    real = BinPyramids._new  # noqa: SLF001 - counted, not replaced
    monkeypatch.setattr(BinPyramids, "_new", staticmethod(lambda c: made.append(1) or real(c)))
    room = column_major(3000, LAYERS)
    steps = np.cumsum(rng.integers(1, 4, 3000)).astype(np.int64)
    room[:] = rng.lognormal(size=room.shape)
    norms = room[:, :, S["norm"]]
    norms[rng.random(norms.shape) < 0.01] = np.nan
    norms[rng.random(norms.shape) < 0.005] = np.inf
    room[:, :, S["nan"]] = np.where(rng.random(norms.shape) < 0.01, 2, 0)
    flags = np.where(rng.random((LAYERS, 3000)) < 0.04, rng.choice(FLAG_KINDS, (LAYERS, 3000)), 0).astype(np.uint8)
    flags[1, 500:700] = anomalies.VANISHING  # a long episode: one kept row where it starts
    pyramids, n = BinPyramids(), 0
    for i in range(20):
        n += int(rng.integers(1, 150))
        if i == 12:  # read anew: other memory, binned whole
            room = room.copy()
        tables = [StatsRows(steps[:n], steps[:n].astype(float), room[:n, j, :]) for j in range(LAYERS)]
        for stat in ("norm", "nonfinite"):
            for bins in (1, 7, 1000):
                got = pyramids.binned((stat, bins), tables, stat, flags[:, :n], bins)
                _check(got, tables, flags[:, :n], stat, bins)
        for bins in (7,):  # one layer's statistics (the `stats` route), its flags on each
            got = pyramids.binned_stats(("one", bins), tables[1], series.ALL_STATS, flags[1:2, :n], bins)
            values = np.stack([series.stat_column(tables[1].table, name) for name in series.ALL_STATS])
            _check(got, tables, np.repeat(flags[1:2, :n], len(values), axis=0), "", bins, values)
    assert len(made) == (2 * 3 + 1) * 2  # each (stat, bins) once at first and once read anew, extended otherwise


def test_what_the_pyramid_cannot_answer_is_left_to_downsample():
    steps = np.arange(100, dtype=np.int64)
    table = np.ones((100, len(series.STORED_STATS)))
    whole = StatsRows(steps, steps.astype(float), table)
    other = StatsRows(steps[::2], steps[::2].astype(float), table[::2])
    flags = np.zeros((2, 100), np.uint8)
    pyramids = BinPyramids()
    assert pyramids.binned("k", [whole, other], "norm", flags, 10) is None  # layers at other steps
    huge = StatsRows(np.array([0, 2**61], np.int64), np.zeros(2), np.ones((2, len(series.STORED_STATS))))
    assert pyramids.binned("h", [huge], "norm", np.zeros((1, 2), np.uint8), 4) is None  # bins computed in floats
    assert bin_pyramid.BinPyramids().binned("e", [], "norm", flags[:0], 10) is None
