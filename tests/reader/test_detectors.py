"""Each detector measured on runs whose answer is set by construction (tests/known_answer_fixtures.py): precision
and recall of the flagged cells through the real `anomalies` route, where a NaN was born, vanishing through time,
one example dominating; and the same verdicts from the route, `tb-layergrad report` and `load()`.
docs/ANOMALIES.md ("How well the rules find what they look for") states the numbers measured here."""

from __future__ import annotations

import json

import known_answer_fixtures as ka
import numpy as np
import pytest
from plugin_fixtures import InProcess, get_json

from tb_layergrad.cli import report
from tb_layergrad.reader import anomalies


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("known_answers"))
    ka.write_planted(d)
    ka.write_timesteps(d)
    ka.write_flipped(d)
    return d


@pytest.fixture(scope="module")
def tb(logdir):
    return InProcess(logdir)


def _flags(body, kind: str) -> np.ndarray:
    """bool [layers, steps] of one flag, decoded from the route's `flags` strings (rows in LAYERS order)."""
    assert [e["layer"] for e in body["layers"]] == [ka.path(layer) for layer in ka.LAYERS]
    bits = np.stack([anomalies.decode_flags(e["flags"]) for e in body["layers"]])
    return (bits >= 0) & ((bits & anomalies.FLAG_BITS[kind]) > 0)


@pytest.mark.parametrize("run", ["vanish", "explode", "dead", "clean"])
@pytest.mark.parametrize("kind", ["vanishing", "exploding", "dead"])
@pytest.mark.slow
def test_cell_detectors_find_exactly_the_planted_cells(tb, run, kind):
    """A 1e-5, 1e4 or 0 factor on the gradient from step K on: flagged cells == planted cells, in every run
    (so no other kind fires either: the layers after the gate are neither vanishing nor exploding)."""
    body = get_json(tb, "anomalies", {"run": run})
    flagged, truth = _flags(body, kind), ka.truth_cells(run, kind, body["steps"])
    precision, recall = ka.precision_recall(flagged, truth)
    assert (precision, recall) == (1.0, 1.0), (run, kind, flagged.sum(), truth.sum())
    assert not _flags(body, "nonfinite").any()


def test_a_cell_has_one_state(tb):
    """Precedence: at most one flag per cell, in every run (docs/ANOMALIES.md, "Rules")."""
    for run in ka.PLANTS:
        for e in get_json(tb, "anomalies", {"run": run})["layers"]:
            assert all(c == "." or int(c, 16) in (0, 1, 2, 4, 8) for c in e["flags"]), (run, e["layer"])


@pytest.mark.parametrize(
    "run, pass_, reached",
    [("nan_backward", "backward", ka.BEFORE), ("nan_forward", "forward", tuple(x for x in ka.LAYERS if x != "gate"))],
)
def test_the_origin_is_its_own_state_and_the_reached_layers_another(tb, logdir, run, pass_, reached):
    body = get_json(tb, "anomalies", {"run": run})
    o = body["summary"]["origin"]
    assert (o["step"], o["pass"], o["origin"]) == (ka.K, pass_, ka.path("gate"))
    states = {e["layer"]: e["verdict"]["state"] for e in body["layers"]}
    want = {ka.path(x): "nan_origin" if x == "gate" else "nonfinite" if x in reached else "ok" for x in ka.LAYERS}
    assert states == want
    nan_findings = [f for f in body["summary"]["findings"] if f["kind"] == "nonfinite"]
    assert [(f["layer"], f["step"], f["line"]) for f in nan_findings] == [(ka.path("gate"), ka.K, o["line"])]
    # The same states in the report (JSON and the text's verdict column) and in load()'s `state` column.
    doc = report.to_json(report.build(logdir, runs=[run]))
    assert {e["layer"]: e["verdict"]["state"] for e in doc["runs"][0]["layers"]} == want
    df = _load(logdir, run)
    out = df[df.source == "output"]
    origin_rows = df[df.state == "nan_origin"]
    assert (out[out.state == "nan_origin"][["layer", "step"]].values.tolist()) == [[ka.path("gate"), ka.K]]
    if pass_ == "forward":  # its activation too: where the NaN first appeared
        assert len(origin_rows) == 2 and set(origin_rows.source) == {"output", "activation"}
    reached_rows = out[(out.state == "nonfinite")]  # at K the rows it reached; after K the origin's row too
    assert set(reached_rows[reached_rows.step == ka.K].layer) == {ka.path(x) for x in reached}
    assert reached_rows.step.min() == ka.K


def test_clean_run_has_no_finding(tb, logdir):
    body = get_json(tb, "anomalies", {"run": "clean"})
    assert body["summary"]["findings"] == [] and body["summary"]["origin"] is None
    assert {e["verdict"]["state"] for e in body["layers"]} == {"ok"}
    assert set(_load(logdir, "clean").state) == {"ok"}


def test_vanishing_through_time_at_the_documented_threshold(tb):
    body = get_json(tb, "anomalies", {"run": "rnn"})
    got = {e["layer"] for e in body["layers"] if e["verdict"]["state"] == "vanishing_through_time"}
    truth = {layer for layer, decades in ka.DECAYS.items() if decades >= anomalies.TIME_DECAY_DECADES}
    assert got == truth  # precision and recall 1 on decays of 0.5 ... 6 decades, 0.2 from the threshold
    (finding,) = [f for f in body["summary"]["findings"] if f["kind"] == "vanishing_through_time"]
    assert finding["layers"] == [x for x in ka.DECAYS if x in truth]  # one line for every such layer
    assert body["summary"]["latest"]["vanishing_through_time"] == len(truth)


def test_dominated_finds_the_flipped_labels(tb):
    """Every flipped batch the classifier sees after it learnt: precision and recall over steps."""
    body = get_json(tb, "anomalies", {"run": "flipped/train"})
    first = body["summary"]["first_step"]  # the step of the first batch (fit() logs every batch)
    assert body["summary"]["steps"] == ka.FLIP_BATCHES
    truth = {first + b for b in ka.flipped_positions()}
    for d in body["dominated"]:
        steps = _dominated_steps(tb, "flipped/train", d["layer"])
        precision = len(set(steps) & truth) / max(1, len(steps))
        recall = len(set(steps) & truth) / len(truth)
        assert precision == 1.0 and recall == 1.0, (d["layer"], sorted(steps), sorted(truth))
        assert d["steps"] == len(steps)
    (finding,) = [f for f in body["summary"]["findings"] if f["kind"] == "dominated"]  # one line, three layers
    assert len(finding["layers"]) == 3 and f"at {len(truth)} steps" in finding["line"]
    assert ka.flipped_positions()[finding["step"] - first] == next(
        d["worst_position"] for d in body["dominated"] if d["layer"] == finding["layer"]
    )


def _dominated_steps(tb, run: str, layer: str) -> list:
    """The steps the rule flags for one layer, recomputed with numpy from the `examples` route's columns."""
    ex = get_json(tb, "examples", {"run": run, "layer": layer})
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


def test_report_text_shows_the_verdicts_and_nan(logdir, capsys):
    from tb_layergrad import cli

    assert cli.main(["report", logdir, "--run", "nan_backward"]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.split()}
    assert rows["d0"].split()[1] == "nan"  # the stored norm of its finite elements is not the gradient's norm
    assert rows["gate"].rstrip().endswith(f"NaN/Inf born here @{ka.K}") and rows["d1"].rstrip().endswith(
        f"NaN/Inf @{ka.K}"
    )
    doc = report.to_json(report.build(logdir, runs=["nan_backward"]))
    assert json.dumps(doc, allow_nan=False)
