"""The precedence of a layer's verdict (docs/ANOMALIES.md, "One verdict"), on matrices set by hand."""

from __future__ import annotations

import numpy as np

from tb_layergrad import nonfinite_origin
from tb_layergrad.reader import anomalies

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
    cells = anomalies.cell_states(run)
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


def test_vanishing_over_steps_needs_a_loss_that_did_not_follow_and_rides_beside_the_cell_states():
    """Three layers whose gradient falls 10^2.5 from step 60 of 120 (12 logged steps); m/c also vanishes against the
    others at every step (a cell state: it comes first, and its collapse is carried beside it, not dropped). With a
    stalled loss all three vanish over steps; with a loss that fell to ~0 (convergence) or without the loss's value,
    none does."""
    steps = list(range(0, 120, 10))
    fall = np.where(np.arange(12) >= 6, 10**-2.5, 1.0)
    rms = np.stack([fall, fall * 0.5, fall * 1e-4])
    stats = {"rms": rms, "norm": rms * 8.0, "nonfinite": 0 * rms, "zero_frac": 0 * rms}
    layers = ["m/a", "m/b", "m/c"]
    stalled = anomalies.evaluate(layers, steps, stats, target_values=np.full(12, 0.7))
    got = [(v.state, v.step, v.text) for v in stalled.verdicts()]
    assert got == [
        ("vanishing_over_steps", 60, "vanishing over steps @60"),
        ("vanishing_over_steps", 60, "vanishing over steps @60"),
        ("vanishing", 0, "vanishing · vanishing over steps @60"),
    ]
    assert stalled.verdicts()[2].also == (
        {"state": "vanishing_over_steps", "step": 60, "text": "vanishing over steps @60"},
    )
    found = stalled.summary_json()["findings"]
    assert [f["kind"] for f in found] == ["vanishing", "vanishing_over_steps"] and found[1]["layers"] == layers
    assert (found[0]["step"], found[1]["step"]) == (110, 60)  # "at the latest step (110)" opens step 110
    assert stalled.latest["vanishing_over_steps"] == 3
    cells = anomalies.cell_states(stalled)
    assert list(cells[0]) == ["ok"] * 6 + ["vanishing_over_steps"] * 6 and set(cells[2]) == {"vanishing"}
    converged = anomalies.evaluate(layers, steps, stats, target_values=np.geomspace(0.7, 1e-6, 12))
    assert [v.state for v in converged.verdicts()] == ["ok", "ok", "vanishing"]
    assert [v.state for v in anomalies.evaluate(layers, steps, stats).verdicts()] == ["ok", "ok", "vanishing"]


def test_the_states_in_their_order(verdicts):
    """STATES is the precedence, most serious first (what a reader that counts or sorts verdicts relies on): the
    order docs/ANOMALIES.md writes (the fixture), and SEVERITY the ranks docs/HTTP_API.md gives."""
    assert anomalies.STATES == verdicts.states
    assert anomalies.SEVERITY == verdicts.severity


def test_the_two_measures_of_vanishing_over_steps():
    """step_decay: medians of the first and last EDGE_STEPS usable norms; target_fall: of the target's value."""
    from tb_layergrad.reader import trends

    norms = np.r_[[2.0, 1.0, 1.0, np.nan, 0.0, 1.0, 1.0], np.full(5, 1e-3), [np.nan]]  # NaN, 0: not usable
    assert trends.step_decay(norms) == -3.0 and trends.step_decay(norms[:9]) is None  # 9 usable: too few
    assert trends.step_decay(norms, np.r_[np.zeros(12), 0]) == -3.0
    assert trends.collapse_step(np.arange(13) * 10, norms) == 70
    minimax = np.r_[np.full(5, -0.45), np.full(5, -1e-5)]  # minimized, it rose towards 0
    assert trends.target_fall(trends.target_edges(minimax)) == (-0.45 + 1e-5) / 0.45
    assert trends.target_fall(trends.target_edges(np.r_[np.full(5, 2.0), np.full(5, 1e-6)])) == (2.0 - 1e-6) / 2.0
    assert trends.target_fall(trends.target_edges(np.zeros(10))) is None and trends.target_fall(None) is None
    assert trends.collapsed(-2.0, 0.49) and not trends.collapsed(-1.99, -1.0) and not trends.collapsed(-5.0, 0.5)
    assert not trends.collapsed(-5.0, None) and not trends.collapsed(None, -1.0)
