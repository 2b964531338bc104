"""The demo's `gan` run in the tab: a real `tensorboard` on `tb-layergrad demo --quick`'s logdir, headless Chromium.

The run's two targets (the discriminator's tape and the generator's, tb_layergrad/cli/demo_gan.py) are both
offered by the target selector; each, picked, draws its overview: one heatmap row per layer its records hold
(the layers read back with `tb_layergrad.load`), one column per step; the generator's layer view charts its
vanishing gradient.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(600), pytest.mark.browser, pytest.mark.slow]
TARGET = 'select[aria-label="target"]'
PAINTED = """c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }"""


@pytest.fixture(scope="module")
def gan_tab(demo, tmp_path_factory, tab_fixtures, tensorboard_process, demo_plan):
    """A `tensorboard` on the demo's logdir and a browser; the layers of each target of the `gan` run, as written."""
    import tb_layergrad

    work = tmp_path_factory.mktemp("gan_tab")
    df = tb_layergrad.load(demo["logdir"])
    gan = df[(df.run == "gan") & (df.source == "output")]
    layers = {t: set(gan[gan.target == t].layer) for t in gan.target.unique()}
    steps = demo_plan.steps.gan
    tb = tensorboard_process.TensorBoardProcess(demo["logdir"], log_path=str(work / "tensorboard.log"))
    browser = None
    try:
        tb.wait_for_runs({"gan": steps})
        browser = tab_fixtures.Browser(str(work / "profile"), poll_ms=60_000)
        yield {"tb": tb, "browser": browser, "layers": layers, "steps": steps}
    finally:
        if browser is not None:
            browser.close()
        tb.stop()


def texts(frame, selector: str):
    return frame.locator(selector).evaluate_all("els => els.map(e => e.textContent)")


def test_the_tab_offers_both_targets_of_the_gan_and_draws_each(gan_tab, tab_fixtures, demo_plan):
    b, targets = gan_tab["browser"], sorted([demo_plan.d_target, demo_plan.g_target])
    assert sorted(gan_tab["layers"]) == targets
    frame = b.open(gan_tab["tb"].base, {"run": "gan", "target": demo_plan.d_target})
    frame.wait_for_function("() => document.querySelector('.lg-run-name')?.textContent === 'gan'")
    assert texts(frame, f"{TARGET} option") == targets
    assert frame.locator(TARGET).is_visible()
    for target in (demo_plan.d_target, demo_plan.g_target):
        if texts(frame, f"{TARGET} option:checked") != [target]:
            frame.select_option(TARGET, target)
        layers = gan_tab["layers"][target]
        canvas = frame.locator(f".lg-overview .lg-heatmap-canvas[data-rows='{len(layers)}']")
        canvas.wait_for()
        assert canvas.get_attribute("data-cols") == str(gan_tab["steps"])
        assert texts(frame, f"{TARGET} option:checked") == [target]
        labels = frame.locator(".lg-row-label").evaluate_all("els => els.map(e => e.dataset.layer)")
        assert set(labels) == layers, target
        assert canvas.evaluate(PAINTED) > 0, f"{target}: the heatmap is blank"
        assert tab_fixtures.parent_state(b.page)["target"] == target
    assert frame.locator(".lg-error").count() == 0
    tab_fixtures.assert_no_browser_errors(b)


def test_the_generators_layer_view_charts_its_vanishing_gradient(gan_tab, demo, tab_fixtures, demo_plan):
    """The generator's output under its own target: the charts over steps, and at the last step the table's
    L2 norm is the record's (5 significant digits), < 1/GAN_VANISH of its largest over the first 10 steps."""
    import tb_layergrad

    b, layer, steps = gan_tab["browser"], demo_plan.g_output, gan_tab["steps"]
    df = tb_layergrad.load(demo["logdir"])
    norms = df[(df.run == "gan") & (df.target == demo_plan.g_target) & (df.layer == layer) & (df.source == "output")]
    norms = norms.set_index("step")["norm"]
    state = {"run": "gan", "view": "layer", "layer": layer, "target": demo_plan.g_target, "step": steps}
    frame = b.open(gan_tab["tb"].base, state)
    frame.wait_for_function("(name) => document.querySelector('.lg-layer-name')?.textContent === name", arg=layer)
    frame.wait_for_selector(".lg-panel-charts path.lg-line")
    assert texts(frame, ".lg-panel-charts .lg-panel-head .lg-legend-name") == [f"{demo_plan.g_target} · output"]
    frame.wait_for_selector(f".lg-stats-table[data-step='{steps}']")
    shown = frame.locator(".lg-stats-table tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent))"
    )
    norm = float(next(cells[1] for cells in shown if cells and cells[0] == "L2 norm"))
    assert norm == pytest.approx(norms[steps], rel=1e-4)
    assert norm < norms.loc[1:10].max() / demo_plan.gan_vanish
    tab_fixtures.assert_no_browser_errors(b)


def test_a_run_without_a_loss_target_opens_on_its_worst_target(gan_tab, tab_fixtures, demo_plan):
    """No target in the URL (the run picker, a link): the target the Runs view opens it on and the report calls its
    worst (the `sweep` route's row: `generator`), its own layers first, its rows drawn, nothing asked of a target
    `loss` (no 404 in the console); the URL stays without one, so a copied link opens the same. Its banner says what
    the generator's value did, the arrow between the two numbers held by non-breaking spaces."""
    b = gan_tab["browser"]
    (row,) = gan_tab["tb"].get_json("/data/plugin/layergrad/sweep?run=gan")["runs"]
    assert row["target"] == demo_plan.g_target
    frame = b.open(gan_tab["tb"].base, {"run": "gan"})
    frame.wait_for_function("() => document.querySelector('.lg-run-name')?.textContent === 'gan'")
    layers = gan_tab["layers"][row["target"]]
    canvas = frame.locator(f".lg-overview .lg-heatmap-canvas[data-rows='{len(layers)}']")
    canvas.wait_for(timeout=10_000)
    assert canvas.get_attribute("data-cols") == str(gan_tab["steps"])
    assert texts(frame, f"{TARGET} option:checked") == [row["target"]]
    shown = frame.locator(".lg-row-label").evaluate_all("els => els.map(e => e.dataset.layer)")
    assert set(shown) == layers
    own = [x for x in shown if "generator" in x.split("/")]
    assert shown[: len(own)] == own and shown[0] == demo_plan.g_output, shown  # its own layers first
    text = frame.locator(".lg-summary .lg-alert").first.inner_text()
    assert "the value of generator rose (" in text and "\u00a0→\u00a0" in text, text
    assert frame.locator(".lg-error").count() == 0
    assert "target" not in tab_fixtures.parent_state(b.page)
    tab_fixtures.assert_no_browser_errors(b)


def test_a_target_the_url_names_is_kept(gan_tab, tab_fixtures, demo_plan):
    b = gan_tab["browser"]
    frame = b.open(gan_tab["tb"].base, {"run": "gan", "target": demo_plan.g_target})
    layers = gan_tab["layers"][demo_plan.g_target]
    frame.locator(f".lg-overview .lg-heatmap-canvas[data-rows='{len(layers)}']").wait_for(timeout=10_000)
    assert texts(frame, f"{TARGET} option:checked") == [demo_plan.g_target]
    assert tab_fixtures.parent_state(b.page)["target"] == demo_plan.g_target
    tab_fixtures.assert_no_browser_errors(b)


def test_the_overview_says_the_generators_gradient_vanished_over_steps(gan_tab, demo, tab_fixtures, demo_plan):
    """The generator's target: one banner line (the report's finding, word for word), a `vanishing over steps` chip
    on each of its rows and the count at the latest step; the discriminator's (its loss converged): none. The layer
    view of the generator's output shows the same verdict."""
    b = gan_tab["browser"]
    report = {t: demo["by_target"][("gan", t)] for t in (demo_plan.d_target, demo_plan.g_target)}
    (finding,) = report[demo_plan.g_target]["summary"]["findings"]
    frame = b.open(gan_tab["tb"].base, {"run": "gan", "target": demo_plan.g_target})
    alert = frame.locator('.lg-summary .lg-alert[data-kind="vanishing_over_steps"]')
    alert.wait_for(timeout=20_000)
    assert alert.count() == 1 and alert.inner_text().rstrip(" →").lower() == finding["line"].lower()
    assert alert.get_attribute("data-layers") == str(len(finding["layers"]))
    chips = frame.locator('.lg-chip[data-state="vanishing_over_steps"]')
    want = [e["verdict"]["text"] for e in report[demo_plan.g_target]["layers"]]
    assert sorted(chips.evaluate_all("els => els.map(e => e.textContent)")) == sorted(want)
    n = len(gan_tab["layers"][demo_plan.g_target])
    assert f"{len(want)} vanishing over steps of {n} layers" in frame.locator(".lg-health").inner_text()
    frame.select_option(TARGET, demo_plan.d_target)
    rows = len(gan_tab["layers"][demo_plan.d_target])
    frame.locator(f".lg-overview .lg-heatmap-canvas[data-rows='{rows}']").wait_for()
    frame.wait_for_function("() => !document.querySelector('.lg-alert[data-kind=\"vanishing_over_steps\"]')")
    assert frame.locator('.lg-chip[data-state="vanishing_over_steps"]').count() == 0
    layer = next(e for e in report[demo_plan.g_target]["layers"] if e["layer"] == demo_plan.g_output)
    state = {"run": "gan", "view": "layer", "layer": demo_plan.g_output, "target": demo_plan.g_target}
    frame = b.open(gan_tab["tb"].base, state)
    chip = frame.locator('.lg-layer-verdict .lg-chip[data-state="vanishing_over_steps"]')
    chip.wait_for(timeout=20_000)
    assert chip.inner_text() == f"{demo_plan.g_target} · output: {layer['verdict']['text']}"
    tab_fixtures.assert_no_browser_errors(b)
