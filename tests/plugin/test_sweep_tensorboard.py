"""The `sweep` route in a real `tensorboard` process, both loaders, on fits whose hyperparameters were logged
with TensorBoard's HParams API (`hp.KerasCallback` and `hp.hparams`, `hparams_fixtures`), and a run whose
names and values are hostile (HTML, a 10,000-character string, NaN).

Every row is checked against `tb-layergrad report` for the same run (the report reads the event files with
its own provider), and both loaders must answer the same body.
"""

from __future__ import annotations

import math
import os

import pytest

HOSTILE_RUN = '<img src=x onerror="alert(1)">'
LONG = "&<script>alert(1)</script>" + "x" * 10_000
HOSTILE = {"<b>name</b>": LONG, "nan": float("nan"), "learning_rate": "fast", "units": 8}


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, hparams_fixtures):
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    d = str(tmp_path_factory.mktemp("sweep_hparams"))
    hparams_fixtures.write_hparams_logdir(d)
    with tf.summary.create_file_writer(os.path.join(d, HOSTILE_RUN)).as_default():
        hp.hparams(HOSTILE)
    hparams_fixtures.fit_with_logger(d, HOSTILE_RUN, [], seed=6)
    return d


def expected_rows(report_json, verdicts, logdir):
    """Each run's health as `tb-layergrad report` sees it; its verdict the worst of its layers' (docs/ANOMALIES.md)."""
    out = {}
    for r in report_json(logdir)["runs"]:
        summary = r["summary"]
        worst = min((e["verdict"]["state"] for e in r["layers"]), key=verdicts.states.index)
        first = summary["first_nonfinite"]
        out[r["run"]] = {
            "target": r["target"],
            "last_step": summary["last_step"],
            "layers": summary["layers"],
            "verdict": worst,
            "severity": verdicts.severity[worst],
            "first_nonfinite": None if first is None else first["step"],
            "latest": summary["latest"],
            "dominated_steps": None,
        }
    return out


@pytest.mark.slow
def test_the_sweep_route_under_both_loaders(
    logdir, tmp_path, hparams_fixtures, tensorboard_process, report_json, verdicts
):

    want = expected_rows(report_json, verdicts, logdir)
    runs = {
        **{run: hparams_fixtures.STEPS for run in hparams_fixtures.EXPECTED},
        f"{HOSTILE_RUN}/train": hparams_fixtures.STEPS,
    }
    assert set(want) == set(runs)
    bodies = []
    with tensorboard_process.tensorboards(logdir, [("true", []), ("false", [])], str(tmp_path)) as procs:
        for p in procs:
            p.wait_for_runs(runs)
            bodies.append(p.get_json(tensorboard_process.PLUGIN_API + "sweep"))
            code, text, _ = p.get(tensorboard_process.PLUGIN_API + "sweep?source=nope")
            assert code == 400 and b"source" in text
    assert bodies[0] == bodies[1]  # the Rust data server and the Python multiplexer alike
    body = bodies[0]
    kinds = {h["name"]: h["kind"] for h in body["hparams"]}
    assert kinds == {
        "<b>name</b>": "string",
        "activation": "string",
        "batch_norm": "bool",
        "dropout": "number",
        "learning_rate": "mixed",  # numbers in three runs, "fast" in the hostile one
        "mixed": "mixed",  # 3.5 in one run, "three" in another
        "nan": "number",
        "units": "number",
    }
    by_run = {r["run"]: r for r in body["runs"]}
    assert set(by_run) == set(runs)
    for run, row in by_run.items():
        got = {k: row[k] for k in want[run] if k != "first_nonfinite"}
        assert got == {k: v for k, v in want[run].items() if k != "first_nonfinite"}, run
        assert (row["first_nonfinite"] or {}).get("step") == want[run]["first_nonfinite"]
        assert row["noise_scale_end"] is None
        assert row["norm_trend"] is None or math.isfinite(row["norm_trend"])
    for run, values in hparams_fixtures.EXPECTED.items():
        assert by_run[run]["hparams"] == values
    hostile = by_run[f"{HOSTILE_RUN}/train"]["hparams"]
    assert hostile == {"<b>name</b>": LONG, "nan": None, "learning_rate": "fast", "units": 8.0}
