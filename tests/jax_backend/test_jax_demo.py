"""`KERAS_BACKEND=jax tb-layergrad demo --quick`, run once as a user runs it: the demo's fit() runs written
without TensorFlow, the runs that need TensorFlow named as such, and what each run plants read back by
`tb-layergrad report` and `load()` (the same answers tests/cli/test_demo.py asks of the TensorFlow demo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import tb_layergrad
from tb_layergrad import metadata

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def jax_demo(tmp_path_factory):
    logdir = os.fspath(tmp_path_factory.mktemp("jax_demo") / "logs")
    env = dict(os.environ, KERAS_BACKEND="jax")
    done = subprocess.run(
        [sys.executable, "-m", "tb_layergrad", "demo", "--quick", "--logdir", logdir],
        env=env, capture_output=True, text=True, timeout=800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rep = subprocess.run(
        [sys.executable, "-m", "tb_layergrad", "report", logdir, "--format", "json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rep.returncode == 0, rep.stderr
    runs = {r["run"]: r for r in json.loads(rep.stdout)["runs"] if r["target"] == "loss"}
    return {"logdir": logdir, "stdout": done.stdout, "runs": runs}


def _layers(run: dict) -> dict:
    return {entry["layer"].split("/", 1)[1]: entry for entry in run["layers"]}


def test_the_fit_runs_are_written_and_the_tensorflow_ones_say_why_not(jax_demo, demo_plan):
    trained = set(demo_plan.runs) - set(demo_plan.tensorflow_only)
    assert sorted(jax_demo["runs"]) == sorted(trained | set(demo_plan.sweep_runs))
    for name in demo_plan.tensorflow_only:
        line = next(l for l in jax_demo["stdout"].splitlines() if l.strip().startswith(name + " "))
        assert "needs TensorFlow" in line and "KERAS_BACKEND=tensorflow" in line
    plan = demo_plan.steps
    assert jax_demo["runs"]["mlp_sigmoid"]["summary"]["last_step"] == plan.mlp


def test_the_planted_behaviours_show_in_the_report(jax_demo, demo_plan):
    runs = jax_demo["runs"]
    sig, relu = _layers(runs["mlp_sigmoid"]), _layers(runs["mlp_relu_he"])
    assert "vanishing" in sig["dense_0"]["now"] and sig["dense_0"]["last_norm"] < 1e-3 * sig["logits"]["last_norm"]
    assert all(l["counts"]["vanishing"] == 0 for l in relu.values())
    dead = _layers(runs["dead_relu"])
    assert dead["dense_0"]["now"] == ["dead"] and dead["dense_0"]["last_norm"] == 0.0
    assert all("exploding" in l["now"] for l in _layers(runs["explode_noclip"]).values())
    assert all(l["counts"]["exploding"] == 0 for l in _layers(runs["explode_clipnorm"]).values())
    first = runs["nan_log0"]["summary"]["first_nonfinite"]
    assert (first["pass"], first["origin"]) == ("loss", "loss")
    for run, step, pass_, layer in (
        ("nan_forward", demo_plan.nan_forward_step, "forward", "log_features"),
        ("nan_backward", demo_plan.nan_backward_step, "backward", "sqrt_features"),
    ):
        first = runs[run]["summary"]["first_nonfinite"]
        assert (first["step"], first["pass"], first["origin"]) == (step, pass_, f"{run}/{layer}")


def test_load_reads_every_run_with_the_sweeps_hyperparameters(jax_demo, demo_plan):
    frame = tb_layergrad.load(jax_demo["logdir"])
    assert set(frame["run"]) == set(jax_demo["runs"])
    sweep = frame[frame["run"].isin(demo_plan.sweep_runs)].drop_duplicates("run")
    assert len(sweep) == len(demo_plan.sweep_runs)
    for run, lr, activation in zip(sweep["run"], sweep["hp/learning_rate"], sweep["hp/activation"]):
        assert run == demo_plan.sweep_run_name(lr, activation)


def test_the_mislabelled_example_leads_the_per_example_norms(jax_demo, demo_plan, tb_reading):
    """`mislabelled` on JAX, as tests/cli/test_demo.py asks of TensorFlow's: once learnt (from step 16 on), each
    batch's flipped label is the largest per-example norm of the logits' kernel, with most of its energy."""
    found = tb_reading.examples(jax_demo["logdir"])["mislabelled"][("loss", "weight")]
    F = metadata.EXAMPLE_INDEX
    steps = demo_plan.steps.mlp
    assert sorted(found) == list(range(1, steps + 1))
    late = {step: at for step, at in demo_plan.mislabelled_positions(steps).items() if step >= 16}
    assert late
    for step, position in late.items():
        row = found[step]["mislabelled/logits/kernel"]
        assert row[F["top_index_1"]] == position, step
        assert row[F["top_share"]] > 0.9, (step, row[F["top_share"]])
