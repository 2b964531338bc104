"""The `examples`, `noise_scale` routes and `matrix?stat=example_norm_*` (docs/HTTP_API.md), through their HTTP
handlers, against numpy applied to the per-example norms the fixture made up (tests/examples_fixtures.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def env(tmp_path_factory, examples_fixtures, plugin_fixtures):
    written = examples_fixtures.write_examples_logdir(str(tmp_path_factory.mktemp("examples")))
    return written, plugin_fixtures.InProcess(written.logdir)


def spread(norms: np.ndarray) -> dict:
    """numpy's answer per step, from the raw norms [steps, batch]."""
    sq = norms**2
    return {
        "min": norms.min(1),
        "median": np.median(norms, 1),
        "max": norms.max(1),
        "top_share": sq.max(1) / sq.sum(1),
        "examples": np.full(norms.shape[0], norms.shape[1]),
    }


def test_spread_per_step(env, examples_run, examples_fixtures, plugin_fixtures):
    run = examples_run
    written, tb = env
    for layer in ("net/in", examples_fixtures.DOMINATED_LAYER):
        body = plugin_fixtures.get_json(tb, "examples", {"run": run, "layer": layer})
        assert body["steps"] == list(range(examples_fixtures.STEPS))
        want = spread(written.norms[layer])
        for name, values in want.items():
            np.testing.assert_allclose(
                plugin_fixtures.as_float(body[name]), values, rtol=1e-12, err_msg=f"{run} {layer} {name}"
            )
        assert body["status"] == [0] * examples_fixtures.STEPS
        assert "binned" not in body and body["top_k"] == 5


def test_unsupported_layer_has_no_numbers(env, examples_fixtures, plugin_fixtures):
    _, tb = env
    body = plugin_fixtures.get_json(
        tb, "examples", {"run": examples_fixtures.RUN, "layer": examples_fixtures.UNSUPPORTED_LAYER}
    )
    assert body["status"] == [1] * examples_fixtures.STEPS
    assert body["min"] == body["max"] == body["top_share"] == [None] * examples_fixtures.STEPS
    assert body["at"]["top"] == []


def test_top_positions_at_a_step(env, examples_run, examples_fixtures, plugin_fixtures):
    run = examples_run
    written, tb = env
    body = plugin_fixtures.get_json(
        tb,
        "examples",
        {"run": run, "layer": examples_fixtures.DOMINATED_LAYER, "step": examples_fixtures.DOMINATED_STEP},
    )
    at, norms = body["at"], written.norms[examples_fixtures.DOMINATED_LAYER][examples_fixtures.DOMINATED_STEP]
    assert at["step"] == examples_fixtures.DOMINATED_STEP
    order = np.argsort(-norms, kind="stable")[:5]
    assert [t["position"] for t in at["top"]] == order.tolist()
    np.testing.assert_allclose([t["norm"] for t in at["top"]], norms[order], rtol=1e-12)
    assert at["top"][0]["position"] == examples_fixtures.DOMINATED_POSITION and at["top_share"] > 0.9
    if run == examples_fixtures.RENAMED:  # absent from its fields: NaN, sent as null
        assert at["sum_sq"] is None
    else:
        np.testing.assert_allclose(at["sum_sq"], np.sum(norms**2), rtol=1e-12)
    last = plugin_fixtures.get_json(tb, "examples", {"run": run, "layer": examples_fixtures.DOMINATED_LAYER})["at"]
    assert last["step"] == examples_fixtures.STEPS - 1


def test_range_and_binning(env, examples_fixtures, plugin_fixtures):
    written, tb = env
    norms = written.norms[examples_fixtures.DOMINATED_LAYER]
    body = plugin_fixtures.get_json(
        tb,
        "examples",
        {"run": examples_fixtures.RUN, "layer": examples_fixtures.DOMINATED_LAYER, "start": 5, "end": 30, "points": 6},
    )
    assert body["binned"] is True and body["points"] == 6
    assert sum(body["counts"]) == 26 and body["steps"][0] == 5 and body["last_steps"][-1] == 30
    assert len(body["steps"]) <= 6
    for a, b, lo, hi, share, at in zip(
        body["steps"], body["last_steps"], body["min"], body["max"], body["top_share"], body["top_share_step"]
    ):
        block = norms[a : b + 1]
        shares = (block**2).max(1) / (block**2).sum(1)
        np.testing.assert_allclose([lo, hi, share], [block.min(), block.max(), shares.max()], rtol=1e-12)
        assert at == a + int(np.argmax(shares))
    assert examples_fixtures.DOMINATED_STEP in body["top_share_step"]
    few = plugin_fixtures.get_json(
        tb, "examples", {"run": examples_fixtures.RUN, "layer": "net/in", "start": 5, "end": 8, "points": 100}
    )
    assert few["binned"] is False and few["steps"] == [5, 6, 7, 8]


def test_matrix_by_top_share(env, examples_fixtures, plugin_fixtures):
    written, tb = env
    body = plugin_fixtures.get_json(tb, "matrix", {"run": examples_fixtures.RUN, "stat": "example_norm_top_share"})
    assert body["layers"] == list(examples_fixtures.LAYERS) and body["steps"] == list(range(examples_fixtures.STEPS))
    for layer, values in zip(body["layers"], body["values"]):
        if layer == examples_fixtures.UNSUPPORTED_LAYER:
            assert values == [None] * examples_fixtures.STEPS
        else:
            np.testing.assert_allclose(
                plugin_fixtures.as_float(values), spread(written.norms[layer])["top_share"], rtol=1e-12
            )
    med = plugin_fixtures.get_json(
        tb, "matrix", {"run": examples_fixtures.RENAMED, "stat": "example_norm_median", "max_steps": 4}
    )
    assert med["steps"] == [0, 13, 26, 39]
    np.testing.assert_allclose(
        plugin_fixtures.as_float(med["values"][0]), np.median(written.norms["net/in"], 1)[[0, 13, 26, 39]]
    )
    binned = plugin_fixtures.get_json(
        tb, "matrix", {"run": examples_fixtures.RUN, "stat": "example_norm_top_share", "points": 4}
    )
    assert binned["binned"] is True
    row = binned["layers"].index(examples_fixtures.DOMINATED_LAYER)
    shares = spread(written.norms[examples_fixtures.DOMINATED_LAYER])["top_share"]
    for a, b, hi in zip(binned["steps"], binned["last_steps"], binned["max"][row]):
        np.testing.assert_allclose(hi, shares[a : b + 1].max(), rtol=1e-12)


def test_noise_scale(env, charts_fixtures, examples_fixtures, plugin_fixtures):
    written, tb = env
    body = plugin_fixtures.get_json(tb, "noise_scale", {"run": examples_fixtures.RUN})
    assert body["runs"] == [examples_fixtures.RUN] and body["missing"] == []
    (s,) = body["series"]
    assert s["steps"] == list(range(examples_fixtures.STEPS))
    np.testing.assert_allclose(plugin_fixtures.as_float(s["trace"]), written.trace.astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(plugin_fixtures.as_float(s["signal"]), written.signal.astype(np.float32), rtol=1e-6)
    assert s["coverage"] == [0.75] * examples_fixtures.STEPS
    ratio = plugin_fixtures.as_float(s["noise_scale"])
    assert np.isnan(ratio[examples_fixtures.NO_SIGNAL_STEP])
    ok = np.arange(examples_fixtures.STEPS) != examples_fixtures.NO_SIGNAL_STEP
    np.testing.assert_allclose(ratio[ok], (written.trace / written.signal)[ok], rtol=1e-6)
    both = plugin_fixtures.get_json(
        tb, "noise_scale", [("run", examples_fixtures.RUN), ("run", examples_fixtures.PLAIN)]
    )
    assert both["missing"] == [examples_fixtures.PLAIN] and [x["run"] for x in both["series"]] == [
        examples_fixtures.RUN
    ]
    none = plugin_fixtures.get_json(tb, "noise_scale", {"run": examples_fixtures.PLAIN})
    assert none["series"] == [] and none["missing"] == [examples_fixtures.PLAIN]
    ranged = plugin_fixtures.get_json(tb, "noise_scale", {"run": examples_fixtures.RUN, "start": 10, "end": 12})
    assert ranged["series"][0]["steps"] == [10, 11, 12]
    # B_simple, EMA(trace) / EMA(signal) for the weight asked (TensorBoard's 0.6 by default), numpy's here.
    trace, signal = (x.astype(np.float32).astype(np.float64) for x in (written.trace, written.signal))
    for w, asked in ((0.6, None), (0.95, ".95"), (0.0, "0")):
        got = plugin_fixtures.get_json(
            tb, "noise_scale", {"run": examples_fixtures.RUN, **({"smoothing": asked} if asked else {})}
        )
        assert got["smoothing"] == w
        t, g = charts_fixtures.ema(trace, w), charts_fixtures.ema(signal, w)
        want = np.where(g > 0, t / np.where(g > 0, g, 1), np.nan)
        np.testing.assert_allclose(plugin_fixtures.as_float(got["series"][0]["estimate"]), want, rtol=1e-9)
    for bad in ("1", "0.9999", "-0.5", "1e-3", "nan", " 0.6", "0.1234567", ""):
        plugin_fixtures.get_json(tb, "noise_scale", {"run": examples_fixtures.RUN, "smoothing": bad}, status=400)


def test_runs_without_examples_read_as_before(env, examples_fixtures, plugin_fixtures):
    _, tb = env
    runs = {r["run"]: r for r in plugin_fixtures.get_json(tb, "runs", {})["runs"]}
    kinds = {r: {k for layer in runs[r]["layers"] for d in layer["series"] for k in d["kinds"]} for r in runs}
    assert "examples" in kinds[examples_fixtures.RUN] and kinds[examples_fixtures.PLAIN] == {"stats"}
    assert runs[examples_fixtures.PLAIN]["format_versions"] == runs[examples_fixtures.RUN]["format_versions"] == [2]
    assert kinds[examples_fixtures.PLAIN_V1] == {"stats"} and runs[examples_fixtures.PLAIN_V1]["format_versions"] == [1]
    # The same stats tables in both runs: every stats answer of `ex` is that of `plain` (`anomalies` adds
    # `dominated` for `ex` alone, test_anomalies_say_which_layer_one_example_dominates).
    for route, query in (
        ("matrix", {"stat": "norm"}),
        ("stats", {"layer": "net/mid"}),
        ("matrix", {"stat": "rms", "points": 5}),
        ("anomalies", {}),
    ):
        a = plugin_fixtures.get_json(tb, route, {"run": examples_fixtures.RUN, **query})
        b = plugin_fixtures.get_json(tb, route, {"run": examples_fixtures.PLAIN, **query})
        a.pop("run"), b.pop("run"), a.pop("dominated", None), a.pop("example_thresholds", None)
        if "summary" in a:  # and its finding, the one line that names it
            a["summary"]["findings"] = [f for f in a["summary"]["findings"] if f["kind"] != "dominated"]
            _without_the_dominated_verdict(a, b, examples_fixtures)
        assert a == b, route
    for route, query in (("matrix", {"stat": "norm"}), ("matrix", {"stat": "rms", "points": 5}), ("anomalies", {})):
        a = plugin_fixtures.get_json(tb, route, {"run": examples_fixtures.RUN, **query})
        b = plugin_fixtures.get_json(
            tb, route, {"run": examples_fixtures.PLAIN_V1, **query}
        )  # version 1, the same numbers
        a.pop("run"), b.pop("run"), a.pop("dominated", None), a.pop("example_thresholds", None)
        if "summary" in a:  # and its finding, the one line that names it
            a["summary"]["findings"] = [f for f in a["summary"]["findings"] if f["kind"] != "dominated"]
            _without_the_dominated_verdict(a, b, examples_fixtures)
        assert a == b, route


def _without_the_dominated_verdict(with_examples: dict, plain: dict, examples_fixtures) -> None:
    """The dominated layer's verdict, the one that differs (its episode, carried past it), checked and set aside."""
    for layer, other in zip(with_examples["layers"], plain["layers"]):
        if layer["layer"] == examples_fixtures.DOMINATED_LAYER:
            verdict = layer.pop("verdict")
            assert (verdict["state"], verdict["step"]) == ("dominated", examples_fixtures.DOMINATED_STEP), verdict
            assert verdict["text"].startswith("ok now") and other.pop("verdict")["state"] == "ok"


def test_anomalies_say_which_layer_one_example_dominates(env, examples_run, examples_fixtures, plugin_fixtures):
    """`dominated` (docs/HTTP_API.md): numpy on the made-up norms; absent for the runs without per-example records."""
    run = examples_run
    written, tb = env
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": run})
    norms = written.norms[examples_fixtures.DOMINATED_LAYER]
    share = (norms**2).max(1) / (norms**2).sum(1)
    assert np.flatnonzero(share > 0.5).tolist() == [examples_fixtures.DOMINATED_STEP]
    (d,) = body["dominated"]  # net/in is never dominated, net/out has no numbers (status 1)
    assert (d["layer"], d["steps"], d["first_step"], d["worst_step"], d["worst_position"], d["examples"]) == (
        examples_fixtures.DOMINATED_LAYER,
        1,
        examples_fixtures.DOMINATED_STEP,
        examples_fixtures.DOMINATED_STEP,
        examples_fixtures.DOMINATED_POSITION,
        examples_fixtures.BATCH,
    )
    np.testing.assert_allclose(d["worst_share"], share[examples_fixtures.DOMINATED_STEP], rtol=1e-12)
    assert f"from batch position {examples_fixtures.DOMINATED_POSITION} of {examples_fixtures.BATCH}" in d["line"]
    assert plugin_fixtures.get_json(tb, "anomalies", {"run": run, "layer": "net/in"})["dominated"] == []
    for plain in (examples_fixtures.PLAIN, examples_fixtures.PLAIN_V1):
        b = plugin_fixtures.get_json(tb, "anomalies", {"run": plain})
        assert "dominated" not in b and "example_thresholds" not in b


# `{RUN}`, `{PLAIN}`, `{PLAIN_V1}`: the runs' names, `{AFTER_LAST}` a step after the last (examples_fixtures),
# filled in by the test
@pytest.mark.parametrize(
    "route,query,status",
    [
        ("examples", {"layer": "net/in"}, 400),
        ("examples", {"run": "{RUN}"}, 400),
        ("examples", {"run": "{RUN}", "layer": "net/in", "points": "0"}, 400),
        ("examples", {"run": "{RUN}", "layer": "net/in", "step": "-1"}, 400),
        ("examples", {"run": "{RUN}", "layer": "net/in", "step": "1e3"}, 400),
        ("examples", {"run": "{RUN}", "layer": "net/in", "start": "9", "end": "3"}, 400),
        ("examples", {"run": "{RUN}", "layer": "net/in", "source": "bogus"}, 400),
        ("examples", [("run", "{RUN}"), ("layer", "net/in"), ("step", "1"), ("step", "2")], 400),
        ("examples", {"run": "{RUN}", "layer": "net/in", "step": "{AFTER_LAST}"}, 404),
        ("examples", {"run": "{RUN}", "layer": "no/such"}, 404),
        ("examples", {"run": "nope", "layer": "net/in"}, 404),
        ("examples", {"run": "{PLAIN}", "layer": "net/in"}, 404),
        ("examples", {"run": "{PLAIN_V1}", "layer": "net/in"}, 404),
        ("matrix", {"run": "{PLAIN_V1}", "stat": "example_norm_max"}, 404),
        ("examples", {"run": "{RUN}", "layer": "net/in", "target": "aux"}, 404),
        ("matrix", {"run": "{PLAIN}", "stat": "example_norm_top_share"}, 404),
        ("matrix", {"run": "{RUN}", "stat": "example_norm_top_share", "points": "x"}, 400),
        ("matrix", {"run": "{RUN}", "stat": "example_norm_bogus"}, 400),
        ("matrix", [("run", "{RUN}"), ("stat", "example_norm_max"), ("stat", "norm")], 400),
        ("anomalies", {"run": "{RUN}", "end": "-3"}, 400),
        ("anomalies", [("run", "{RUN}"), ("source", "output"), ("source", "weight")], 400),
        ("noise_scale", {}, 400),
        ("noise_scale", {"run": "{RUN}", "start": "5", "end": "1"}, 400),
        ("noise_scale", {"run": ""}, 400),
    ],
)
def test_bad_queries(env, route, query, status, examples_fixtures):
    _, tb = env
    names = {
        "RUN": examples_fixtures.RUN,
        "PLAIN": examples_fixtures.PLAIN,
        "PLAIN_V1": examples_fixtures.PLAIN_V1,
        "AFTER_LAST": str(examples_fixtures.STEPS + 5),
    }
    pairs = query.items() if isinstance(query, dict) else query
    r = tb.get(route, [(k, v.format(**names)) for k, v in pairs])  # a list of pairs: one key may repeat
    assert r.status_code == status, r.data[:300]
    body = r.get_json()
    assert body["error"] and "Traceback" not in r.get_data(as_text=True)
