"""`tb-layergrad report`: the formats, the exit status for CI, and pandas staying optional.

The report reads with TensorBoard's multiplexer (every step) and the plugin's code: its numbers
must be the `anomalies` route's, which tests/plugin/test_report_route.py checks against numpy.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
import re
import sys

import pytest

from tb_layergrad import cli
from tb_layergrad.cli import report

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv):
    code = cli.main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_the_routes_answer(planted, capsys, plugin_fixtures, report_fixtures):
    code, out, _ = run_cli(capsys, planted.logdir, "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert [r["run"] for r in doc["runs"]] == [report_fixtures.LONG_RUN, report_fixtures.RUN]
    tb = report_fixtures.in_process(planted.logdir)
    for r in doc["runs"]:
        route = plugin_fixtures.strict_json(tb.get("anomalies", {"run": r["run"]}).data)
        for got, want in zip(r["layers"], route["layers"]):
            want = {k: v for k, v in want.items() if k != "flags"}
            assert got == want  # the very same numbers
        assert r["summary"] == route["summary"]
    assert doc["thresholds"]["VANISH_REL"] == 1e-3 and doc["failures"] == []


def test_text_fits_100_columns_and_names_the_planted_layers(planted, capsys, report_fixtures):
    code, out, _ = run_cli(capsys, planted.logdir)
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    # Where it broke: no target series in this logdir, so the pass is unknown (docs/ANOMALIES.md).
    assert (
        f"  first non-finite gradient at step {report_fixtures.NAN_STEPS[0]}: {report_fixtures.NAN_LAYER} (the loss was not recorded: pass unknown)"
        in lines
    )
    rows = {
        line.split()[0]: line
        for line in lines
        if line.startswith("  ")
        and line.split()
        and line.split()[0] in {"embed", "dense", "grow", "dead", "head", "sparse"}
    }
    assert rows["embed"].endswith("vanishing") and rows["dead"].endswith("dead")
    assert rows["grow"].rstrip().endswith("exploding")
    assert re.search(
        rf"\s{report_fixtures.NAN_STEPS[0]}\s+-6\.\d", rows["dense"]
    )  # first NaN step, then the timestep decay
    # Its verdict: a NaN reached it (not born there: the pass is unknown), from its first non-finite step on.
    # Its timestep decay (-6) is a finding too, carried beside it (`+1` where the column has no room for its words).
    assert re.search(
        rf"NaN/Inf @{report_fixtures.NAN_STEPS[0]}( · vanishing through time| \+1)$", rows["dense"].rstrip()
    )
    # Long paths: cut in the middle, the start and the leaf kept, every line within 100 columns.
    long_rows = [line for line in lines if line.startswith("  ") and "…" in line]  # the rows, not the heading
    assert len(long_rows) == 2 and long_rows[0].split()[0].endswith("attention_output_projection")


def test_csv_rows(planted, capsys, report_fixtures):
    code, out, _ = run_cli(capsys, planted.logdir, "--format", "csv", "--run", report_fixtures.RUN)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert tuple(rows[0]) == report.CSV_COLUMNS
    by = {r["layer"]: r for r in rows}
    assert list(by) == report_fixtures.LAYERS + [report_fixtures.SPARSE]
    assert (
        by[report_fixtures.NAN_LAYER]["first_nonfinite"] == str(report_fixtures.NAN_STEPS[0])
        and by[report_fixtures.NAN_LAYER]["nonfinite_steps"] == "3"
    )
    assert by["net/embed"]["now"] == "vanishing" and by["net/head"]["first_nonfinite"] == ""
    assert float(by[report_fixtures.RNN_LAYER]["timestep_decay"]) == pytest.approx(
        -(report_fixtures.TIMESTEPS - 1), abs=report_fixtures.DECAY_SPREAD
    )  # the planted noise; repr(): exact
    assert by["net/dead"]["last_norm"] == "0.0" and by["net/dead"]["last_zero_frac"] == "1.0"
    # No per-example records in this run: the `dominated_*` columns (appended after `now`) say nothing.
    at = report.CSV_COLUMNS.index("now") + 1
    assert report.CSV_COLUMNS[at : at + len(report.DOMINATED_FIELDS)] == tuple(
        f"dominated_{k}" for k in report.DOMINATED_FIELDS
    )
    assert report.CSV_COLUMNS[at + len(report.DOMINATED_FIELDS) :] == ("verdict", "last_nonfinite", "step_decay")
    assert all(r[f"dominated_{k}"] == "" for r in rows for k in report.DOMINATED_FIELDS)


# `{LONG_RUN}`: report_fixtures.LONG_RUN, filled in by the test (a fixture, not known at collection)
@pytest.mark.parametrize(
    "argv,code",
    [
        (["--fail-on", "nan"], 3),
        (["--fail-on", "nan", "--run", "{LONG_RUN}"], 0),
        (["--fail-on", "exploding"], 3),
        (["--fail-on", "dead,vanishing", "--run", "{LONG_RUN}"], 0),
        (["--fail-on", "dead", "--source", "weight"], 0),
        (["--fail-on", "bogus"], 2),
        (["--run", "nope"], 1),
        (["--target", "nope"], 1),
    ],
)
def test_exit_status(planted, capsys, argv, code, report_fixtures):
    argv = [a.format(LONG_RUN=report_fixtures.LONG_RUN) for a in argv]
    got, out, err = run_cli(capsys, planted.logdir, *argv)
    assert got == code, (out, err)
    if code == 3:
        assert "FAIL" in out
    if code == 1:
        assert "not found" in err or "no output statistics" in err


def test_fail_on_names_each_failing_layer(planted, capsys, report_fixtures):
    code, out, err = run_cli(
        capsys, planted.logdir, "--format", "json", "--fail-on", "nan,vanishing,dead", "--run", report_fixtures.RUN
    )
    assert code == 3
    failures = json.loads(out)["failures"]
    assert {(f["layer"], f["condition"], f["step"]) for f in failures} == {
        (report_fixtures.NAN_LAYER, "nan", report_fixtures.NAN_STEPS[0]),
        ("net/embed", "vanishing", 29),
        ("net/dead", "dead", 29),
    }
    assert err.count("FAIL") == 3


def test_missing_logdir(tmp_path, capsys):
    code, _, err = run_cli(capsys, str(tmp_path / "nothing"))
    assert code == 1 and "no such directory" in err
    code, _, err = run_cli(capsys, str(tmp_path))
    assert code == 1 and "no tb_layergrad data" in err


def test_pandas_stays_optional(planted, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now fails
    import tb_layergrad

    with pytest.raises(ImportError, match=r"pip install 'tb-layergrad\[pandas\]'"):
        tb_layergrad.load(planted.logdir)
    code, out, _ = run_cli(capsys, planted.logdir, "--format", "csv")  # the report does not need it
    assert code == 0 and out.startswith("run,target")
    setup = (ROOT / "setup.py").read_text()
    install = re.search(r"install_requires=\[(.*?)\]", setup, re.S).group(1)
    assert "pandas" not in install
    assert re.search(r'"pandas": \["pandas', setup) and '"pandas>=' in setup.split("TEST_REQUIRES", 1)[1]


# -- a run without a `loss` target (a custom train_step names its targets after what each tape trains) --
NAMED_TARGETS = {"critic": {"m/a": 1.0, "m/b": 1e-6}, "maker": {"m/a": 1.0, "m/b": 2.0}}  # layer scales


@pytest.fixture(scope="module")
def named_targets(tmp_path_factory) -> str:
    """Run `gan`: targets `critic` (its `m/b` vanishes) and `maker`, no `loss`; run `plain`: `loss` and `aux`."""
    import numpy as np
    import tensorflow as tf

    from tb_layergrad import summary

    logdir = str(tmp_path_factory.mktemp("named_targets"))
    rng = np.random.default_rng(3)
    plain = {"loss": {"m/a": 1.0, "m/b": 1.0}, "aux": {"m/a": 1.0, "m/b": 1e-6}}
    for run, targets in (("gan", NAMED_TARGETS), ("plain", plain)):
        with tf.summary.create_file_writer(f"{logdir}/{run}").as_default():
            for step in range(8):
                for target, scales in targets.items():
                    grads = {
                        k: tf.constant(rng.normal(scale=s, size=(4, 5)).astype(np.float32)) for k, s in scales.items()
                    }
                    summary.gradients(grads, step=step, target=target)
    return logdir


def test_a_run_without_loss_is_reported_on_each_of_its_targets(named_targets, capsys, plugin_fixtures, report_fixtures):
    code, out, _ = run_cli(capsys, named_targets, "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["target"] is None and doc["skipped"] == []
    assert [(r["run"], r["target"]) for r in doc["runs"]] == [("gan", "critic"), ("gan", "maker"), ("plain", "loss")]
    tb = report_fixtures.in_process(named_targets)
    for r in doc["runs"]:  # each target's verdicts are the route's for that target
        route = plugin_fixtures.strict_json(tb.get("anomalies", {"run": r["run"], "target": r["target"]}).data)
        assert [x["verdict"] for x in r["layers"]] == [x["verdict"] for x in route["layers"]]
        assert r["summary"] == route["summary"]
    states = {(r["target"], x["layer"]): x["verdict"]["state"] for r in doc["runs"] for x in r["layers"]}
    assert states[("critic", "m/b")] == "vanishing" and states[("maker", "m/b")] == "ok"

    code, out, _ = run_cli(capsys, named_targets, "--fail-on", "vanishing")
    assert code == 3
    assert "run gan (target critic)  ·  2 layers" in out and "run gan (target maker)  ·  2 layers" in out
    assert "run plain  ·  2 layers" in out and "target loss; a run without it: each of its targets, named" in " ".join(
        out.split()
    )
    assert [line for line in out.splitlines() if line.startswith("FAIL")] == [
        "FAIL vanishing: run gan (target critic), layer m/b: vanishing at step 7"
    ]


def test_an_asked_target_is_the_only_one(named_targets, capsys):
    code, out, _ = run_cli(capsys, named_targets, "--format", "json", "--target", "maker")
    assert code == 0
    doc = json.loads(out)
    assert doc["target"] == "maker" and [(r["run"], r["target"]) for r in doc["runs"]] == [("gan", "maker")]
    assert [s["run"] for s in doc["skipped"]] == ["plain"]


def test_sort_rules():
    rows = [[2.0], [None], ["b"], [float("nan")], [1.0], [True], ["a"], [2.0]]
    assert report.order(rows, ["x"], "x") == [4, 5, 0, 7, 6, 2, 1, 3]
    assert report.order(rows, ["x"], "-x") == [2, 6, 0, 7, 4, 5, 1, 3]
    with pytest.raises(ValueError, match="use one of: x"):
        report.order(rows, ["x"], "y")
