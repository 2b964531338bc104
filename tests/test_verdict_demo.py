"""The demo's runs, whose answers are known (tb_layergrad/cli/demo.py), told the same by every reader: the
`anomalies` route (what the overview draws), `tb-layergrad report` (text and JSON) and `load()`."""

from __future__ import annotations

import subprocess

import pytest
from conftest import CLI
from plugin_fixtures import InProcess, get_json

from tb_layergrad.cli import demo as demo_module
from tb_layergrad.cli import demo_gan


@pytest.fixture(scope="module")
def tb(demo):
    return InProcess(demo["logdir"])


def _states(layers) -> dict:
    return {e["layer"].split("/", 1)[1]: e["verdict"]["state"] for e in layers}


@pytest.mark.slow
def test_every_reader_gives_the_same_verdicts_and_findings(demo, tb):
    for name, run in demo["runs"].items():
        body = get_json(tb, "anomalies", {"run": name})
        assert [e["verdict"] for e in body["layers"]] == [e["verdict"] for e in run["layers"]], name
        assert body["summary"]["findings"] == run["summary"]["findings"], name


def test_nan_backward_marks_where_it_was_born_apart_from_where_it_reached(demo, tb):
    body = get_json(tb, "anomalies", {"run": "nan_backward"})
    assert _states(body["layers"]) == {"dense_0": "nonfinite", "sqrt_features": "nan_origin", "head": "ok"}
    origin = body["summary"]["origin"]
    (finding,) = body["summary"]["findings"]
    assert (finding["kind"], finding["layer"], finding["step"]) == ("nonfinite", origin["origin"], origin["step"])


def test_report_prints_nan_for_a_nan_norm_and_the_verdict_column(demo):
    r = subprocess.run([CLI, "report", demo["logdir"], "--run", "nan_backward"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ") and line.split()}
    step = demo["runs"]["nan_backward"]["summary"]["origin"]["step"]
    assert rows["dense_0"].split()[1] == "nan" and rows["dense_0"].rstrip().endswith(f"NaN/Inf @{step}")
    assert rows["sqrt_features"].rstrip().endswith(f"NaN/Inf born here @{step}")


def test_explode_noclip_has_one_state_per_layer(demo):
    layers = demo["layers"]["explode_noclip"]
    assert {k: v["verdict"]["state"] for k, v in layers.items()} == {"features": "exploding", "head": "exploding"}
    assert layers["head"]["counts"]["vanishing"] == 0  # not vanishing because the layer before it exploded


def test_rnn_simplernn_vanishes_through_time(demo):
    rnn = demo["layers"]["rnn_simplernn"]["rnn"]
    assert rnn["timestep_decay"] <= -3 and rnn["verdict"]["state"] == "vanishing_through_time"
    assert demo["layers"]["rnn_lstm"]["rnn"]["verdict"]["state"] == "ok"  # the LSTM carries it back
    kinds = [f["kind"] for f in demo["runs"]["rnn_simplernn"]["summary"]["findings"]]
    assert kinds == ["vanishing_through_time"]
    r = subprocess.run([CLI, "report", demo["logdir"], "--run", "rnn_simplernn"], capture_output=True, text=True)
    assert "vanishing through time in rnn_simplernn/rnn" in r.stdout


def test_mislabelled_dominated_steps_hold_a_flipped_label(demo):
    """Precision >= 0.9 over the steps flagged in any layer; the recall is what docs/ANOMALIES.md states."""
    run = demo["runs"]["mislabelled"]
    steps = max(l["last_step"] for l in run["layers"])
    planted = demo_module.mislabelled_positions(steps)
    (finding,) = [f for f in run["summary"]["findings"] if f["kind"] == "dominated"]  # one line, every layer
    assert len(finding["layers"]) == 3
    flagged = _flagged_steps(demo["logdir"])
    precision = len(flagged & set(planted)) / len(flagged)
    recall = len(flagged & set(planted)) / len(planted)
    assert precision >= 0.9, (sorted(flagged), sorted(planted))
    assert recall >= 0.9, recall  # docs/ANOMALIES.md: 14 of 15 (the first flip comes before the model learnt)
    assert planted[finding["step"]] == next(
        d["worst_position"] for d in run["dominated"] if d["layer"] == finding["layer"]
    )
    assert f"at {len(flagged)} steps" in finding["line"]


def _flagged_steps(logdir: str) -> set:
    """Every step flagged in any layer: the union of `dominance`'s steps, read with the reader's own code."""
    from tb_layergrad.cli import report

    (run,) = report.build(logdir, runs=["mislabelled"]).runs
    return {s for d in run.dominated for s in d.at}


def test_the_gan_generator_vanishes_over_steps_and_no_other_run_does(demo):
    """Precision and recall over every (run, target, layer) of the demo: the truth is the generator's target, every
    layer of it (its loss saturates as the discriminator wins: docs/ANOMALIES.md, "Vanishing over steps")."""
    flagged, truth = set(), set()
    for (run, target), r in demo["by_target"].items():
        for e in r["layers"]:
            key = (run, target, e["layer"])
            if e["verdict"]["state"] == "vanishing_over_steps":
                flagged.add(key)
            if (run, target) == ("gan", demo_gan.G_TARGET):
                truth.add(key)
    assert flagged == truth and len(truth) >= 3, sorted(flagged ^ truth)  # precision and recall 1.0
    generator = demo["by_target"][("gan", demo_gan.G_TARGET)]
    (finding,) = generator["summary"]["findings"]
    assert finding["kind"] == "vanishing_over_steps" and finding["layers"] == [e["layer"] for e in generator["layers"]]
    assert all(e["step_decay"] <= -2 for e in generator["layers"])
    # The discriminator's gradients fell as far, and its loss with them: convergence, not a finding.
    discriminator = demo["by_target"][("gan", demo_gan.D_TARGET)]
    assert min(e["step_decay"] for e in discriminator["layers"]) <= -2 and not discriminator["summary"]["findings"]
    r = subprocess.run([CLI, "report", demo["logdir"], "--run", "gan"], capture_output=True, text=True)
    assert "vanishing over steps in gan/" in r.stdout and f"vanishing over steps @{finding['step']}" in r.stdout
