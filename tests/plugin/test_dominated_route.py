"""The `anomalies` route's `dominated` (docs/HTTP_API.md; docs/ANOMALIES.md, "One example dominates") and the
`examples` route for a weight variable, through their HTTP handlers, on a run written by the real capture and
summary ops (tests/dominated_fixtures.py): the layers, worst steps, batch positions and shares are numpy's on
independent per-example gradients (one tape per example), and the same as `tb-layergrad report`'s.
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from tb_layergrad import cli

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def share_rtol(dominated_fixtures) -> float:
    """A share of squared norms, each norm within `dominated_fixtures.RTOL`."""
    return 4 * dominated_fixtures.RTOL


@pytest.fixture(scope="module")
def env(tmp_path_factory, dominated_fixtures, plugin_fixtures):
    logdir = str(tmp_path_factory.mktemp("dominated"))
    written = dominated_fixtures.write_logdir(logdir)
    return written, plugin_fixtures.InProcess(logdir), logdir


def _paths(written, source: str):
    """The layers (or weights) of `written` (a `dominated_fixtures.Written`) for `source`."""
    return sorted((written.outputs if source == "output" else written.weights)[0])


@pytest.mark.parametrize("source", ["output", "weight"])
def test_route_names_the_dominated_layers_as_numpy_does(env, source, dominated_fixtures, plugin_fixtures, share_rtol):
    written, tb, _ = env
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": dominated_fixtures.RUN, "source": source})
    want = {p: dominated_fixtures.expected_dominance(p, written.norms(source, p)) for p in _paths(written, source)}
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
            == (
                1,
                dominated_fixtures.DOMINATED_STEP,
                dominated_fixtures.DOMINATED_STEP,
                dominated_fixtures.DOMINATED_POSITION,
                dominated_fixtures.BATCH,
            )
        ), d["layer"]
        np.testing.assert_allclose(d["worst_share"], w["worst_share"], rtol=share_rtol, err_msg=d["layer"])
        assert d["worst_share"] > 0.5
        assert d["line"] == (
            f"one example dominates {d['layer']} at 1 step: first step {dominated_fixtures.DOMINATED_STEP}; worst step "
            f"{dominated_fixtures.DOMINATED_STEP}, {d['worst_share']:.0%} of its gradient from batch position "
            f"{dominated_fixtures.DOMINATED_POSITION} of {dominated_fixtures.BATCH}"
        )
    assert body["example_thresholds"] == {"DOMINANT_SHARE": 0.5, "DOMINANT_MIN_EXAMPLES": 8, "DOMINANT_OUTLIER": 4.0}
    # Not a flag bit: no step of the flags says anything about it.
    assert all(set(entry["counts"]) == {"nonfinite", "vanishing", "exploding", "dead"} for entry in body["layers"])


def test_one_layer_and_a_step_range(env, dominated_fixtures, plugin_fixtures, share_rtol):
    written, tb, _ = env
    one = plugin_fixtures.get_json(tb, "anomalies", {"run": dominated_fixtures.RUN, "layer": dominated_fixtures.OUT})
    assert [d["layer"] for d in one["dominated"]] == [dominated_fixtures.OUT] and [
        e["layer"] for e in one["layers"]
    ] == [dominated_fixtures.OUT]
    kernel = plugin_fixtures.get_json(
        tb, "anomalies", {"run": dominated_fixtures.RUN, "source": "weight", "layer": dominated_fixtures.KERNEL}
    )
    assert [d["layer"] for d in kernel["dominated"]] == [dominated_fixtures.KERNEL]
    np.testing.assert_allclose(
        kernel["dominated"][0]["worst_share"],
        dominated_fixtures.expected_dominance(
            dominated_fixtures.KERNEL, written.norms("weight", dominated_fixtures.KERNEL)
        )["worst_share"],
        rtol=share_rtol,
    )
    after = plugin_fixtures.get_json(
        tb, "anomalies", {"run": dominated_fixtures.RUN, "start": dominated_fixtures.DOMINATED_STEP + 1}
    )
    norms = written.norms("output", dominated_fixtures.OUT)[dominated_fixtures.DOMINATED_STEP + 1 :]
    assert (
        dominated_fixtures.expected_dominance(dominated_fixtures.OUT, norms) is None
    )  # numpy agrees: nothing after the planted step
    assert after["dominated"] == [] and "example_thresholds" in after  # said, and nothing found
    upto = plugin_fixtures.get_json(
        tb, "anomalies", {"run": dominated_fixtures.RUN, "end": dominated_fixtures.DOMINATED_STEP}
    )
    assert [d["worst_step"] for d in upto["dominated"]] == [dominated_fixtures.DOMINATED_STEP] * 2


def test_the_route_and_the_report_say_the_same(env, capsys, dominated_fixtures, plugin_fixtures):
    """`tb-layergrad report --format json` (the command's entry point, in process) and the route."""
    _, tb, logdir = env
    for source in ("output", "weight"):
        assert cli.main(["report", logdir, "--format", "json", "--source", source]) == 0
        rep = json.loads(capsys.readouterr().out)
        (run,) = rep["runs"]
        route = plugin_fixtures.get_json(tb, "anomalies", {"run": dominated_fixtures.RUN, "source": source})[
            "dominated"
        ]
        assert [{k: v for k, v in d.items() if k != "line"} for d in route] == run["dominated"], source


@pytest.mark.parametrize("source", ["output", "weight"])
def test_the_csv_says_what_the_json_says(env, capsys, source, dominated_fixtures, share_rtol):
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
            dominated_fixtures.DOMINATED_STEP,
            dominated_fixtures.DOMINATED_POSITION,
        )
        want = dominated_fixtures.expected_dominance(d["layer"], written.norms(source, d["layer"]))["worst_share"]
        np.testing.assert_allclose(float(row["dominated_worst_share"]), want, rtol=share_rtol, err_msg=d["layer"])


# `{RUN}`, `{OUT}`: the run's names (dominated_fixtures), filled in by the test
@pytest.mark.parametrize(
    "query,status",
    [
        ({"run": "{RUN}", "start": "5", "end": "1"}, 400),
        ({"run": "{RUN}", "source": "bogus"}, 400),
        ({"run": "{RUN}", "start": "x"}, 400),
        ([("run", "{RUN}"), ("layer", "{OUT}"), ("layer", "mlp/h")], 400),
        ({"run": "{RUN}", "layer": "no/such"}, 404),
        ({"run": "{RUN}", "source": "weight", "layer": "{OUT}"}, 404),
    ],
)
def test_bad_queries_are_json_errors(env, query, status, dominated_fixtures):
    _, tb, _ = env
    names = {"RUN": dominated_fixtures.RUN, "OUT": dominated_fixtures.OUT}
    pairs = query.items() if isinstance(query, dict) else query
    query = [(k, v.format(**names)) for k, v in pairs]  # a list of pairs: one key may repeat
    r = tb.get("anomalies", query)
    assert r.status_code == status, r.data[:300]
    assert r.get_json()["error"] and "Traceback" not in r.get_data(as_text=True)


def test_examples_route_of_a_weight(env, dominated_weight, dominated_fixtures, plugin_fixtures, share_rtol):
    """The layer view asks `examples` for each weight its layer owns: their spread and top positions."""
    written, tb, _ = env
    norms = written.norms("weight", dominated_weight)
    body = plugin_fixtures.get_json(
        tb, "examples", {"run": dominated_fixtures.RUN, "layer": dominated_weight, "source": "weight"}
    )
    assert (body["layer"], body["source"], body["steps"]) == (
        dominated_weight,
        "weight",
        list(range(dominated_fixtures.STEPS)),
    )
    sq = norms**2
    np.testing.assert_allclose(plugin_fixtures.as_float(body["min"]), norms.min(1), rtol=dominated_fixtures.RTOL)
    np.testing.assert_allclose(
        plugin_fixtures.as_float(body["median"]), np.median(norms, 1), rtol=dominated_fixtures.RTOL
    )
    np.testing.assert_allclose(plugin_fixtures.as_float(body["max"]), norms.max(1), rtol=dominated_fixtures.RTOL)
    np.testing.assert_allclose(plugin_fixtures.as_float(body["top_share"]), sq.max(1) / sq.sum(1), rtol=share_rtol)
    assert (
        body["examples"] == [dominated_fixtures.BATCH] * dominated_fixtures.STEPS
        and body["status"] == [0] * dominated_fixtures.STEPS
    )
    at = plugin_fixtures.get_json(
        tb,
        "examples",
        {
            "run": dominated_fixtures.RUN,
            "layer": dominated_weight,
            "source": "weight",
            "step": dominated_fixtures.DOMINATED_STEP,
        },
    )["at"]
    order = np.argsort(-norms[dominated_fixtures.DOMINATED_STEP], kind="stable")[:5]
    assert [t["position"] for t in at["top"]] == order.tolist() and order[0] == dominated_fixtures.DOMINATED_POSITION
    np.testing.assert_allclose(
        [t["norm"] for t in at["top"]], norms[dominated_fixtures.DOMINATED_STEP][order], rtol=dominated_fixtures.RTOL
    )


def test_a_bias_holds_its_layers_output_norms(env, dominated_fixtures, plugin_fixtures):
    """A Dense bias's per-example gradient is its layer's output gradient: the two series read the same numbers."""
    written, tb, _ = env
    bias = plugin_fixtures.get_json(
        tb, "examples", {"run": dominated_fixtures.RUN, "layer": dominated_fixtures.BIAS, "source": "weight"}
    )
    out = plugin_fixtures.get_json(tb, "examples", {"run": dominated_fixtures.RUN, "layer": dominated_fixtures.OUT})
    np.testing.assert_allclose(
        plugin_fixtures.as_float(bias["max"]), plugin_fixtures.as_float(out["max"]), rtol=dominated_fixtures.RTOL
    )
    np.testing.assert_allclose(
        plugin_fixtures.as_float(out["max"]),
        written.norms("output", dominated_fixtures.OUT).max(1),
        rtol=dominated_fixtures.RTOL,
    )
    missing = tb.get(
        "examples", {"run": dominated_fixtures.RUN, "layer": dominated_fixtures.KERNEL}
    )  # a weight asked as an output: no such series
    assert missing.status_code == 404 and missing.get_json()["error"]
