"""`depth`: every layer's statistic in many runs at one step, through a real `tensorboard` under both loaders.

RUNS runs x LAYERS layers (`long_fixtures.write_run`: the records the summary ops write, framed fast), run k
`k % 7` steps shorter than the longest and every tenth in format version 1 (a tag per layer); one more run
records another target only. Each run's profile is checked against the records written and against what
`matrix` answers for that run at that step; asked again (warm), the same answer. Its speed is measured in
bench/tab_sweep.py.
"""

from __future__ import annotations

import urllib.parse

import numpy as np
import pytest

RUNS = 100
LAYERS = [f"net/l{i:02d}" for i in range(50)]
STEPS = 60
OTHER = "other/aux"  # its only target is `aux`: missing for target `loss`


def run_name(k: int) -> str:
    return f"sweep/run_{k:03d}"


def last_step(k: int) -> int:
    return STEPS - 1 - k % 7


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, long_fixtures, tensorboard_process):
    logdir = tmp_path_factory.mktemp("depth")
    tables = {
        run_name(k): long_fixtures.write_run(
            str(logdir / run_name(k)), LAYERS, last_step(k) + 1, format_version=1 if k % 10 == 3 else 2, seed=k + 1
        )
        for k in range(RUNS)
    }
    long_fixtures.write_run(str(logdir / OTHER), LAYERS[:3], STEPS, target="aux")
    lasts = {run_name(k): last_step(k) for k in range(RUNS)}
    with tensorboard_process.tensorboards(
        str(logdir), [("true", []), ("false", [])], str(tmp_path_factory.mktemp("logs"))
    ) as procs:
        for p in procs:
            p.wait_for_runs({**lasts, OTHER: STEPS - 1}, timeout=300)
        yield procs, tables


def depth_path(tensorboard_process, runs, **more) -> str:
    return (
        tensorboard_process.PLUGIN_API
        + "depth?"
        + urllib.parse.urlencode([("run", r) for r in runs] + list(more.items()))
    )


def check_against_matrix(tensorboard_process, tb, profile: dict, stat: str) -> None:
    """The profile is the column `matrix` answers for that run at that step."""
    step = profile["step"]
    m = tb.get_json(
        tensorboard_process.PLUGIN_API
        + "matrix?"
        + urllib.parse.urlencode({"run": profile["run"], "stat": stat, "start": step, "end": step})
    )
    assert m["steps"] == [step]
    assert m["layers"] == profile["layers"]
    assert [row[0] for row in m["values"]] == profile["values"]


@pytest.mark.parametrize("loader", [0, 1], ids=["load_fast=true", "load_fast=false"])
@pytest.mark.slow
def test_depth_of_a_hundred_runs_is_each_runs_column_at_the_step_or_before(
    sweep, loader, long_fixtures, tensorboard_process
):
    procs, tables = sweep
    tb = procs[loader]
    runs = [run_name(k) for k in reversed(range(RUNS))] + [OTHER]  # the order asked is the order answered
    asked = STEPS - 1
    body = tb.get_json(depth_path(tensorboard_process, runs, step=asked), timeout=60)
    assert body["runs"] == runs and body["missing"] == [OTHER]
    assert (body["step"], body["stat"], body["target"], body["source"]) == (asked, "norm", "loss", "output")
    assert [p["run"] for p in body["profiles"]] == runs
    assert body["profiles"][-1] == {"run": OTHER, "step": None, "layers": [], "values": []}
    for p in body["profiles"][:-1]:
        k = int(p["run"][-3:])
        assert p["step"] == last_step(k)  # the nearest recorded step at or before the one asked
        assert p["layers"] == LAYERS  # model order
        want = [tables[p["run"]][layer][p["step"], long_fixtures.S["norm"]] for layer in LAYERS]
        np.testing.assert_array_equal(np.array(p["values"], dtype=np.float64), want)  # float64 records, JSON
        check_against_matrix(tensorboard_process, tb, p, "norm")
    assert tb.get_json(depth_path(tensorboard_process, runs, step=asked), timeout=60) == body  # warm: the same answer


@pytest.mark.parametrize("loader", [0, 1], ids=["load_fast=true", "load_fast=false"])
def test_depth_at_an_earlier_step_a_derived_statistic_and_without_a_step(
    sweep, loader, tensorboard_process, plugin_fixtures
):
    procs, tables = sweep
    tb = procs[loader]
    runs = [run_name(k) for k in range(0, RUNS, 9)]
    for stat in ("rms", "elements"):
        body = tb.get_json(depth_path(tensorboard_process, runs, step=17, stat=stat), timeout=60)
        assert body["missing"] == [] and body["stat"] == stat
        for p in body["profiles"]:
            assert p["step"] == 17
            want = [plugin_fixtures.expected_stat(tables[p["run"]][layer][17], stat) for layer in LAYERS]
            if stat == "elements":
                assert p["values"] == [int(w) for w in want]  # a count: a JSON integer
            else:
                np.testing.assert_allclose(p["values"], want, rtol=4 * np.finfo(np.float64).eps)
            check_against_matrix(tensorboard_process, tb, p, stat)
    # No step: each run's last.
    body = tb.get_json(depth_path(tensorboard_process, runs), timeout=60)
    assert body["step"] is None
    assert [p["step"] for p in body["profiles"]] == [last_step(int(r[-3:])) for r in runs]


def test_depth_names_what_is_missing_or_unknown(sweep, tensorboard_process):
    tb = sweep[0][0]
    status, body, _ = tb.get(depth_path(tensorboard_process, [OTHER]), timeout=30)
    assert status == 404 and b"no 'output' stats for target 'loss' in any of the runs" in body
    status, body, _ = tb.get(depth_path(tensorboard_process, [run_name(0), "sweep/nope"]), timeout=30)
    assert status == 404 and b"sweep/nope" in body
    body = tb.get_json(depth_path(tensorboard_process, [OTHER, run_name(1)], target="aux"))
    assert body["missing"] == [run_name(1)] and body["profiles"][0]["layers"] == LAYERS[:3]
