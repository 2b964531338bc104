"""tb_layergrad.reader.anomalies: the one implementation of docs/ANOMALIES.md, against an independent evaluation.

No TensorFlow here: the module is numpy only (the plugin imports it).
"""

from __future__ import annotations

import pathlib
import re
import sys

import numpy as np
import pytest

from tb_layergrad.reader import anomalies, run_health, trends

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ANOMALIES.md"


def random_matrices(seed: int = 3, layers: int = 9, steps: int = 40):
    """Every kind of flag, missing cells, unrecorded cells (the case mix the tab test used)."""
    rng = np.random.default_rng(seed)
    rms = np.exp(rng.normal(-4, 3, size=(layers, steps)))
    rms[2, 25:] *= 1e3  # grows: exploding by the growth rule
    rms[4] *= 1e-6  # vanishing
    rms[5, 10] = 5e3  # exploding by the absolute rule
    rms[rng.random(rms.shape) < 0.05] = np.nan  # missing
    norm = rms * 7.0
    norm[6, 3:] = 0.0  # dead: no gradient
    rms[6, 3:] = np.nan
    nonfinite = np.zeros(rms.shape)
    nonfinite[1, 30:] = 4
    zero_frac = rng.uniform(0, 0.2, size=rms.shape)
    zero_frac[7, 20:] = 0.995  # dead: (almost) all zeros
    missing = np.isnan(rms) & (rng.random(rms.shape) < 0.5)
    for a in (norm, nonfinite, zero_frac):
        a[missing] = np.nan  # some cells not recorded at all
    return {"rms": rms, "norm": norm, "nonfinite": nonfinite, "zero_frac": zero_frac}


@pytest.mark.parametrize("seed", [3, 4, 5, 6])
def test_detect_equals_the_independent_cell_by_cell_evaluation(seed, report_fixtures):
    m = random_matrices(seed)
    expected = report_fixtures.reference_detect(m["rms"], m["norm"], m["nonfinite"], m["zero_frac"])
    got = anomalies.detect(m["rms"], m["norm"], m["nonfinite"], m["zero_frac"])
    assert got.dtype == np.uint8
    assert {int(f) for f in np.unique(expected)} >= {0, 1, 2, 4, 8}  # every kind of flag occurs
    np.testing.assert_array_equal(got, expected)


def test_evaluate_summaries_equal_the_independent_ones(report_fixtures, tolerances):
    m = random_matrices(7)
    steps = list(range(0, 400, 10))
    layers = [f"m/l{i}" for i in range(m["rms"].shape[0])]
    ts = {"m/l3": [10.0 ** (np.arange(6) - 5 + 0.01 * k) for k in range(30)]}
    run = anomalies.evaluate(layers, steps, m, run="r", timesteps=ts)
    want = report_fixtures.reference_summaries(layers, steps, m, timesteps=ts)
    flags = run.flag_strings()
    for i, (s, w) in enumerate(zip(run.summaries, want)):
        got = s.to_json()
        got["flags"] = flags[i]
        for key in ("layer", "flags", "recorded", "last_step", "first_nonfinite", "counts", "now"):
            assert got[key] == w[key], (s.layer, key)
        for key in ("last_norm", "last_rms", "last_zero_frac"):  # read from the same matrix: copies, exact
            assert got[key] == w[key], (s.layer, key)
        # A least-squares slope over <= 20 points in float64, two formulas: report_fixtures.reference_trend_atol.
        assert got["trend"] == tolerances.approx_or_none(w["trend"], rel=0, abs=w["atol"]["trend"]), (s.layer, "trend")
        assert ("timestep_decay" in got) == ("timestep_decay" in w)
        if "timestep_decay" in w:  # log10 of two float64 numbers, a difference, a median: reference_decay_atol
            assert got["timestep_decay"] == tolerances.approx_or_none(
                w["timestep_decay"], rel=0, abs=w["atol"]["timestep_decay"]
            )
    # Planted 10**(j - 5 + c): -5 + c rounds once (<= 5 u off -5), each pow once (moves its log10 by
    # <= u / ln 10 < u); then the two evaluations' own rounding (reference_decay_atol).
    u = tolerances.gamma(1, np.float64)
    assert run.summaries[3].timestep_decay == pytest.approx(
        -5.0, rel=0, abs=report_fixtures.reference_decay_atol(ts["m/l3"]) + 5 * u + 2 * u
    )
    np.testing.assert_array_equal(
        run.max_rms, np.nanmax(np.where(m["rms"] > 0, m["rms"], np.nan), axis=0)
    )  # a max: exact


def test_flag_strings_round_trip():
    flags = np.array([[0, 1, 2, 6, 8, 15]], np.uint8)
    rec = np.array([[True, True, False, True, True, True]])
    text = anomalies.encode_flags(flags[0], rec[0])
    assert text == "01.68f"
    np.testing.assert_array_equal(anomalies.decode_flags(text), [0, 1, -1, 6, 8, 15])
    assert anomalies.flag_names(6) == ["vanishing", "exploding"]


def test_the_step_running_records_name_wins_only_when_earlier():
    m = {k: np.ones((2, 4)) for k in anomalies.REQUIRED_STATS}
    m["zero_frac"][:] = 0
    m["nonfinite"][:] = 0
    m["nonfinite"][0, 2:] = 1  # layer 0 non-finite from step 20 in the kept steps
    run = anomalies.evaluate(["a", "b"], [0, 10, 20, 30], m, running_first_steps=[15, None])
    assert run.summaries[0].first_nonfinite_step == 15  # a sampled-away step, known from the records
    assert run.earliest_nonfinite == {"step": 15, "layers": ["a"]}
    later = anomalies.evaluate(["a", "b"], [0, 10, 20, 30], m, running_first_steps=[25, 3])
    assert later.summaries[0].first_nonfinite_step == 20 and later.summaries[1].first_nonfinite_step == 3


def test_trend_is_the_fitted_change_in_decades(report_fixtures, tolerances):
    steps = np.arange(0, 100, 2)
    norm = 10.0 ** (-0.01 * steps)  # -0.01 decade per step
    # Two float64 least-squares evaluations (report_fixtures.reference_trend_atol); against the exact
    # -0.38 also the planted norms' rounding: -0.01 and -0.01 * step round (2 u of |e| <= 1, moving
    # 10**e by <= 2 ln 10 u < 5 u) and the pow once: norm_rel <= gamma(6).
    atol = report_fixtures.reference_trend_atol(
        list(steps), norm, np.zeros(50), norm_rel=tolerances.gamma(6, np.float64)
    )
    # The last 20 logged steps span 38 steps: -0.38 decades.
    assert trends.trend(steps, norm) == pytest.approx(-0.38, rel=0, abs=atol)
    assert trends.trend(steps, norm) == pytest.approx(
        report_fixtures.reference_trend(list(steps), norm, np.zeros(50)), rel=0, abs=atol
    )
    noisy = norm * np.exp(np.random.default_rng(0).normal(0, 0.3, norm.shape))
    atol_noisy = report_fixtures.reference_trend_atol(
        list(steps), noisy, np.zeros(50)
    )  # the same inputs: rounding only
    assert trends.trend(steps, noisy) == pytest.approx(
        report_fixtures.reference_trend(list(steps), noisy, np.zeros(50)), rel=0, abs=atol_noisy
    )
    assert trends.trend([1, 2], [1.0, 2.0]) is None  # fewer than 3 points
    with_nan = norm.copy()
    nonfinite = np.zeros(50)
    nonfinite[-5:] = 3  # non-finite steps are left out of the fit
    assert trends.trend(steps, with_nan, nonfinite) == pytest.approx(-0.38, rel=0, abs=atol)


def test_timestep_decay(report_fixtures):
    v = [np.array([1e-4, 1e-2, 1.0]), np.array([0.0, 1.0, 2.0]), np.array([1.0, np.nan, 0.0])]
    # log10 of 1e-4 (a decimal constant, rounded once) and of 1.0: reference_decay_atol covers both.
    assert trends.timestep_decay(v[:1]) == pytest.approx(-4.0, rel=0, abs=report_fixtures.reference_decay_atol(v[:1]))
    assert trends.timestep_decay(v) == pytest.approx(
        report_fixtures.reference_decay(v), rel=0, abs=report_fixtures.reference_decay_atol(v)
    )
    assert trends.timestep_decay([np.array([1.0])]) is None


def _doc_thresholds():
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Thresholds") : text.index("## Rules")]
    return {name: float(value) for name, value in re.findall(r"^\| `(\w+)` \| `([0-9e.+-]+)` \|", section, re.M)}


def test_docs_thresholds_are_the_modules():
    assert _doc_thresholds() == {k: float(v) for k, v in anomalies.THRESHOLDS.items()}


def test_docs_point_at_the_module_and_their_python_block_runs():
    text = DOC.read_text(encoding="utf-8")
    assert "tb_layergrad/reader/anomalies.py" in text
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/ANOMALIES.md", "exec"), {})  # its asserts are the doc's examples


def test_module_needs_no_tensorflow():
    import subprocess

    code = (
        "import sys, tb_layergrad.reader.anomalies, tb_layergrad.reader.run_anomalies, tb_layergrad.cli.report; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_evaluate_200_layers_by_5000_steps():
    """The server does what the tab's detect() did, at this size."""
    L, S = 200, 5000
    j = np.arange(S)
    rms = np.exp(-np.arange(L)[:, None] / 20 + np.sin(j / 50)[None, :])
    nonfinite = np.zeros((L, S))
    nonfinite[7, 4001:] = 1
    m = {"rms": rms, "norm": rms, "nonfinite": nonfinite, "zero_frac": np.full((L, S), 0.01)}
    run = anomalies.evaluate([f"l{i}" for i in range(L)], j, m)
    strings = run.flag_strings()
    assert run.summaries[7].first_nonfinite_step == 4001 and strings[7][4001] == "1"
    assert strings[7][4000] == "0" and len(strings) == L and all(len(s) == S for s in strings)


def test_any_numbers_give_strict_json():
    """NaN, infinities, huge, tiny, negative values anywhere: the route's body stays strict JSON."""
    import json
    import warnings

    from tb_layergrad.plugin.bodies import anomalies_body

    rng = np.random.default_rng(0)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0, 1e308, 1e-320, 5e-324, 1.0, 2.0**63])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no numpy warning either
        for _ in range(300):
            L, S = rng.integers(0, 5), rng.integers(0, 12)
            m = {k: rng.choice(special, size=(L, S)) for k in anomalies.REQUIRED_STATS}
            steps = np.sort(rng.choice(10**6, size=S, replace=False))
            ts = {f"l{i}": [rng.choice(special, size=rng.integers(0, 5)) for _ in range(3)] for i in range(L)}
            named = [int(x) if x >= 0 else None for x in rng.integers(-3, 10**6, size=L)]
            run = anomalies.evaluate([f"l{i}" for i in range(L)], steps, m, timesteps=ts, running_first_steps=named)
            json.dumps(anomalies_body(run), allow_nan=False)


def test_default_targets():
    assert run_health.default_targets(["critic", "maker"]) == ["critic", "maker"]
    assert run_health.default_targets(["aux", "loss"]) == ["loss"]
    assert run_health.default_targets([]) == []


def test_every_verdict_state_has_a_severity_and_every_latest_count_a_measure():
    """A state added to the verdicts must rank in the sweep (a row of that run would fail) and be a column."""
    assert set(anomalies.SEVERITY) == set(anomalies.STATES)
    measured = {m.key for m in run_health.MEASURES}
    counted = {s for s in anomalies.STATES if s not in ("ok", "nan_origin", "nonfinite", "dominated")}
    assert {f"latest.{s}" for s in counted} <= measured and "dominated_steps" in measured  # steps, not layers
