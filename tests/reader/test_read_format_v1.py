"""A logdir written by the version-1 writer (tests/data/format_v1) is still read: reader, `load()` and routes.

Only format version 2 is written now; these event files were written by the last writer that could
write version 1 (tests/data/format_v1/README.md says how). `expected.json` holds every record of them as
TensorFlow's own event reader read them right after the writing: the numbers every reader must give back.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import tb_layergrad
from tb_layergrad import metadata

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "format_v1")
RUN = "train"
NAN_STEP = 3  # model/dense's output gradient holds a NaN and an +Inf at this step


def _expected():
    with open(os.path.join(DATA, "expected.json")) as f:
        records = json.load(f)["records"]
    out = {}  # (source, layer, kind) -> {step: np.ndarray}
    for r in records:
        info = r["info"]
        assert info["version"] == 1  # every record of the data is a version-1 record
        value = np.asarray(r["value"], dtype=np.float64).reshape(r["shape"])  # a JSON null reads as NaN
        for text in r["nonfinite"]:  # a non-finite value of a record was stored as null: put it back
            value.reshape(-1)[np.flatnonzero(np.isnan(value.reshape(-1)))[0]] = float(text)
        out.setdefault((info["source"], info["layer"], info["kind"]), {})[r["step"]] = value
    return out


EXPECTED = _expected()
STATS = {(src, layer): v for (src, layer, kind), v in EXPECTED.items() if kind == metadata.KIND_STATS}


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A copy: TensorBoard's reader never writes, but a test must not depend on that."""
    path = str(tmp_path_factory.mktemp("format_v1"))
    shutil.copytree(os.path.join(DATA, "logdir"), path, dirs_exist_ok=True)
    return path


@pytest.fixture(scope="module")
def tb(logdir, plugin_fixtures):
    return plugin_fixtures.InProcess(logdir)


def test_the_data_is_what_its_readme_says():
    assert set(STATS) == {
        ("output", "model/dense"),
        ("output", "model/dense_1"),
        ("weight", "model/dense/kernel"),
        ("target", "loss"),
    }
    assert all(sorted(v) == list(range(6)) for v in STATS.values())
    nan_stats = STATS[("output", "model/dense")][NAN_STEP]
    assert nan_stats[metadata.STAT_INDEX["nan"]] == 1 and nan_stats[metadata.STAT_INDEX["pos_inf"]] == 1
    firsts = EXPECTED[("output", "model/dense", metadata.KIND_FIRST_NONFINITE)]
    assert {s: int(v[0]) for s, v in firsts.items()} == {3: 3, 4: 3, 5: 3}


def test_runs_route_lists_the_version_1_run(tb, plugin_fixtures):
    (run,) = plugin_fixtures.get_json(tb, "runs", {})["runs"]
    assert run["run"] == RUN and run["format_versions"] == [1]
    assert [x["layer"] for x in run["layers"]] == ["model/dense", "model/dense/kernel", "model/dense_1"]
    assert run["target_series"] == ["loss"]


@pytest.mark.parametrize("source, layer", sorted(STATS))
def test_stats_route_gives_the_written_numbers(tb, source, layer, plugin_fixtures):
    target = layer if source == metadata.SOURCE_TARGET else metadata.DEFAULT_TARGET
    body = plugin_fixtures.get_json(tb, "stats", {"run": RUN, "layer": layer, "target": target, "source": source})
    written = STATS[(source, layer)]
    assert body["steps"] == sorted(written)
    for i, name in enumerate(metadata.STAT_FIELDS):
        np.testing.assert_array_equal(
            plugin_fixtures.as_float(body["stats"][name]), [written[s][i] for s in body["steps"]], name
        )


@pytest.mark.parametrize("source, layer", [k for k in sorted(STATS) if k[0] != metadata.SOURCE_TARGET])
def test_histograms_route_gives_the_written_buckets(tb, source, layer, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "histograms", {"run": RUN, "layer": layer, "source": source})
    written = EXPECTED[(source, layer, metadata.KIND_HISTOGRAM)]
    assert body["steps"] == sorted(written)
    for step, hist in zip(body["steps"], body["histograms"]):
        np.testing.assert_array_equal(np.asarray(hist, np.float64), written[step])
        assert np.asarray(hist)[:, 2].sum() == STATS[(source, layer)][step][metadata.STAT_INDEX["elements"]] - (
            2 if (layer, step) == ("model/dense", NAN_STEP) else 0
        )


def test_anomalies_route_finds_the_nan_step_and_where_it_was_born(tb, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": RUN})
    first = body["summary"]["first_nonfinite"]
    assert first["step"] == NAN_STEP and first["layers"] == ["model/dense"]
    assert (first["pass"], first["origin"]) == ("backward", "model/dense_1")


def test_load_gives_the_written_numbers(logdir):
    df = tb_layergrad.load(logdir)
    assert set(df.run) == {RUN}
    for (source, layer), written in STATS.items():
        rows = df[(df.layer == layer) & (df.source == source)].sort_values("step")
        assert list(rows.step) == sorted(written)
        for i, name in enumerate(metadata.STAT_FIELDS):
            np.testing.assert_array_equal(rows[name].to_numpy(float), [written[s][i] for s in rows.step], name)
    origin = df.attrs["nonfinite_origin"][RUN]["loss"]
    assert (origin["step"], origin["pass"], origin["origin"]) == (NAN_STEP, "backward", "model/dense_1")
