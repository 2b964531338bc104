"""The `examples`, `noise_scale` routes and `matrix?stat=example_norm_*` (docs/HTTP_API.md), through their HTTP
handlers, against numpy applied to the per-example norms the fixture made up (tests/examples_fixtures.py)."""

from __future__ import annotations

import charts_fixtures as cf
import examples_fixtures as ef
import numpy as np
import pytest
from plugin_fixtures import InProcess, as_float, get_json

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    written = ef.write_examples_logdir(str(tmp_path_factory.mktemp("examples")))
    return written, InProcess(written.logdir)


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


@pytest.mark.parametrize("run", [ef.RUN, ef.RENAMED])
def test_spread_per_step(env, run):
    written, tb = env
    for layer in ("net/in", ef.DOMINATED_LAYER):
        body = get_json(tb, "examples", {"run": run, "layer": layer})
        assert body["steps"] == list(range(ef.STEPS))
        want = spread(written.norms[layer])
        for name, values in want.items():
            np.testing.assert_allclose(as_float(body[name]), values, rtol=1e-12, err_msg=f"{run} {layer} {name}")
        assert body["status"] == [0] * ef.STEPS
        assert "binned" not in body and body["top_k"] == 5


def test_unsupported_layer_has_no_numbers(env):
    _, tb = env
    body = get_json(tb, "examples", {"run": ef.RUN, "layer": ef.UNSUPPORTED_LAYER})
    assert body["status"] == [1] * ef.STEPS
    assert body["min"] == body["max"] == body["top_share"] == [None] * ef.STEPS
    assert body["at"]["top"] == []


@pytest.mark.parametrize("run", [ef.RUN, ef.RENAMED])
def test_top_positions_at_a_step(env, run):
    written, tb = env
    body = get_json(tb, "examples", {"run": run, "layer": ef.DOMINATED_LAYER, "step": ef.DOMINATED_STEP})
    at, norms = body["at"], written.norms[ef.DOMINATED_LAYER][ef.DOMINATED_STEP]
    assert at["step"] == ef.DOMINATED_STEP
    order = np.argsort(-norms, kind="stable")[:5]
    assert [t["position"] for t in at["top"]] == order.tolist()
    np.testing.assert_allclose([t["norm"] for t in at["top"]], norms[order], rtol=1e-12)
    assert at["top"][0]["position"] == ef.DOMINATED_POSITION and at["top_share"] > 0.9
    if run == ef.RENAMED:  # absent from its fields: NaN, sent as null
        assert at["sum_sq"] is None
    else:
        np.testing.assert_allclose(at["sum_sq"], np.sum(norms**2), rtol=1e-12)
    last = get_json(tb, "examples", {"run": run, "layer": ef.DOMINATED_LAYER})["at"]
    assert last["step"] == ef.STEPS - 1


def test_range_and_binning(env):
    written, tb = env
    norms = written.norms[ef.DOMINATED_LAYER]
    body = get_json(tb, "examples", {"run": ef.RUN, "layer": ef.DOMINATED_LAYER, "start": 5, "end": 30, "points": 6})
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
    assert ef.DOMINATED_STEP in body["top_share_step"]
    few = get_json(tb, "examples", {"run": ef.RUN, "layer": "net/in", "start": 5, "end": 8, "points": 100})
    assert few["binned"] is False and few["steps"] == [5, 6, 7, 8]


def test_matrix_by_top_share(env):
    written, tb = env
    body = get_json(tb, "matrix", {"run": ef.RUN, "stat": "example_norm_top_share"})
    assert body["layers"] == list(ef.LAYERS) and body["steps"] == list(range(ef.STEPS))
    for layer, values in zip(body["layers"], body["values"]):
        if layer == ef.UNSUPPORTED_LAYER:
            assert values == [None] * ef.STEPS
        else:
            np.testing.assert_allclose(as_float(values), spread(written.norms[layer])["top_share"], rtol=1e-12)
    med = get_json(tb, "matrix", {"run": ef.RENAMED, "stat": "example_norm_median", "max_steps": 4})
    assert med["steps"] == [0, 13, 26, 39]
    np.testing.assert_allclose(as_float(med["values"][0]), np.median(written.norms["net/in"], 1)[[0, 13, 26, 39]])
    binned = get_json(tb, "matrix", {"run": ef.RUN, "stat": "example_norm_top_share", "points": 4})
    assert binned["binned"] is True
    row = binned["layers"].index(ef.DOMINATED_LAYER)
    shares = spread(written.norms[ef.DOMINATED_LAYER])["top_share"]
    for a, b, hi in zip(binned["steps"], binned["last_steps"], binned["max"][row]):
        np.testing.assert_allclose(hi, shares[a : b + 1].max(), rtol=1e-12)


def test_noise_scale(env):
    written, tb = env
    body = get_json(tb, "noise_scale", {"run": ef.RUN})
    assert body["runs"] == [ef.RUN] and body["missing"] == []
    (s,) = body["series"]
    assert s["steps"] == list(range(ef.STEPS))
    np.testing.assert_allclose(as_float(s["trace"]), written.trace.astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(as_float(s["signal"]), written.signal.astype(np.float32), rtol=1e-6)
    assert s["coverage"] == [0.75] * ef.STEPS
    ratio = as_float(s["noise_scale"])
    assert np.isnan(ratio[ef.NO_SIGNAL_STEP])
    ok = np.arange(ef.STEPS) != ef.NO_SIGNAL_STEP
    np.testing.assert_allclose(ratio[ok], (written.trace / written.signal)[ok], rtol=1e-6)
    both = get_json(tb, "noise_scale", [("run", ef.RUN), ("run", ef.PLAIN)])
    assert both["missing"] == [ef.PLAIN] and [x["run"] for x in both["series"]] == [ef.RUN]
    none = get_json(tb, "noise_scale", {"run": ef.PLAIN})
    assert none["series"] == [] and none["missing"] == [ef.PLAIN]
    ranged = get_json(tb, "noise_scale", {"run": ef.RUN, "start": 10, "end": 12})
    assert ranged["series"][0]["steps"] == [10, 11, 12]
    # B_simple, EMA(trace) / EMA(signal) for the weight asked (TensorBoard's 0.6 by default), numpy's here.
    trace, signal = (x.astype(np.float32).astype(np.float64) for x in (written.trace, written.signal))
    for w, asked in ((0.6, None), (0.95, ".95"), (0.0, "0")):
        got = get_json(tb, "noise_scale", {"run": ef.RUN, **({"smoothing": asked} if asked else {})})
        assert got["smoothing"] == w
        t, g = cf.ema(trace, w), cf.ema(signal, w)
        want = np.where(g > 0, t / np.where(g > 0, g, 1), np.nan)
        np.testing.assert_allclose(as_float(got["series"][0]["estimate"]), want, rtol=1e-9)
    for bad in ("1", "0.9999", "-0.5", "1e-3", "nan", " 0.6", "0.1234567", ""):
        get_json(tb, "noise_scale", {"run": ef.RUN, "smoothing": bad}, status=400)


def test_runs_without_examples_read_as_before(env):
    _, tb = env
    runs = {r["run"]: r for r in get_json(tb, "runs", {})["runs"]}
    kinds = {r: {k for layer in runs[r]["layers"] for d in layer["series"] for k in d["kinds"]} for r in runs}
    assert "examples" in kinds[ef.RUN] and kinds[ef.PLAIN] == {"stats"}
    assert runs[ef.PLAIN]["format_versions"] == runs[ef.RUN]["format_versions"] == [2]
    assert kinds[ef.PLAIN_V1] == {"stats"} and runs[ef.PLAIN_V1]["format_versions"] == [1]
    # The same stats tables in both runs: every stats answer of `ex` is that of `plain` (`anomalies` adds
    # `dominated` for `ex` alone, test_anomalies_say_which_layer_one_example_dominates).
    for route, query in (
        ("matrix", {"stat": "norm"}),
        ("stats", {"layer": "net/mid"}),
        ("matrix", {"stat": "rms", "points": 5}),
        ("anomalies", {}),
    ):
        a = get_json(tb, route, {"run": ef.RUN, **query})
        b = get_json(tb, route, {"run": ef.PLAIN, **query})
        a.pop("run"), b.pop("run"), a.pop("dominated", None), a.pop("example_thresholds", None)
        if "summary" in a:  # and its finding, the one line that names it
            a["summary"]["findings"] = [f for f in a["summary"]["findings"] if f["kind"] != "dominated"]
            _without_the_dominated_verdict(a, b)
        assert a == b, route
    for route, query in (("matrix", {"stat": "norm"}), ("matrix", {"stat": "rms", "points": 5}), ("anomalies", {})):
        a = get_json(tb, route, {"run": ef.RUN, **query})
        b = get_json(tb, route, {"run": ef.PLAIN_V1, **query})  # version 1, the same numbers
        a.pop("run"), b.pop("run"), a.pop("dominated", None), a.pop("example_thresholds", None)
        if "summary" in a:  # and its finding, the one line that names it
            a["summary"]["findings"] = [f for f in a["summary"]["findings"] if f["kind"] != "dominated"]
            _without_the_dominated_verdict(a, b)
        assert a == b, route


def _without_the_dominated_verdict(with_examples: dict, plain: dict) -> None:
    """The dominated layer's verdict, the one that differs (its episode, carried past it), checked and set aside."""
    for layer, other in zip(with_examples["layers"], plain["layers"]):
        if layer["layer"] == ef.DOMINATED_LAYER:
            verdict = layer.pop("verdict")
            assert (verdict["state"], verdict["step"]) == ("dominated", ef.DOMINATED_STEP), verdict
            assert verdict["text"].startswith("ok now") and other.pop("verdict")["state"] == "ok"


@pytest.mark.parametrize("run", [ef.RUN, ef.RENAMED])
def test_anomalies_say_which_layer_one_example_dominates(env, run):
    """`dominated` (docs/HTTP_API.md): numpy on the made-up norms; absent for the runs without per-example records."""
    written, tb = env
    body = get_json(tb, "anomalies", {"run": run})
    norms = written.norms[ef.DOMINATED_LAYER]
    share = (norms**2).max(1) / (norms**2).sum(1)
    assert np.flatnonzero(share > 0.5).tolist() == [ef.DOMINATED_STEP]
    (d,) = body["dominated"]  # net/in is never dominated, net/out has no numbers (status 1)
    assert (d["layer"], d["steps"], d["first_step"], d["worst_step"], d["worst_position"], d["examples"]) == (
        ef.DOMINATED_LAYER,
        1,
        ef.DOMINATED_STEP,
        ef.DOMINATED_STEP,
        ef.DOMINATED_POSITION,
        ef.BATCH,
    )
    np.testing.assert_allclose(d["worst_share"], share[ef.DOMINATED_STEP], rtol=1e-12)
    assert f"from batch position {ef.DOMINATED_POSITION} of {ef.BATCH}" in d["line"]
    assert get_json(tb, "anomalies", {"run": run, "layer": "net/in"})["dominated"] == []
    for plain in (ef.PLAIN, ef.PLAIN_V1):
        b = get_json(tb, "anomalies", {"run": plain})
        assert "dominated" not in b and "example_thresholds" not in b


@pytest.mark.parametrize(
    "route,query,status",
    [
        ("examples", {"layer": "net/in"}, 400),
        ("examples", {"run": ef.RUN}, 400),
        ("examples", {"run": ef.RUN, "layer": "net/in", "points": "0"}, 400),
        ("examples", {"run": ef.RUN, "layer": "net/in", "step": "-1"}, 400),
        ("examples", {"run": ef.RUN, "layer": "net/in", "step": "1e3"}, 400),
        ("examples", {"run": ef.RUN, "layer": "net/in", "start": "9", "end": "3"}, 400),
        ("examples", {"run": ef.RUN, "layer": "net/in", "source": "bogus"}, 400),
        ("examples", [("run", ef.RUN), ("layer", "net/in"), ("step", "1"), ("step", "2")], 400),
        ("examples", {"run": ef.RUN, "layer": "net/in", "step": str(ef.STEPS + 5)}, 404),
        ("examples", {"run": ef.RUN, "layer": "no/such"}, 404),
        ("examples", {"run": "nope", "layer": "net/in"}, 404),
        ("examples", {"run": ef.PLAIN, "layer": "net/in"}, 404),
        ("examples", {"run": ef.PLAIN_V1, "layer": "net/in"}, 404),
        ("matrix", {"run": ef.PLAIN_V1, "stat": "example_norm_max"}, 404),
        ("examples", {"run": ef.RUN, "layer": "net/in", "target": "aux"}, 404),
        ("matrix", {"run": ef.PLAIN, "stat": "example_norm_top_share"}, 404),
        ("matrix", {"run": ef.RUN, "stat": "example_norm_top_share", "points": "x"}, 400),
        ("matrix", {"run": ef.RUN, "stat": "example_norm_bogus"}, 400),
        ("matrix", [("run", ef.RUN), ("stat", "example_norm_max"), ("stat", "norm")], 400),
        ("anomalies", {"run": ef.RUN, "end": "-3"}, 400),
        ("anomalies", [("run", ef.RUN), ("source", "output"), ("source", "weight")], 400),
        ("noise_scale", {}, 400),
        ("noise_scale", {"run": ef.RUN, "start": "5", "end": "1"}, 400),
        ("noise_scale", {"run": ""}, 400),
    ],
)
def test_bad_queries(env, route, query, status):
    _, tb = env
    r = tb.get(route, query)
    assert r.status_code == status, r.data[:300]
    body = r.get_json()
    assert body["error"] and "Traceback" not in r.get_data(as_text=True)
