"""The report flags the step where one example carries most of a layer's gradient (docs/ANOMALIES.md,
"One example dominates"), from per-example records written by hand (tests/examples_fixtures.py)."""
from __future__ import annotations

import argparse
import io
import json

import numpy as np
import pytest

import examples_fixtures as ef
from tb_layergrad.cli import report
from tb_layergrad.reader import anomalies

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    return ef.write_examples_logdir(str(tmp_path_factory.mktemp("examples_report"))).logdir


def _run(logdir, *extra):
    parser = argparse.ArgumentParser()
    report.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    code = report.main(parser.parse_args([logdir, *extra]), out, err)
    return code, out.getvalue(), err.getvalue()


def test_rule_by_hand():
    share = np.array([0.49, 0.51, 0.9, 0.9, 0.9, np.nan])
    count = np.array([32, 32, 7, 8, 8, 32])
    status = np.array([0, 0, 0, 0, 2, 0])
    assert anomalies.dominated(share, count, status).tolist() == [False, True, False, True, False, False]
    d = anomalies.dominance("m/a", [0, 5, 10, 15, 20, 25], share, count, status, [1, 2, 3, 4, 5, 6])
    assert (d.steps, d.first_step, d.worst_step, d.worst_share, d.worst_position, d.examples) == (2, 5, 15, 0.9, 4, 8)
    assert anomalies.dominance("m/a", [0], [0.2], [32], [0], [3]) is None


def test_report_names_the_dominated_step(logdir):
    code, out, _ = _run(logdir, "--format", "json")
    assert code == 0
    runs = {r["run"]: r for r in json.loads(out)["runs"]}
    norms = ef.make_norms()
    for name in (ef.RUN, ef.RENAMED):
        want = []
        for layer in ef.LAYERS:  # numpy on the raw norms: the steps where the largest carries > half
            if layer == ef.UNSUPPORTED_LAYER:
                continue
            sq = norms[layer] ** 2
            share = sq.max(1) / sq.sum(1)
            hit = np.flatnonzero(share > 0.5)
            if hit.size:
                worst = int(hit[np.argmax(share[hit])])
                want.append({"layer": layer, "steps": int(hit.size), "first_step": int(hit[0]), "worst_step": worst,
                             "worst_share": pytest.approx(float(share[worst]), rel=1e-12),
                             "worst_position": int(np.argmax(norms[layer][worst])), "examples": ef.BATCH})
        assert runs[name]["dominated"] == want
        assert want[0]["layer"] == ef.DOMINATED_LAYER and want[0]["worst_step"] == ef.DOMINATED_STEP
        assert want[0]["worst_position"] == ef.DOMINATED_POSITION
    assert "dominated" not in runs[ef.PLAIN]  # no per-example records: nothing said, the JSON as before
    code, text, _ = _run(logdir, "--run", ef.RUN)
    text = " ".join(text.split())  # the line is wrapped at the terminal width
    assert f"one example dominates {ef.DOMINATED_LAYER} at 1 step: first step {ef.DOMINATED_STEP}" in text
    assert f"from batch position {ef.DOMINATED_POSITION} of {ef.BATCH}" in text


def test_fail_on_dominated(logdir):
    code, _, err = _run(logdir, "--format", "json", "--fail-on", "dominated")
    assert code == report.EXIT_FAILED and f"layer {ef.DOMINATED_LAYER}, step {ef.DOMINATED_STEP}" in err
    code, out, _ = _run(logdir, "--run", ef.PLAIN, "--fail-on", "dominated")
    assert code == 0 and "OK: none of dominated holds" in out
