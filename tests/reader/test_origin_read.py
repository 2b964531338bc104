"""Where it broke, on the reading side: the `anomalies` route, the activation routes, `tb-layergrad report`
and `tb_layergrad.load()` over event files written with the real summary ops (tests/origin_fixtures.py).

The expected pass and origin of each run are stated by the fixture from how it was written, never
computed by tb_layergrad; the numbers of the activation and target series are recomputed with numpy
from the arrays written.
"""

from __future__ import annotations

import json

import numpy as np
import origin_fixtures as of
import pytest
from plugin_fixtures import InProcess, as_float, get_json, strict_json

from tb_layergrad import cli, nonfinite_origin


def line_of(want: dict) -> str:
    return nonfinite_origin.Origin(want["step"], want["pass"], want["origin"], want["target"], want["layers"]).line


@pytest.fixture(scope="module")
def tb(origin_logdir):
    return InProcess(origin_logdir.logdir)


get = get_json


@pytest.mark.parametrize("run", of.RUNS)
def test_anomalies_route_names_pass_and_origin(tb, run):
    want = of.expected(run)
    for source in ("output", "weight", "activation") if run in of.WITH_ACTIVATIONS else ("output",):
        if source == "weight" and run == of.HTML:
            continue
        body = get(tb, "anomalies", {"run": run, "source": source})
        summary = body["summary"]
        assert summary["origin"] == {**want, "line": line_of(want)}, source
        first = summary["first_nonfinite"]  # of this source's layers: none when they all stayed finite
        all_finite = source == "activation" and run not in (of.FORWARD, of.HTML)
        assert (first is None) == all_finite, source
        if first is not None:
            assert first["step"] == of.NAN_STEP and (first["pass"], first["origin"]) == (want["pass"], want["origin"])
            assert first["line"] == line_of(want)
            assert isinstance(first["layers"], list)  # what old clients read is still there
    # The gradient layers of the view: the loss series is not one of them.
    body = get(tb, "anomalies", {"run": run})
    assert [l["layer"] for l in body["layers"]] == [p for p, _ in of._layers(run)]


def test_a_clean_step_range_has_no_origin(tb):
    body = get(tb, "anomalies", {"run": of.FORWARD, "end": str(of.NAN_STEP - 1)})
    assert body["summary"]["origin"] is None and body["summary"]["first_nonfinite"] is None


def test_runs_route_keeps_forward_and_the_loss_out_of_targets_and_layers(tb):
    runs = {r["run"]: r for r in get(tb, "runs", {})["runs"]}
    for name, r in runs.items():
        assert r["targets"] == ["loss"], name
        assert [l["layer"] for l in r["layers"] if l["sources"] != ["weight"]] == [p for p, _ in of._layers(name)]
        assert "loss" not in [l["layer"] for l in r["layers"]]
        assert r["activations"] == (name in of.WITH_ACTIVATIONS)
        assert r["target_series"] == (["loss"] if name in of.WITH_TARGET else [])
        for l in r["layers"]:
            assert "forward" not in l["targets"]
            if name in of.WITH_ACTIVATIONS and l["layer"] in dict(of._layers(name)):
                assert "activation" in l["sources"]
                assert {"target": "forward", "source": "activation"}.items() <= next(
                    x for x in l["series"] if x["source"] == "activation"
                ).items()


@pytest.mark.parametrize("asked_target", [None, "loss", "whatever"])
def test_activation_stats_and_histograms_whatever_target_the_view_shows(tb, origin_logdir, asked_target):
    q = {"run": of.FORWARD, "layer": of.K, "source": "activation"}
    if asked_target:
        q["target"] = asked_target
    body = get(tb, "stats", q)
    assert (body["target"], body["source"]) == ("forward", "activation") and body["steps"] == of.STEPS
    written = origin_logdir.arrays[(of.FORWARD, "forward", "activation", of.K)]
    for j, step in enumerate(of.STEPS):
        want = of.numpy_stats_record(written[step])
        assert body["stats"]["nan"][j] == want[1] and body["stats"]["elements"][j] == 20
        assert body["stats"]["max"][j] == pytest.approx(want[6], rel=0, abs=0)  # float32 values: exact
        assert body["stats"]["norm"][j] == pytest.approx(want[9], rel=1e-6)
    assert [n > 0 for n in body["stats"]["nonfinite"]] == [s >= of.NAN_STEP for s in of.STEPS]
    hist = get(tb, "histograms", q)
    assert hist["steps"] == of.STEPS
    for step, h in zip(hist["steps"], hist["histograms"]):
        x = written[step].reshape(-1)
        assert sum(b[2] for b in h) == np.isfinite(x).sum()


def test_matrix_colours_by_an_activation_statistic(tb, origin_logdir):
    body = get(tb, "matrix", {"run": of.FORWARD, "source": "activation", "stat": "nonfinite"})
    assert (body["target"], body["source"]) == ("forward", "activation")
    assert body["layers"] == [p for p, _ in of.LAYERS] and body["steps"] == of.STEPS
    for layer, row in zip(body["layers"], body["values"]):
        written = origin_logdir.arrays[(of.FORWARD, "forward", "activation", layer)]
        assert row == [int((~np.isfinite(written[s])).sum()) for s in of.STEPS]
    norm = get(tb, "matrix", {"run": of.BACKWARD, "source": "activation", "stat": "norm"})
    for layer, row in zip(norm["layers"], norm["values"]):
        written = origin_logdir.arrays[(of.BACKWARD, "forward", "activation", layer)]
        np.testing.assert_allclose(
            as_float(row), [np.linalg.norm(written[s].astype(np.float64)) for s in of.STEPS], rtol=1e-6
        )
    # Compare runs with activations: one layer in two runs.
    cmp_ = get(tb, "compare", {"run": [of.FORWARD, of.BACKWARD], "layer": of.K, "source": "activation", "stat": "nan"})
    assert cmp_["values"] == [[1 if s >= of.NAN_STEP else 0 for s in of.STEPS], [0] * len(of.STEPS)]


def test_the_target_series_reads_without_a_histogram(tb, origin_logdir):
    for run in (of.LOSS, of.FORWARD):  # written with tf.summary.write (no histogram), and with summary.gradient
        body = get(tb, "stats", {"run": run, "layer": "loss", "source": "target"})
        values = [float(origin_logdir.arrays[(run, "loss", "target", "loss")][s][0]) for s in of.STEPS]
        assert body["stats"]["mean"] == [v if np.isfinite(v) else None for v in values]
        assert body["stats"]["nan"] == [0 if np.isfinite(v) else 1 for v in values]
    assert get(tb, "histograms", {"run": of.LOSS, "layer": "loss", "source": "target"}, 404)["code"] == 404


@pytest.mark.parametrize(
    "route,query,status",
    [
        ("matrix", {"run": of.FORWARD, "source": "activations"}, 400),
        ("matrix", {"run": of.FORWARD, "source": ["activation", "activation"]}, 400),
        ("matrix", {"run": of.GRADS_ONLY, "source": "activation"}, 404),
        ("stats", {"run": of.GRADS_ONLY, "layer": of.K, "source": "activation"}, 404),
        ("anomalies", {"run": of.FORWARD, "source": "forward"}, 400),
        ("compare", {"run": [of.GRADS_ONLY], "layer": of.K, "source": "activation"}, 404),
    ],
)
def test_bad_parameters_are_json_errors(tb, route, query, status):
    body = get(tb, route, query, status)
    assert body["code"] == status and isinstance(body["error"], str)


def test_report_json_and_text_name_pass_and_origin(origin_logdir, capsys):
    code = cli.main(["report", origin_logdir.logdir, "--format", "json"])
    out, _ = capsys.readouterr()
    assert code == 0
    doc = json.loads(out)
    assert sorted(r["run"] for r in doc["runs"]) == sorted(of.RUNS)
    tb = InProcess(origin_logdir.logdir)
    for r in doc["runs"]:
        want = of.expected(r["run"])
        first = r["summary"]["first_nonfinite"]
        assert (first["step"], first["pass"], first["origin"]) == (want["step"], want["pass"], want["origin"]), r["run"]
        assert r["summary"] == strict_json(tb.get("anomalies", {"run": r["run"]}).data)["summary"]
    code = cli.main(["report", origin_logdir.logdir])
    text, _ = capsys.readouterr()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    joined = " ".join(line.strip() for line in lines)  # a long line is wrapped, not cut
    for run in of.RUNS:
        assert line_of(of.expected(run)) in joined, run
    assert (
        "first non-finite value at step 3: backward pass, born in the backward pass of net/log (loss finite)" in joined
    )
    assert "  first non-finite value at step 3: in the loss (every layer output finite)" in lines
    assert "  first non-finite value at step 3: forward pass, output of net/log" in lines


def test_load_gives_activations_the_loss_and_the_origins(origin_logdir):
    import tb_layergrad
    from tb_layergrad.reader import dataframe

    df = tb_layergrad.load(origin_logdir.logdir)
    acts = df[(df.run == of.FORWARD) & (df.source == "activation")]
    assert set(acts.target) == {"forward"} and list(dict.fromkeys(acts.layer)) == [p for p, _ in of.LAYERS]
    at_k = acts[acts.layer == of.K]
    assert list(at_k.nan) == [float(s >= of.NAN_STEP) for s in of.STEPS]
    loss = df[(df.run == of.LOSS) & (df.source == "target")]
    assert list(loss.layer.unique()) == ["loss"] and list(loss["index"].unique()) == [-1]
    np.testing.assert_array_equal(
        loss["mean"].to_numpy(float),
        [origin_logdir.arrays[(of.LOSS, "loss", "target", "loss")][s][0] for s in of.STEPS],
    )
    assert df[df.run == of.LOSS].source.iloc[-1] == "target"  # the loss after the layers
    assert "activation" not in set(df[df.run == of.GRADS_ONLY].source)
    for run in of.RUNS:
        want = of.expected(run)
        assert df.attrs["nonfinite_origin"][run] == {"loss": {**want, "line": line_of(want)}}, run
    origins = dataframe.origins(origin_logdir.logdir, runs=[of.BACKWARD])
    o = origins[of.BACKWARD]["loss"]
    assert (o.step, o.pass_, o.origin) == (of.NAN_STEP, "backward", of.K)
