"""The `anomalies` route's `dominated` (docs/HTTP_API.md; docs/ANOMALIES.md, "One example dominates") and the
`examples` route for a weight variable, through their HTTP handlers, on a run written by the real capture and
summary ops (tests/dominated_fixtures.py): the layers, worst steps, batch positions and shares are numpy's on
independent per-example gradients (one tape per example), and the same as `tb-layergrad report`'s.
"""

from __future__ import annotations

import csv
import io
import json

import dominated_fixtures as df
import numpy as np
import pytest
from plugin_fixtures import InProcess, as_float, get_json

from tb_layergrad import cli
from tb_layergrad.cli import report

pytestmark = pytest.mark.timeout(300)

SHARE_RTOL = 4 * df.RTOL  # a share of squared norms, each norm within RTOL


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("dominated"))
    written = df.write_logdir(logdir)
    return written, InProcess(logdir), logdir


def _paths(written: df.Written, source: str):
    return sorted((written.outputs if source == "output" else written.weights)[0])


@pytest.mark.parametrize("source", ["output", "weight"])
def test_route_names_the_dominated_layers_as_numpy_does(env, source):
    written, tb, _ = env
    body = get_json(tb, "anomalies", {"run": df.RUN, "source": source})
    want = {p: df.expected_dominance(p, written.norms(source, p)) for p in _paths(written, source)}
    want = {p: w for p, w in want.items() if w is not None}
    # The planted example dominates every layer's and every weight's gradient at its step, and nothing else does.
    assert sorted(want) == _paths(written, source)
    got = body["dominated"]
    model_order = [entry["layer"] for entry in body["layers"]]
    assert [d["layer"] for d in got] == [p for p in model_order if p in want]
    for d in got:
        w = want[d["layer"]]
        assert (
            (d["steps"], d["first_step"], d["worst_step"], d["worst_position"], d["examples"])
            == (w["steps"], w["first_step"], w["worst_step"], w["worst_position"], w["examples"])
            == (1, df.DOMINATED_STEP, df.DOMINATED_STEP, df.DOMINATED_POSITION, df.BATCH)
        ), d["layer"]
        np.testing.assert_allclose(d["worst_share"], w["worst_share"], rtol=SHARE_RTOL, err_msg=d["layer"])
        assert d["worst_share"] > 0.5
        assert d["line"] == (
            f"one example dominates {d['layer']} at 1 step: first step {df.DOMINATED_STEP}; worst step "
            f"{df.DOMINATED_STEP}, {d['worst_share']:.0%} of its gradient from batch position "
            f"{df.DOMINATED_POSITION} of {df.BATCH}"
        )
    assert body["example_thresholds"] == {"DOMINANT_SHARE": 0.5, "DOMINANT_MIN_EXAMPLES": 8, "DOMINANT_OUTLIER": 4.0}
    # Not a flag bit: no step of the flags says anything about it.
    assert all(set(entry["counts"]) == {"nonfinite", "vanishing", "exploding", "dead"} for entry in body["layers"])


def test_one_layer_and_a_step_range(env):
    written, tb, _ = env
    one = get_json(tb, "anomalies", {"run": df.RUN, "layer": df.OUT})
    assert [d["layer"] for d in one["dominated"]] == [df.OUT] and [e["layer"] for e in one["layers"]] == [df.OUT]
    kernel = get_json(tb, "anomalies", {"run": df.RUN, "source": "weight", "layer": df.KERNEL})
    assert [d["layer"] for d in kernel["dominated"]] == [df.KERNEL]
    np.testing.assert_allclose(
        kernel["dominated"][0]["worst_share"],
        df.expected_dominance(df.KERNEL, written.norms("weight", df.KERNEL))["worst_share"],
        rtol=SHARE_RTOL,
    )
    after = get_json(tb, "anomalies", {"run": df.RUN, "start": df.DOMINATED_STEP + 1})
    norms = written.norms("output", df.OUT)[df.DOMINATED_STEP + 1 :]
    assert df.expected_dominance(df.OUT, norms) is None  # numpy agrees: nothing after the planted step
    assert after["dominated"] == [] and "example_thresholds" in after  # said, and nothing found
    upto = get_json(tb, "anomalies", {"run": df.RUN, "end": df.DOMINATED_STEP})
    assert [d["worst_step"] for d in upto["dominated"]] == [df.DOMINATED_STEP] * 2


def test_the_route_and_the_report_say_the_same(env):
    _, tb, logdir = env
    for source in ("output", "weight"):
        rep = report.to_json(report.build(logdir, source=source))
        (run,) = rep["runs"]
        route = get_json(tb, "anomalies", {"run": df.RUN, "source": source})["dominated"]
        assert [{k: v for k, v in d.items() if k != "line"} for d in route] == run["dominated"], source


@pytest.mark.parametrize("source", ["output", "weight"])
def test_the_csv_says_what_the_json_says(env, capsys, source):
    """`--format csv`: each dominated layer's row carries the JSON's numbers, which are numpy's."""
    written, _, logdir = env
    outs = []
    for fmt in ("json", "csv"):
        assert cli.main(["report", logdir, "--format", fmt, "--source", source]) == 0
        outs.append(capsys.readouterr().out)
    (run,) = json.loads(outs[0])["runs"]
    rows = {r["layer"]: r for r in csv.DictReader(io.StringIO(outs[1]))}
    assert list(rows) == [entry["layer"] for entry in run["layers"]]
    assert sorted(d["layer"] for d in run["dominated"]) == _paths(written, source)
    for d in run["dominated"]:
        row = rows[d["layer"]]
        for k in ("steps", "first_step", "worst_step", "worst_position", "examples"):
            assert int(row[f"dominated_{k}"]) == d[k], (d["layer"], k)
        assert float(row["dominated_worst_share"]) == d["worst_share"]  # repr(): the same float
        assert (int(row["dominated_worst_step"]), int(row["dominated_worst_position"])) == (
            df.DOMINATED_STEP,
            df.DOMINATED_POSITION,
        )
        want = df.expected_dominance(d["layer"], written.norms(source, d["layer"]))["worst_share"]
        np.testing.assert_allclose(float(row["dominated_worst_share"]), want, rtol=SHARE_RTOL, err_msg=d["layer"])


@pytest.mark.parametrize(
    "query,status",
    [
        ({"run": df.RUN, "start": "5", "end": "1"}, 400),
        ({"run": df.RUN, "source": "bogus"}, 400),
        ({"run": df.RUN, "start": "x"}, 400),
        ([("run", df.RUN), ("layer", df.OUT), ("layer", "mlp/h")], 400),
        ({"run": df.RUN, "layer": "no/such"}, 404),
        ({"run": df.RUN, "source": "weight", "layer": df.OUT}, 404),
    ],
)
def test_bad_queries_are_json_errors(env, query, status):
    _, tb, _ = env
    r = tb.get("anomalies", query)
    assert r.status_code == status, r.data[:300]
    assert r.get_json()["error"] and "Traceback" not in r.get_data(as_text=True)


@pytest.mark.parametrize("variable", [df.KERNEL, df.BIAS, df.HIDDEN_KERNEL])
def test_examples_route_of_a_weight(env, variable):
    """The layer view asks `examples` for each weight its layer owns: their spread and top positions."""
    written, tb, _ = env
    norms = written.norms("weight", variable)
    body = get_json(tb, "examples", {"run": df.RUN, "layer": variable, "source": "weight"})
    assert (body["layer"], body["source"], body["steps"]) == (variable, "weight", list(range(df.STEPS)))
    sq = norms**2
    np.testing.assert_allclose(as_float(body["min"]), norms.min(1), rtol=df.RTOL)
    np.testing.assert_allclose(as_float(body["median"]), np.median(norms, 1), rtol=df.RTOL)
    np.testing.assert_allclose(as_float(body["max"]), norms.max(1), rtol=df.RTOL)
    np.testing.assert_allclose(as_float(body["top_share"]), sq.max(1) / sq.sum(1), rtol=SHARE_RTOL)
    assert body["examples"] == [df.BATCH] * df.STEPS and body["status"] == [0] * df.STEPS
    at = get_json(tb, "examples", {"run": df.RUN, "layer": variable, "source": "weight", "step": df.DOMINATED_STEP})[
        "at"
    ]
    order = np.argsort(-norms[df.DOMINATED_STEP], kind="stable")[:5]
    assert [t["position"] for t in at["top"]] == order.tolist() and order[0] == df.DOMINATED_POSITION
    np.testing.assert_allclose([t["norm"] for t in at["top"]], norms[df.DOMINATED_STEP][order], rtol=df.RTOL)


def test_a_bias_holds_its_layers_output_norms(env):
    """A Dense bias's per-example gradient is its layer's output gradient: the two series read the same numbers."""
    written, tb, _ = env
    bias = get_json(tb, "examples", {"run": df.RUN, "layer": df.BIAS, "source": "weight"})
    out = get_json(tb, "examples", {"run": df.RUN, "layer": df.OUT})
    np.testing.assert_allclose(as_float(bias["max"]), as_float(out["max"]), rtol=df.RTOL)
    np.testing.assert_allclose(as_float(out["max"]), written.norms("output", df.OUT).max(1), rtol=df.RTOL)
    missing = tb.get("examples", {"run": df.RUN, "layer": df.KERNEL})  # a weight asked as an output: no such series
    assert missing.status_code == 404 and missing.get_json()["error"]
