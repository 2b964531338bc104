"""`compare` and `noise_scale` at a sweep's scale, through a real `tensorboard` process under both loaders.

A logdir of RUNS runs x STEPS steps of two layers (`long_fixtures.write_run`: the records the summary ops write,
framed fast), each run its own values. `compare` of all of them answers every run's column exactly as written,
and asked again (warm) answers the same; 201 runs are refused. Its speed is measured in bench/tab_sweep.py.
"""

from __future__ import annotations

import urllib.parse

import numpy as np
import pytest

RUNS = 100
STEPS = 1000
LAYERS = ["net/in", "net/out"]
LIMIT = 200  # docs/HTTP_API.md


def run_name(k: int) -> str:
    return f"sweep/run_{k:03d}"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, long_fixtures, tensorboard_process):
    logdir = tmp_path_factory.mktemp("sweep")
    tables = {
        run_name(k): long_fixtures.write_run(str(logdir / run_name(k)), LAYERS, STEPS, seed=k + 1) for k in range(RUNS)
    }
    with tensorboard_process.tensorboards(
        str(logdir), [("true", []), ("false", [])], str(tmp_path_factory.mktemp("logs"))
    ) as procs:
        for p in procs:
            p.wait_for_runs({run_name(k): STEPS - 1 for k in range(RUNS)}, timeout=300)
        yield procs, tables


def compare_path(tensorboard_process, runs, **more) -> str:
    return (
        tensorboard_process.PLUGIN_API
        + "compare?"
        + urllib.parse.urlencode([("run", r) for r in runs] + list(more.items()))
    )


@pytest.mark.parametrize("loader", [0, 1], ids=["load_fast=true", "load_fast=false"])
@pytest.mark.slow
def test_compare_of_a_hundred_runs_answers_each_run(sweep, loader, long_fixtures, tensorboard_process):
    procs, tables = sweep
    tb = procs[loader]
    runs = [run_name(k) for k in reversed(range(RUNS))]  # the order asked is the order answered
    path = compare_path(tensorboard_process, runs, layer="net/out", stat="norm")
    body = tb.get_json(path, timeout=60)
    assert body["runs"] == runs and body["missing"] == []
    assert body["steps"] == list(range(STEPS))
    for name, values in zip(runs, body["values"]):
        want = tables[name]["net/out"][:, long_fixtures.S["norm"]]
        np.testing.assert_array_equal(np.array(values, dtype=np.float64), want)  # float64 records, JSON round trip
    assert tb.get_json(path, timeout=60) == body  # warm: the same answer


@pytest.mark.parametrize("loader", [0, 1], ids=["load_fast=true", "load_fast=false"])
def test_noise_scale_of_a_hundred_runs_names_those_without_it(sweep, loader, tensorboard_process):
    tb = sweep[0][loader]
    runs = [run_name(k) for k in range(RUNS)]
    body = tb.get_json(
        tensorboard_process.PLUGIN_API + "noise_scale?" + urllib.parse.urlencode([("run", r) for r in runs]), timeout=60
    )
    assert body["runs"] == runs and body["missing"] == runs and body["series"] == []


def test_more_runs_than_the_limit_is_a_400_that_says_so(sweep, tensorboard_process):
    tb = sweep[0][0]
    names = [run_name(k % RUNS) + f"_{k}" for k in range(LIMIT + 1)]
    for route in ("compare", "noise_scale"):
        query = [("run", r) for r in names] + ([("layer", "net/out")] if route == "compare" else [])
        status, body, _ = tb.get(
            tensorboard_process.PLUGIN_API + route + "?" + urllib.parse.urlencode(query), timeout=60
        )
        assert status == 400, body[:300]
        assert f"at most {LIMIT} runs".encode() in body and b"ask for fewer runs" in body
    # The limit itself is allowed: runs that do not exist are a 404, not a 400.
    status, body, _ = tb.get(compare_path(tensorboard_process, names[:LIMIT], layer="net/out"), timeout=60)
    assert status == 404, body[:300]
