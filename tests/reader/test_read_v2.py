"""Readers read format version 2 beside version 1 (reading side; docs/FORMAT.md).

The same numbers are written twice into one logdir: run `X` as version 1 (one record per layer, kind
and step) and run `X_v2` grouped as version 2 (one record per (target, source, kind) and step, the
metadata only with a tag's first record, histograms as counts whose edges come from the stats),
converted from event files the real summary ops wrote (tests/plugin_fixtures.py). Every route, the
report and `load()` must give the same answer for both, except run names and wall times.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import numpy as np
import pytest

from tb_layergrad import metadata
from tb_layergrad.reader import series

SMALL_RUNS = ("train", "eval")
ORIGIN_RUNS = ("forward_nan", "loss_nan")  # origin_fixtures' FORWARD and LOSS (checked by twins)
RUNS = SMALL_RUNS + ORIGIN_RUNS
REORDER_AT = 5  # train_v2's model is "rebuilt" here: its layer list (so its tags) changes
DROPPED = ("model/rnn", 4)  # run dropped_v2: this layer joins the layer list at this step


@pytest.fixture(scope="module")
def twins(tmp_path_factory, origin_fixtures, plugin_fixtures):
    """(logdir, what the small logdir wrote)."""
    assert ORIGIN_RUNS == (origin_fixtures.FORWARD, origin_fixtures.LOSS)
    src = str(tmp_path_factory.mktemp("v1_source"))
    written = plugin_fixtures.write_small_logdir(src)
    origin_fixtures.write_origin_logdir(src, runs=ORIGIN_RUNS)
    logdir = str(tmp_path_factory.mktemp("v1_v2"))
    for run in RUNS:
        plugin_fixtures.write_twin_runs(os.path.join(src, run), logdir, run, REORDER_AT if run == "train" else None)
    records = plugin_fixtures.read_run_records(os.path.join(src, "train"))
    plugin_fixtures.write_records(
        os.path.join(logdir, "dropped_v2"), plugin_fixtures.grouped_records(records, drop=DROPPED)
    )
    return logdir, written


@pytest.fixture(scope="module")
def tb(twins, plugin_fixtures):
    return plugin_fixtures.InProcess(twins[0])


def without_run_and_wall(doc):
    """The answer with what legitimately differs between the twins removed: run names, wall times, versions, and
    whether the background read-ahead has reached each run yet (`statistics_read`, timing)."""
    if isinstance(doc, dict):
        return {
            k: without_run_and_wall(v)
            for k, v in doc.items()
            if k not in ("run", "format_versions", "statistics_read") and "wall" not in k
        }
    if isinstance(doc, list):
        return [without_run_and_wall(v) for v in doc]
    return doc


def runs_by_name(plugin_fixtures, tb):
    return {r["run"]: r for r in plugin_fixtures.get_json(tb, "runs", {})["runs"]}


def layer_queries(plugin_fixtures, tb, run):
    """(layer, target, source) of every stats series of a run, from the `runs` route."""
    out = []
    for entry in runs_by_name(plugin_fixtures, tb)[run]["layers"]:
        for s in entry["series"]:
            if "stats" in s["kinds"]:
                out.append((entry["layer"], s["target"], s["source"], "histogram" in s["kinds"]))
    return out


# -- the same answers --------------------------------------------------------------------------------------


def test_runs_route_lists_the_same_layers_and_names_the_versions(tb, origin_fixtures, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "runs", {})
    assert body["format_version"] == metadata.FORMAT_VERSION == 2
    by_name = runs_by_name(plugin_fixtures, tb)
    for run in RUNS:
        assert by_name[run]["format_versions"] == [1]
        assert by_name[f"{run}_v2"]["format_versions"] == [2]
        assert without_run_and_wall(by_name[run]) == without_run_and_wall(by_name[f"{run}_v2"])
    layers = [x["layer"] for x in by_name["train_v2"]["layers"]]
    assert layers == [
        "model/embedding",
        "model/dense",
        "model/dense/kernel",
        "model/rnn",
        "model/unused",
        "extra/no_index",
    ]
    forward_v2 = by_name[f"{origin_fixtures.FORWARD}_v2"]
    assert forward_v2["activations"] and forward_v2["target_series"] == ["loss"]


def test_both_kinds_of_record_in_one_run_list_both_versions(tmp_path, plugin_fixtures):
    layer = metadata.SeriesInfo(layer="m/a", kind=metadata.KIND_STATS, index=0, dtype="float32")
    group = metadata.GroupInfo.of(metadata.KIND_STATS, [dataclass_replace(layer, layer="m/b", index=1)])
    plugin_fixtures.write_records(
        str(tmp_path / "mixed"),
        [(0, layer.tag, layer, stats_row(1.0)), (0, group.tag_at(0), group, stats_row(2.0)[None])],
    )
    body = plugin_fixtures.get_json(plugin_fixtures.InProcess(str(tmp_path)), "runs", {})
    (run,) = body["runs"]
    assert run["format_versions"] == [1, 2]
    assert [x["layer"] for x in run["layers"]] == ["m/a", "m/b"]


@pytest.mark.parametrize("run", RUNS)
def test_matrix_is_the_same_for_every_statistic(tb, run, plugin_fixtures):
    sources = {(t, s) for _, t, s, _ in layer_queries(plugin_fixtures, tb, run) if s != metadata.SOURCE_TARGET}
    assert sources
    for target, source in sorted(sources):
        for stat in series.ALL_STATS:
            q = {"target": target, "source": source, "stat": stat}
            one = plugin_fixtures.get_json(tb, "matrix", {"run": run, **q})
            two = plugin_fixtures.get_json(tb, "matrix", {"run": f"{run}_v2", **q})
            assert without_run_and_wall(one) == without_run_and_wall(two), (target, source, stat)


def test_matrix_numbers_are_the_written_ones(tb, twins, plugin_fixtures):
    _, written = twins
    body = plugin_fixtures.get_json(tb, "matrix", {"run": "train_v2", "stat": "norm"})
    assert body["steps"] == plugin_fixtures.TRAIN_STEPS
    row = plugin_fixtures.as_float(body["values"][body["layers"].index("model/rnn")])
    want = [
        np.linalg.norm(written.inputs[("train", "loss", "output", "model/rnn")][s].astype(np.float64))
        for s in plugin_fixtures.TRAIN_STEPS
    ]
    np.testing.assert_allclose(row, want, rtol=1e-5)
    nonfinite = plugin_fixtures.get_json(tb, "matrix", {"run": "train_v2", "stat": "nonfinite"})
    dense = nonfinite["values"][nonfinite["layers"].index("model/dense")]
    assert dense[plugin_fixtures.NAN_STEP] == 4 and sum(dense) == 4


@pytest.mark.parametrize("run", RUNS)
def test_stats_and_histograms_are_the_same_per_layer(tb, run, plugin_fixtures):
    for layer, target, source, has_hist in layer_queries(plugin_fixtures, tb, run):
        q = {"layer": layer, "target": target, "source": source}
        one = plugin_fixtures.get_json(tb, "stats", {"run": run, **q})
        two = plugin_fixtures.get_json(tb, "stats", {"run": f"{run}_v2", **q})
        assert without_run_and_wall(one) == without_run_and_wall(two), q
        if has_hist:
            one = plugin_fixtures.get_json(tb, "histograms", {"run": run, **q})
            two = plugin_fixtures.get_json(tb, "histograms", {"run": f"{run}_v2", **q})
            assert without_run_and_wall(one) == without_run_and_wall(two), q


def test_histograms_are_rebuilt_from_counts_and_stats(tb, twins, plugin_fixtures):
    _, written = twins
    key = ("train", "loss", "output", "model/embedding")
    body = plugin_fixtures.get_json(tb, "histograms", {"run": "train_v2", "layer": "model/embedding"})
    assert body["steps"] == plugin_fixtures.TRAIN_STEPS
    for step, hist in zip(body["steps"], body["histograms"]):
        h = np.asarray(hist, dtype=np.float64)
        want = written.hist[key][step]
        assert h.shape == (plugin_fixtures.BUCKETS, 3)
        np.testing.assert_array_equal(h[:, 2], want[:, 2])
        np.testing.assert_array_equal(h[:, :2], want[:, :2])
        x = written.inputs[key][step]
        assert h[0, 0] == x.min() and h[-1, 1] == x.max() and h[:, 2].sum() == x.size


def test_a_histogram_step_without_stats_is_skipped(tmp_path, plugin_fixtures):
    info = metadata.SeriesInfo(layer="m/a", kind=metadata.KIND_STATS, index=0)
    stats = metadata.GroupInfo.of(metadata.KIND_STATS, [info])
    hist = stats.with_kind(metadata.KIND_HISTOGRAM)
    counts = np.asarray([[1, 2, 3]], np.uint8)
    records = [
        (0, stats.tag_at(0), stats, stats_row(1.0, lo=-1.0, hi=2.0)[None]),
        (0, hist.tag_at(0), hist, counts),
        (1, hist.tag_at(1), hist, counts),
    ]
    plugin_fixtures.write_records(str(tmp_path / "r"), records)
    body = plugin_fixtures.get_json(
        plugin_fixtures.InProcess(str(tmp_path)), "histograms", {"run": "r", "layer": "m/a"}
    )
    assert body["steps"] == [0]
    assert body["histograms"] == [[[-1.0, 0.0, 1.0], [0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]]


@pytest.mark.parametrize("run", RUNS)
def test_anomalies_are_the_same(tb, run, plugin_fixtures):
    targets = {(t, s) for _, t, s, _ in layer_queries(plugin_fixtures, tb, run) if s != metadata.SOURCE_TARGET}
    for target, source in sorted(targets):
        q = {"target": "loss" if source == metadata.SOURCE_ACTIVATION else target, "source": source}
        one = plugin_fixtures.get_json(tb, "anomalies", {"run": run, **q})
        two = plugin_fixtures.get_json(tb, "anomalies", {"run": f"{run}_v2", **q})
        assert without_run_and_wall(one) == without_run_and_wall(two), q


def test_first_nonfinite_records_are_read_from_groups(tb, origin_fixtures, plugin_fixtures):
    """The records name a step before the stats do (a dropped stats record): the earlier one wins."""
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": "train_v2"})
    dense = next(x for x in body["layers"] if x["layer"] == "model/dense")
    assert dense["first_nonfinite"] == plugin_fixtures.NAN_STEP - 1
    assert body["summary"]["first_nonfinite"]["step"] == plugin_fixtures.NAN_STEP - 1
    origin = plugin_fixtures.get_json(tb, "anomalies", {"run": f"{origin_fixtures.FORWARD}_v2"})["summary"]["origin"]
    assert origin["step"] == origin_fixtures.NAN_STEP - 1 and origin["pass"] == "forward"


@pytest.mark.parametrize("run", RUNS)
def test_csv_is_the_same(tb, run):
    def rows(name):
        r = tb.get("csv", {"run": name})
        assert r.status_code == 200
        lines = r.data.decode().splitlines()
        header = lines[0].split(",")
        keep = [i for i, h in enumerate(header) if h not in ("run", "wall_time")]
        return [[line.split(",")[i] for i in keep] for line in lines]

    one, two = rows(run), rows(f"{run}_v2")
    assert one == two and len(one) > 1


def test_report_is_the_same(twins, plugin_fixtures, capsys):
    """`tb-layergrad report --format json` (the command's entry point, in process)."""
    from tb_layergrad import cli

    logdir, _ = twins
    assert cli.main(["report", logdir, "--format", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    by_run = {r["run"]: r for r in body["runs"]}
    for run in SMALL_RUNS:
        assert without_run_and_wall(by_run[run]) == without_run_and_wall(by_run[f"{run}_v2"])
    assert by_run["train_v2"]["summary"]["first_nonfinite"]["step"] == plugin_fixtures.NAN_STEP - 1
    assert body["warnings"] == []


def test_load_dataframe_is_the_same(twins, plugin_fixtures):
    import tb_layergrad

    logdir, written = twins
    df = tb_layergrad.load(logdir)
    for run in RUNS:
        one = df[df.run == run].drop(columns=["run", "wall_time"]).reset_index(drop=True)
        two = df[df.run == f"{run}_v2"].drop(columns=["run", "wall_time"]).reset_index(drop=True)
        assert len(one) > 0
        assert one.equals(two), run
    rnn = df[(df.run == "train_v2") & (df.layer == "model/rnn") & (df.source == "output")]
    assert list(rnn.step) == plugin_fixtures.TRAIN_STEPS
    want = np.linalg.norm(written.inputs[("train", "loss", "output", "model/rnn")][3].astype(np.float64))
    assert rnn.norm.iloc[3] == pytest.approx(want, rel=1e-5)
    for run in ORIGIN_RUNS:
        assert df.attrs["nonfinite_origin"][run] == df.attrs["nonfinite_origin"][f"{run}_v2"]


# -- a layer list that changes mid-run ---------------------------------------------------------------------


def test_a_rebuilt_model_writes_new_tags_and_its_layers_continue(tb, plugin_fixtures):
    from tensorboard import context

    tags = tb.provider.list_tensors(context.RequestContext(), experiment_id="", plugin_name=metadata.PLUGIN_NAME)[
        "train_v2"
    ]
    stats_groups = [t for t in tags if t.startswith("loss/output/layers-") and "/stats/" in t]
    assert len(stats_groups) == 2
    body = plugin_fixtures.get_json(tb, "stats", {"run": "train_v2", "layer": "model/embedding"})
    assert body["steps"] == plugin_fixtures.TRAIN_STEPS


def test_a_layer_that_joins_the_list_has_its_steps_from_then_on(tb, plugin_fixtures):
    rnn = plugin_fixtures.get_json(tb, "stats", {"run": "dropped_v2", "layer": DROPPED[0]})
    assert rnn["steps"] == [s for s in plugin_fixtures.TRAIN_STEPS if s >= DROPPED[1]]
    dense = plugin_fixtures.get_json(tb, "stats", {"run": "dropped_v2", "layer": "model/dense"})
    assert dense["steps"] == plugin_fixtures.TRAIN_STEPS
    matrix = plugin_fixtures.get_json(tb, "matrix", {"run": "dropped_v2", "stat": "norm"})
    row = matrix["values"][matrix["layers"].index(DROPPED[0])]
    assert [v is None for v in row] == [s < DROPPED[1] for s in plugin_fixtures.TRAIN_STEPS]


def test_the_blocks_of_a_group_are_one_series(tmp_path, plugin_fixtures):
    """A group's steps are cut into blocks, a tag each (docs/FORMAT.md): the routes read them as one series, its
    histograms drawn with the stats of the same step in the same block."""
    info = metadata.SeriesInfo(layer="m/a", kind=metadata.KIND_STATS, index=0)
    stats = metadata.GroupInfo.of(metadata.KIND_STATS, [info])
    hist = stats.with_kind(metadata.KIND_HISTOGRAM)
    b = stats.block_steps
    steps = [b - 2, b - 1, b, b + 1]
    counts = np.asarray([[1, 2, 3]], np.uint8)
    plugin_fixtures.write_records(
        str(tmp_path / "r"),
        [
            r
            for s in steps
            for r in (
                (s, stats.tag_at(s), stats, stats_row(float(s), lo=-1.0, hi=2.0)[None]),
                (s, hist.tag_at(s), hist, counts),
            )
        ],
    )
    tb = plugin_fixtures.InProcess(str(tmp_path))
    body = plugin_fixtures.get_json(tb, "stats", {"run": "r", "layer": "m/a"})
    assert body["steps"] == steps and body["stats"]["norm"] == [float(s) for s in steps]
    hists = plugin_fixtures.get_json(tb, "histograms", {"run": "r", "layer": "m/a"})
    assert hists["steps"] == steps
    assert hists["histograms"][-1] == [[-1.0, 0.0, 1.0], [0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]
    assert plugin_fixtures.get_json(tb, "matrix", {"run": "r"})["steps"] == steps


def test_at_a_repeated_step_the_later_record_wins_across_tags(tmp_path, plugin_fixtures):
    info = metadata.SeriesInfo(layer="m/a", kind=metadata.KIND_STATS, index=0)
    group = metadata.GroupInfo.of(metadata.KIND_STATS, [info])
    other = metadata.GroupInfo.of(metadata.KIND_STATS, [dataclass_replace(info, index=5)])  # another digest
    plugin_fixtures.write_records(
        str(tmp_path / "r"), [(0, info.tag, info, stats_row(1.0)), (1, info.tag, info, stats_row(1.0))]
    )
    plugin_fixtures.write_records(
        str(tmp_path / "r"),
        [(1, group.tag_at(1), group, stats_row(2.0)[None]), (2, group.tag_at(2), group, stats_row(2.0)[None])],
    )
    plugin_fixtures.write_records(str(tmp_path / "r"), [(2, other.tag_at(2), other, stats_row(3.0)[None])])
    tb = plugin_fixtures.InProcess(str(tmp_path))
    body = plugin_fixtures.get_json(tb, "stats", {"run": "r", "layer": "m/a"})
    assert body["steps"] == [0, 1, 2]
    assert body["stats"]["norm"] == [1.0, 2.0, 3.0]
    assert plugin_fixtures.get_json(tb, "matrix", {"run": "r"})["values"] == [[1.0, 2.0, 3.0]]
    assert plugin_fixtures.get_json(tb, "runs", {})["runs"][0]["layers"][0]["index"] == 5  # the latest layer list's


# -- bad input ---------------------------------------------------------------------------------------------


def test_a_truncated_last_record_is_skipped(tmp_path, twins, plugin_fixtures):
    import shutil

    logdir, _ = twins
    shutil.copytree(os.path.join(logdir, "train_v2"), str(tmp_path / "cut"))
    (path,) = glob.glob(str(tmp_path / "cut" / "events.out.tfevents.*"))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)
    tb = plugin_fixtures.InProcess(str(tmp_path))
    body = plugin_fixtures.get_json(tb, "matrix", {"run": "cut", "stat": "norm"})
    assert (
        body["steps"] == plugin_fixtures.TRAIN_STEPS
    )  # the last record is a step-9 record, other step-9 records remain
    stats = plugin_fixtures.get_json(tb, "stats", {"run": "cut", "layer": "model/dense"})
    assert stats["steps"] == plugin_fixtures.TRAIN_STEPS
    assert (
        plugin_fixtures.get_json(tb, "anomalies", {"run": "cut"})["summary"]["last_step"]
        == plugin_fixtures.TRAIN_STEPS[-1]
    )
    assert (
        plugin_fixtures.get_json(tb, "histograms", {"run": "cut", "layer": "model/dense"})["steps"][:-1]
        == plugin_fixtures.TRAIN_STEPS[:-1]
    )


def test_a_newer_group_content_is_skipped_with_a_warning(tmp_path, plugin_fixtures, capsys):
    import tensorflow as tf
    from tensorboard.compat.proto import summary_pb2

    info = metadata.SeriesInfo(layer="m/a", kind=metadata.KIND_STATS, index=0)
    plugin_fixtures.write_records(str(tmp_path / "ok"), [(0, info.tag, info, stats_row(1.0))])
    content = json.dumps(
        {
            "version": 3,
            "kind": "stats",
            "target": "loss",
            "source": "output",
            "layers": ["m/a"],
            "indexes": [0],
            "dtypes": [""],
            "fields": list(metadata.STAT_FIELDS),
        }
    ).encode()
    md = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
    writer = tf.summary.create_file_writer(str(tmp_path / "ok"))
    with writer.as_default():
        tf.summary.write("loss/output/layers-abc/stats", tf.constant(stats_row(2.0)[None]), step=1, metadata=md)
    writer.close()
    tb = plugin_fixtures.InProcess(str(tmp_path))
    body = plugin_fixtures.get_json(tb, "runs", {})
    (warning,) = body["warnings"]
    assert "format version 3" in warning and "upgrade tb_layergrad" in warning and "'ok'" in warning
    assert plugin_fixtures.get_json(tb, "stats", {"run": "ok", "layer": "m/a"})["steps"] == [0]
    assert plugin_fixtures.get_json(tb, "matrix", {"run": "ok"})["steps"] == [0]

    # `tb-layergrad report` says it too, in each format (CSV: on stderr)
    from tb_layergrad import cli

    assert cli.main(["report", str(tmp_path)]) == 0
    assert "upgrade tb_layergrad" in capsys.readouterr().out
    assert cli.main(["report", str(tmp_path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == [warning]
    assert cli.main(["report", str(tmp_path), "--format", "csv"]) == 0
    assert "format version 3" in capsys.readouterr().err


def test_a_record_whose_rows_disagree_with_its_layers_is_skipped(tmp_path, caplog, plugin_fixtures):
    a = metadata.SeriesInfo(layer="m/a", kind=metadata.KIND_STATS, index=0)
    b = dataclass_replace(a, layer="m/b", index=1)
    stats = metadata.GroupInfo.of(metadata.KIND_STATS, [a, b])
    hist = stats.with_kind(metadata.KIND_HISTOGRAM)
    first = stats.with_kind(metadata.KIND_FIRST_NONFINITE)
    good = np.stack([stats_row(1.0), stats_row(2.0)])
    records = [
        (0, stats.tag_at(0), stats, good),
        (0, hist.tag_at(0), hist, np.ones([2, 3], np.uint8)),
        (0, first.tag_at(0), first, np.asarray([-1, -1])),
        (1, stats.tag_at(1), stats, good[:1]),
        (1, hist.tag_at(1), hist, np.ones([3, 3], np.uint8)),
        (1, first.tag_at(1), first, np.asarray([1])),
        (2, stats.tag_at(2), stats, good[:, :5]),
        (2, hist.tag_at(2), hist, np.ones([2, 3], np.uint8)),
        (3, stats.tag_at(3), stats, good),
        (3, hist.tag_at(3), hist, np.ones([2, 4], np.uint8)),
    ]
    plugin_fixtures.write_records(str(tmp_path / "r"), records)
    tb = plugin_fixtures.InProcess(str(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert plugin_fixtures.get_json(tb, "stats", {"run": "r", "layer": "m/b"})["steps"] == [0, 3]
        assert plugin_fixtures.get_json(tb, "matrix", {"run": "r"})["steps"] == [0, 3]
        assert plugin_fixtures.get_json(tb, "histograms", {"run": "r", "layer": "m/b"})["steps"] == [0, 3]
        body = plugin_fixtures.get_json(tb, "anomalies", {"run": "r"})
    assert body["steps"] == [0, 3] and all(x["first_nonfinite"] is None for x in body["layers"])
    assert any("expected [2, 12]" in r.getMessage() for r in caplog.records)
    assert any("expected [2, *]" in r.getMessage() for r in caplog.records)


# -- helpers -----------------------------------------------------------------------------------------------


def dataclass_replace(info, **changes):
    import dataclasses

    return dataclasses.replace(info, **changes)


def stats_row(norm: float, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """A float64 stats record (STAT_FIELDS order) with the given norm, min and max."""
    return np.asarray(
        metadata.stat_values(
            elements=4,
            nan=0,
            pos_inf=0,
            neg_inf=0,
            zeros=0,
            min=lo,
            max=hi,
            mean=0.5,
            std=0.5,
            norm=norm,
            mean_abs=0.5,
            no_gradient=0,
        ),
        np.float64,
    )


# -- a real TensorBoard, both loaders -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(twins, tmp_path_factory, tensorboard_process):

    logdir, _ = twins
    logs = str(tmp_path_factory.mktemp("tensorboard_logs_v2"))
    with tensorboard_process.tensorboards(logdir, [("true", []), ("false", [])], logs) as procs:
        for p in procs:
            p.wait_for_runs({run: 9 if run.startswith("train") else 0 for run in ("train", "train_v2")}, timeout=120)
        yield dict(zip(("rust", "python"), procs))


def served(plugin_fixtures, p, route, **query):
    import urllib.parse

    status, body, _ = p.get("/data/plugin/layergrad/" + route + "?" + urllib.parse.urlencode(query, doseq=True))
    assert status == 200, body[:300]
    return plugin_fixtures.strict_json(body)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rust", "python"])
def test_both_loaders_list_and_read_group_tags_whose_metadata_is_in_the_first_record(
    servers, tb, name, plugin_fixtures
):
    p = servers[name]
    runs = {r["run"]: r for r in served(plugin_fixtures, p, "runs")["runs"]}
    assert runs["train_v2"]["format_versions"] == [2] and runs["train"]["format_versions"] == [1]
    assert without_run_and_wall(runs["train"]) == without_run_and_wall(runs["train_v2"])
    for route, query in (
        ("matrix", {"stat": "norm"}),
        ("matrix", {"stat": "zero_frac", "source": "weight"}),
        ("stats", {"layer": "model/dense"}),
        ("histograms", {"layer": "model/rnn"}),
        ("anomalies", {}),
        ("compare", {"layer": "model/dense", "run": ["train", "train_v2"]}),
    ):
        if route == "compare":
            body = served(plugin_fixtures, p, route, **query)
            assert body["values"][0] == body["values"][1] and body["missing"] == []
            continue
        one = served(plugin_fixtures, p, route, run="train", **query)
        two = served(plugin_fixtures, p, route, run="train_v2", **query)
        assert without_run_and_wall(one) == without_run_and_wall(two), (route, query)
        # and the in-process answer (the Python loader through the plugin's own test harness)
        assert without_run_and_wall(two) == without_run_and_wall(
            plugin_fixtures.get_json(tb, route, {"run": "train_v2", **query})
        )


# -- cost: one table per group tag, one-layer routes list by tag -------------------------------------------


def test_a_group_tag_is_cached_once_and_its_layers_are_views(tb, plugin_fixtures):
    from tensorboard import context

    from tb_layergrad.reader import catalog as cat_mod
    from tb_layergrad.reader.stats_store import StatsStore

    ctx = context.RequestContext()
    rc = cat_mod.load(tb.provider, ctx, "", runs=["eval_v2"]).run("eval_v2")
    chosen = rc.with_kind("loss", "output", metadata.KIND_STATS)
    assert len(chosen) == 4 and all(len(s.parts) == 1 and s.parts[0].grouped for s in chosen)
    store = StatsStore(tb.provider)
    rows = store.read(ctx, "", "eval_v2", chosen)
    (united,) = [v for _, v in store._tables.values()]  # noqa: SLF001 - the cache itself is what is tested
    cached = united.rows
    steps = len(plugin_fixtures.EVAL_STEPS)
    assert cached.table.shape == (steps, 4, len(metadata.STAT_FIELDS))
    assert store._bytes == cached.nbytes == steps * (8 + 8 + 4 * 12 * 8)  # noqa: SLF001
    assert all(np.shares_memory(rows[s.key].table, cached.table) for s in chosen)
    again = store.read(ctx, "", "eval_v2", chosen)
    assert all(np.shares_memory(again[s.key].table, cached.table) for s in chosen)
    # Column-major per layer: one statistic of one layer over every step is one contiguous run of memory.
    assert all(again[s.key].table[:, j].flags.c_contiguous for s in chosen for j in range(len(metadata.STAT_FIELDS)))


@pytest.mark.parametrize("run, layer", [("eval", "model/dense"), ("eval_v2", "model/dense")])
def test_one_layer_routes_list_by_tag_once_the_run_was_listed(tb, run, layer, plugin_fixtures):
    plugin_fixtures.get_json(tb, "runs", {})
    for route in ("stats", "histograms"):
        before = len(tb.provider.calls)
        plugin_fixtures.get_json(tb, route, {"run": run, "layer": layer})
        lists = [c for c in tb.provider.calls[before:] if c[0] == "list_tensors"]
        assert lists and all(c[3] is not None for c in lists), lists  # never a listing of the whole run
        if run == "eval":  # version 1: the layer's own tag, as before
            assert lists[0][3] == {
                metadata.make_tag("loss", "output", layer, {"stats": "stats", "histograms": "histogram"}[route])
            }


@pytest.mark.slow
def test_a_truncated_last_record_is_skipped_by_the_rust_loader_too(
    tmp_path, twins, plugin_fixtures, tensorboard_process
):
    """The same cut file as above, served by a real TensorBoard with its Rust data server."""
    import shutil

    logdir, _ = twins
    shutil.copytree(os.path.join(logdir, "train_v2"), str(tmp_path / "logs" / "cut"))
    (path,) = glob.glob(str(tmp_path / "logs" / "cut" / "events.out.tfevents.*"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    p = tensorboard_process.TensorBoardProcess(
        str(tmp_path / "logs"), str(tmp_path / "tensorboard.log"), load_fast="true"
    )
    try:
        p.wait_for_runs({"cut": plugin_fixtures.TRAIN_STEPS[-1]}, timeout=120)
        assert served(plugin_fixtures, p, "matrix", run="cut", stat="norm")["steps"] == plugin_fixtures.TRAIN_STEPS
        assert (
            served(plugin_fixtures, p, "stats", run="cut", layer="model/dense")["steps"] == plugin_fixtures.TRAIN_STEPS
        )
        assert (
            served(plugin_fixtures, p, "anomalies", run="cut")["summary"]["last_step"]
            == plugin_fixtures.TRAIN_STEPS[-1]
        )
        assert (
            served(plugin_fixtures, p, "histograms", run="cut", layer="model/dense")["steps"][:-1]
            == plugin_fixtures.TRAIN_STEPS[:-1]
        )
    finally:
        p.stop()
