"""tb_layergrad.load() gives the plugin's numbers, as a DataFrame."""

from __future__ import annotations

import numpy as np

import tb_layergrad
from tb_layergrad import metadata


def test_load_equals_the_stats_route_for_every_series(small_logdir, plugin_fixtures):
    df = tb_layergrad.load(small_logdir.logdir)
    tb = plugin_fixtures.InProcess(small_logdir.logdir)
    runs = plugin_fixtures.strict_json(tb.get("runs").data)["runs"]
    compared = 0
    for run in runs:
        layers = run["layers"]
        # Model order, as the tab lists it.
        assert list(dict.fromkeys(df[df.run == run["run"]].layer)) == [l["layer"] for l in layers if l["stats"]]
        for layer in layers:
            for s in layer["series"]:
                if "stats" not in s["kinds"]:
                    continue
                q = {"run": run["run"], "layer": layer["layer"], "target": s["target"], "source": s["source"]}
                route = plugin_fixtures.strict_json(tb.get("stats", q).data)
                rows = df[
                    (df.run == run["run"])
                    & (df.layer == layer["layer"])
                    & (df.target == s["target"])
                    & (df.source == s["source"])
                ]
                assert list(rows.step) == route["steps"]
                for stat, values in route["stats"].items():
                    np.testing.assert_array_equal(
                        rows[stat].to_numpy(dtype=float), plugin_fixtures.as_float(values), err_msg=f"{q} {stat}"
                    )
                compared += 1
    assert compared >= 5


def test_load_numbers_are_what_was_written(small_logdir):
    df = tb_layergrad.load(small_logdir.logdir)
    for (run, target, source, layer), by_step in small_logdir.stats.items():
        rows = df[(df.run == run) & (df.layer == layer) & (df.target == target) & (df.source == source)]
        assert sorted(by_step) == list(rows.step)
        for step, stats in by_step.items():
            row = rows[rows.step == step].iloc[0]
            for i, name in enumerate(metadata.STAT_FIELDS):
                np.testing.assert_allclose(
                    row[name], stats[i], rtol=0, equal_nan=True, err_msg=f"{layer} {step} {name}"
                )


def test_load_of_an_empty_logdir(tmp_path):
    df = tb_layergrad.load(str(tmp_path))
    assert len(df) == 0 and "norm" in df.columns


def test_load_of_a_part_is_that_part_of_the_whole(small_logdir):
    import pandas as pd

    whole = tb_layergrad.load(small_logdir.logdir)
    run = sorted(set(whole.run))[0]
    layer = next(l for l in whole[whole.run == run].layer if l != metadata.DEFAULT_TARGET)
    steps = sorted(set(whole[whole.run == run].step))
    start, end = steps[1], steps[-2]
    part = tb_layergrad.load(
        small_logdir.logdir, runs=[run], layers=[layer], steps=(start, end), columns=["norm", "state"]
    )
    assert list(part.columns) == ["run", "layer", "target", "source", "step", "norm", "state"]
    want = whole[(whole.run == run) & (whole.layer == layer) & (whole.step >= start) & (whole.step <= end)]
    pd.testing.assert_frame_equal(part.reset_index(drop=True), want[list(part.columns)].reset_index(drop=True))
    assert part.attrs["damage"] == []
