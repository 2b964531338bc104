"""Where it broke, in the tab: a real `tensorboard` process over tests/origin_fixtures.py, headless Chromium.

The overview's banner names the pass and the origin (as text: a layer named with HTML stays text), the
layer view shows the layer's activation beside its gradient (statistics from numpy on the written arrays,
histograms), the overview colours by an activation statistic, and compare runs shows activations.
"""

from __future__ import annotations

import csv
import io
import json
import os
import urllib.parse

import numpy as np
import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)

pytestmark = [pytest.mark.timeout(300), pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory, origin_fixtures, tab_fixtures):
    logdir = str(tmp_path_factory.mktemp("origin_logs"))
    work = tmp_path_factory.mktemp("origin_work")
    last = {run: origin_fixtures.STEPS[-1] for run in origin_fixtures.RUNS}
    with tab_fixtures.served(
        logdir, work, last, lambda: origin_fixtures.write_origin_logdir(logdir), poll_ms=60_000
    ) as (
        tb,
        browser,
        written,
    ):
        yield {"tb": tb, "browser": browser, "written": written}


@pytest.fixture(autouse=True)
def no_browser_errors(env, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(env["browser"])


def banner(frame, run: str):
    frame.wait_for_function("(name) => document.querySelector('.lg-run-name')?.textContent === name", arg=run)
    el = frame.locator(".lg-summary .lg-origin")
    el.wait_for()
    return el


def test_the_route_over_http_names_pass_and_origin(env, origin_fixtures, tensorboard_process):
    for run in origin_fixtures.RUNS:
        body = env["tb"].get_json(tensorboard_process.PLUGIN_API + "anomalies?run=" + urllib.parse.quote(run))
        want = origin_fixtures.expected(run)
        assert {k: v for k, v in body["summary"]["origin"].items() if k != "line"} == want, run


def test_banner_names_pass_and_origin(env, origin_run, origin_fixtures):
    run = origin_run
    frame = env["browser"].open(env["tb"].base, {"run": run})
    el = banner(frame, run)
    want = origin_fixtures.expected(run)
    assert el.get_attribute("data-pass") == want["pass"]
    assert el.get_attribute("data-origin") == (want["origin"] or "")
    text = el.inner_text()
    assert f"step {origin_fixtures.NAN_STEP}" in text
    words = {
        "forward": "forward pass, output of",
        "loss": "in the loss",
        "backward": "backward pass, born in",
        "forward_or_loss": "the forward pass or the loss",
        "unknown": "pass unknown",
    }
    assert words[want["pass"]] in text
    if want["origin"]:
        assert want["origin"] in text


def test_a_layer_named_with_html_is_text_in_the_banner(env, origin_fixtures, tab_fixtures):
    b = env["browser"]
    frame = b.open(env["tb"].base, {"run": origin_fixtures.HTML})
    el = banner(frame, origin_fixtures.HTML)
    assert origin_fixtures.HTML_LAYER in el.inner_text()  # the literal "<b>x</b>": not bold, not parsed
    assert el.evaluate("e => e.querySelectorAll('*').length") == 0
    assert frame.evaluate("() => document.querySelectorAll('b').length") == 0
    assert el.get_attribute("data-origin") == origin_fixtures.HTML_LAYER
    # The banner opens that layer at that step.
    el.click()
    frame.wait_for_function(
        "(name) => document.querySelector('.lg-layer-name')?.textContent === name", arg=origin_fixtures.HTML_LAYER
    )
    assert tab_fixtures.parent_state(b.page)["step"] == str(origin_fixtures.NAN_STEP)
    assert frame.evaluate("() => document.querySelectorAll('b').length") == 0


def shown(frame, series: str, stat: str):
    text = frame.locator(f'td[data-series="{series}"][data-stat="{stat}"]').inner_text().strip().replace("−", "-")
    return None if text in ("—", "·", "") else float(text)


def test_layer_view_shows_the_activation_beside_the_gradient(env, origin_fixtures, tab_fixtures):
    b, written = env["browser"], env["written"]
    frame = b.open(
        env["tb"].base,
        {"run": origin_fixtures.FORWARD, "view": "layer", "layer": origin_fixtures.K, "step": origin_fixtures.NAN_STEP},
    )
    frame.wait_for_selector(
        f'.lg-stats-table[data-step="{origin_fixtures.NAN_STEP}"][data-layer="{origin_fixtures.K}"]'
    )
    heads = frame.locator(".lg-series-head").all_inner_texts()
    assert heads[:2] == ["output", "activation (forward value)"]
    act, grad = f"forward|activation|{origin_fixtures.K}", f"loss|output|{origin_fixtures.K}"
    for step in (origin_fixtures.NAN_STEP, origin_fixtures.NAN_STEP - 1):
        if step != origin_fixtures.NAN_STEP:
            frame.locator(".lg-layer-name").click()
            b.page.keyboard.press("ArrowLeft")
            frame.wait_for_selector(f'.lg-stats-table[data-step="{step}"][data-layer="{origin_fixtures.K}"]')
        a = written.arrays[(origin_fixtures.FORWARD, "forward", "activation", origin_fixtures.K)][step]
        g = written.arrays[(origin_fixtures.FORWARD, "loss", "output", origin_fixtures.K)][step]
        want = tab_fixtures.numpy_stats(a)
        for stat in ("elements", "nan", "zeros"):
            assert shown(frame, act, stat) == want[stat], (step, stat)
        for stat in ("norm", "mean", "max"):
            assert shown(frame, act, stat) == pytest.approx(
                want[stat], rel=0, abs=tab_fixtures.shown_atol(a, stat, digits=tab_fixtures.TABLE_DIGITS)
            ), (step, stat)
        assert shown(frame, grad, "nan") == tab_fixtures.numpy_stats(g)["nan"]
    # The activation's histograms, one ridge per step, beside the gradient's.
    panel = frame.locator(".lg-panel-act-hist")
    panel.wait_for(state="visible")
    frame.wait_for_function(
        "(n) => document.querySelectorAll('.lg-panel-act-hist path.lg-ridge').length === n",
        arg=len(origin_fixtures.STEPS),
    )
    assert "activation" in panel.locator(".lg-panel-title").first.inner_text().lower()
    assert frame.locator(".lg-panel-hist path.lg-ridge").count() == len(
        origin_fixtures.STEPS
    )  # the gradient's, still there
    # No activation column, no activation panel, for a run without activations.
    frame = b.open(
        env["tb"].base, {"run": origin_fixtures.GRADS_ONLY, "view": "layer", "layer": origin_fixtures.K, "step": 0}
    )
    frame.wait_for_selector(f'.lg-stats-table[data-step="0"][data-layer="{origin_fixtures.K}"]')
    assert frame.locator(".lg-series-head").all_inner_texts() == ["output"]
    assert frame.locator(".lg-panel-act-hist").is_hidden()


def test_overview_colours_by_an_activation_statistic(env, origin_fixtures, tab_fixtures):
    b, page, written = env["browser"], env["browser"].page, env["written"]
    frame = b.open(env["tb"].base, {"run": origin_fixtures.FORWARD, "stat": "norm"})
    banner(frame, origin_fixtures.FORWARD)
    values = frame.locator('.lg-toggle[aria-label="values"]')
    assert values.is_visible()
    asked = []
    listener = lambda r: asked.append(r.url) if "/layergrad/matrix?" in r.url else None  # noqa: E731
    page.on("request", listener)
    try:
        values.locator(".lg-toggle-btn", has_text="activations").click()
        frame.wait_for_function(
            "() => document.querySelector('.lg-legend-title')?.textContent.startsWith('activation ')"
        )
    finally:
        page.remove_listener("request", listener)
    assert asked and all("source=activation" in u for u in asked)
    assert tab_fixtures.parent_state(page)["of"] == "activation"
    canvas = frame.locator(".lg-heatmap-canvas")
    assert canvas.get_attribute("data-rows") == "4" and canvas.get_attribute("data-cols") == str(
        len(origin_fixtures.STEPS)
    )
    # The banner is still where it broke; the hover shows the activation's norm.
    assert banner(frame, origin_fixtures.FORWARD).get_attribute("data-pass") == "forward"
    box = canvas.bounding_box()
    canvas.hover(position={"x": 1.5 * box["width"] / len(origin_fixtures.STEPS), "y": 0.5 * box["height"] / 4})
    tip = frame.locator(".lg-tooltip")
    tip.wait_for(state="visible")
    a = written.arrays[(origin_fixtures.FORWARD, "forward", "activation", "net/in")][1]
    norm_text = tip.locator("tr", has_text="L2 norm").locator("td").first.inner_text()
    assert float(norm_text) == pytest.approx(
        tab_fixtures.numpy_stats(a)["norm"],
        rel=0,
        abs=tab_fixtures.shown_atol(a, "norm", digits=tab_fixtures.TABLE_DIGITS),
    )
    # A run without activations: the choice is disabled, with the reason as its tooltip; gradients shown.
    frame = b.open(env["tb"].base, {"run": origin_fixtures.GRADS_ONLY, "of": "activation"})
    banner(frame, origin_fixtures.GRADS_ONLY)
    button = frame.locator('.lg-toggle[aria-label="values"] .lg-toggle-btn', has_text="activations")
    assert button.is_disabled()
    assert button.get_attribute("title").startswith(
        f"Nothing to show: run '{origin_fixtures.GRADS_ONLY}' recorded no activations"
    )
    assert not frame.locator(".lg-legend-title").inner_text().startswith("activation")


def test_compare_runs_with_activations(env, origin_fixtures):
    b, page, written = env["browser"], env["browser"].page, env["written"]
    frame = b.open(
        env["tb"].base,
        {
            "view": "compare",
            "run": origin_fixtures.FORWARD,
            "layer": origin_fixtures.K,
            "of": "activation",
            "stat": "nonfinite",
            "runs": json.dumps([origin_fixtures.FORWARD, origin_fixtures.BACKWARD]),
            "step": origin_fixtures.NAN_STEP,
            "log": "0",
        },
    )
    frame.wait_for_selector(
        f'.lg-panel-wide path.lg-line[data-series="{origin_fixtures.BACKWARD}"][d*="L"]', state="attached"
    )  # flat: no height
    assert "activation" in frame.locator(".lg-panel-wide").inner_text()
    with page.expect_download() as dl:
        frame.locator(".lg-compare .lg-button", has_text="Download CSV").click()
    rows = list(csv.DictReader(io.StringIO(open(dl.value.path(), encoding="utf-8").read())))
    over = {(r["run"], int(r["step"])): float(r["value"]) for r in rows if r["chart"] == "over_steps"}
    for run in (origin_fixtures.FORWARD, origin_fixtures.BACKWARD):
        for step in origin_fixtures.STEPS:
            a = written.arrays[(run, "forward", "activation", origin_fixtures.K)][step]
            assert over[(run, step)] == float((~np.isfinite(a)).sum()), (run, step)


# -- the demo's three NaN runs, trained for real (`tb-layergrad demo --quick`, tests/conftest.py) ------------
DEMO_NAN_RUNS = {  # run: (pass, origin), as tb_layergrad/cli/demo.py plants them
    "nan_log0": ("loss", "loss"),
    "nan_forward": ("forward", "nan_forward/log_features"),
    "nan_backward": ("backward", "nan_backward/sqrt_features"),
}


@pytest.fixture(scope="module")
def demo_tab(demo, env, tmp_path_factory, tensorboard_process, demo_plan):
    """A second `tensorboard`, on the demo's logdir; the module's browser (one Playwright per thread)."""
    work = tmp_path_factory.mktemp("demo_tab")
    tb = tensorboard_process.TensorBoardProcess(demo["logdir"], log_path=str(work / "tensorboard.log"))
    try:
        tb.wait_for_runs({run: demo["runs"][run]["summary"]["last_step"] for run in DEMO_NAN_RUNS})
        steps = {
            "nan_forward": demo_plan.nan_forward_step,
            "nan_backward": demo_plan.nan_backward_step,
            "nan_log0": demo["runs"]["nan_log0"]["summary"]["first_nonfinite"]["step"],
        }
        yield {"tb": tb, "browser": env["browser"], "steps": steps}
    finally:
        tb.stop()


@pytest.mark.parametrize("run", sorted(DEMO_NAN_RUNS))
def test_the_demo_nan_runs_are_placed_by_the_route_and_the_tab(demo_tab, run, tensorboard_process):
    pass_, origin = DEMO_NAN_RUNS[run]
    step = demo_tab["steps"][run]
    body = demo_tab["tb"].get_json(tensorboard_process.PLUGIN_API + "anomalies?run=" + urllib.parse.quote(run))
    got = body["summary"]["origin"]
    assert (got["step"], got["pass"], got["origin"]) == (step, pass_, origin)
    frame = demo_tab["browser"].open(demo_tab["tb"].base, {"run": run})
    el = banner(frame, run)
    assert (el.get_attribute("data-pass"), el.get_attribute("data-origin")) == (pass_, origin)
    assert f"step {step}" in el.inner_text() and origin in el.inner_text()

    # The layer view says it too: the origin's verdict is that it was born there, at that step.
    if origin != "loss":
        frame = demo_tab["browser"].open(demo_tab["tb"].base, {"view": "layer", "run": run, "layer": origin})
        frame.wait_for_function("(name) => document.querySelector('.lg-layer-name')?.textContent === name", arg=origin)
        chip = frame.locator(f'.lg-layer-verdict .lg-chip[data-series="loss|output|{origin}"]')
        chip.wait_for()
        assert chip.get_attribute("data-state") == "nan_origin" and chip.get_attribute("data-step") == str(step)
        assert chip.inner_text().endswith(f"NaN/Inf born here @{step}")
