"""The demo's runs, whose answers are known (tb_layergrad/cli/demo.py), told the same by every reader: the
`anomalies` route (what the overview draws), `tb-layergrad report` (text and JSON) and `load()`."""

from __future__ import annotations

import subprocess

import pytest

from tb_layergrad.cli import demo as demo_module
from tb_layergrad.cli import demo_gan

pytestmark = pytest.mark.slow  # every test reads `tb-layergrad demo --quick`, trained in a subprocess


@pytest.fixture(scope="module")
def tb(demo, plugin_fixtures):
    return plugin_fixtures.InProcess(demo["logdir"])


def _states(layers) -> dict:
    return {e["layer"].split("/", 1)[1]: e["verdict"]["state"] for e in layers}


def test_every_reader_gives_the_same_verdicts_and_findings(demo, tb, plugin_fixtures):
    for name, run in demo["runs"].items():
        body = plugin_fixtures.get_json(tb, "anomalies", {"run": name})
        assert [e["verdict"] for e in body["layers"]] == [e["verdict"] for e in run["layers"]], name
        assert body["summary"]["findings"] == run["summary"]["findings"], name


def test_nan_backward_marks_where_it_was_born_apart_from_where_it_reached(demo, tb, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": "nan_backward"})
    assert _states(body["layers"]) == {"dense_0": "nonfinite", "sqrt_features": "nan_origin", "head": "ok"}
    origin = body["summary"]["origin"]
    (finding,) = body["summary"]["findings"]
    assert (finding["kind"], finding["layer"], finding["step"]) == ("nonfinite", origin["origin"], origin["step"])


def test_report_prints_nan_for_a_nan_norm_and_the_verdict_column(demo, console_script):
    r = subprocess.run(
        [console_script.CLI, "report", demo["logdir"], "--run", "nan_backward"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ") and line.split()}
    step = demo["runs"]["nan_backward"]["summary"]["origin"]["step"]
    assert rows["dense_0"].split()[1] == "nan" and rows["dense_0"].rstrip().endswith(f"NaN/Inf @{step}")
    assert rows["sqrt_features"].rstrip().endswith(f"NaN/Inf born here @{step}")


def test_explode_noclip_has_one_state_per_layer(demo):
    layers = demo["layers"]["explode_noclip"]
    assert {k: v["verdict"]["state"] for k, v in layers.items()} == {"features": "exploding", "head": "exploding"}
    assert layers["head"]["counts"]["vanishing"] == 0  # not vanishing because the layer before it exploded


def test_rnn_simplernn_vanishes_through_time(demo, console_script):
    rnn = demo["layers"]["rnn_simplernn"]["rnn"]
    assert rnn["timestep_decay"] <= -3 and rnn["verdict"]["state"] == "vanishing_through_time"
    assert demo["layers"]["rnn_lstm"]["rnn"]["verdict"]["state"] == "ok"  # the LSTM carries it back
    kinds = [f["kind"] for f in demo["runs"]["rnn_simplernn"]["summary"]["findings"]]
    assert kinds == ["vanishing_through_time"]
    r = subprocess.run(
        [console_script.CLI, "report", demo["logdir"], "--run", "rnn_simplernn"], capture_output=True, text=True
    )
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


def test_the_gan_generator_vanishes_over_steps_and_no_other_run_does(demo, console_script):
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
    r = subprocess.run([console_script.CLI, "report", demo["logdir"], "--run", "gan"], capture_output=True, text=True)
    assert "vanishing over steps in gan/" in r.stdout and f"vanishing over steps @{finding['step']}" in r.stdout


def test_a_statistic_of_no_finite_element_has_no_value_in_every_reader(demo, tb, plugin_fixtures, console_script):
    """nan_backward/dense_0 is all ±Inf from some step on: its stored `norm` there is 0 (the root of an empty sum), and
    every reader says "no value" instead: the `stats` route null, the `csv` route nan, load() NaN, the report's JSON
    null and its CSV an empty cell (docs/FORMAT.md, "Reading `stats`")."""
    body = plugin_fixtures.get_json(tb, "stats", {"run": "nan_backward", "layer": "nan_backward/dense_0"})
    st = body["stats"]
    none = [j for j, n in enumerate(st["elements"]) if n > 0 and st["nonfinite"][j] == n]
    assert none and st["nan"][none[0]] == 0 and st["pos_inf"][none[0]] > 0  # ±Inf, no NaN: what the README says
    for stat in ("norm", "rms", "mean_abs", "mean", "min", "max", "std"):
        assert {st[stat][j] for j in none} == {None}, stat
    finite = [j for j, n in enumerate(st["elements"]) if st["nonfinite"][j] == 0]
    assert finite and all(st["norm"][j] > 0 for j in finite)  # a finite gradient keeps its norm
    steps = {body["steps"][j] for j in none}
    text = tb.get("csv", {"run": "nan_backward", "layer": "nan_backward/dense_0"}).data.decode()
    rows = [line.split(",") for line in text.splitlines()]
    at = rows[0].index("norm")
    assert {r[at] for r in rows[1:] if int(r[5]) in steps} == {"nan"}
    pytest.importorskip("pandas")
    import tb_layergrad

    df = tb_layergrad.load(demo["logdir"], runs=["nan_backward"])
    cells = df[(df.layer == "nan_backward/dense_0") & (df.source == "output") & df.step.isin(steps)]
    assert len(cells) == len(steps) and cells.norm.isna().all() and (cells.state == "nonfinite").all()
    (layer,) = [e for e in demo["runs"]["nan_backward"]["layers"] if e["layer"].endswith("/dense_0")]
    assert layer["last_norm"] is None and layer["last_step"] in steps
    r = subprocess.run(
        [console_script.CLI, "report", demo["logdir"], "--run", "nan_backward", "--format", "csv"],
        capture_output=True,
        text=True,
    )
    head, *lines = [line.split(",") for line in r.stdout.splitlines()]
    (row,) = [x for x in lines if x[head.index("layer")] == "nan_backward/dense_0"]
    assert row[head.index("last_norm")] == "" and row[head.index("last_nonfinite")] == "1024.0"


def test_mislabelled_is_not_ok_its_only_finding_is_its_verdict(demo, tb, plugin_fixtures):
    """One example dominating 14 steps is the layers' verdict (`dominated`), the run's (the sweep row), each
    dominated cell's `state` in load(), and the report's `verdict` column: no reader says "ok"."""
    run = demo["runs"]["mislabelled"]
    flagged = _flagged_steps(demo["logdir"])
    last = run["summary"]["last_step"]
    words = (
        f"one example dominates: {len(flagged)} steps"
        if last in flagged
        else f"ok now – one example dominated {len(flagged)} steps"
    )
    for e in run["layers"]:
        d = next(x for x in run["dominated"] if x["layer"] == e["layer"])
        assert (e["verdict"]["state"], e["verdict"]["step"]) == ("dominated", d["worst_step"]), e["verdict"]
        n = d["steps"]
        expected = (
            f"one example dominates: {n} steps" if last in flagged else f"ok now – one example dominated {n} steps"
        )
        assert e["verdict"]["text"] == expected
    (row,) = plugin_fixtures.get_json(tb, "sweep", {"run": "mislabelled"})["runs"]
    assert (row["verdict"], row["verdict_text"], row["severity"]) == ("dominated", words, 1)
    assert row["dominated_steps"] == len(flagged)
    pytest.importorskip("pandas")
    import tb_layergrad

    df = tb_layergrad.load(demo["logdir"], runs=["mislabelled"])
    out = df[df.source == "output"]
    assert set(out[out.state == "dominated"].step) == flagged
    assert set(out[out.state == "ok"].step).isdisjoint(flagged) or len(out.layer.unique()) > 1


def test_the_gan_finding_says_what_the_generators_value_did(demo):
    """Its value rose from about -0.45 to about -1e-5: the sentence says "rose", with both numbers held by
    non-breaking spaces around the arrow, and the rule (a signed fall of less than half) flagged it."""
    (finding,) = demo["by_target"][("gan", demo_gan.G_TARGET)]["summary"]["findings"]
    line = finding["line"]
    assert "the value of generator rose (" in line and "did not fall" not in line, line
    early, late = (float(x) for x in line.split("rose (")[1].split(")")[0].split("\u00a0→\u00a0"))
    assert early < late < 0 and (early - late) / abs(early) < 0  # docs/ANOMALIES.md: the fall, signed
    assert abs(late) < 1e-3 * abs(early)  # its size shrank, the value still rose: the generator got worse


def test_the_readme_table_states_what_the_demo_measures(demo):
    """The README's demo table: the SimpleRNN's decay through time as the demo measures it (`--quick` is the run
    the tests train; the full demo's figure beside it), and NaN vs Inf named as the data holds them."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_0-9]+)` \| (.*) \|$", readme, re.M)}
    quick = re.search(r"decays ~10\^5\.\d back through time \(10\^([\d.]+) in `--quick`", rows["rnn_simplernn"])
    assert quick, rows["rnn_simplernn"]
    assert -demo["layers"]["rnn_simplernn"]["rnn"]["timestep_decay"] == pytest.approx(float(quick.group(1)), abs=0.05)
    pytest.importorskip("pandas")
    import tb_layergrad

    df = tb_layergrad.load(demo["logdir"], runs=["nan_backward", "nan_forward", "nan_log0"])
    # The README's one column that tells load()'s rows apart: `source` (a target's value, a forward value, gradients).
    assert set(df.source) == {"output", "activation", "target"}
    value = df.source == "target"
    assert ((df.layer == df.target) & (df["index"] == -1) | ~value).all() and set(df[value].layer) == {"loss"}
    assert ((df.target == "forward") == (df.source == "activation")).all()
    grads = df[df.source == "output"].groupby("run")[["nan", "pos_inf", "neg_inf"]].sum()
    said = {name: ("**Inf**" in rows[name], "a NaN born" in rows[name]) for name in grads.index}
    held = {name: (r.nan == 0 and r.pos_inf + r.neg_inf > 0, r.nan > 0) for name, r in grads.iterrows()}
    assert said == held == {"nan_backward": (True, False), "nan_forward": (False, True), "nan_log0": (False, True)}
