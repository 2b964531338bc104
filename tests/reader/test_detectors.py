"""Each detector measured on runs whose answer is set by construction (tests/known_answer_fixtures.py): precision
and recall of the flagged cells through the real `anomalies` route, where a NaN was born, vanishing through time,
one example dominating; and the same verdicts from the route, `tb-layergrad report` and `load()`.
docs/ANOMALIES.md ("How well the rules find what they look for") states the numbers measured here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tb_layergrad.reader import anomalies

# Every test reads the module's planted logdir, which takes seconds to write: out of the quick loop, in CI's main leg.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, known_answer_fixtures):
    d = str(tmp_path_factory.mktemp("known_answers"))
    known_answer_fixtures.write_planted(d)
    known_answer_fixtures.write_timesteps(d)
    known_answer_fixtures.write_flipped(d)
    return d


@pytest.fixture(scope="module")
def tb(logdir, plugin_fixtures):
    return plugin_fixtures.InProcess(logdir)


def _flags(known_answer_fixtures, body, kind: str) -> np.ndarray:
    """bool [layers, steps] of one flag, decoded from the route's `flags` strings (rows in LAYERS order)."""
    assert [e["layer"] for e in body["layers"]] == [
        known_answer_fixtures.path(layer) for layer in known_answer_fixtures.LAYERS
    ]
    bits = np.stack([anomalies.decode_flags(e["flags"]) for e in body["layers"]])
    return (bits >= 0) & ((bits & anomalies.FLAG_BITS[kind]) > 0)


@pytest.mark.parametrize("run", ["vanish", "explode", "dead", "clean"])
@pytest.mark.parametrize("kind", ["vanishing", "exploding", "dead"])
def test_cell_detectors_find_exactly_the_planted_cells(tb, run, kind, known_answer_fixtures, plugin_fixtures):
    """A 1e-5, 1e4 or 0 factor on the gradient from step K on: flagged cells == planted cells, in every run
    (so no other kind fires either: the layers after the gate are neither vanishing nor exploding)."""
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": run})
    flagged, truth = (
        _flags(known_answer_fixtures, body, kind),
        known_answer_fixtures.truth_cells(run, kind, body["steps"]),
    )
    precision, recall = known_answer_fixtures.precision_recall(flagged, truth)
    assert (precision, recall) == (1.0, 1.0), (run, kind, flagged.sum(), truth.sum())
    assert not _flags(known_answer_fixtures, body, "nonfinite").any()


def test_a_cell_has_one_state(tb, known_answer_fixtures, plugin_fixtures):
    """Precedence: at most one flag per cell, in every run (docs/ANOMALIES.md, "Rules")."""
    for run in known_answer_fixtures.PLANTS:
        for e in plugin_fixtures.get_json(tb, "anomalies", {"run": run})["layers"]:
            assert all(c == "." or int(c, 16) in (0, 1, 2, 4, 8) for c in e["flags"]), (run, e["layer"])


@pytest.mark.parametrize("run, pass_", [("nan_backward", "backward"), ("nan_forward", "forward")])
def test_the_origin_is_its_own_state_and_the_reached_layers_another(
    tb, logdir, run, pass_, known_answer_fixtures, plugin_fixtures, report_json
):
    # A NaN born backward reaches the layers before the gate; one born forward, every layer but the gate.
    reached = (
        known_answer_fixtures.BEFORE
        if pass_ == "backward"
        else tuple(x for x in known_answer_fixtures.LAYERS if x != "gate")
    )
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": run})
    o = body["summary"]["origin"]
    assert (o["step"], o["pass"], o["origin"]) == (known_answer_fixtures.K, pass_, known_answer_fixtures.path("gate"))
    states = {e["layer"]: e["verdict"]["state"] for e in body["layers"]}
    want = {
        known_answer_fixtures.path(x): "nan_origin" if x == "gate" else "nonfinite" if x in reached else "ok"
        for x in known_answer_fixtures.LAYERS
    }
    assert states == want
    nan_findings = [f for f in body["summary"]["findings"] if f["kind"] == "nonfinite"]
    assert [(f["layer"], f["step"], f["line"]) for f in nan_findings] == [
        (known_answer_fixtures.path("gate"), known_answer_fixtures.K, o["line"])
    ]
    # The same states in the report (JSON and the text's verdict column) and in load()'s `state` column.
    doc = report_json(logdir, "--run", run)
    assert {e["layer"]: e["verdict"]["state"] for e in doc["runs"][0]["layers"]} == want
    df = _load(logdir, run)
    out = df[df.source == "output"]
    origin_rows = df[df.state == "nan_origin"]
    assert (out[out.state == "nan_origin"][["layer", "step"]].values.tolist()) == [
        [known_answer_fixtures.path("gate"), known_answer_fixtures.K]
    ]
    if pass_ == "forward":  # its activation too: where the NaN first appeared
        assert len(origin_rows) == 2 and set(origin_rows.source) == {"output", "activation"}
    reached_rows = out[(out.state == "nonfinite")]  # at K the rows it reached; after K the origin's row too
    assert set(reached_rows[reached_rows.step == known_answer_fixtures.K].layer) == {
        known_answer_fixtures.path(x) for x in reached
    }
    assert reached_rows.step.min() == known_answer_fixtures.K


def test_clean_run_has_no_finding(tb, logdir, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": "clean"})
    assert body["summary"]["findings"] == [] and body["summary"]["origin"] is None
    assert {e["verdict"]["state"] for e in body["layers"]} == {"ok"}
    assert set(_load(logdir, "clean").state) == {"ok"}


def test_vanishing_through_time_at_the_documented_threshold(tb, known_answer_fixtures, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": "rnn"})
    got = {e["layer"] for e in body["layers"] if e["verdict"]["state"] == "vanishing_through_time"}
    truth = {
        layer for layer, decades in known_answer_fixtures.DECAYS.items() if decades >= anomalies.TIME_DECAY_DECADES
    }
    assert got == truth  # precision and recall 1 on decays of 0.5 ... 6 decades, 0.2 from the threshold
    (finding,) = [f for f in body["summary"]["findings"] if f["kind"] == "vanishing_through_time"]
    assert finding["layers"] == [x for x in known_answer_fixtures.DECAYS if x in truth]  # one line for every such layer
    assert body["summary"]["latest"]["vanishing_through_time"] == len(truth)


def test_dominated_finds_the_flipped_labels(tb, known_answer_fixtures, plugin_fixtures):
    """Every flipped batch the classifier sees after it learnt: precision and recall over steps."""
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": "flipped/train"})
    first = body["summary"]["first_step"]  # the step of the first batch (fit() logs every batch)
    assert body["summary"]["steps"] == known_answer_fixtures.FLIP_BATCHES
    truth = {first + b for b in known_answer_fixtures.flipped_positions()}
    for d in body["dominated"]:
        steps = _dominated_steps(plugin_fixtures, tb, "flipped/train", d["layer"])
        precision = len(set(steps) & truth) / max(1, len(steps))
        recall = len(set(steps) & truth) / len(truth)
        assert precision == 1.0 and recall == 1.0, (d["layer"], sorted(steps), sorted(truth))
        assert d["steps"] == len(steps)
    (finding,) = [f for f in body["summary"]["findings"] if f["kind"] == "dominated"]  # one line, three layers
    assert len(finding["layers"]) == 3 and f"at {len(truth)} steps" in finding["line"]
    assert known_answer_fixtures.flipped_positions()[finding["step"] - first] == next(
        d["worst_position"] for d in body["dominated"] if d["layer"] == finding["layer"]
    )


def _dominated_steps(plugin_fixtures, tb, run: str, layer: str) -> list:
    """The steps the rule flags for one layer, recomputed with numpy from the `examples` route's columns."""
    ex = plugin_fixtures.get_json(tb, "examples", {"run": run, "layer": layer})
    share, top = np.asarray(ex["top_share"], float), np.asarray(ex["max"], float)
    count, status = np.asarray(ex["examples"], float), np.asarray(ex["status"], float)
    ok = (status == 0) & (count >= 8)
    usual = np.median(top[ok])
    hit = ok & (share > 0.5) & (top > 4.0 * usual)
    return [int(s) for s in np.asarray(ex["steps"])[hit]]


def _load(logdir: str, run: str):
    pytest.importorskip("pandas")
    import tb_layergrad

    return tb_layergrad.load(logdir, runs=[run])


def test_report_text_shows_the_verdicts_and_nan(logdir, capsys, known_answer_fixtures, report_json):
    from tb_layergrad import cli

    assert cli.main(["report", logdir, "--run", "nan_backward"]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.split()}
    assert rows["d0"].split()[1] == "nan"  # the stored norm of its finite elements is not the gradient's norm
    assert rows["gate"].rstrip().endswith(f"NaN/Inf born here @{known_answer_fixtures.K}") and rows[
        "d1"
    ].rstrip().endswith(f"NaN/Inf @{known_answer_fixtures.K}")
    doc = report_json(logdir, "--run", "nan_backward")
    assert json.dumps(doc, allow_nan=False)
