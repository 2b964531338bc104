"""The precedence of a layer's verdict (docs/ANOMALIES.md, "One verdict"), on matrices set by hand."""

from __future__ import annotations

import numpy as np

from tb_layergrad import nonfinite_origin
from tb_layergrad.reader import anomalies, verdict

STEPS = list(range(0, 80, 10))


def _run(rms_rows, nonfinite_rows=None, timesteps=None, layers=("m/a", "m/b", "m/c")):
    rms = np.asarray(rms_rows, float)
    norm = rms * 8.0
    nf = np.zeros_like(rms) if nonfinite_rows is None else np.asarray(nonfinite_rows, float)
    zero = np.where(norm == 0, 1.0, 0.0)
    return anomalies.evaluate(
        list(layers), STEPS, {"rms": rms, "norm": norm, "nonfinite": nf, "zero_frac": zero}, timesteps=timesteps
    )


def test_now_before_the_past_and_the_most_serious_first():
    healthy = [1.0] * 8
    grew_then_died = [1.0] * 5 + [500.0, 0.0, 0.0]  # exploding at step 50, dead from 60 on
    grew_then_calmed = [1.0] * 5 + [500.0, 1.0, 1.0]
    run = _run([healthy, grew_then_died, grew_then_calmed])
    got = [(v.state, v.now, v.step, v.text) for v in run.verdicts()]
    assert got == [("ok", True, 70, "ok"), ("dead", True, 60, "dead"), ("exploding", False, 50, "exploding 1/8")]


def test_the_origin_comes_before_every_other_state_and_the_nan_it_reached_next():
    nf = np.zeros((3, 8))
    nf[0, 4:] = 3  # the NaN reached m/a from step 40 on
    run = _run([[1.0] * 8, [1e-6] * 8, [1.0] * 8], nf)  # m/b vanishing all along
    run.origin = nonfinite_origin.Origin(40, nonfinite_origin.PASS_BACKWARD, "m/b", "loss", ["m/a"])
    states = [(v.state, v.step, v.text) for v in run.verdicts()]
    assert states == [("nonfinite", 40, "NaN/Inf @40"), ("nan_origin", 40, "NaN/Inf born here @40"), ("ok", 70, "ok")]
    cells = verdict.cell_states(run)
    assert cells[1, 4] == "nan_origin" and cells[1, 3] == "vanishing" and list(cells[0, 4:]) == ["nonfinite"] * 4
    (finding,) = [f for f in run.summary_json()["findings"] if f["kind"] == "nonfinite"]
    assert (finding["layer"], finding["step"], finding["line"]) == ("m/b", 40, run.origin.line)
    # Born in the loss: no row is the origin, the rows it reached are non-finite.
    run.origin = nonfinite_origin.Origin(40, nonfinite_origin.PASS_LOSS, "loss", "loss", [])
    assert [v.state for v in run.verdicts()] == ["nonfinite", "vanishing", "ok"]


def test_vanishing_through_time_only_when_nothing_else_holds():
    decays = lambda d: [10.0 ** (-d * np.linspace(1, 0, 5))] * 8  # noqa: E731 - one record per step
    run = _run([[1.0] * 8] * 3, timesteps={"m/a": decays(3.0), "m/b": decays(2.9), "m/c": decays(5.0)})
    assert [v.state for v in run.verdicts()] == ["vanishing_through_time", "ok", "vanishing_through_time"]
    (finding,) = run.summary_json()["findings"]
    assert finding["layers"] == ["m/a", "m/c"] and "10^5.0 times smaller" in finding["line"]
    assert run.latest["vanishing_through_time"] == 2
