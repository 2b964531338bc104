"""The plugin's JSON routes, in-process, checked number by number against what was written.

The logdir is written by the real summary ops (`plugin_fixtures.write_small_logdir`);
`Written` keeps the input arrays and the exact histogram/stats tensors, and the
statistics are also recomputed with numpy, independently of `reductions`.
"""

from __future__ import annotations

import csv
import io
import math
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tb_layergrad import metadata

LOSS, OUT, WEIGHT = metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, metadata.SOURCE_WEIGHT
TRAIN_OUTPUT_LAYERS = ["model/embedding", "model/dense", "model/rnn", "model/unused", "extra/no_index"]


@pytest.fixture(scope="module")
def get_json(plugin_fixtures):
    """get_json(tb, route, query=None, status=200): a route's strict JSON answer, its status, content type and
    API version checked."""

    def get(tb, route, query=None, status=200):
        r = tb.get(route, query)
        assert r.status_code == status, r.get_data(as_text=True)
        assert r.headers["Content-Type"].startswith("application/json")
        body = plugin_fixtures.strict_json(r.get_data())
        assert body["api_version"] == 1
        return body

    return get


@pytest.fixture(scope="module")
def assert_same(plugin_fixtures):
    """assert_same(actual, expected, rtol=0.0, atol=0.0): JSON values (None = null) equal `expected` (NaN/Inf ->
    null)."""

    def check(actual, expected, rtol=0.0, atol=0.0):
        a = plugin_fixtures.as_float(actual)
        e = np.asarray(expected, dtype=np.float64)
        assert a.shape == e.shape
        np.testing.assert_array_equal(np.isfinite(a), np.isfinite(e))
        fin = np.isfinite(e)
        np.testing.assert_allclose(a[fin], e[fin], rtol=rtol, atol=atol)

    return check


# -- the data itself, before any route: what was written is what numpy says --------------------


def check_against_reference(reference_checks, stats, x, where: str) -> None:
    """The stats of float32 input x against the independent float64 reference, within the bounds
    derived from the reduction length (reference_checks.check_stats, tests/tolerances.py)."""
    import tensorflow as tf  # only here: the rest of this file reads what was written

    reference_checks.check_stats(np.asarray(stats, np.float64), tf.constant(x), where)


def test_written_stats_match_numpy(small_logdir, reference_checks):
    for key, by_step in small_logdir.inputs.items():
        for step, x in by_step.items():
            check_against_reference(reference_checks, small_logdir.stats[key][step], x, f"{key} {step}")


# -- listing -------------------------------------------------------------------------------


def test_plugins_listing_enables_the_tab(tb, plugin_fixtures):
    r = tb.get("plugins_listing", prefix="/data/")
    listing = plugin_fixtures.strict_json(r.get_data())["layergrad"]
    assert listing["enabled"] is True
    assert listing["tab_name"] == "Layer gradients"
    assert listing["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/layergrad/index.js"}


def test_runs_lists_layers_in_model_order_with_what_exists(tb, small_logdir, plugin_fixtures, get_json):
    body = get_json(tb, "runs")
    assert body["format_version"] == metadata.FORMAT_VERSION
    assert body["stats"] == list(plugin_fixtures.HTTP_STATS)
    # The stored statistics in record order, from the one source the writer uses too: the tab reads them here.
    assert body["stored_stats"] == list(metadata.STAT_FIELDS)
    assert body["stats"][: len(metadata.STAT_FIELDS)] == body["stored_stats"]
    assert body["default_stat"] == "norm"
    assert [r["run"] for r in body["runs"]] == ["eval", "train"]  # "future" has nothing readable
    assert any(plugin_fixtures.FUTURE_RUN in w and "newer" in w for w in body["warnings"])

    train = body["runs"][1]
    assert train["max_step"] == plugin_fixtures.TRAIN_STEPS[-1]
    assert train["targets"] == [plugin_fixtures.AUX_TARGET, LOSS]
    assert train["sources"] == [OUT, WEIGHT]
    layers = {entry["layer"]: entry for entry in train["layers"]}
    assert [entry["layer"] for entry in train["layers"]] == [
        "model/embedding",
        "model/dense",
        "model/dense/kernel",
        "model/rnn",
        "model/unused",
        "extra/no_index",
    ]
    assert [entry["index"] for entry in train["layers"]] == [0, 1, 1, 2, 3, -1]
    dense = layers[plugin_fixtures.TENSOR_LAYER]
    assert (dense["histograms"], dense["stats"], dense["tensors"], dense["timesteps"]) == (True, True, True, False)
    assert dense["targets"] == [plugin_fixtures.AUX_TARGET, LOSS] and dense["sources"] == [OUT]
    assert dense["dtype"] == "float32"
    assert dense["series"] == [
        {
            "target": plugin_fixtures.AUX_TARGET,
            "source": OUT,
            "kinds": ["histogram", "stats", "tensor"],
            "max_step": plugin_fixtures.TRAIN_STEPS[-1],
            "max_wall_time": dense["series"][0]["max_wall_time"],
        },
        {
            "target": LOSS,
            "source": OUT,
            "kinds": ["histogram", "stats", "tensor"],
            "max_step": plugin_fixtures.TRAIN_STEPS[-1],
            "max_wall_time": dense["series"][1]["max_wall_time"],
        },
    ]
    assert layers["model/dense/kernel"]["sources"] == [WEIGHT]
    assert (
        layers[plugin_fixtures.RNN_LAYER]["timesteps"] is True and layers[plugin_fixtures.RNN_LAYER]["tensors"] is False
    )
    # The layer's gradient dtype, not the float64 of its derived timestep norms.
    assert layers[plugin_fixtures.RNN_LAYER]["dtype"] == dense["dtype"] == "float32"
    assert layers[plugin_fixtures.UNUSED_LAYER[0]]["dtype"] == ""
    assert all(isinstance(e["series"][0]["max_wall_time"], float) for e in train["layers"])

    only = get_json(tb, "runs", {"run": "eval"})
    assert [r["run"] for r in only["runs"]] == ["eval"]
    assert only["runs"][0]["max_step"] == plugin_fixtures.EVAL_STEPS[-1]


def test_runs_reads_no_tensor_bodies(tb, get_json):
    before = len(tb.provider.calls)
    get_json(tb, "runs")
    assert [c[0] for c in tb.provider.calls[before:]] == ["list_tensors"]


# -- gradient-flow matrix ----------------------------------------------------------------------


def test_matrix_every_stat_matches_what_was_written(
    tb, small_logdir, http_stat, plugin_fixtures, get_json, assert_same
):
    stat = http_stat
    body = get_json(tb, "matrix", {"run": "train", "stat": stat})
    assert (body["run"], body["target"], body["source"], body["stat"]) == ("train", LOSS, OUT, stat)
    assert body["layers"] == TRAIN_OUTPUT_LAYERS
    assert body["steps"] == plugin_fixtures.TRAIN_STEPS
    assert len(body["values"]) == len(body["layers"])
    for layer, row in zip(body["layers"], body["values"]):
        written = small_logdir.stats[("train", LOSS, OUT, layer)]
        assert_same(row, [plugin_fixtures.expected_stat(written[s], stat) for s in plugin_fixtures.TRAIN_STEPS])
        if stat in plugin_fixtures.COUNT_STATS:
            assert all(isinstance(v, int) for v in row)


def test_matrix_nonfinite_finds_the_planted_step(tb, plugin_fixtures, get_json):
    body = get_json(tb, "matrix", {"run": "train", "stat": "nonfinite"})
    dense = body["values"][body["layers"].index(plugin_fixtures.TENSOR_LAYER)]
    assert [s for s, v in zip(body["steps"], dense) if v] == [plugin_fixtures.NAN_STEP]
    assert dense[plugin_fixtures.NAN_STEP] == 4  # 2 NaN + 1 +Inf + 1 -Inf
    means = get_json(tb, "matrix", {"run": "train", "stat": "mean"})
    unused = means["values"][means["layers"].index(plugin_fixtures.UNUSED_LAYER[0])]
    assert unused == [None] * len(plugin_fixtures.TRAIN_STEPS)  # no gradient: undefined mean -> null


def test_matrix_step_range_and_max_steps(tb, small_logdir, plugin_fixtures, get_json, assert_same):
    body = get_json(tb, "matrix", {"run": "train", "start": "3", "end": "6"})
    assert body["steps"] == [3, 4, 5, 6]
    dense = small_logdir.stats[("train", LOSS, OUT, plugin_fixtures.TENSOR_LAYER)]
    assert_same(body["values"][1], [dense[s][STAT("norm")] for s in (3, 4, 5, 6)])
    assert get_json(tb, "matrix", {"run": "train", "start": "8"})["steps"] == [8, 9]
    assert get_json(tb, "matrix", {"run": "train", "end": "1"})["steps"] == [0, 1]
    assert get_json(tb, "matrix", {"run": "train", "start": "500"})["steps"] == []
    thinned = get_json(tb, "matrix", {"run": "train", "max_steps": "4"})
    assert thinned["steps"] == [0, 3, 6, 9]
    assert_same(thinned["values"][1], [dense[s][STAT("norm")] for s in (0, 3, 6, 9)])


def STAT(name):
    return metadata.STAT_INDEX[name]


def test_matrix_weight_source_and_second_target(tb, small_logdir, plugin_fixtures, get_json, assert_same):
    weights = get_json(tb, "matrix", {"run": "train", "source": "weight", "stat": "max"})
    assert weights["layers"] == ["model/dense/kernel"]
    written = small_logdir.stats[("train", LOSS, WEIGHT, "model/dense/kernel")]
    assert_same(weights["values"][0], [written[s][STAT("max")] for s in plugin_fixtures.TRAIN_STEPS])

    aux = get_json(tb, "matrix", {"run": "train", "target": plugin_fixtures.AUX_TARGET})
    assert aux["layers"] == [plugin_fixtures.TENSOR_LAYER]
    written = small_logdir.stats[("train", plugin_fixtures.AUX_TARGET, OUT, plugin_fixtures.TENSOR_LAYER)]
    assert_same(aux["values"][0], [written[s][STAT("norm")] for s in plugin_fixtures.TRAIN_STEPS])
    assert get_json(tb, "matrix", {"run": "eval", "target": plugin_fixtures.AUX_TARGET}, status=404)["error"]


def test_matrix_aligns_layers_with_different_steps(tmp_path, plugin_fixtures, get_json):
    """Layers logged at different steps share one steps axis with nulls."""
    import tensorflow as tf

    from tb_layergrad import summary

    writer = tf.summary.create_file_writer(str(tmp_path / "run"))
    with writer.as_default():
        for step in range(6):
            summary.ops.write_tensor("a", tf.fill([2], float(step)), step=step, index=0)
            if step % 2:
                summary.ops.write_tensor("b", tf.fill([2], -float(step)), step=step, index=1)
    writer.close()
    body = get_json(plugin_fixtures.InProcess(str(tmp_path)), "matrix", {"run": "run", "stat": "max"})
    assert body["layers"] == ["a", "b"]
    assert body["steps"] == [0, 1, 2, 3, 4, 5]
    assert body["values"] == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [None, -1.0, None, -3.0, None, -5.0]]


# -- one layer -----------------------------------------------------------------------------------


# `{TENSOR_LAYER}`, `{AUX_TARGET}`, `{UNUSED_LAYER}`: the small logdir's names (plugin_fixtures), filled in by
# the test
@pytest.mark.parametrize(
    "key",
    [
        ("train", LOSS, OUT, "{TENSOR_LAYER}"),
        ("train", LOSS, WEIGHT, "model/dense/kernel"),
        ("train", "{AUX_TARGET}", OUT, "{TENSOR_LAYER}"),
        ("train", LOSS, OUT, "{UNUSED_LAYER}"),
        ("eval", LOSS, OUT, "model/embedding"),
    ],
)
def test_stats_route_matches_what_was_written(
    tb, small_logdir, key, plugin_fixtures, get_json, assert_same, reference_checks
):
    names = {
        "TENSOR_LAYER": plugin_fixtures.TENSOR_LAYER,
        "AUX_TARGET": plugin_fixtures.AUX_TARGET,
        "UNUSED_LAYER": plugin_fixtures.UNUSED_LAYER[0],
    }
    key = tuple(part.format(**names) for part in key)
    run, target, source, layer = key
    body = get_json(tb, "stats", {"run": run, "layer": layer, "target": target, "source": source})
    written = small_logdir.stats[key]
    steps = sorted(written)
    assert body["steps"] == steps
    assert (body["run"], body["target"], body["source"], body["layer"]) == key
    assert body["index"] == small_logdir.indices[layer]
    assert len(body["wall_times"]) == len(steps) and all(isinstance(t, float) for t in body["wall_times"])
    assert list(body["stats"]) == list(plugin_fixtures.HTTP_STATS)
    for name in plugin_fixtures.HTTP_STATS:
        assert_same(body["stats"][name], [plugin_fixtures.expected_stat(written[s], name) for s in steps])
    # independent numpy recomputation from the input arrays (float32 sums: the derived bounds)
    if key in small_logdir.inputs:
        for i, s in enumerate(steps):
            got = [plugin_fixtures.as_float([body["stats"][name][i]])[0] for name in metadata.STAT_FIELDS]
            check_against_reference(reference_checks, got, small_logdir.inputs[key][s], f"{key} {s}")


def test_stats_of_the_nan_step_and_no_gradient(tb, plugin_fixtures, get_json):
    dense = get_json(tb, "stats", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER})["stats"]
    assert (
        dense["nan"][plugin_fixtures.NAN_STEP],
        dense["pos_inf"][plugin_fixtures.NAN_STEP],
        dense["neg_inf"][plugin_fixtures.NAN_STEP],
    ) == (2, 1, 1)
    assert dense["nonfinite_frac"][plugin_fixtures.NAN_STEP] == 4 / 60  # one float64 division of the same counts: exact
    assert dense["elements"] == [60] * len(plugin_fixtures.TRAIN_STEPS)
    unused = get_json(tb, "stats", {"run": "train", "layer": plugin_fixtures.UNUSED_LAYER[0]})["stats"]
    assert unused["no_gradient"] == [1] * len(plugin_fixtures.TRAIN_STEPS)
    assert unused["elements"] == [10] * len(plugin_fixtures.TRAIN_STEPS)
    assert unused["mean"] == unused["min"] == unused["rms"] == [None] * len(plugin_fixtures.TRAIN_STEPS)


def test_stats_range_and_max_steps(tb, small_logdir, plugin_fixtures, get_json, assert_same):
    body = get_json(
        tb, "stats", {"run": "eval", "layer": plugin_fixtures.TENSOR_LAYER, "start": "4", "end": "13", "max_steps": "3"}
    )
    # eval steps in [4, 13]: 4, 6, 8, 10, 12 -> evenly 3 of 5: first, middle, last
    assert body["steps"] == [4, 8, 12]
    written = small_logdir.stats[("eval", LOSS, OUT, plugin_fixtures.TENSOR_LAYER)]
    assert_same(body["stats"]["std"], [written[s][STAT("std")] for s in (4, 8, 12)])
    assert get_json(tb, "stats", {"run": "eval", "layer": plugin_fixtures.TENSOR_LAYER, "max_steps": "1"})["steps"] == [
        18
    ]


def test_histograms_match_what_was_written(tb, small_logdir, plugin_fixtures, get_json):
    for key in [
        ("train", LOSS, OUT, plugin_fixtures.TENSOR_LAYER),
        ("eval", LOSS, OUT, "model/rnn"),
        ("train", LOSS, WEIGHT, "model/dense/kernel"),
        ("train", LOSS, OUT, plugin_fixtures.UNUSED_LAYER[0]),
    ]:
        run, target, source, layer = key
        body = get_json(tb, "histograms", {"run": run, "layer": layer, "target": target, "source": source})
        written = small_logdir.hist[key]
        assert body["steps"] == sorted(written)
        for step, hist in zip(body["steps"], body["histograms"]):
            np.testing.assert_array_equal(np.asarray(hist, dtype=np.float64), written[step])
            if key in small_logdir.inputs:  # counts = finite elements, edges = finite min/max
                x = small_logdir.inputs[key][step].astype(np.float64).reshape(-1)
                fin = x[np.isfinite(x)]
                assert sum(b[2] for b in hist) == fin.size
                assert hist[0][0] == fin.min() and hist[-1][1] == fin.max()  # float32 values held exactly in float64
    thinned = get_json(tb, "histograms", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER, "max_steps": "3"})
    assert thinned["steps"] == [0, 4, 9] and len(thinned["histograms"]) == 3


def test_tensor_route_returns_the_raw_gradient(tb, small_logdir, plugin_fixtures, get_json, assert_same):
    x = small_logdir.inputs[("train", LOSS, OUT, plugin_fixtures.TENSOR_LAYER)][plugin_fixtures.NAN_STEP]
    body = get_json(
        tb, "tensor", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER, "step": str(plugin_fixtures.NAN_STEP)}
    )
    rows = x.reshape(x.shape[0], -1)
    assert rows.size <= plugin_fixtures.TENSOR_MAX_ELEMENTS
    assert body["step"] == plugin_fixtures.NAN_STEP and body["shape"] == list(rows.shape)
    assert_same([v for row in body["values"] for v in row], rows.reshape(-1))
    want_nonfinite = [
        [int(r), int(c), "nan" if np.isnan(rows[r, c]) else ("+inf" if rows[r, c] > 0 else "-inf")]
        for r, c in np.argwhere(~np.isfinite(rows))
    ]
    assert body["nonfinite"] == want_nonfinite
    assert sorted(k for _, _, k in body["nonfinite"]) == ["+inf", "-inf", "nan", "nan"]
    fin = rows[np.isfinite(rows)]
    assert body["min"] == float(fin.min()) and body["max"] == float(fin.max())
    assert body["steps"] == plugin_fixtures.TRAIN_STEPS

    latest = get_json(tb, "tensor", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER})
    assert latest["step"] == plugin_fixtures.TRAIN_STEPS[-1] and latest["nonfinite"] == []
    x_last = small_logdir.inputs[("train", LOSS, OUT, plugin_fixtures.TENSOR_LAYER)][plugin_fixtures.TRAIN_STEPS[-1]]
    assert_same([v for row in latest["values"] for v in row], x_last.reshape(-1))

    aux = get_json(
        tb,
        "tensor",
        {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER, "target": plugin_fixtures.AUX_TARGET, "step": "2"},
    )
    assert_same(
        [v for row in aux["values"] for v in row],
        small_logdir.inputs[("train", plugin_fixtures.AUX_TARGET, OUT, plugin_fixtures.TENSOR_LAYER)][2].reshape(-1),
    )

    assert get_json(tb, "tensor", {"run": "eval", "layer": plugin_fixtures.TENSOR_LAYER, "step": "3"}, status=404)[
        "error"
    ]
    assert get_json(tb, "tensor", {"run": "train", "layer": "model/embedding"}, status=404)["error"]


def test_timesteps_route(tb, small_logdir, plugin_fixtures, get_json, assert_same):
    body = get_json(tb, "timesteps", {"run": "train", "layer": plugin_fixtures.RNN_LAYER})
    written = small_logdir.timesteps[("train", plugin_fixtures.RNN_LAYER)]
    assert body["steps"] == sorted(written)
    for step, norms in zip(body["steps"], body["norms"]):
        assert_same(norms, written[step])
    assert body["norms"][plugin_fixtures.NAN_STEP][2] is None
    ranged = get_json(tb, "timesteps", {"run": "eval", "layer": plugin_fixtures.RNN_LAYER, "start": "10"})
    assert ranged["steps"] == [10, 12, 14, 16, 18]
    assert get_json(tb, "timesteps", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER}, status=404)["error"]


# -- several runs ---------------------------------------------------------------------------------


def test_compare_aligns_runs_on_steps(tb, small_logdir, plugin_fixtures, get_json, assert_same):
    body = get_json(
        tb,
        "compare",
        [
            ("run", "train"),
            ("run", "eval"),
            ("run", "train"),
            ("layer", plugin_fixtures.TENSOR_LAYER),
            ("stat", "mean_abs"),
        ],
    )
    assert body["runs"] == ["train", "eval"]  # the duplicate is dropped
    steps = sorted(set(plugin_fixtures.TRAIN_STEPS) | set(plugin_fixtures.EVAL_STEPS))
    assert body["steps"] == steps and body["missing"] == []
    for run, row in zip(body["runs"], body["values"]):
        written = small_logdir.stats[(run, LOSS, OUT, plugin_fixtures.TENSOR_LAYER)]
        assert_same(row, [written[s][STAT("mean_abs")] if s in written else np.nan for s in steps])

    part = get_json(
        tb,
        "compare",
        [("run", "eval"), ("run", "train"), ("layer", plugin_fixtures.UNUSED_LAYER[0]), ("stat", "elements")],
    )
    assert part["missing"] == ["eval"]
    assert part["values"][0] == [None] * len(plugin_fixtures.TRAIN_STEPS) and part["values"][1] == [10] * len(
        plugin_fixtures.TRAIN_STEPS
    )

    ranged = get_json(
        tb,
        "compare",
        [("run", "train"), ("run", "eval"), ("layer", plugin_fixtures.TENSOR_LAYER), ("start", "8"), ("end", "12")],
    )
    assert ranged["steps"] == [8, 9, 10, 12]
    thinned = get_json(
        tb, "compare", [("run", "train"), ("run", "eval"), ("layer", plugin_fixtures.TENSOR_LAYER), ("max_steps", "2")]
    )
    assert thinned["steps"] == [0, 18]


# -- CSV ------------------------------------------------------------------------------------------


def test_csv_export(tb, small_logdir, plugin_fixtures):
    r = tb.get("csv", {"run": "train"})
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/csv; charset=utf-8"
    assert 'filename="layergrad-train.csv"' in r.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))
    assert list(rows[0]) == ["run", "target", "source", "layer", "index", "step", "wall_time", *metadata.STAT_FIELDS]
    assert [row["layer"] for row in rows[:: len(plugin_fixtures.TRAIN_STEPS)]] == TRAIN_OUTPUT_LAYERS
    assert len(rows) == len(TRAIN_OUTPUT_LAYERS) * len(plugin_fixtures.TRAIN_STEPS)
    for row in rows:
        written = small_logdir.stats[(row["run"], row["target"], row["source"], row["layer"])][int(row["step"])]
        assert int(row["index"]) == small_logdir.indices[row["layer"]]
        got = np.asarray([float(row[name]) for name in metadata.STAT_FIELDS])
        np.testing.assert_array_equal(got, written)  # exact: repr round-trips; "nan" parses to NaN
        assert row["elements"].isdigit()

    one = list(
        csv.DictReader(
            io.StringIO(
                tb.get("csv", {"run": "eval", "layer": plugin_fixtures.TENSOR_LAYER, "start": "10"}).get_data(
                    as_text=True
                )
            )
        )
    )
    assert [int(row["step"]) for row in one] == [10, 12, 14, 16, 18]
    weights = tb.get("csv", {"run": "train", "source": "weight"}).get_data(as_text=True)
    assert {row["layer"] for row in csv.DictReader(io.StringIO(weights))} == {"model/dense/kernel"}


# -- plumbing: experiment id, path prefix, filtered reads, live data ------------------------------


def test_every_read_is_filtered_by_run_and_tag(tb, plugin_fixtures):
    for route, query in [
        ("matrix", {"run": "train"}),
        ("stats", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER}),
        ("histograms", {"run": "eval", "layer": plugin_fixtures.TENSOR_LAYER}),
        ("tensor", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER}),
        ("timesteps", {"run": "train", "layer": plugin_fixtures.RNN_LAYER}),
        ("compare", [("run", "train"), ("run", "eval"), ("layer", plugin_fixtures.TENSOR_LAYER)]),
        ("csv", {"run": "train"}),
    ]:
        tb.forget_stats()  # else a stats table read by an earlier route is served without a read
        before = len(tb.provider.calls)
        assert tb.get(route, query).status_code == 200
        reads = [c for c in tb.provider.calls[before:] if c[0] == "read_tensors"]
        assert reads, route
        for _, _, runs, tags in reads:
            assert runs is not None and len(runs) == 1, (route, runs)
            assert tags, (route, tags)
            assert all(re.search(rf"/({'|'.join(metadata.KINDS)})(/\d+)?$", t) for t in tags), tags
        if route == "stats":
            layer = metadata.SeriesInfo(layer=plugin_fixtures.TENSOR_LAYER, kind="stats", index=1, dtype="float32")
            assert reads[0][3] == frozenset({metadata.GroupInfo.of("stats", [layer]).tag_at(0)})  # its group alone


def test_experiment_id_and_path_prefix(small_logdir, plugin_fixtures):
    tb = plugin_fixtures.InProcess(small_logdir.logdir, path_prefix="/pfx")
    r = tb.get("matrix", {"run": "train"}, prefix="/experiment/exp42/data/plugin/layergrad/")
    assert r.status_code == 200, r.get_data(as_text=True)
    assert plugin_fixtures.strict_json(r.get_data())["steps"] == plugin_fixtures.TRAIN_STEPS
    assert {c[1] for c in tb.provider.calls} == {"exp42"}
    assert tb.get("index.js").status_code == 200
    assert tb.client.get("/data/plugin/layergrad/runs").status_code == 404  # outside the prefix


def next_second() -> None:
    """Wait for the next second of the clock, so that a new event file's name sorts after the last one.

    TensorFlow names files `events.out.tfevents.<seconds>.<host>.<pid>.<n>.v2`: two in the same second
    with n = 9 and 10 sort the wrong way round, and TensorBoard's Python loader then skips the newer.
    """
    time.sleep(1.01 - time.time() % 1)


def test_live_training_new_steps_appear_on_next_request(tmp_path, plugin_fixtures, get_json):
    import tensorflow as tf

    from tb_layergrad import summary

    def write(steps):
        writer = tf.summary.create_file_writer(str(tmp_path / "live"))
        with writer.as_default():
            for step in steps:
                summary.ops.write_tensor("net/layer", tf.fill([3], float(step + 1)), step=step, index=0)
        writer.flush()
        return writer

    first = write(range(3))
    tb = plugin_fixtures.InProcess(str(tmp_path))
    assert get_json(tb, "matrix", {"run": "live"})["steps"] == [0, 1, 2]
    next_second()
    second = write(range(3, 6))  # a second event file, as after a restart, while TensorBoard runs
    tb.reload()  # what TensorBoard's reload thread does every --reload_interval
    body = get_json(tb, "matrix", {"run": "live", "stat": "max"})
    assert body["steps"] == [0, 1, 2, 3, 4, 5]
    assert body["values"] == [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]
    assert get_json(tb, "stats", {"run": "live", "layer": "net/layer"})["steps"][-1] == 5
    first.close()
    second.close()


def test_stats_tables_are_read_once_while_the_run_is_unchanged(tmp_path, plugin_fixtures, get_json):
    """matrix, anomalies, stats, csv share one read of a run's stats; a new record invalidates it. The steps
    cross a block (a tag each, docs/FORMAT.md), and only the block that changed is read again."""
    import tensorflow as tf

    from tb_layergrad import summary

    group = metadata.GroupInfo.of(
        metadata.KIND_STATS,
        [
            metadata.SeriesInfo(layer=p, kind="stats", index=i, dtype="float32")
            for i, p in enumerate(("net/a", "net/b"))
        ],
    )
    origin = group.block_steps - 3  # steps origin..origin+2, then two in the next block
    steps = [origin + i for i in range(5)]

    def write(chosen):
        writer = tf.summary.create_file_writer(str(tmp_path / "live"))
        with writer.as_default():
            for step in chosen:
                values = {
                    layer: tf.fill([3], float(step - origin + 1 + i)) for i, layer in enumerate(("net/a", "net/b"))
                }
                summary.gradients(values, step=step)
        writer.flush()
        return writer

    def stats_reads(route, query):
        before = len(tb.provider.calls)
        body = tb.get(route, query)
        assert body.status_code == 200, body.get_data()
        return sum(
            1
            for c in tb.provider.calls[before:]
            if c[0] == "read_tensors" and any(t.endswith("/stats") or "/stats/" in t for t in c[3])
        )

    first = write(steps[:3])
    tb = plugin_fixtures.InProcess(str(tmp_path))
    assert stats_reads("matrix", {"run": "live"}) == 1
    for route, query in [
        ("matrix", {"run": "live", "stat": "max"}),
        ("anomalies", {"run": "live"}),
        ("stats", {"run": "live", "layer": "net/b"}),
        ("csv", {"run": "live"}),
        ("compare", {"run": "live", "layer": "net/a"}),
    ]:
        assert stats_reads(route, query) == 0, route
    next_second()
    second = write(steps[3:])
    tb.reload()
    assert stats_reads("matrix", {"run": "live"}) == 1  # the new block alone
    body = get_json(tb, "matrix", {"run": "live", "stat": "max"})
    assert body["steps"] == steps
    assert body["values"] == [[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 3.0, 4.0, 5.0, 6.0]]
    assert get_json(tb, "stats", {"run": "live", "layer": "net/b", "start": str(steps[3])})["stats"]["max"] == [
        5.0,
        6.0,
    ]
    first.close()
    second.close()


def test_json_never_contains_nan_literals(tb, plugin_fixtures):
    for route, query in [
        ("runs", None),
        ("matrix", {"run": "train", "stat": "mean"}),
        ("stats", {"run": "train", "layer": plugin_fixtures.UNUSED_LAYER[0]}),
        ("tensor", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER, "step": str(plugin_fixtures.NAN_STEP)}),
        ("timesteps", {"run": "train", "layer": plugin_fixtures.RNN_LAYER}),
    ]:
        text = tb.get(route, query).get_data(as_text=True)
        assert "NaN" not in text and "Infinity" not in text
        plugin_fixtures.strict_json(text.encode())


def test_reader_and_plugin_modules_do_not_import_tensorflow():
    """Every module of `tb_layergrad.reader`, then the plugin's: no TensorFlow, no Keras; and the reader
    alone imports nothing of the plugin (the HTTP side reads through it, never the other way)."""
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import tb_layergrad.reader as reader
        for m in pkgutil.iter_modules(reader.__path__):
            importlib.import_module(f"tb_layergrad.reader.{m.name}")
        assert len([m for m in sys.modules if m.startswith("tb_layergrad.reader.")]) >= 7
        up = [m for m in sys.modules if m.startswith("tb_layergrad.plugin")]
        assert not up, f"the reader imported {up}"
        import tb_layergrad.plugin as plugin
        import tb_layergrad.plugin.loader
        for m in pkgutil.iter_modules(plugin.__path__):
            importlib.import_module(f"tb_layergrad.plugin.{m.name}")
        bad = [m for m in ("tensorflow", "keras") if m in sys.modules]
        assert not bad, bad
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_fast_float_rows_parse_to_the_same_float64():
    """`matrix` writes its values with 17 significant digits (faster than repr): parsed, every number
    is the float64 that `float_list` would have sent, and NaN/Inf are null."""
    import json

    from tb_layergrad.plugin import responses

    rng = np.random.default_rng(7)
    edge = [
        0.0,
        -0.0,
        1.0,
        0.1,
        1 / 3,
        5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        -123.456,
        np.nan,
        np.inf,
        -np.inf,
        2.0**53 + 2,
        1e22,
        1e-7,
    ]
    rows = [
        np.asarray(edge),
        rng.normal(size=300) * 10.0 ** rng.integers(-300, 300, size=300),
        np.zeros(0),
        np.full(4, np.nan),
    ]
    got = json.loads(responses.float_rows_json(rows))
    want = [responses.float_list(r) for r in rows]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert [None if v is None else float(v) for v in g] == w


def test_csv_cells_read_back_as_the_values():
    """The export's cells, made a column at a time: each parses back (float()) to the float64 it was, nan and
    +-inf spelled as float() reads them, the shortest repr; a count that is a whole number is written as one
    (Python's own int() text, past int64 too), any other count as a float."""
    from tb_layergrad.plugin import responses

    rng = np.random.default_rng(11)
    values = np.concatenate(
        [
            [0.0, -0.0, 1.0, 0.1, 1 / 3, 5e-324, 1.7976931348623157e308, -123.456, np.nan, np.inf, -np.inf],
            [2.0**53 + 2, 2.0**63, -(2.0**63), 2.0**64, 1e22, 7.0, -3.0, 0.5, 2.5],
            rng.normal(size=200) * 10.0 ** rng.integers(-300, 300, size=200),
            rng.integers(0, 10**6, size=50).astype(np.float64),
        ]
    )
    for integer in (False, True):
        cells = responses.csv_cells(values, integer=integer)
        assert len(cells) == values.size
        for cell, v in zip(cells, values.tolist()):
            np.testing.assert_array_equal(float(cell), v)  # NaN equal to NaN, -0.0 as written
            if integer and math.isfinite(v) and v == int(v):
                assert cell == str(int(v))
            else:
                assert cell == repr(v)
    whole = rng.integers(0, 10**9, size=100).astype(np.float64)  # every cell an integer: the column at once
    assert responses.csv_cells(whole, integer=True) == [str(int(v)) for v in whole.tolist()]
    assert responses.csv_cells(np.zeros(0), integer=True) == []


@pytest.mark.parametrize(
    "route,query",
    [
        ("matrix", {"run": "train"}),
        ("anomalies", {"run": "train"}),
        ("runs", {}),
        ("matrix", {"run": "no such run"}),  # an error body: gzipped alike
    ],
)
def test_a_browser_gets_the_body_gzipped(tb, route, query):
    """A request that accepts gzip (every browser's) gets the same JSON compressed, with its Content-Encoding; a
    kept answer (`AnswerCache`) is sent as the same bytes to each; gzip refused (q=0) or not named: plain."""
    import gzip
    import json

    path = tb.prefix + "/data/plugin/layergrad/" + route
    plain = tb.client.get(path, query_string=query)
    assert "Content-Encoding" not in plain.headers
    zipped = [tb.client.get(path, query_string=query, headers={"Accept-Encoding": "gzip, deflate, br"}) for _ in "ab"]
    for r in zipped:
        assert r.status_code == plain.status_code
        assert r.headers["Content-Encoding"] == "gzip"
        assert int(r.headers["Content-Length"]) == len(r.get_data())
        assert json.loads(gzip.decompress(r.get_data())) == json.loads(plain.get_data())
    assert zipped[0].get_data() == zipped[1].get_data()
    for refused in ("gzip;q=0", "gzip; q=0.000", "identity"):
        r = tb.client.get(path, query_string=query, headers={"Accept-Encoding": refused})
        assert "Content-Encoding" not in r.headers and r.get_data() == plain.get_data()
