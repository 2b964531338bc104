"""`points=N` on matrix, stats and compare (docs/HTTP_API.md, "Binned answers"), through a real TensorBoard.

A run of 100,000 steps x 3 layers (tests/long_fixtures.py) served by `tensorboard --load_fast=true`;
every bin is checked against numpy applied to the tables that were written, and the NaN step (inside
a bin) and the exploding spike must come back exactly.
"""

from __future__ import annotations

import json
import time
import urllib.parse

import numpy as np
import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory, long_fixtures, tensorboard_process):
    logdir = str(tmp_path_factory.mktemp("long"))
    written = long_fixtures.write_long_logdir(logdir)
    tb = tensorboard_process.TensorBoardProcess(
        logdir, str(tmp_path_factory.mktemp("log") / "tb.log"), load_fast="true", reload_interval=0
    )
    try:
        tb.wait_for_runs({long_fixtures.RUN: long_fixtures.STEPS - 1}, timeout=120)
        yield tb, written
    finally:
        tb.stop()


def get(tensorboard_process, tb, route: str, status: int = 200, **query):
    started = time.perf_counter()
    code, body, _ = tb.get(tensorboard_process.PLUGIN_API + route + "?" + urllib.parse.urlencode(query), timeout=120)
    print(f"{route} {query}: {time.perf_counter() - started:.3f} s, {len(body)} bytes")
    assert code == status, body[:300]
    return json.loads(body)


def numpy_bins(steps: np.ndarray, values: np.ndarray, bins: int, start: int, end: int):
    """Per non-empty bin: (first, last, count, min, max) of the finite values, from the bin's edges."""
    edges = start + (end - start + 1) * np.arange(bins + 1) / bins
    lo_rows = np.searchsorted(steps, edges[:-1], side="left")
    hi_rows = np.searchsorted(steps, edges[1:], side="left")
    hi_rows[-1] = np.searchsorted(steps, end, side="right")
    out = []
    for a, b in zip(lo_rows, hi_rows):
        if a == b:
            continue
        v = values[a:b][np.isfinite(values[a:b])]
        out.append(
            (int(steps[a]), int(steps[b - 1]), int(b - a), v.min() if v.size else np.nan, v.max() if v.size else np.nan)
        )
    return out


def check_columns(plugin_fixtures, body, written, layers, stat, bins, start, end):
    for i, layer in enumerate(layers):
        want = numpy_bins(written.steps, written.column(layer, stat), bins, start, end)
        assert body["steps"] == [w[0] for w in want] and body["last_steps"] == [w[1] for w in want]
        assert body["counts"] == [w[2] for w in want]
        np.testing.assert_array_equal(
            plugin_fixtures.as_float(body["min"][i]), [w[3] for w in want]
        )  # exact: JSON floats round-trip
        np.testing.assert_array_equal(plugin_fixtures.as_float(body["max"][i]), [w[4] for w in want])


def test_matrix_bins_match_numpy_and_keep_the_nan_and_the_spike(
    env, long_fixtures, plugin_fixtures, tensorboard_process
):
    tb, written = env
    body = get(tensorboard_process, tb, "matrix", run=long_fixtures.RUN, points=1000)
    assert body["binned"] is True and body["layers"] == list(long_fixtures.LAYERS) and len(body["steps"]) == 1000
    check_columns(plugin_fixtures, body, written, long_fixtures.LAYERS, "norm", 1000, 0, long_fixtures.STEPS - 1)
    kept = body["kept"]
    assert long_fixtures.NAN_STEP in kept["steps"] and long_fixtures.SPIKE_STEP in kept["steps"]
    k = kept["steps"].index(long_fixtures.NAN_STEP)
    assert kept["flags"][long_fixtures.NAN_LAYER][k] == "1"  # non-finite, at full resolution
    for i, layer in enumerate(long_fixtures.LAYERS):
        assert (
            plugin_fixtures.as_float(kept["values"][i]).tolist()
            == written.column(layer, "norm")[kept["steps"]].tolist()
        )
    b = int(np.searchsorted(body["last_steps"], long_fixtures.NAN_STEP))
    assert body["steps"][b] < long_fixtures.NAN_STEP < body["last_steps"][b]  # inside its bin
    bits = get(tensorboard_process, tb, "anomalies", run=long_fixtures.RUN, start=0, end=0)["flag_bits"]
    assert int(body["flags"][long_fixtures.NAN_LAYER][b], 16) & bits["nonfinite"]
    k = kept["steps"].index(long_fixtures.SPIKE_STEP)
    assert int(kept["flags"][long_fixtures.SPIKE_LAYER][k], 16) & bits["exploding"]
    s = int(np.searchsorted(body["last_steps"], long_fixtures.SPIKE_STEP))
    assert (
        body["max"][long_fixtures.SPIKE_LAYER][s]
        == written.column(long_fixtures.LAYERS[long_fixtures.SPIKE_LAYER], "norm")[long_fixtures.SPIKE_STEP]
    )


def test_matrix_of_a_count_says_which_bin_holds_the_nan(env, long_fixtures, plugin_fixtures, tensorboard_process):
    tb, written = env
    body = get(tensorboard_process, tb, "matrix", run=long_fixtures.RUN, points=777, stat="nonfinite")
    check_columns(plugin_fixtures, body, written, long_fixtures.LAYERS, "nonfinite", 777, 0, long_fixtures.STEPS - 1)
    b = int(np.searchsorted(body["last_steps"], long_fixtures.NAN_STEP))
    assert body["max"][long_fixtures.NAN_LAYER][b] == 3 and sum(body["max"][long_fixtures.NAN_LAYER]) == 3


def test_a_narrow_range_is_full_resolution_and_a_wider_one_binned_over_it(
    env, long_fixtures, plugin_fixtures, tensorboard_process
):
    tb, written = env
    start, end = long_fixtures.NAN_STEP - 200, long_fixtures.NAN_STEP + 299
    body = get(tensorboard_process, tb, "matrix", run=long_fixtures.RUN, points=1000, start=start, end=end)
    assert body["binned"] is False and body["steps"] == list(range(start, end + 1))
    np.testing.assert_array_equal(
        plugin_fixtures.as_float(body["values"][1]), written.column("net/mid", "norm")[start : end + 1]
    )
    start, end = 40_000, 70_000
    body = get(tensorboard_process, tb, "matrix", run=long_fixtures.RUN, points=600, start=start, end=end)
    assert body["binned"] is True
    check_columns(plugin_fixtures, body, written, long_fixtures.LAYERS, "norm", 600, start, end)
    assert body["kept"]["steps"] == [long_fixtures.NAN_STEP]


def test_stats_bins_every_statistic_and_keeps_the_nan_step(env, long_fixtures, plugin_fixtures, tensorboard_process):
    tb, written = env
    body = get(tensorboard_process, tb, "stats", run=long_fixtures.RUN, layer="net/mid", points=500)
    assert body["binned"] is True and len(body["steps"]) == 500
    for stat in ("norm", "rms", "nan", "max"):
        want = numpy_bins(written.steps, written.column("net/mid", stat), 500, 0, long_fixtures.STEPS - 1)
        np.testing.assert_array_equal(plugin_fixtures.as_float(body["min"][stat]), [w[3] for w in want])
        np.testing.assert_array_equal(plugin_fixtures.as_float(body["max"][stat]), [w[4] for w in want])
    assert body["kept"]["steps"] == [long_fixtures.NAN_STEP]
    assert body["kept"]["stats"]["nan"] == [3] and body["kept"]["flags"] == "1"
    assert body["wall_times"][0] == pytest.approx(1.7e9)


def test_compare_bins_the_runs_and_keeps_the_nan_step(env, long_fixtures, plugin_fixtures, tensorboard_process):
    tb, written = env
    body = get(tensorboard_process, tb, "compare", run=long_fixtures.RUN, layer="net/mid", points=300, stat="mean_abs")
    assert body["binned"] is True and body["runs"] == [long_fixtures.RUN] and body["missing"] == []
    check_columns(plugin_fixtures, body, written, ["net/mid"], "mean_abs", 300, 0, long_fixtures.STEPS - 1)
    assert body["kept"]["steps"] == [long_fixtures.NAN_STEP] and body["kept"]["flags"] == ["1"]


def test_without_points_the_answer_is_unchanged_and_bad_points_are_400(env, long_fixtures, tensorboard_process):
    tb, _ = env
    body = get(tensorboard_process, tb, "matrix", run=long_fixtures.RUN, start=0, end=9)
    assert "binned" not in body and body["steps"] == list(range(10))
    body = get(tensorboard_process, tb, "stats", run=long_fixtures.RUN, layer="net/in", start=5, end=9, max_steps=2)
    assert "binned" not in body and body["steps"] == [5, 9]
    for bad in ("0", "100001", "1e3", "-5", ""):
        err = get(tensorboard_process, tb, "matrix", 400, run=long_fixtures.RUN, points=bad)
        assert "points" in err["error"]
