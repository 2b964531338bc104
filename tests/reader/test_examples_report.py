"""The report flags the step where one example carries most of a layer's gradient (docs/ANOMALIES.md,
"One example dominates"), from per-example records written by hand (tests/examples_fixtures.py)."""

from __future__ import annotations

import argparse
import csv
import io
import json
import pathlib

import numpy as np
import pytest

from tb_layergrad import cli
from tb_layergrad.cli import report
from tb_layergrad.reader import anomalies, dominance

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, examples_fixtures):
    return examples_fixtures.write_examples_logdir(str(tmp_path_factory.mktemp("examples_report"))).logdir


def _run(logdir, *extra):
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    code = report.main(parser.parse_args([logdir, *extra]), out, err)
    return code, out.getvalue(), err.getvalue()


def test_rule_by_hand():
    share = np.array([0.49, 0.51, 0.9, 0.9, 0.9, np.nan, 0.9, 0.3, 0.3])
    count = np.array([32, 32, 7, 8, 8, 32, 32, 32, 32])
    status = np.array([0, 0, 0, 0, 2, 0, 0, 0, 0])
    # The usual largest norm: the median of the exact steps in batches >= 8 (not the batch of 7, not status 2): 1.0.
    top = np.array([9.0, 9.0, 9.0, 9.0, 9.0, 1.0, 1.0, 1.0, 1.0])
    assert dominance.usual_top_norm(top, count, status) == 1.0
    assert dominance.dominated(share, count, status, top).tolist() == [False, True, False, True] + [False] * 5
    # Half the gradient, but an example no larger than the layer's usual largest one: not dominated.
    assert not dominance.dominated(share, count, status, np.full(9, 1.0)).any()
    d = dominance.dominance("m/a", [0, 5, 10, 15, 20, 25, 30, 35, 40], share, count, status, list(range(1, 10)), top)
    assert (d.steps, d.first_step, d.worst_step, d.worst_share, d.worst_position, d.examples) == (2, 5, 15, 0.9, 4, 8)
    assert d.at == (5, 15) and "at" not in d.to_json()
    assert dominance.dominance("m/a", [0], [0.2], [32], [0], [3], [1.0]) is None


def test_report_names_the_dominated_step(logdir, examples_fixtures):
    code, out, _ = _run(logdir, "--format", "json")
    assert code == 0
    runs = {r["run"]: r for r in json.loads(out)["runs"]}
    norms = examples_fixtures.make_norms()
    for name in (examples_fixtures.RUN, examples_fixtures.RENAMED):
        want = []
        for layer in examples_fixtures.LAYERS:  # numpy on the raw norms: the steps where the largest carries > half
            if layer == examples_fixtures.UNSUPPORTED_LAYER:
                continue
            sq = norms[layer] ** 2
            share = sq.max(1) / sq.sum(1)
            hit = np.flatnonzero(share > 0.5)
            if hit.size:
                worst = int(hit[np.argmax(share[hit])])
                want.append(
                    {
                        "layer": layer,
                        "steps": int(hit.size),
                        "first_step": int(hit[0]),
                        "worst_step": worst,
                        "worst_share": pytest.approx(float(share[worst]), rel=1e-12),
                        "worst_position": int(np.argmax(norms[layer][worst])),
                        "examples": examples_fixtures.BATCH,
                    }
                )
        assert runs[name]["dominated"] == want
        assert (
            want[0]["layer"] == examples_fixtures.DOMINATED_LAYER
            and want[0]["worst_step"] == examples_fixtures.DOMINATED_STEP
        )
        assert want[0]["worst_position"] == examples_fixtures.DOMINATED_POSITION
    assert "dominated" not in runs[examples_fixtures.PLAIN]  # no per-example records: nothing said, the JSON as before
    code, text, _ = _run(logdir, "--run", examples_fixtures.RUN)
    text = " ".join(text.split())  # the line is wrapped at the terminal width
    assert (
        f"one example dominates {examples_fixtures.DOMINATED_LAYER} at 1 step: first step {examples_fixtures.DOMINATED_STEP}"
        in text
    )
    assert f"from batch position {examples_fixtures.DOMINATED_POSITION} of {examples_fixtures.BATCH}" in text


def test_fail_on_dominated(logdir, examples_fixtures):
    code, _, err = _run(logdir, "--format", "json", "--fail-on", "dominated")
    assert (
        code == report.EXIT_FAILED
        and f"layer {examples_fixtures.DOMINATED_LAYER}, step {examples_fixtures.DOMINATED_STEP}" in err
    )
    code, out, _ = _run(logdir, "--run", examples_fixtures.PLAIN, "--fail-on", "dominated")
    assert code == 0 and "OK: none of dominated holds" in out


DOMINATED_COLUMNS = [f"dominated_{k}" for k in report.DOMINATED_FIELDS]
VERDICT_COLUMNS = ["verdict", "last_nonfinite", "step_decay"]
OLD_COLUMNS = (
    "run",
    "target",
    "source",
    "layer",
    "index",
    "recorded",
    "last_step",
    "last_norm",
    "last_rms",
    "last_zero_frac",
    "trend",
    "first_nonfinite",
    "timestep_decay",
    "nonfinite_steps",
    "vanishing_steps",
    "exploding_steps",
    "dead_steps",
    "now",
)


def _cli(capsys, *argv):
    code = cli.main(["report", *argv])
    out, _ = capsys.readouterr()
    assert code == 0
    return out


def _number(cell: str):
    return float(cell) if "." in cell else int(cell)


def test_csv_carries_what_the_json_says_of_dominated_layers(logdir, capsys, examples_fixtures):
    doc = json.loads(_cli(capsys, logdir, "--format", "json"))
    text = _cli(capsys, logdir, "--format", "csv")
    header = next(csv.reader(io.StringIO(text)))
    assert tuple(header[: len(OLD_COLUMNS)]) == OLD_COLUMNS
    assert header[len(OLD_COLUMNS) :] == DOMINATED_COLUMNS + VERDICT_COLUMNS
    rows = list(csv.DictReader(io.StringIO(text)))
    for run in doc["runs"]:
        mine = [r for r in rows if r["run"] == run["run"]]
        assert [r["layer"] for r in mine] == [s["layer"] for s in run["layers"]]  # still a row per layer
        said = {d["layer"]: d for d in run.get("dominated", ())}
        for r in mine:
            cells = [r[c] for c in DOMINATED_COLUMNS]
            if "dominated" not in run:  # no per-example records: nothing said
                assert cells == [""] * len(cells), r
            elif r["layer"] not in said:
                assert cells == ["0"] + [""] * (len(cells) - 1), r
            else:  # the JSON's numbers exactly (repr of the same floats)
                assert [_number(c) for c in cells] == [said[r["layer"]][k] for k in report.DOMINATED_FIELDS]
    by = {(r["run"], r["layer"]): r for r in rows}
    sq = examples_fixtures.make_norms()[examples_fixtures.DOMINATED_LAYER] ** 2
    for name in (
        examples_fixtures.RUN,
        examples_fixtures.RENAMED,
    ):  # the planted example, against numpy on the norms written
        row = by[(name, examples_fixtures.DOMINATED_LAYER)]
        assert (row["dominated_steps"], row["dominated_first_step"], row["dominated_worst_step"]) == (
            "1",
            str(examples_fixtures.DOMINATED_STEP),
            str(examples_fixtures.DOMINATED_STEP),
        )
        assert (row["dominated_worst_position"], row["dominated_examples"]) == (
            str(examples_fixtures.DOMINATED_POSITION),
            str(examples_fixtures.BATCH),
        )
        share = sq[examples_fixtures.DOMINATED_STEP].max() / sq[examples_fixtures.DOMINATED_STEP].sum()
        assert float(row["dominated_worst_share"]) == pytest.approx(share, rel=1e-12) and share > 0.5
        assert by[(name, examples_fixtures.UNSUPPORTED_LAYER)]["dominated_steps"] == "0"  # status 1: never dominated
    for name in (examples_fixtures.PLAIN, examples_fixtures.PLAIN_V1):
        assert any(r["run"] == name for r in rows)
        assert all(r[c] == "" for r in rows if r["run"] == name for c in DOMINATED_COLUMNS)


def test_csv_names_a_dominated_layer_without_statistics():
    """Per-example records of a layer the stats do not list: a row of its own rather than lost."""
    ones, zeros = np.ones((1, 2)), np.zeros((1, 2))
    run = anomalies.evaluate(
        ["m/a"], [0, 1], {"rms": ones, "norm": ones, "nonfinite": zeros, "zero_frac": zeros}, run="r"
    )
    run.dominated = [dominance.Dominance("m/b", 2, 0, 1, 0.75, 3, 16)]
    rep = report.Report("logs", run.target, run.source, [run], [], [], [])
    rows = list(csv.DictReader(io.StringIO(report.format_csv(rep))))
    assert [(r["layer"], r["dominated_steps"]) for r in rows] == [("m/a", "0"), ("m/b", "2")]
    assert [rows[1][c] for c in DOMINATED_COLUMNS] == ["2", "0", "1", "0.75", "3", "16"]
    assert rows[1]["run"] == "r" and rows[1]["recorded"] == rows[1]["now"] == ""


def test_the_docs_list_the_csv_columns_in_order():
    """docs/ANOMALIES.md is where a spreadsheet or CI user reads what each column index holds."""
    readme = " ".join((pathlib.Path(__file__).resolve().parents[2] / "docs" / "ANOMALIES.md").read_text().split())
    cut = len(OLD_COLUMNS)
    assert report.CSV_COLUMNS[:cut] == OLD_COLUMNS  # appended only: the old indexes hold
    n = len(DOMINATED_COLUMNS)
    for group in (report.CSV_COLUMNS[:cut], report.CSV_COLUMNS[cut : cut + n], report.CSV_COLUMNS[cut + n :]):
        assert f"`{', '.join(group)}`" in readme
