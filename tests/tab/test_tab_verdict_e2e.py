"""One verdict in the tab: a real `tensorboard` over the known-answer runs (tests/known_answer_fixtures.py), headless
Chromium. The overview marks the row where a NaN was born apart from the rows it reached, and shows one banner line
per finding, the route's own lines, however many layers a finding spans."""

from __future__ import annotations

import os
import urllib.parse

import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(300), pytest.mark.browser, pytest.mark.slow]
RUNS = ("nan_backward", "explode", "rnn", "flipped/train")


@pytest.fixture(scope="module")
def env(tmp_path_factory, known_answer_fixtures, tab_fixtures):
    logdir = str(tmp_path_factory.mktemp("verdict_logs"))
    work = tmp_path_factory.mktemp("verdict_work")
    last = {
        **{run: known_answer_fixtures.STEPS - 1 for run in known_answer_fixtures.PLANTS},
        "rnn": known_answer_fixtures.TIME_STEPS - 1,
        "flipped/train": known_answer_fixtures.FLIP_BATCHES - 1,
    }

    def write():
        known_answer_fixtures.write_planted(logdir)
        known_answer_fixtures.write_timesteps(logdir)
        known_answer_fixtures.write_flipped(logdir)

    with tab_fixtures.served(logdir, work, last, write, poll_ms=60_000) as (tb, browser, _):
        yield {"tb": tb, "browser": browser}


@pytest.fixture(autouse=True)
def no_browser_errors(env, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(env["browser"])


def _overview(env, run: str):
    frame = env["browser"].open(env["tb"].base, {"run": run})
    frame.wait_for_function("(name) => document.querySelector('.lg-run-name')?.textContent === name", arg=run)
    frame.wait_for_selector(".lg-row-label[data-state]")
    return frame


def _route(tensorboard_process, env, run: str) -> dict:
    return env["tb"].get_json(tensorboard_process.PLUGIN_API + "anomalies?run=" + urllib.parse.quote(run))


def test_origin_row_is_marked_apart_from_the_rows_it_reached(env, known_answer_fixtures, tab_fixtures):
    frame = _overview(env, "nan_backward")
    states = frame.locator(".lg-row-label").evaluate_all("els => els.map(e => [e.dataset.layer, e.dataset.state])")
    want = {
        known_answer_fixtures.path(x): "nan_origin"
        if x == "gate"
        else "nonfinite"
        if x in known_answer_fixtures.BEFORE
        else "ok"
        for x in known_answer_fixtures.LAYERS
    }
    assert dict(states) == want
    gate = known_answer_fixtures.LAYERS.index("gate")
    origin_chip = frame.locator(f'.lg-row-chip[data-row="{gate}"] .lg-chip')
    assert origin_chip.inner_text() == f"NaN/Inf born here @{known_answer_fixtures.K}" and origin_chip.get_attribute(
        "data-state"
    ) == ("nan_origin")
    for x in known_answer_fixtures.BEFORE:
        chip = frame.locator(f'.lg-row-chip[data-row="{known_answer_fixtures.LAYERS.index(x)}"] .lg-chip')
        assert (
            chip.inner_text() == f"NaN/Inf @{known_answer_fixtures.K}"
            and chip.get_attribute("data-state") == "nonfinite"
        )
    # The two marks look different: the origin's chip is the non-finite colour inverted.
    bg = [
        frame.locator(f'.lg-row-chip[data-row="{i}"] .lg-chip').evaluate("e => getComputedStyle(e).backgroundColor")
        for i in (0, gate)
    ]
    assert bg[0] != bg[1]
    banner = frame.locator(".lg-summary .lg-origin")
    assert banner.count() == 1 and banner.get_attribute("data-layer") == known_answer_fixtures.path("gate")
    banner.click()
    state = tab_fixtures.parent_state(env["browser"].page)
    assert (state["view"], state["layer"], state["step"]) == (
        "layer",
        known_answer_fixtures.path("gate"),
        str(known_answer_fixtures.K),
    )


@pytest.mark.parametrize("run", RUNS)
def test_one_banner_line_per_finding(env, run, tensorboard_process):
    frame = _overview(env, run)
    findings = _route(tensorboard_process, env, run)["summary"]["findings"]
    alerts = frame.locator(".lg-summary .lg-alert")
    shown = alerts.evaluate_all("els => els.map(e => [e.dataset.kind, e.textContent])")
    assert [k for k, _ in shown] == [f["kind"] for f in findings]
    for (_, text), f in zip(shown, findings):
        assert text.rstrip(" →").lower() == f["line"].lower()
    kinds = {"nan_backward": ["nonfinite"], "explode": ["exploding"], "rnn": ["vanishing_through_time"]}
    assert [k for k, _ in shown] == kinds.get(run, ["dominated"])


def test_explode_marks_no_layer_vanishing(env, known_answer_fixtures):
    frame = _overview(env, "explode")
    assert frame.locator(".lg-chip-vanishing").count() == 0
    chips = frame.locator(".lg-chip-exploding").evaluate_all("els => els.map(e => e.textContent)")
    assert chips == ["exploding"] * len(known_answer_fixtures.BEFORE)


def test_dominated_is_one_line_for_three_layers(env):
    frame = _overview(env, "flipped/train")
    alert = frame.locator(".lg-alert-dominated")
    assert alert.count() == 1 and alert.get_attribute("data-layers") == "3"
    assert frame.locator(".lg-chip-dominated").count() == 3  # still a chip on each row


def test_vanishing_through_time_is_a_finding_of_the_overview(env, known_answer_fixtures):
    frame = _overview(env, "rnn")
    truth = [x for x, d in known_answer_fixtures.DECAYS.items() if d >= 3]
    chips = frame.locator('.lg-chip[data-state="vanishing_through_time"]')
    assert chips.count() == len(truth)
    assert f"{len(truth)} vanishing through time" in frame.locator(".lg-health").inner_text()
