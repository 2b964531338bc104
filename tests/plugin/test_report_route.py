"""The plugin's `anomalies` route, checked against an independent numpy evaluation of what was written.

The planted logdir (tests/report_fixtures.py) is written with the real summary ops; the expected
answer is recomputed from the written float32 arrays with numpy and the cell-by-cell reference
rules, never through tb_layergrad's reader or its anomalies module. The sampling tests make
TensorBoard keep 5 records per series and check that the first NaN step survives.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

EXACT_KEYS = ("layer", "flags", "recorded", "last_step", "first_nonfinite", "counts", "now")
ELEMENTS = 5 * 7  # report_fixtures.planted_array


@pytest.fixture(scope="module")
def rel(tolerances) -> dict:
    """Each float key's rtol. The route reads the norms the summary op wrote; the reference recomputes them from the
    written float32 arrays in float64. The written norm may come from TensorFlow's path (where the fused kernel is
    not built): squares and a sum of ELEMENTS terms in float32 (any order: gamma(n)), a sqrt halving that and
    rounding once more; the float64 side (numpy, the route's division by sqrt(n)) rounds a few times more."""
    gamma, two_sides = tolerances.gamma, tolerances.TWO_SIDES
    norm_rel = gamma(ELEMENTS, np.float32) / 2 + gamma(1, np.float32) + two_sides * gamma(ELEMENTS + 3, np.float64)
    return {"last_norm": norm_rel, "last_rms": norm_rel, "last_zero_frac": two_sides * gamma(1, np.float64)}


@pytest.fixture(scope="module")
def output_layers(report_fixtures) -> list:
    """The output layers in model order: the dict order they were written in, then the low-level op's layer
    (index 5)."""
    return [*report_fixtures.LAYERS, report_fixtures.SPARSE]


@pytest.fixture(scope="module")
def tb(planted, report_fixtures):
    return report_fixtures.in_process(planted.logdir)


def assert_layer_matches(got: dict, want: dict, rel: dict, tolerances) -> None:
    for key in EXACT_KEYS:
        assert got[key] == want[key], (want["layer"], key, got[key], want[key])
    for key, rtol in rel.items():
        assert got[key] == tolerances.approx_or_none(want[key], rel=rtol), (want["layer"], key, got[key], want[key])
    for key in ("trend", "timestep_decay"):  # report_fixtures.reference_*_atol, from norms within rel
        if key in want:
            assert got[key] == tolerances.approx_or_none(want[key], rel=0, abs=want["atol"][key]), (
                want["layer"],
                key,
                got[key],
                want[key],
            )
    assert ("timestep_decay" in got) == ("timestep_decay" in want)


def test_route_equals_independent_numpy_evaluation(
    tb, planted, plugin_fixtures, report_fixtures, output_layers, rel, tolerances
):
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": report_fixtures.RUN})
    assert body["api_version"] == 1 and (body["run"], body["target"], body["source"]) == (
        report_fixtures.RUN,
        "loss",
        "output",
    )
    assert body["steps"] == report_fixtures.STEPS
    assert [l["layer"] for l in body["layers"]] == output_layers
    m = planted.matrices(output_layers, report_fixtures.STEPS)
    want = report_fixtures.reference_summaries(
        output_layers,
        report_fixtures.STEPS,
        m,
        timesteps={report_fixtures.RNN_LAYER: [planted.timesteps[s] for s in report_fixtures.STEPS]},
        norm_rel=rel["last_norm"],
    )
    for got, w in zip(body["layers"], want):
        assert_layer_matches(got, w, rel, tolerances)
    expected_max = np.nanmax(np.where(m["rms"] > 0, m["rms"], np.nan), axis=0)
    np.testing.assert_allclose(body["max_rms"], expected_max, rtol=rel["last_rms"])  # a max of rms: as each rms
    by = {l["layer"]: l for l in body["layers"]}
    # Each planted behaviour on its layer (not just "equal to the reference"):
    assert by["net/embed"]["now"] == ["vanishing"] and by["net/embed"]["counts"]["vanishing"] == 30
    assert by["net/dead"]["now"] == ["dead"] and by["net/dead"]["last_norm"] == 0.0
    assert by["net/grow"]["now"] == ["exploding"] and 0 < by["net/grow"]["counts"]["exploding"] < 30
    assert by["net/grow"]["trend"] > 1  # grew 1.5x per step over the first 10 steps of the trend window
    assert (
        by[report_fixtures.NAN_LAYER]["first_nonfinite"] == report_fixtures.NAN_STEPS[0]
        and by[report_fixtures.NAN_LAYER]["counts"]["nonfinite"] == 3
    )
    assert by[report_fixtures.RNN_LAYER]["timestep_decay"] == pytest.approx(
        -(report_fixtures.TIMESTEPS - 1), abs=report_fixtures.DECAY_SPREAD
    )  # the planted noise
    assert [c == "." for c in by[report_fixtures.SPARSE]["flags"]] == [
        s not in report_fixtures.SPARSE_STEPS for s in report_fixtures.STEPS
    ]
    assert by["net/head"]["counts"] == {"nonfinite": 0, "vanishing": 0, "exploding": 0, "dead": 0}
    # No target series in the planted files: where it broke is "unknown"; the weight gradient (planted from
    # net/head's array, finite) is not non-finite, so the layers are the output gradient's alone.
    unknown_line = f"first non-finite gradient at step {report_fixtures.NAN_STEPS[0]}: {report_fixtures.NAN_LAYER} (the loss was not recorded: pass unknown)"
    findings = body["summary"].pop(
        "findings"
    )  # one line per finding (tests/reader/test_verdict_rules.py says what they hold)
    assert [(f["kind"], f["layers"]) for f in findings] == [
        ("nonfinite", [report_fixtures.NAN_LAYER]),
        ("exploding", ["net/grow"]),
        ("dead", ["net/dead"]),
        ("vanishing", ["net/embed"]),
        ("vanishing_through_time", [report_fixtures.RNN_LAYER]),
    ]  # RNN_LAYER is NAN_LAYER: its NaN is its verdict, and its decay through time a finding it carries too
    assert body["summary"] == {
        "layers": 6,
        "steps": 30,
        "first_step": 0,
        "last_step": 29,
        "first_nonfinite": {
            "step": report_fixtures.NAN_STEPS[0],
            "layers": [report_fixtures.NAN_LAYER],
            "pass": "unknown",
            "origin": None,
            "line": unknown_line,
        },
        "origin": {
            "step": report_fixtures.NAN_STEPS[0],
            "pass": "unknown",
            "origin": None,
            "target": "loss",
            "layers": [report_fixtures.NAN_LAYER],
            "line": unknown_line,
        },
        "latest": {
            "nonfinite": 0,
            "vanishing": 1,
            "exploding": 1,
            "dead": 1,
            "vanishing_over_steps": 0,
            "vanishing_through_time": 1,  # RNN_LAYER's, carried beside its NaN (counted with its verdict's `also`)
        },
    }
    assert body["thresholds"] == {
        "VANISH_REL": 1e-3,
        "EXPLODE_ABS": 1e3,
        "EXPLODE_GROWTH": 1e2,
        "BASELINE_STEPS": 5,
        "DEAD_ZERO_FRAC": 0.99,
        "TIME_DECAY_DECADES": 3.0,
        "STEP_DECAY_DECADES": 2.0,
        "TARGET_FALL": 0.5,
        "EDGE_STEPS": 5,
    }


def test_route_flags_agree_with_the_matrix_route(tb, plugin_fixtures, report_fixtures):
    """Same rows and columns as `matrix`, and the non-finite flags are exactly its nonfinite > 0 cells."""
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": report_fixtures.RUN})
    mat = plugin_fixtures.get_json(tb, "matrix", {"run": report_fixtures.RUN, "stat": "nonfinite"})
    assert mat["layers"] == [l["layer"] for l in body["layers"]] and mat["steps"] == body["steps"]
    for row, entry in zip(mat["values"], body["layers"]):
        assert [v is not None and v > 0 for v in row] == [c != "." and int(c, 16) & 1 == 1 for c in entry["flags"]]


def test_step_range_is_evaluated_on_its_own(
    tb, planted, plugin_fixtures, report_fixtures, output_layers, rel, tolerances
):
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": report_fixtures.RUN, "start": "10", "end": "25"})
    steps = list(range(10, 26))
    assert body["steps"] == steps
    want = report_fixtures.reference_summaries(
        output_layers,
        steps,
        planted.matrices(output_layers, steps),
        timesteps={report_fixtures.RNN_LAYER: [planted.timesteps[s] for s in steps]},
        norm_rel=rel["last_norm"],
    )
    for got, w in zip(body["layers"], want):
        assert_layer_matches(got, w, rel, tolerances)


def test_weight_source_and_one_layer(tb, planted, plugin_fixtures, report_fixtures):
    body = plugin_fixtures.get_json(tb, "anomalies", {"run": report_fixtures.RUN, "source": "weight"})
    assert [l["layer"] for l in body["layers"]] == ["net/dense/kernel"]
    assert body["layers"][0]["flags"] == "0" * 30  # one layer: never vanishing; steady: never exploding
    one = plugin_fixtures.get_json(tb, "anomalies", {"run": report_fixtures.RUN, "layer": "net/grow"})
    full = plugin_fixtures.get_json(tb, "anomalies", {"run": report_fixtures.RUN})
    assert one["layers"] == [l for l in full["layers"] if l["layer"] == "net/grow"]
    assert one["summary"] == full["summary"]  # the rules still saw every layer


# `{RUN}`: report_fixtures.RUN, filled in by the test
@pytest.mark.parametrize(
    "query,status",
    [
        ({}, 400),
        ({"run": "nope"}, 404),
        ({"run": "{RUN}", "target": "nope"}, 404),
        ({"run": "{RUN}", "layer": "nope"}, 404),
        ({"run": "{RUN}", "layer": "net/dense/kernel"}, 404),  # a weight: no output stats
        ({"run": "{RUN}", "source": "bias"}, 400),
        ({"run": "{RUN}", "start": "9", "end": "3"}, 400),
        ({"run": "{RUN}", "start": "-1"}, 400),
    ],
)
def test_errors(tb, query, status, plugin_fixtures, report_fixtures):
    query = {k: v.format(RUN=report_fixtures.RUN) for k, v in query.items()}
    body = plugin_fixtures.get_json(tb, "anomalies", query, status)
    assert body["code"] == status and isinstance(body["error"], str)


def test_first_nan_step_survives_tensorboards_sampling(sampled_logdir, plugin_fixtures, report_fixtures):
    """TensorBoard keeps 5 of 60 records: the NaN step's stats are dropped, its step is not."""
    tb = report_fixtures.in_process(sampled_logdir, keep=5)
    for run in ("tracked", "plain"):
        kept = plugin_fixtures.get_json(tb, "matrix", {"run": run, "stat": "nonfinite"})
        # the NaN's stats are gone
        assert len(kept["steps"]) <= 10 and report_fixtures.SAMPLED_NAN_STEP not in kept["steps"]
    tracked = plugin_fixtures.get_json(tb, "anomalies", {"run": "tracked"})
    a = tracked["layers"][0]
    assert a["layer"] == "m/a" and a["first_nonfinite"] == report_fixtures.SAMPLED_NAN_STEP
    unknown = {
        "pass": "unknown",
        "origin": None,  # no target series in these files: where it broke is unknown
        "line": f"first non-finite gradient at step {report_fixtures.SAMPLED_NAN_STEP}: m/a (the loss was not recorded: pass unknown)",
    }
    assert tracked["summary"]["first_nonfinite"] == {
        "step": report_fixtures.SAMPLED_NAN_STEP,
        "layers": ["m/a"],
        **unknown,
    }
    assert tracked["summary"]["origin"] == {
        "step": report_fixtures.SAMPLED_NAN_STEP,
        "layers": ["m/a"],
        "target": "loss",
        **unknown,
    }
    assert tracked["layers"][1]["first_nonfinite"] is None
    # Written with the low-level op (no first_nonfinite records), the sampled run has lost it.
    assert plugin_fixtures.get_json(tb, "anomalies", {"run": "plain"})["summary"]["first_nonfinite"] is None
    assert plugin_fixtures.get_json(tb, "anomalies", {"run": "plain"})["summary"]["origin"] is None
    # Every step kept: the same answer from the stats themselves.
    full = plugin_fixtures.get_json(report_fixtures.in_process(sampled_logdir), "anomalies", {"run": "plain"})
    assert full["summary"]["first_nonfinite"] == {
        "step": report_fixtures.SAMPLED_NAN_STEP,
        "layers": ["m/a"],
        **unknown,
    }


@pytest.mark.slow
def test_sampling_in_real_tensorboards_both_loaders(
    sampled_logdir, tmp_path, plugin_fixtures, report_fixtures, tensorboard_process
):
    """The int64 first_nonfinite records through the Rust data server and the Python loader."""
    configs = [("true", ["--samples_per_plugin", "layergrad=5"]), ("false", ["--samples_per_plugin", "layergrad=5"])]
    with tensorboard_process.tensorboards(sampled_logdir, configs, str(tmp_path)) as procs:
        for p in procs:

            def ready(p):
                status, body, _ = p.get("/data/plugin/layergrad/runs")
                runs = json.loads(body)["runs"] if status == 200 else []
                return len(runs) == 2 and all(r["max_step"] == report_fixtures.SAMPLED_STEPS - 1 for r in runs)

            p.wait_until(ready, "both runs", timeout=120)
        for p in procs:
            status, body, _ = p.get("/data/plugin/layergrad/anomalies?run=tracked")
            assert status == 200, body[:300]
            answer = plugin_fixtures.strict_json(body)
            assert answer["layers"][0]["first_nonfinite"] == report_fixtures.SAMPLED_NAN_STEP, p.base
            assert len(answer["steps"]) < report_fixtures.SAMPLED_STEPS  # it did sample
