"""Vanishing over steps measured on runs whose answer is set by construction (tests/known_answer_fixtures.py): a
loss whose gradient collapses by a planted number of decades from step K while its value stalls, and two trainings
whose gradient falls by decades because their loss converges (the false positive the rule must not make).
Precision and recall over layers, through the real `anomalies` route; the same verdicts from `tb-layergrad report`
and `load()`. docs/ANOMALIES.md ("Vanishing over steps") states the numbers measured here."""

from __future__ import annotations

import json
import math

import pytest

from tb_layergrad.reader import anomalies, trends

# Every test reads the module's planted logdir, which takes seconds to write: out of the quick loop, in CI's main leg.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, known_answer_fixtures):
    d = str(tmp_path_factory.mktemp("over_steps"))
    known_answer_fixtures.write_stalled(d)
    known_answer_fixtures.write_converging(d)
    return d


@pytest.fixture(scope="module")
def bodies(logdir, known_answer_fixtures, plugin_fixtures):
    tb = plugin_fixtures.InProcess(logdir)
    return {
        run: plugin_fixtures.get_json(tb, "anomalies", {"run": run})
        for run in (*known_answer_fixtures.COLLAPSES, *known_answer_fixtures.CONVERGING)
    }


def _truth(known_answer_fixtures, run: str) -> bool:
    """Planted: the `stall_*` runs whose gradient was cut by STEP_DECAY_DECADES or more; never a converging run."""
    return (
        run in known_answer_fixtures.COLLAPSES
        and -math.log10(known_answer_fixtures.COLLAPSES[run]) >= trends.STEP_DECAY_DECADES
    )


def test_precision_and_recall_over_layers(bodies, known_answer_fixtures):
    flagged = {(run, e["layer"]) for run, b in bodies.items() for e in b["layers"] if _over(e)}
    truth = {(run, e["layer"]) for run, b in bodies.items() for e in b["layers"] if _truth(known_answer_fixtures, run)}
    tp = len(flagged & truth)
    assert (tp / len(flagged), tp / len(truth)) == (1.0, 1.0), (sorted(flagged ^ truth), len(truth))
    assert len(truth) == 3 * len(known_answer_fixtures.LAYERS)


def test_the_converging_runs_are_the_false_positive_a_gradient_alone_would_make(bodies, known_answer_fixtures):
    """Their gradient fell as far as a collapse's (>= STEP_DECAY_DECADES) but their loss fell with it."""
    for run in known_answer_fixtures.CONVERGING:
        decays = [e["step_decay"] for e in bodies[run]["layers"]]
        assert max(decays) <= -trends.STEP_DECAY_DECADES, (run, decays)
        assert bodies[run]["summary"]["findings"] == [] and not any(_over(e) for e in bodies[run]["layers"])
    for (
        run
    ) in known_answer_fixtures.COLLAPSES:  # their decay is the planted one (the loss's value unchanged, batches aside)
        for e in bodies[run]["layers"]:
            assert e["step_decay"] == pytest.approx(math.log10(known_answer_fixtures.COLLAPSES[run]), abs=0.1), (run, e)


def test_the_verdict_names_the_step_of_the_collapse_and_one_finding_all_layers(bodies, known_answer_fixtures):
    body = bodies["stall_3"]
    assert {e["verdict"]["step"] for e in body["layers"]} == {
        known_answer_fixtures.K
    }  # planted from step K: 10^3 below at once
    (finding,) = body["summary"]["findings"]
    assert finding["kind"] == anomalies.VANISHING_OVER_STEPS and finding["layers"] == [
        known_answer_fixtures.path(x) for x in known_answer_fixtures.LAYERS
    ]
    worst = min(e["step_decay"] for e in body["layers"])
    assert (
        f"10^{-worst:.1f} times" in finding["line"]
        and "value of loss " in finding["line"]
        and "falls by 50% or more" in finding["line"]
    )
    assert body["summary"]["latest"][anomalies.VANISHING_OVER_STEPS] == len(known_answer_fixtures.LAYERS)


def test_report_and_load_tell_the_same(logdir, bodies, known_answer_fixtures, report_json):
    doc = report_json(logdir, "--run", "stall_3", "--run", "regression")
    for r in doc["runs"]:
        route = bodies[r["run"]]
        assert [e["verdict"] for e in r["layers"]] == [e["verdict"] for e in route["layers"]]
        assert r["summary"]["findings"] == route["summary"]["findings"]
    pytest.importorskip("pandas")
    import tb_layergrad

    df = tb_layergrad.load(logdir, runs=["stall_3", "regression"])
    out = df[df.source == "output"]
    stalled = out[out.run == "stall_3"]
    assert set(stalled[stalled.step >= known_answer_fixtures.K].state) == {anomalies.VANISHING_OVER_STEPS}
    assert set(stalled[stalled.step < known_answer_fixtures.K].state) == {anomalies.OK}
    assert set(out[out.run == "regression"].state) == {anomalies.OK}


def _over(entry: dict) -> bool:
    return entry["verdict"]["state"] == anomalies.VANISHING_OVER_STEPS


def test_fail_on_vanishing_over_steps(logdir, capsys, known_answer_fixtures):
    from tb_layergrad import cli

    assert cli.main(["report", logdir, "--run", "regression", "--fail-on", "vanishing_over_steps"]) == 0
    capsys.readouterr()
    assert (
        cli.main(["report", logdir, "--run", "stall_3", "--fail-on", "vanishing_over_steps", "--format", "json"]) == 3
    )
    doc = json.loads(capsys.readouterr().out)
    assert [(f["layer"], f["condition"], f["step"]) for f in doc["failures"]] == [
        (known_answer_fixtures.path(x), "vanishing_over_steps", known_answer_fixtures.K)
        for x in known_answer_fixtures.LAYERS
    ]
