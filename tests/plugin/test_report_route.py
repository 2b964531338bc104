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
import report_fixtures as rf
from plugin_fixtures import get_json, strict_json
from report_fixtures import in_process, reference_summaries
from tensorboard_process import tensorboards
from tolerances import TWO_SIDES, approx_or_none, gamma

# The route reads the norms the summary op wrote; the reference recomputes them from the written float32
# arrays in float64. The written norm may come from TensorFlow's path (where the fused kernel is not
# built): squares and a sum of ELEMENTS terms in float32 (any order: gamma(n)), a sqrt halving that and
# rounding once more; the float64 side (numpy, the route's division by sqrt(n)) rounds a few times more.
ELEMENTS = 5 * 7  # report_fixtures.planted_array
NORM_REL = gamma(ELEMENTS, np.float32) / 2 + gamma(1, np.float32) + TWO_SIDES * gamma(ELEMENTS + 3, np.float64)
REL = {"last_norm": NORM_REL, "last_rms": NORM_REL, "last_zero_frac": TWO_SIDES * gamma(1, np.float64)}
EXACT_KEYS = ("layer", "flags", "recorded", "last_step", "first_nonfinite", "counts", "now")
OUTPUT_LAYERS = rf.LAYERS[:]  # model order: the dict order they were written in...
OUTPUT_LAYERS.append(rf.SPARSE)  # ...then the low-level op's layer (index 5)


@pytest.fixture(scope="module")
def tb(planted):
    return in_process(planted.logdir)


get = get_json


def assert_layer_matches(got: dict, want: dict):
    for key in EXACT_KEYS:
        assert got[key] == want[key], (want["layer"], key, got[key], want[key])
    for key, rel in REL.items():
        assert got[key] == approx_or_none(want[key], rel=rel), (want["layer"], key, got[key], want[key])
    for key in ("trend", "timestep_decay"):  # report_fixtures.reference_*_atol, from norms within NORM_REL
        if key in want:
            assert got[key] == approx_or_none(want[key], rel=0, abs=want["atol"][key]), (
                want["layer"],
                key,
                got[key],
                want[key],
            )
    assert ("timestep_decay" in got) == ("timestep_decay" in want)


def test_route_equals_independent_numpy_evaluation(tb, planted):
    body = get(tb, "anomalies", {"run": rf.RUN})
    assert body["api_version"] == 1 and (body["run"], body["target"], body["source"]) == (rf.RUN, "loss", "output")
    assert body["steps"] == rf.STEPS
    assert [l["layer"] for l in body["layers"]] == OUTPUT_LAYERS
    m = planted.matrices(OUTPUT_LAYERS, rf.STEPS)
    want = reference_summaries(
        OUTPUT_LAYERS,
        rf.STEPS,
        m,
        timesteps={rf.RNN_LAYER: [planted.timesteps[s] for s in rf.STEPS]},
        norm_rel=NORM_REL,
    )
    for got, w in zip(body["layers"], want):
        assert_layer_matches(got, w)
    expected_max = np.nanmax(np.where(m["rms"] > 0, m["rms"], np.nan), axis=0)
    np.testing.assert_allclose(body["max_rms"], expected_max, rtol=REL["last_rms"])  # a max of rms: as each rms
    by = {l["layer"]: l for l in body["layers"]}
    # Each planted behaviour on its layer (not just "equal to the reference"):
    assert by["net/embed"]["now"] == ["vanishing"] and by["net/embed"]["counts"]["vanishing"] == 30
    assert by["net/dead"]["now"] == ["dead"] and by["net/dead"]["last_norm"] == 0.0
    assert by["net/grow"]["now"] == ["exploding"] and 0 < by["net/grow"]["counts"]["exploding"] < 30
    assert by["net/grow"]["trend"] > 1  # grew 1.5x per step over the first 10 steps of the trend window
    assert by[rf.NAN_LAYER]["first_nonfinite"] == rf.NAN_STEPS[0] and by[rf.NAN_LAYER]["counts"]["nonfinite"] == 3
    assert by[rf.RNN_LAYER]["timestep_decay"] == pytest.approx(
        -(rf.TIMESTEPS - 1), abs=rf.DECAY_SPREAD
    )  # the planted noise
    assert [c == "." for c in by[rf.SPARSE]["flags"]] == [s not in rf.SPARSE_STEPS for s in rf.STEPS]
    assert by["net/head"]["counts"] == {"nonfinite": 0, "vanishing": 0, "exploding": 0, "dead": 0}
    # No target series in the planted files: where it broke is "unknown"; the weight gradient (planted from
    # net/head's array, finite) is not non-finite, so the layers are the output gradient's alone.
    unknown_line = (
        f"first non-finite gradient at step {rf.NAN_STEPS[0]}: {rf.NAN_LAYER} (the loss was not recorded: pass unknown)"
    )
    findings = body["summary"].pop(
        "findings"
    )  # one line per finding (tests/reader/test_verdict_rules.py says what they hold)
    assert [(f["kind"], f["layers"]) for f in findings] == [
        ("nonfinite", [rf.NAN_LAYER]),
        ("exploding", ["net/grow"]),
        ("dead", ["net/dead"]),
        ("vanishing", ["net/embed"]),
        ("vanishing_through_time", [rf.RNN_LAYER]),
    ]  # RNN_LAYER is NAN_LAYER: its NaN is its verdict, and its decay through time a finding it carries too
    assert body["summary"] == {
        "layers": 6,
        "steps": 30,
        "first_step": 0,
        "last_step": 29,
        "first_nonfinite": {
            "step": rf.NAN_STEPS[0],
            "layers": [rf.NAN_LAYER],
            "pass": "unknown",
            "origin": None,
            "line": unknown_line,
        },
        "origin": {
            "step": rf.NAN_STEPS[0],
            "pass": "unknown",
            "origin": None,
            "target": "loss",
            "layers": [rf.NAN_LAYER],
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


def test_route_flags_agree_with_the_matrix_route(tb):
    """Same rows and columns as `matrix`, and the non-finite flags are exactly its nonfinite > 0 cells."""
    body = get(tb, "anomalies", {"run": rf.RUN})
    mat = get(tb, "matrix", {"run": rf.RUN, "stat": "nonfinite"})
    assert mat["layers"] == [l["layer"] for l in body["layers"]] and mat["steps"] == body["steps"]
    for row, entry in zip(mat["values"], body["layers"]):
        assert [v is not None and v > 0 for v in row] == [c != "." and int(c, 16) & 1 == 1 for c in entry["flags"]]


def test_step_range_is_evaluated_on_its_own(tb, planted):
    body = get(tb, "anomalies", {"run": rf.RUN, "start": "10", "end": "25"})
    steps = list(range(10, 26))
    assert body["steps"] == steps
    want = reference_summaries(
        OUTPUT_LAYERS,
        steps,
        planted.matrices(OUTPUT_LAYERS, steps),
        timesteps={rf.RNN_LAYER: [planted.timesteps[s] for s in steps]},
        norm_rel=NORM_REL,
    )
    for got, w in zip(body["layers"], want):
        assert_layer_matches(got, w)


def test_weight_source_and_one_layer(tb, planted):
    body = get(tb, "anomalies", {"run": rf.RUN, "source": "weight"})
    assert [l["layer"] for l in body["layers"]] == ["net/dense/kernel"]
    assert body["layers"][0]["flags"] == "0" * 30  # one layer: never vanishing; steady: never exploding
    one = get(tb, "anomalies", {"run": rf.RUN, "layer": "net/grow"})
    full = get(tb, "anomalies", {"run": rf.RUN})
    assert one["layers"] == [l for l in full["layers"] if l["layer"] == "net/grow"]
    assert one["summary"] == full["summary"]  # the rules still saw every layer


@pytest.mark.parametrize(
    "query,status",
    [
        ({}, 400),
        ({"run": "nope"}, 404),
        ({"run": rf.RUN, "target": "nope"}, 404),
        ({"run": rf.RUN, "layer": "nope"}, 404),
        ({"run": rf.RUN, "layer": "net/dense/kernel"}, 404),  # a weight: no output stats
        ({"run": rf.RUN, "source": "bias"}, 400),
        ({"run": rf.RUN, "start": "9", "end": "3"}, 400),
        ({"run": rf.RUN, "start": "-1"}, 400),
    ],
)
def test_errors(tb, query, status):
    body = get(tb, "anomalies", query, status)
    assert body["code"] == status and isinstance(body["error"], str)


def test_first_nan_step_survives_tensorboards_sampling(sampled_logdir):
    """TensorBoard keeps 5 of 60 records: the NaN step's stats are dropped, its step is not."""
    tb = in_process(sampled_logdir, keep=5)
    for run in ("tracked", "plain"):
        kept = get(tb, "matrix", {"run": run, "stat": "nonfinite"})
        assert len(kept["steps"]) <= 10 and rf.SAMPLED_NAN_STEP not in kept["steps"]  # the NaN's stats are gone
    tracked = get(tb, "anomalies", {"run": "tracked"})
    a = tracked["layers"][0]
    assert a["layer"] == "m/a" and a["first_nonfinite"] == rf.SAMPLED_NAN_STEP
    unknown = {
        "pass": "unknown",
        "origin": None,  # no target series in these files: where it broke is unknown
        "line": f"first non-finite gradient at step {rf.SAMPLED_NAN_STEP}: m/a (the loss was not recorded: pass unknown)",
    }
    assert tracked["summary"]["first_nonfinite"] == {"step": rf.SAMPLED_NAN_STEP, "layers": ["m/a"], **unknown}
    assert tracked["summary"]["origin"] == {"step": rf.SAMPLED_NAN_STEP, "layers": ["m/a"], "target": "loss", **unknown}
    assert tracked["layers"][1]["first_nonfinite"] is None
    # Written with the low-level op (no first_nonfinite records), the sampled run has lost it.
    assert get(tb, "anomalies", {"run": "plain"})["summary"]["first_nonfinite"] is None
    assert get(tb, "anomalies", {"run": "plain"})["summary"]["origin"] is None
    # Every step kept: the same answer from the stats themselves.
    full = get(in_process(sampled_logdir), "anomalies", {"run": "plain"})
    assert full["summary"]["first_nonfinite"] == {"step": rf.SAMPLED_NAN_STEP, "layers": ["m/a"], **unknown}


@pytest.mark.slow
def test_sampling_in_real_tensorboards_both_loaders(sampled_logdir, tmp_path):
    """The int64 first_nonfinite records through the Rust data server and the Python loader."""
    configs = [("true", ["--samples_per_plugin", "layergrad=5"]), ("false", ["--samples_per_plugin", "layergrad=5"])]
    with tensorboards(sampled_logdir, configs, str(tmp_path)) as procs:
        for p in procs:

            def ready(p):
                status, body, _ = p.get("/data/plugin/layergrad/runs")
                runs = json.loads(body)["runs"] if status == 200 else []
                return len(runs) == 2 and all(r["max_step"] == rf.SAMPLED_STEPS - 1 for r in runs)

            p.wait_until(ready, "both runs", timeout=120)
        for p in procs:
            status, body, _ = p.get("/data/plugin/layergrad/anomalies?run=tracked")
            assert status == 200, body[:300]
            answer = strict_json(body)
            assert answer["layers"][0]["first_nonfinite"] == rf.SAMPLED_NAN_STEP, p.base
            assert len(answer["steps"]) < rf.SAMPLED_STEPS  # it did sample
