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


def test_load_skips_a_record_of_other_rows_and_keeps_the_later_of_a_repeated_step(tmp_path, caplog, plugin_fixtures):
    """A record whose rows disagree with its layers is skipped with its warning, and a step written again (a
    restarted run) takes the later record: as the tab's `stats` route reads them (TensorBoard's reader), whether
    a series' records are all of one shape (read as arrays at once) or not (read one by one)."""
    import logging

    a = metadata.SeriesInfo(layer="m/a", kind=metadata.KIND_STATS, index=0)
    b = metadata.SeriesInfo(layer="m/b", kind=metadata.KIND_STATS, index=1)
    stats = metadata.GroupInfo.of(metadata.KIND_STATS, [a, b])

    def row(norm: float) -> np.ndarray:
        values = dict(elements=4, nan=0, pos_inf=0, neg_inf=0, zeros=0, min=0.0, max=1.0, mean=0.5, std=0.1)
        values.update(norm=norm, mean_abs=0.5, no_gradient=0)
        return np.asarray(metadata.stat_values(**values), np.float64)

    def good(norm: float) -> np.ndarray:
        return np.stack([row(norm), row(norm * 10)])

    steps = {"mixed": [0, 1, 2, 2, 3], "restarted": [0, 1, 2, 1, 2, 3]}
    for run, written in steps.items():
        records = [(s, stats.tag_at(s), stats, good(float(i + 1))) for i, s in enumerate(written)]
        if run == "mixed":
            records[1] = (1, stats.tag_at(1), stats, good(2.0)[:1])  # one row for two layers
        plugin_fixtures.write_records(str(tmp_path / run), records)
    with caplog.at_level(logging.WARNING):
        df = tb_layergrad.load(str(tmp_path))
    assert any("expected [2, 12]" in r.getMessage() for r in caplog.records)
    tb = plugin_fixtures.InProcess(str(tmp_path))
    want = {"mixed": ([0, 2, 3], [10.0, 40.0, 50.0]), "restarted": ([0, 1, 2, 3], [10.0, 40.0, 50.0, 60.0])}
    for run, (want_steps, want_norms) in want.items():
        rows = df[(df.run == run) & (df.layer == "m/b")]
        assert list(rows.step) == want_steps
        np.testing.assert_array_equal(rows.norm.to_numpy(), want_norms)
        route = plugin_fixtures.get_json(tb, "stats", {"run": run, "layer": "m/b"})
        assert route["steps"] == want_steps
        np.testing.assert_array_equal(plugin_fixtures.as_float(route["stats"]["norm"]), want_norms)
