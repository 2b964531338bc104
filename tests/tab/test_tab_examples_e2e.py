"""The tab's per-example views in headless Chromium against a real `tensorboard`: the layer view's
band of per-example norms and the batch positions of the largest at a step, for the layer's output and for
each weight it owns, the overview coloured by `example_norm_top_share` and naming the layers one example
dominates, and the gradient noise scale chart with its smoothing slider, in the run's view and in compare.
A run without these records shows none of them. The runs are tests/examples_fixtures.py's and
tests/dominated_fixtures.py's (written by the real capture and summary ops, with weights).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(300), pytest.mark.browser, pytest.mark.slow]

SMOOTHED = "EMA(tr Σ) / EMA(|G|²)"


@pytest.fixture(scope="module")
def env(tmp_path_factory, dominated_fixtures, examples_fixtures, tab_fixtures):
    logdir = str(tmp_path_factory.mktemp("examples_tab"))
    work = tmp_path_factory.mktemp("work")
    last = {
        examples_fixtures.RUN: examples_fixtures.STEPS - 1,
        examples_fixtures.PLAIN: examples_fixtures.STEPS - 1,
        dominated_fixtures.RUN: dominated_fixtures.STEPS - 1,
    }

    def write():
        return examples_fixtures.write_examples_logdir(logdir), dominated_fixtures.write_logdir(logdir)

    with tab_fixtures.served(logdir, work, last, write, write_first=True, load_fast="true", reload_interval=0) as (
        tb,
        browser,
        (written, weights),
    ):
        yield {"tb": tb, "browser": browser, "written": written, "weights": weights}


@pytest.fixture(autouse=True)
def no_browser_errors(env, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(env["browser"])


def test_the_served_tab_is_this_worktrees(env):
    status, body, _ = env["tb"].get("/data/plugin/layergrad/views/examples_panel.js")
    assert status == 200 and b"class ExamplesPanel" in body


def reference_smoothed(trace: np.ndarray, signal: np.ndarray, w: float) -> np.ndarray:
    """TensorBoard's debiased EMA of each, then their ratio (NaN while the averaged signal is <= 0)."""

    def ema(ys):
        out, last = [], 0.0
        for n, v in enumerate(ys, start=1):
            last = last * w + (1 - w) * v
            out.append(last / (1 - w**n))
        return np.asarray(out)

    t, g = ema(trace.astype(np.float32).astype(np.float64)), ema(signal.astype(np.float32).astype(np.float64))
    return np.where(g > 0, t / np.where(g > 0, g, 1), np.nan)


def test_layer_view_shows_the_band_and_the_dominating_position(env, examples_fixtures):
    b = env["browser"]
    frame = b.open(
        env["tb"].base,
        {
            "run": examples_fixtures.RUN,
            "view": "layer",
            "layer": examples_fixtures.DOMINATED_LAYER,
            "step": examples_fixtures.DOMINATED_STEP,
        },
    )
    panel = frame.locator('[data-panel="examples"]')
    frame.wait_for_selector('[data-panel="examples"] path.lg-band')
    assert panel.is_visible()
    assert frame.locator('[data-panel="examples"] path.lg-band').count() == 1  # every step has numbers: one outline
    lines = frame.locator('[data-panel="examples"] path.lg-line').evaluate_all("els => els.map(e => e.dataset.series)")
    assert lines == ["max", "median", "min"]
    frame.wait_for_selector(f'.lg-example-table[data-step="{examples_fixtures.DOMINATED_STEP}"]')
    positions = frame.locator(".lg-example-table tbody tr").evaluate_all(
        "els => els.map(e => Number(e.dataset.position))"
    )
    norms = env["written"].norms[examples_fixtures.DOMINATED_LAYER][examples_fixtures.DOMINATED_STEP]
    assert (
        positions == np.argsort(-norms, kind="stable")[:5].tolist()
        and positions[0] == examples_fixtures.DOMINATED_POSITION
    )
    head = frame.locator(".lg-example-head").inner_text()
    share = norms.max() ** 2 / np.sum(norms**2)
    assert f"of {examples_fixtures.BATCH} examples carries {100 * share:.1f}%" in head
    # Another step: its own positions.
    frame.locator('.lg-layer button[aria-label="next step"]').click()
    step = examples_fixtures.DOMINATED_STEP + 1
    frame.wait_for_function(f"() => document.querySelector('.lg-step-value')?.textContent.includes('{step}')")
    frame.wait_for_selector(f'.lg-example-table[data-step="{step}"]')
    positions = frame.locator(".lg-example-table tbody tr").evaluate_all(
        "els => els.map(e => Number(e.dataset.position))"
    )
    assert (
        positions
        == np.argsort(-env["written"].norms[examples_fixtures.DOMINATED_LAYER][step], kind="stable")[:5].tolist()
    )


def test_unsupported_layer_says_why(env, examples_fixtures):
    frame = env["browser"].open(
        env["tb"].base,
        {"run": examples_fixtures.RUN, "view": "layer", "layer": examples_fixtures.UNSUPPORTED_LAYER, "step": 3},
    )
    frame.wait_for_function(
        "() => document.querySelector('.lg-example-top')?.textContent.includes('no exact per-example rule')"
    )
    assert frame.locator('[data-panel="examples"] path.lg-band').count() == 0


def test_overview_colours_by_top_share_and_shows_the_noise_scale(env, examples_fixtures, tab_fixtures):
    b = env["browser"]
    frame = b.open(env["tb"].base, {"run": examples_fixtures.RUN})
    frame.wait_for_selector(
        '.lg-overview select[aria-label="statistic"] option[value="example_norm_top_share"]', state="attached"
    )
    options = frame.locator('.lg-overview select[aria-label="statistic"] option').evaluate_all(
        "els => els.map(e => e.value)"
    )
    assert "example_norm_top_share" in options
    frame.locator('.lg-overview select[aria-label="statistic"]').select_option("example_norm_top_share")
    frame.wait_for_function(
        "() => document.querySelector('.lg-heat-legend')?.textContent.includes(\"largest example's share\")"
    )
    assert tab_fixtures.parent_state(b.page)["stat"] == "example_norm_top_share"
    # The noise-scale chart: smoothed at TensorBoard's default 0.6, the numbers those of numpy's EMA ratio.
    noise = frame.locator('[data-panel="noise-scale"]')
    frame.wait_for_selector(f'[data-panel="noise-scale"] path.lg-line[data-series="{SMOOTHED}"]')
    assert noise.is_visible()
    written = env["written"]
    for w in (0.6, 0.95, 0.0):
        got = frame.evaluate(
            """async ([w]) => {
                const b = await (await fetch('./noise_scale?run=ex&smoothing=' + w)).json();
                return b.series[0].estimate;
            }""",
            [w],
        )
        want = reference_smoothed(written.trace, written.signal, w)
        np.testing.assert_allclose(np.asarray([np.nan if v is None else v for v in got]), want, rtol=1e-9)
    # The slider: moving it redraws the smoothed line (and says its value).
    before = frame.locator(f'[data-panel="noise-scale"] path.lg-line[data-series="{SMOOTHED}"]').get_attribute("d")
    frame.locator(".lg-noise-smoothing").fill("0.95")
    frame.wait_for_function("() => document.querySelector('[data-panel=\"noise-scale\"]').dataset.smoothing === '0.95'")
    after = frame.locator(f'[data-panel="noise-scale"] path.lg-line[data-series="{SMOOTHED}"]').get_attribute("d")
    assert after != before and frame.locator(".lg-noise-smoothing-value").inner_text() == "0.950"
    raw = frame.locator('[data-panel="noise-scale"] path.lg-line[data-series="raw tr(Σ)/|G|²"]').get_attribute("d")
    assert raw.count("M") == 2  # the raw ratio has no value at the step without a positive signal: two pieces
    assert "covers 75% of the trainable parameters" in noise.inner_text()


def test_overview_names_the_layer_one_example_dominates(env, examples_fixtures, tab_fixtures):
    """The `anomalies` route's `dominated`, as text above the matrix and a chip on the row; a click opens the
    layer at its worst step, where the table names the dominating batch position."""
    b = env["browser"]
    frame = b.open(env["tb"].base, {"run": examples_fixtures.RUN})
    frame.wait_for_selector(".lg-alert-dominated")
    alerts = frame.locator(".lg-alert-dominated")
    assert alerts.count() == 1  # net/in is never dominated; net/out has no numbers
    assert alerts.first.get_attribute("data-layer") == examples_fixtures.DOMINATED_LAYER
    assert alerts.first.get_attribute("data-step") == str(examples_fixtures.DOMINATED_STEP)
    norms = env["written"].norms[examples_fixtures.DOMINATED_LAYER][examples_fixtures.DOMINATED_STEP]
    share = norms.max() ** 2 / np.sum(norms**2)
    assert alerts.first.inner_text() == (
        f"One example dominates {examples_fixtures.DOMINATED_LAYER} at 1 step: first step {examples_fixtures.DOMINATED_STEP}; "
        f"worst step {examples_fixtures.DOMINATED_STEP}, {share:.0%} of its gradient from batch position "
        f"{examples_fixtures.DOMINATED_POSITION} of {examples_fixtures.BATCH} →"
    )
    chip = frame.locator(f'.lg-chip-dominated[data-layer="{examples_fixtures.DOMINATED_LAYER}"]')
    # Its only finding, so the layer's verdict (the route's text: its last step is not dominated); the share in its title.
    assert chip.count() == 1 and chip.inner_text() == "ok now – one example dominated 1 step"
    assert chip.get_attribute("data-state") == "dominated" and f"{share:.0%} of its gradient" in chip.get_attribute(
        "title"
    )
    row = frame.locator(".lg-row-chip").nth(list(examples_fixtures.LAYERS).index(examples_fixtures.DOMINATED_LAYER))
    assert row.locator(".lg-chip-dominated").count() == 1  # on its own row
    alerts.first.click()
    frame.wait_for_selector(f'.lg-example-table[data-step="{examples_fixtures.DOMINATED_STEP}"]')
    state = tab_fixtures.parent_state(b.page)
    assert (state["view"], state["layer"], state["step"]) == (
        "layer",
        examples_fixtures.DOMINATED_LAYER,
        str(examples_fixtures.DOMINATED_STEP),
    )
    first = frame.locator(".lg-example-table tbody tr").first.get_attribute("data-position")
    assert first == str(examples_fixtures.DOMINATED_POSITION)


def test_overview_of_weights_names_each_dominated_variable(env, dominated_fixtures):
    """The weight gradients' overview: every variable is dominated at the planted step; one line names three
    and counts the rest (one finding, however many layers), and a chip marks each variable's row."""
    b = env["browser"]
    frame = b.open(env["tb"].base, {"run": dominated_fixtures.RUN, "source": "weight"})
    frame.wait_for_selector(".lg-alert-dominated")
    alerts = frame.locator(".lg-alert-dominated")
    variables = sorted(env["weights"].weights[0])
    assert alerts.count() == 1 and alerts.first.get_attribute("data-layers") == str(len(variables))
    assert alerts.first.get_attribute("data-step") == str(dominated_fixtures.DOMINATED_STEP)
    assert alerts.first.get_attribute("data-layer") in variables
    text = alerts.first.inner_text()
    assert text.startswith("One example dominates ") and f"and {len(variables) - 3} more layer" in text
    assert f"from batch position {dominated_fixtures.DOMINATED_POSITION} of {dominated_fixtures.BATCH}" in text
    chips = frame.locator(".lg-chip-dominated").evaluate_all("els => els.map(e => e.dataset.layer)")
    assert sorted(chips) == variables


def test_layer_view_shows_the_examples_of_each_weight_it_owns(env, dominated_fixtures):
    """`mlp/out` owns `mlp/out/kernel` and `mlp/out/bias`: the panel's selector offers its output and both, and the
    kernel's band and largest positions are the kernel's own (numpy on independent per-example gradients)."""
    b = env["browser"]
    weights = env["weights"]
    frame = b.open(
        env["tb"].base,
        {
            "run": dominated_fixtures.RUN,
            "view": "layer",
            "layer": dominated_fixtures.OUT,
            "step": dominated_fixtures.DOMINATED_STEP,
        },
    )
    frame.wait_for_selector(f'.lg-example-table[data-step="{dominated_fixtures.DOMINATED_STEP}"]')
    picker = frame.locator('[data-panel="examples"] select[aria-label="per-example series"]')
    assert picker.is_visible()
    options = picker.locator("option").evaluate_all("els => els.map(e => [e.value, e.textContent])")
    kernel_key, bias_key, out_key = (
        f"loss|weight|{dominated_fixtures.KERNEL}",
        f"loss|weight|{dominated_fixtures.BIAS}",
        f"loss|output|{dominated_fixtures.OUT}",
    )
    assert options[0] == [out_key, "output"]  # the layer's own output first, as before
    assert sorted(options[1:]) == [[bias_key, "bias (weight)"], [kernel_key, "kernel (weight)"]]

    def positions(key):
        sel = f'.lg-example-table[data-series="{key}"][data-step="{dominated_fixtures.DOMINATED_STEP}"]'
        frame.wait_for_selector(sel)
        return frame.locator(f"{sel} tbody tr").evaluate_all("els => els.map(e => Number(e.dataset.position))")

    def order(source, path):
        return np.argsort(-weights.norms(source, path)[dominated_fixtures.DOMINATED_STEP], kind="stable")[:5].tolist()

    assert positions(out_key) == order("output", dominated_fixtures.OUT)
    picker.select_option(kernel_key)
    assert positions(kernel_key) == order("weight", dominated_fixtures.KERNEL)
    assert positions(kernel_key)[0] == dominated_fixtures.DOMINATED_POSITION
    norms = weights.norms("weight", dominated_fixtures.KERNEL)[dominated_fixtures.DOMINATED_STEP]
    head = frame.locator(".lg-example-head").inner_text()
    assert f"of {dominated_fixtures.BATCH} examples carries {100 * norms.max() ** 2 / np.sum(norms**2):.1f}%" in head
    assert (
        f"weight {dominated_fixtures.KERNEL}" in frame.locator('[data-panel="examples"] .lg-muted').first.inner_text()
    )
    assert frame.locator('[data-panel="examples"] path.lg-band').count() == 1
    # Another step keeps the kernel: its own positions there.
    frame.locator('.lg-layer button[aria-label="next step"]').click()
    step = dominated_fixtures.DOMINATED_STEP + 1
    sel = f'.lg-example-table[data-series="{kernel_key}"][data-step="{step}"]'
    frame.wait_for_selector(sel)
    got = frame.locator(f"{sel} tbody tr").evaluate_all("els => els.map(e => Number(e.dataset.position))")
    assert got == np.argsort(-weights.norms("weight", dominated_fixtures.KERNEL)[step], kind="stable")[:5].tolist()


def test_a_layer_without_weight_examples_shows_no_picker(env, examples_fixtures):
    frame = env["browser"].open(
        env["tb"].base,
        {"run": examples_fixtures.RUN, "view": "layer", "layer": examples_fixtures.DOMINATED_LAYER, "step": 3},
    )
    frame.wait_for_selector('.lg-example-table[data-step="3"]')
    assert frame.locator('[data-panel="examples"] select[aria-label="per-example series"]').is_hidden()


def test_compare_shows_the_noise_scale_of_the_runs_that_have_it(env, examples_fixtures):
    frame = env["browser"].open(
        env["tb"].base,
        {
            "run": examples_fixtures.RUN,
            "view": "compare",
            "layer": "net/mid",
            "runs": json.dumps([examples_fixtures.RUN, examples_fixtures.PLAIN]),
            "stat": "example_norm_top_share",
        },
    )
    frame.wait_for_selector(
        f'.lg-compare [data-panel="noise-scale"] path.lg-line[data-series="{examples_fixtures.RUN} {SMOOTHED}"]'
    )
    assert (
        f"not recorded in {examples_fixtures.PLAIN}"
        in frame.locator('.lg-compare [data-panel="noise-scale"]').inner_text()
    )
    frame.wait_for_selector('.lg-compare path.lg-line[data-series="plain"]')  # compared by the norm meanwhile
    # These runs hold no histograms (stats and examples only): compare does not ask for them (no 404s).
    # Hovering a run's entry in the noise-scale legend highlights it there and in the other charts, the
    # other run faded; a run the noise-scale chart does not have fades nothing there.
    noise = '.lg-compare [data-panel="noise-scale"]'
    frame.locator(f"{noise} .lg-legend-item").filter(has_text=examples_fixtures.RUN).hover()
    frame.wait_for_selector(f"{noise} svg.lg-dimmed path.lg-line.lg-hi")
    overlay = frame.locator(".lg-compare .lg-panel-wide")
    assert overlay.locator("path.lg-line.lg-hi").evaluate_all("els => els.map(e => e.dataset.key)") == [
        examples_fixtures.RUN
    ]
    plain = overlay.locator(f'path.lg-line[data-key="{examples_fixtures.PLAIN}"]')
    assert plain.evaluate("e => getComputedStyle(e).strokeOpacity") == "0.15"
    frame.locator(".lg-compare .lg-panel-wide .lg-legend-item").filter(has_text=examples_fixtures.PLAIN).hover()
    frame.wait_for_function(
        "(r) => document.querySelector('.lg-panel-wide path.lg-line.lg-hi')?.dataset.key === r",
        arg=examples_fixtures.PLAIN,
    )
    assert frame.locator(f"{noise} svg.lg-dimmed").count() == 0 and frame.locator(f"{noise} .lg-hi").count() == 0
    env["browser"].page.mouse.move(1, 1)


def test_a_run_without_them_shows_none(env, examples_fixtures):
    b = env["browser"]
    asked = []
    record = lambda r: asked.append(r.url)  # noqa: E731
    b.page.on("request", record)
    frame = b.open(env["tb"].base, {"run": examples_fixtures.PLAIN, "stat": "example_norm_top_share"})
    frame.wait_for_selector(".lg-heat-legend .lg-legend-title")
    options = frame.locator('.lg-overview select[aria-label="statistic"] option').evaluate_all(
        "els => els.map(e => e.value)"
    )
    assert not any(o.startswith("example_") for o in options)
    assert "L2 norm" in frame.locator(".lg-heat-legend").inner_text()
    assert frame.locator('[data-panel="noise-scale"]').is_hidden()
    frame = env["browser"].open(
        env["tb"].base, {"run": examples_fixtures.PLAIN, "view": "layer", "layer": "net/mid", "step": 3}
    )
    frame.wait_for_selector(".lg-stats-table")
    assert frame.locator('[data-panel="examples"]').is_hidden()
    b.page.remove_listener("request", record)
    assert any("/matrix?" in u for u in asked)
    assert not [
        u for u in asked if "/examples?" in u or "/noise_scale?" in u or "example_norm" in u
    ]  # asked nothing new


# -- the demo's `mislabelled` run, trained for real (`tb-layergrad demo --quick`, tests/conftest.py) -----------


@pytest.fixture(scope="module")
def mislabelled(demo, env, tmp_path_factory, tensorboard_process, demo_plan):
    """A second `tensorboard`, on the demo's logdir; the module's browser. The planted flips that the classifier
    has learnt past (from step 16 on, as tests/cli/test_demo.py checks in the records)."""

    work = tmp_path_factory.mktemp("mislabelled_tab")
    tb = tensorboard_process.TensorBoardProcess(demo["logdir"], log_path=str(work / "tensorboard.log"))
    try:
        last = demo["runs"]["mislabelled"]["summary"]["last_step"]
        tb.wait_for_runs({"mislabelled": last})
        planted = demo_plan.mislabelled_positions(last)
        learnt = {s: p for s, p in planted.items() if s >= 16}
        yield {"tb": tb, "browser": env["browser"], "planted": planted, "learnt": learnt}
    finally:
        tb.stop()


def test_the_report_finds_the_flipped_labels(demo, mislabelled):
    """`tb-layergrad report` on the demo: the logits' gradient is dominated at a planted step, by the planted example."""
    found = {d["layer"]: d for d in demo["runs"]["mislabelled"]["dominated"]}
    logits = found["mislabelled/logits"]
    assert logits["worst_step"] in mislabelled["planted"]
    assert logits["worst_position"] == mislabelled["planted"][logits["worst_step"]]
    assert logits["worst_share"] > 0.5 and logits["examples"] == 32
    assert not [r for r in demo["runs"].values() if r["run"] != "mislabelled" and r.get("dominated")]


def test_the_tab_shows_the_flipped_example_at_its_step(mislabelled):
    step, position = sorted(mislabelled["learnt"].items())[-1]
    frame = mislabelled["browser"].open(
        mislabelled["tb"].base, {"run": "mislabelled", "view": "layer", "layer": "mislabelled/logits", "step": step}
    )
    frame.wait_for_selector('[data-panel="examples"] path.lg-band')
    frame.wait_for_selector(f'.lg-example-table[data-step="{step}"]')
    positions = frame.locator(".lg-example-table tbody tr").evaluate_all(
        "els => els.map(e => Number(e.dataset.position))"
    )
    assert positions[0] == position
    assert "of 32 examples carries" in frame.locator(".lg-example-head").inner_text()
