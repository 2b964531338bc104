"""Where it broke, on the reading side: the `anomalies` route, the activation routes, `tb-layergrad report`
and `tb_layergrad.load()` over event files written with the real summary ops (tests/origin_fixtures.py).

The expected pass and origin of each run are stated by the fixture from how it was written, never
computed by tb_layergrad; the numbers of the activation and target series are recomputed with numpy
from the arrays written.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tb_layergrad import cli, nonfinite_origin


def line_of(want: dict) -> str:
    return nonfinite_origin.Origin(want["step"], want["pass"], want["origin"], want["target"], want["layers"]).line


@pytest.fixture(scope="module")
def tb(origin_logdir, plugin_fixtures):
    return plugin_fixtures.InProcess(origin_logdir.logdir)


def test_anomalies_route_names_pass_and_origin(tb, origin_run, origin_fixtures, plugin_fixtures):
    run = origin_run
    want = origin_fixtures.expected(run)
    for source in ("output", "weight", "activation") if run in origin_fixtures.WITH_ACTIVATIONS else ("output",):
        if source == "weight" and run == origin_fixtures.HTML:
            continue
        body = plugin_fixtures.get_json(tb, "anomalies", {"run": run, "source": source})
        summary = body["summary"]
        assert summary["origin"] == {**want, "line": line_of(want)}, source
        first = summary["first_nonfinite"]  # of this source's layers: none when they all stayed finite
        all_finite = source == "activation" and run not in (origin_fixtures.FORWARD, origin_fixtures.HTML)
        assert (first is None) == all_finite, source
        if first is not None:
            assert first["step"] == origin_fixtures.NAN_STEP and (first["pass"], first["origin"]) == (
                want["pass"],
                want["origin"],
            )
            assert first["line"] == line_of(want)
            assert isinstance(first["layers"], list)  # what old clients read is still there
    # The gradient layers of the view: the loss series is not one of them.
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": run})
    assert [l["layer"] for l in body["layers"]] == [p for p, _ in origin_fixtures._layers(run)]


def test_a_clean_step_range_has_no_origin(tb, origin_fixtures, plugin_fixtures):
    body = plugin_fixtures.get_json(
        tb, "anomalies", {"run": origin_fixtures.FORWARD, "end": str(origin_fixtures.NAN_STEP - 1)}
    )
    assert body["summary"]["origin"] is None and body["summary"]["first_nonfinite"] is None


def test_runs_route_keeps_forward_and_the_loss_out_of_targets_and_layers(tb, origin_fixtures, plugin_fixtures):
    runs = {r["run"]: r for r in plugin_fixtures.get_json(tb, "runs", {})["runs"]}
    for name, r in runs.items():
        assert r["targets"] == ["loss"], name
        assert [l["layer"] for l in r["layers"] if l["sources"] != ["weight"]] == [
            p for p, _ in origin_fixtures._layers(name)
        ]
        assert "loss" not in [l["layer"] for l in r["layers"]]
        assert r["activations"] == (name in origin_fixtures.WITH_ACTIVATIONS)
        assert r["target_series"] == (["loss"] if name in origin_fixtures.WITH_TARGET else [])
        for l in r["layers"]:
            assert "forward" not in l["targets"]
            if name in origin_fixtures.WITH_ACTIVATIONS and l["layer"] in dict(origin_fixtures._layers(name)):
                assert "activation" in l["sources"]
                assert {"target": "forward", "source": "activation"}.items() <= next(
                    x for x in l["series"] if x["source"] == "activation"
                ).items()


@pytest.mark.parametrize("asked_target", [None, "loss", "whatever"])
def test_activation_stats_and_histograms_whatever_target_the_view_shows(
    tb, origin_logdir, asked_target, origin_fixtures, plugin_fixtures
):
    q = {"run": origin_fixtures.FORWARD, "layer": origin_fixtures.K, "source": "activation"}
    if asked_target:
        q["target"] = asked_target
    body = plugin_fixtures.get_json(tb, "stats", q)
    assert (body["target"], body["source"]) == ("forward", "activation") and body["steps"] == origin_fixtures.STEPS
    written = origin_logdir.arrays[(origin_fixtures.FORWARD, "forward", "activation", origin_fixtures.K)]
    for j, step in enumerate(origin_fixtures.STEPS):
        want = origin_fixtures.numpy_stats_record(written[step])
        assert body["stats"]["nan"][j] == want[1] and body["stats"]["elements"][j] == 20
        assert body["stats"]["max"][j] == pytest.approx(want[6], rel=0, abs=0)  # float32 values: exact
        assert body["stats"]["norm"][j] == pytest.approx(want[9], rel=1e-6)
    assert [n > 0 for n in body["stats"]["nonfinite"]] == [s >= origin_fixtures.NAN_STEP for s in origin_fixtures.STEPS]
    hist = plugin_fixtures.get_json(tb, "histograms", q)
    assert hist["steps"] == origin_fixtures.STEPS
    for step, h in zip(hist["steps"], hist["histograms"]):
        x = written[step].reshape(-1)
        assert sum(b[2] for b in h) == np.isfinite(x).sum()


def test_matrix_colours_by_an_activation_statistic(tb, origin_logdir, origin_fixtures, plugin_fixtures):
    body = plugin_fixtures.get_json(
        tb, "matrix", {"run": origin_fixtures.FORWARD, "source": "activation", "stat": "nonfinite"}
    )
    assert (body["target"], body["source"]) == ("forward", "activation")
    assert body["layers"] == [p for p, _ in origin_fixtures.LAYERS] and body["steps"] == origin_fixtures.STEPS
    for layer, row in zip(body["layers"], body["values"]):
        written = origin_logdir.arrays[(origin_fixtures.FORWARD, "forward", "activation", layer)]
        assert row == [int((~np.isfinite(written[s])).sum()) for s in origin_fixtures.STEPS]
    norm = plugin_fixtures.get_json(
        tb, "matrix", {"run": origin_fixtures.BACKWARD, "source": "activation", "stat": "norm"}
    )
    for layer, row in zip(norm["layers"], norm["values"]):
        written = origin_logdir.arrays[(origin_fixtures.BACKWARD, "forward", "activation", layer)]
        np.testing.assert_allclose(
            plugin_fixtures.as_float(row),
            [np.linalg.norm(written[s].astype(np.float64)) for s in origin_fixtures.STEPS],
            rtol=1e-6,
        )
    # Compare runs with activations: one layer in two runs.
    cmp_ = plugin_fixtures.get_json(
        tb,
        "compare",
        {
            "run": [origin_fixtures.FORWARD, origin_fixtures.BACKWARD],
            "layer": origin_fixtures.K,
            "source": "activation",
            "stat": "nan",
        },
    )
    assert cmp_["values"] == [
        [1 if s >= origin_fixtures.NAN_STEP else 0 for s in origin_fixtures.STEPS],
        [0] * len(origin_fixtures.STEPS),
    ]


def test_the_target_series_reads_without_a_histogram(tb, origin_logdir, origin_fixtures, plugin_fixtures):
    for run in (
        origin_fixtures.LOSS,
        origin_fixtures.FORWARD,
    ):  # written with tf.summary.write (no histogram), and with summary.gradient
        body = plugin_fixtures.get_json(tb, "stats", {"run": run, "layer": "loss", "source": "target"})
        values = [float(origin_logdir.arrays[(run, "loss", "target", "loss")][s][0]) for s in origin_fixtures.STEPS]
        assert body["stats"]["mean"] == [v if np.isfinite(v) else None for v in values]
        assert body["stats"]["nan"] == [0 if np.isfinite(v) else 1 for v in values]
    assert (
        plugin_fixtures.get_json(
            tb, "histograms", {"run": origin_fixtures.LOSS, "layer": "loss", "source": "target"}, 404
        )["code"]
        == 404
    )


# `{FORWARD}`, `{GRADS_ONLY}`: the runs' names, `{K}` the layer (origin_fixtures), filled in by the test
@pytest.mark.parametrize(
    "route,query,status",
    [
        ("matrix", {"run": "{FORWARD}", "source": "activations"}, 400),
        ("matrix", {"run": "{FORWARD}", "source": ["activation", "activation"]}, 400),
        ("matrix", {"run": "{GRADS_ONLY}", "source": "activation"}, 404),
        ("stats", {"run": "{GRADS_ONLY}", "layer": "{K}", "source": "activation"}, 404),
        ("anomalies", {"run": "{FORWARD}", "source": "forward"}, 400),
        ("compare", {"run": ["{GRADS_ONLY}"], "layer": "{K}", "source": "activation"}, 404),
    ],
)
def test_bad_parameters_are_json_errors(tb, route, query, status, origin_fixtures, plugin_fixtures):
    names = {"FORWARD": origin_fixtures.FORWARD, "GRADS_ONLY": origin_fixtures.GRADS_ONLY, "K": origin_fixtures.K}
    query = {k: [x.format(**names) for x in v] if isinstance(v, list) else v.format(**names) for k, v in query.items()}
    body = plugin_fixtures.get_json(tb, route, query, status)
    assert body["code"] == status and isinstance(body["error"], str)


def test_report_json_and_text_name_pass_and_origin(origin_logdir, capsys, origin_fixtures, plugin_fixtures):
    code = cli.main(["report", origin_logdir.logdir, "--format", "json"])
    out, _ = capsys.readouterr()
    assert code == 0
    doc = json.loads(out)
    assert sorted(r["run"] for r in doc["runs"]) == sorted(origin_fixtures.RUNS)
    tb = plugin_fixtures.InProcess(origin_logdir.logdir)
    for r in doc["runs"]:
        want = origin_fixtures.expected(r["run"])
        first = r["summary"]["first_nonfinite"]
        assert (first["step"], first["pass"], first["origin"]) == (want["step"], want["pass"], want["origin"]), r["run"]
        assert r["summary"] == plugin_fixtures.strict_json(tb.get("anomalies", {"run": r["run"]}).data)["summary"]
    code = cli.main(["report", origin_logdir.logdir])
    text, _ = capsys.readouterr()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    joined = " ".join(line.strip() for line in lines)  # a long line is wrapped, not cut
    for run in origin_fixtures.RUNS:
        assert line_of(origin_fixtures.expected(run)) in joined, run
    assert (
        "first non-finite value at step 3: backward pass, born in the backward pass of net/log (loss finite)" in joined
    )
    assert "  first non-finite value at step 3: in the loss (every layer output finite)" in lines
    assert "  first non-finite value at step 3: forward pass, output of net/log" in lines


def test_load_gives_activations_the_loss_and_the_origins(origin_logdir, origin_fixtures):
    import tb_layergrad
    from tb_layergrad.reader import dataframe

    df = tb_layergrad.load(origin_logdir.logdir)
    acts = df[(df.run == origin_fixtures.FORWARD) & (df.source == "activation")]
    assert set(acts.target) == {"forward"} and list(dict.fromkeys(acts.layer)) == [p for p, _ in origin_fixtures.LAYERS]
    at_k = acts[acts.layer == origin_fixtures.K]
    assert list(at_k.nan) == [float(s >= origin_fixtures.NAN_STEP) for s in origin_fixtures.STEPS]
    loss = df[(df.run == origin_fixtures.LOSS) & (df.source == "target")]
    assert list(loss.layer.unique()) == ["loss"] and list(loss["index"].unique()) == [-1]
    np.testing.assert_array_equal(
        loss["mean"].to_numpy(float),
        [origin_logdir.arrays[(origin_fixtures.LOSS, "loss", "target", "loss")][s][0] for s in origin_fixtures.STEPS],
    )
    assert df[df.run == origin_fixtures.LOSS].source.iloc[-1] == "target"  # the loss after the layers
    assert "activation" not in set(df[df.run == origin_fixtures.GRADS_ONLY].source)
    for run in origin_fixtures.RUNS:
        want = origin_fixtures.expected(run)
        assert df.attrs["nonfinite_origin"][run] == {"loss": {**want, "line": line_of(want)}}, run
    origins = dataframe.origins(origin_logdir.logdir, runs=[origin_fixtures.BACKWARD])
    o = origins[origin_fixtures.BACKWARD]["loss"]
    assert (o.step, o.pass_, o.origin) == (origin_fixtures.NAN_STEP, "backward", origin_fixtures.K)
