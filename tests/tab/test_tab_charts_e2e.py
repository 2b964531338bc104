"""The tab's charts as a person reads them, in headless Chromium on a real `tensorboard`: sizes, ticks,
fraction axes, one number format, one colour for the chosen step, zoom reaching the histograms, the step
keys wherever the focus is, values a log axis cannot draw, the noise-scale chart's undefined steps, a
control that can do nothing disabled with its reason, colour-bar labels kept apart.

The runs are tests/charts_fixtures.py's (the real summary ops); every expected number is computed here
from what was written (numpy), and every measured one read from the page (boxes, attributes, text).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(300), pytest.mark.browser]

SMOOTHED = "EMA(tr Σ) / EMA(|G|²)"
RAW = "raw tr(Σ)/|G|²"
# Today's layer charts (the size this view had before): ~225 x 115 px each.
OLD_AREA = 225 * 115


@pytest.fixture(scope="module")
def env(tmp_path_factory, charts_fixtures, examples_fixtures, tab_fixtures, truth_fixtures):
    logdir = str(tmp_path_factory.mktemp("charts"))
    work = tmp_path_factory.mktemp("work")
    last = {
        charts_fixtures.STEADY: charts_fixtures.STEPS - 1,
        charts_fixtures.ZERO: charts_fixtures.STEPS - 1,
        charts_fixtures.ACT: charts_fixtures.STEPS - 1,
        charts_fixtures.NOISY: examples_fixtures.STEPS - 1,
    }
    last.update(truth_fixtures.LAST_STEPS)

    def write():
        return charts_fixtures.write_charts_logdir(logdir), truth_fixtures.write_truth_runs(logdir)

    with tab_fixtures.served(logdir, work, last, write, write_first=True, reload_interval=0) as (tb, browser, written):
        yield {"tb": tb, "browser": browser, "written": written[0], "truth": written[1]}


@pytest.fixture(autouse=True)
def no_browser_errors(env, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(env["browser"])


def layer_view(env, run: str, layer: str, **state):
    frame = env["browser"].open(env["tb"].base, {"run": run, "view": "layer", "layer": layer, **state})
    frame.wait_for_selector(f'.lg-stats-table[data-layer="{layer}"]')
    frame.wait_for_selector(".lg-panel-charts path.lg-line")
    return frame


def chart(frame, title: str):
    """The `.lg-chart` of the layer view whose title starts with `title`."""
    return frame.locator(".lg-panel-charts .lg-chart").filter(
        has=frame.locator(".lg-chart-title", has_text=re.compile("^" + re.escape(title)))
    )


def step_shown(frame) -> int:
    return int(frame.locator(".lg-step-value").inner_text())


def test_layer_charts_are_twice_as_large_with_4_to_6_ticks_and_fractions_on_0_to_1(env, charts_fixtures):
    frame = layer_view(env, charts_fixtures.STEADY, "net/b")
    svgs = frame.locator(".lg-panel-charts svg.lg-lines")
    assert svgs.count() == 6
    for k in range(6):
        svg = svgs.nth(k)
        box = svg.bounding_box()
        assert box["width"] * box["height"] >= 2 * OLD_AREA, box
        assert 4 <= svg.locator("text.lg-ytick").count() <= 6
        assert 4 <= svg.locator("text.lg-xtick").count() <= 6
    # Fractions on 0…1: the axis' range, its ticks, and net/b's zero fraction (a quarter of it is 0) drawn at 0.25.
    want = charts_fixtures.gradient(charts_fixtures.STEADY, "net/b", 0)
    zero_frac = float(np.mean(want == 0))
    for title in ("zero fraction", "non-finite fraction"):
        c = chart(frame, title)
        svg = c.locator("svg")
        assert (float(svg.get_attribute("data-y0")), float(svg.get_attribute("data-y1"))) == (0.0, 1.0)
        labels = [float(t) for t in charts_fixtures.texts(svg.locator("text.lg-ytick"))]
        assert min(labels) == 0 and max(labels) == 1 and 4 <= len(labels) <= 6
    frame_rect = chart(frame, "zero fraction").locator("rect.lg-frame")
    top, height = float(frame_rect.get_attribute("y")), float(frame_rect.get_attribute("height"))
    ys = {
        y
        for _, y in charts_fixtures.path_points(
            chart(frame, "zero fraction").locator("path.lg-line").get_attribute("d")
        )
    }
    assert all(abs(y - (top + height * (1 - zero_frac))) <= 0.1 for y in ys), (ys, zero_frac)
    # The histograms: 4 to 6 value ticks, step labels that do not overlap.
    assert 4 <= frame.locator(".lg-panel-hist svg text.lg-xtick").count() <= 6
    labels = [t.bounding_box() for t in frame.locator(".lg-panel-hist svg text:not(.lg-xtick)").all()]
    assert len(labels) >= 4
    assert not any(charts_fixtures.boxes_overlap(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :])


def test_numbers_are_printed_with_4_significant_digits_everywhere(env, charts_fixtures, tab_fixtures):
    frame = layer_view(env, charts_fixtures.STEADY, "net/a", step=5)
    cells = frame.locator(".lg-stats-table td[data-value]")
    assert cells.count() >= 10
    for k in range(cells.count()):
        td = cells.nth(k)
        text, exact = td.inner_text(), float(td.get_attribute("data-value"))
        charts_fixtures.assert_four_digits([text])
        assert float(text) == pytest.approx(exact, rel=5e-4, abs=0)
    # The value written: the table's norm is numpy's within 4 significant digits.
    norm = float(frame.locator('td[data-stat="norm"]').first.inner_text())
    x = charts_fixtures.gradient(charts_fixtures.STEADY, "net/a", 5)
    want = tab_fixtures.numpy_stats(x)["norm"]
    assert norm == pytest.approx(want, abs=tab_fixtures.shown_atol(x, "norm", digits=4))
    # Axes (charts, histograms) and a chart's tooltip.
    charts_fixtures.assert_four_digits(charts_fixtures.texts(frame.locator(".lg-layer svg text.lg-tick")))
    svg = frame.locator(".lg-panel-charts svg.lg-lines").first
    box = svg.bounding_box()
    svg.hover(position={"x": box["width"] * 0.5, "y": box["height"] * 0.5})
    frame.locator(".lg-tooltip").wait_for(state="visible")
    charts_fixtures.assert_four_digits(frame.locator(".lg-tooltip td").all_inner_texts())
    # The overview's tooltip.
    frame = env["browser"].open(env["tb"].base, {"run": charts_fixtures.STEADY})
    # Drawn, not only attached: the tooltip needs the matrix the heatmap was drawn from.
    canvas = frame.locator(f".lg-heatmap-canvas[data-cols='{charts_fixtures.STEPS}']")
    canvas.wait_for()
    box = canvas.bounding_box()
    canvas.hover(position={"x": 5.5 * box["width"] / charts_fixtures.STEPS, "y": 0.5 * box["height"] / 2})
    frame.locator(".lg-tooltip").wait_for(state="visible")
    charts_fixtures.assert_four_digits(frame.locator(".lg-tooltip td").all_inner_texts())


def test_the_chosen_step_has_a_colour_no_series_has(env, charts_fixtures):
    frame = layer_view(env, charts_fixtures.ACT, "net/a", step=12)
    frame.wait_for_selector(".lg-panel-act-hist path.lg-ridge.lg-current")
    colour = lambda loc: loc.evaluate("e => getComputedStyle(e).stroke")  # noqa: E731
    markers = frame.locator(".lg-panel-charts line.lg-marker")
    assert markers.count() == 6
    selected = {colour(markers.nth(k)) for k in range(6)}
    assert len(selected) == 1
    (selected,) = selected
    lines = frame.locator(".lg-panel-charts path.lg-line, .lg-panel-charts path.lg-line-raw")
    series = {colour(lines.nth(k)) for k in range(lines.count())}
    assert len(series) == 2 and selected not in series  # output and activation, one colour each
    # The table's swatches are the series' colours; the histograms use them, the chosen step's ridge the marker's.
    swatches = frame.locator(".lg-series-head .lg-swatch")
    by_head = {
        frame.locator(".lg-series-head").nth(k).inner_text(): swatches.nth(k).evaluate(
            "e => getComputedStyle(e).backgroundColor"
        )
        for k in range(swatches.count())
    }
    assert set(by_head.values()) == series
    for panel, head in ((".lg-panel-hist", "output"), (".lg-panel-act-hist", "activation (forward value)")):
        current = frame.locator(f"{panel} path.lg-ridge.lg-current")
        assert current.get_attribute("data-step") == "12" and colour(current) == selected
        others = frame.locator(f"{panel} path.lg-ridge:not(.lg-current)")
        assert others.count() >= 10
        assert {colour(others.nth(k)) for k in range(others.count())} == {by_head[head]}


def test_zoom_reaches_the_histograms(env, charts_fixtures, tab_fixtures):
    def ridge_steps(frame):
        return [
            int(s)
            for s in frame.locator(".lg-panel-hist path.lg-ridge").evaluate_all("es => es.map(e => e.dataset.step)")
        ]

    frame = layer_view(env, charts_fixtures.STEADY, "net/a", zoom="10-25")
    frame.wait_for_selector('.lg-panel-charts .lg-zoom-bar[data-zoom="10-25"]')
    assert ridge_steps(frame) == list(range(10, 26))  # 16 steps: all of them
    assert "10–25 (zoomed)" in frame.locator(".lg-panel-hist .lg-chart-title").inner_text()
    frame.locator(".lg-panel-charts .lg-zoom-reset").click()
    frame.wait_for_function("() => document.querySelectorAll('.lg-panel-hist path.lg-ridge').length === 20")
    steps = ridge_steps(frame)
    assert steps[0] == 0 and steps[-1] == charts_fixtures.STEPS - 1
    # A drag across a chart over steps zooms the histograms too.
    page = env["browser"].page
    svg = frame.locator(".lg-panel-charts svg.lg-lines").first
    catcher = svg.locator("rect.lg-catcher")
    box = catcher.bounding_box()
    y = box["y"] + box["height"] / 2
    at = lambda step: box["x"] + box["width"] * step / (charts_fixtures.STEPS - 1)  # noqa: E731
    page.mouse.move(at(20), y)
    page.mouse.down()
    page.mouse.move(at(30), y, steps=5)
    page.mouse.up()
    frame.wait_for_selector(".lg-panel-charts .lg-zoom-reset")
    a, z = (int(v) for v in tab_fixtures.parent_state(page)["zoom"].split("-"))
    assert 19 <= a <= 21 and 29 <= z <= 31
    frame.wait_for_function(f"() => document.querySelector('.lg-panel-hist path.lg-ridge')?.dataset.step === '{a}'")
    assert ridge_steps(frame) == list(range(a, z + 1))


def test_step_keys_move_the_same_whatever_has_the_focus(env, charts_fixtures):
    frame = layer_view(env, charts_fixtures.STEADY, "net/a", step=0)
    page = env["browser"].page

    def press(key, want):
        page.keyboard.press(key)
        frame.wait_for_selector(f'.lg-stats-table[data-step="{want}"]')
        assert step_shown(frame) == want

    frame.locator(".lg-layer-name").click()  # the page
    press("Shift+ArrowRight", 10)
    frame.locator(".lg-panel-charts svg.lg-lines").first.focus()  # a chart
    press("Shift+ArrowRight", 20)
    frame.locator(".lg-panel-hist svg.lg-hist").focus()  # the histograms
    press("Shift+ArrowLeft", 10)
    frame.locator("input.lg-slider").focus()  # the step slider itself
    press("Shift+ArrowRight", 20)
    press("ArrowRight", 21)
    frame.locator(".lg-icon-btn[aria-label='next step']").focus()  # a button
    press("Shift+ArrowRight", 31)
    press("ArrowLeft", 30)


def test_noise_scale_marks_what_it_cannot_draw_and_draws_one_smoothed_path(env, charts_fixtures, examples_fixtures):
    written = env["written"]
    frame = env["browser"].open(env["tb"].base, {"run": charts_fixtures.NOISY})
    panel = frame.locator('[data-panel="noise-scale"]')
    frame.wait_for_selector(f'[data-panel="noise-scale"] path.lg-line[data-series="{SMOOTHED}"]')
    steps = np.arange(examples_fixtures.STEPS)
    signal = written.signal.astype(np.float32).astype(np.float64)
    for w in (0.6, 0.9):
        if w != 0.6:
            frame.locator(".lg-noise-smoothing").fill(str(w))
            frame.wait_for_function(
                f"() => document.querySelector('[data-panel=\"noise-scale\"]').dataset.smoothing === '{w}'"
            )
        defined = charts_fixtures.ema(signal, w) > 0
        assert not defined.all() and defined.any()  # the run has undefined steps at both weights
        # One path; one stroke per run of defined steps (continuous there), lone steps as dots.
        paths = panel.locator(f'path.lg-line[data-series="{SMOOTHED}"]')
        assert paths.count() == 1
        d = paths.get_attribute("d")
        runs, k = [], 0
        while k < len(defined):
            if defined[k]:
                j = k
                while j + 1 < len(defined) and defined[j + 1]:
                    j += 1
                runs.append((k, j))
                k = j + 1
            else:
                k += 1
        assert d.count("M") == len(runs)
        assert len(charts_fixtures.path_points(d)) == int(defined.sum())
        # Each gap shaded, from the last defined step before it to the first after, with its reason.
        gaps = []
        for (_, j), (k2, _) in zip(runs, runs[1:]):
            gaps.append((int(steps[j]), int(steps[k2])))
        if runs[0][0] > 0:
            gaps.insert(0, (0, int(steps[runs[0][0]])))
        if runs[-1][1] < len(steps) - 1:
            gaps.append((int(steps[runs[-1][1]]), int(steps[-1])))
        bands = panel.locator("rect.lg-undefined-band")
        got = [
            (int(bands.nth(i).get_attribute("data-x0")), int(bands.nth(i).get_attribute("data-x1")))
            for i in range(bands.count())
        ]
        assert got == gaps
        assert "|G|² is ≤ 0" in bands.first.locator("title").text_content()
    assert "shaded: the averaged |G|² is ≤ 0 there" in panel.locator(".lg-muted").first.inner_text()
    # The raw estimate below 0 (a negative signal) is marked at each such step and named under the chart.
    negative = [int(s) for s in steps[signal < 0]]
    marks = panel.locator(f'path.lg-nonpos[data-series="{RAW}"]')
    assert sorted(int(marks.nth(i).get_attribute("data-x")) for i in range(marks.count())) == negative
    assert (
        f"{RAW}: below 0 (not drawn on a log scale) at {len(negative)} steps"
        in panel.locator(".lg-chart-note").inner_text()
    )


def test_the_layer_view_charts_share_the_smoothing(env, charts_fixtures, tab_fixtures):
    frame = layer_view(env, charts_fixtures.STEADY, "net/a")
    norm = chart(frame, "L2 norm")
    frame.locator(".lg-layer-smoothing").fill("0")
    frame.wait_for_function("() => document.querySelector('.lg-layer-smoothing-value')?.textContent === '0.000'")
    assert norm.locator("path.lg-line-raw").count() == 0
    plain = charts_fixtures.path_points(norm.locator("path.lg-line").get_attribute("d"))
    frame.locator(".lg-layer-smoothing").fill("0.9")
    frame.wait_for_function("() => document.querySelector('.lg-layer-smoothing-value')?.textContent === '0.900'")
    raw = charts_fixtures.path_points(norm.locator("path.lg-line-raw").get_attribute("d"))
    smooth = charts_fixtures.path_points(norm.locator("path.lg-line").get_attribute("d"))
    assert raw == plain and smooth != plain
    # The smoothed line is numpy's EMA of the written norms, on the chart's own (log) axis.
    norms = np.array(
        [
            tab_fixtures.numpy_stats(charts_fixtures.gradient(charts_fixtures.STEADY, "net/a", s))["norm"]
            for s in range(charts_fixtures.STEPS)
        ]
    )
    svg = norm.locator("svg")
    y0, y1 = float(svg.get_attribute("data-y0")), float(svg.get_attribute("data-y1"))
    rect = norm.locator("rect.lg-frame")
    top, height = float(rect.get_attribute("y")), float(rect.get_attribute("height"))
    want = top + height * (np.log10(y1) - np.log10(charts_fixtures.ema(norms, 0.9))) / (np.log10(y1) - np.log10(y0))
    np.testing.assert_allclose([y for _, y in smooth], want, atol=0.06)  # the path's one decimal
    # Non-finite counts are never smoothed (a lone NaN step stays a spike).
    assert chart(frame, "non-finite fraction").locator("path.lg-line-raw").count() == 0
    frame.locator(".lg-layer-smoothing").fill("0.6")


def test_a_zero_on_a_log_axis_is_named_and_marked(env, charts_fixtures, tab_fixtures):
    page = env["browser"].page
    frame = env["browser"].open(
        env["tb"].base,
        {"view": "compare", "runs": f'["{charts_fixtures.STEADY}","{charts_fixtures.ZERO}"]', "layer": "net/b"},
    )
    note = frame.locator(".lg-panel-wide .lg-chart-note")
    frame.wait_for_function("() => document.querySelector('.lg-panel-wide .lg-chart-note')?.textContent.length > 0")
    assert (
        note.inner_text()
        == f"▾ under the plot: {charts_fixtures.ZERO}: 0 (not drawn on a log scale) at {charts_fixtures.STEPS} steps"
    )
    marks = frame.locator(f'.lg-panel-wide path.lg-nonpos[data-series="{charts_fixtures.ZERO}"]')
    assert marks.count() == charts_fixtures.STEPS
    # The tooltip says it too.
    svg = frame.locator(".lg-panel-wide svg.lg-lines")
    box = svg.bounding_box()
    svg.hover(position={"x": box["width"] / 2, "y": box["height"] / 2})
    row = frame.locator(".lg-tooltip tr", has_text=charts_fixtures.ZERO).locator("td")
    row.wait_for()
    assert row.inner_text().endswith("0 (not drawn on a log scale)")
    # On a linear axis the zeros are drawn: nothing to say.
    frame.locator('.lg-compare .lg-toggle[aria-label="y scale"] .lg-toggle-btn', has_text="linear").click()
    frame.wait_for_function("() => document.querySelector('.lg-panel-wide .lg-chart-note').textContent === ''")
    assert tab_fixtures.parent_state(page)["log"] == "0"
    frame.locator('.lg-compare .lg-toggle[aria-label="y scale"] .lg-toggle-btn', has_text="log").click()
    # A run alone whose values are all 0: the log scale cannot show it, and the chart says it draws linear.
    frame = env["browser"].open(
        env["tb"].base, {"view": "compare", "runs": f'["{charts_fixtures.ZERO}"]', "layer": "net/b"}
    )
    frame.wait_for_function("() => document.querySelector('.lg-panel-wide .lg-chart-note')?.textContent.length > 0")
    assert (
        frame.locator(".lg-panel-wide .lg-chart-note")
        .inner_text()
        .startswith("no value above 0: drawn on a linear scale")
    )
    item = frame.locator(f'.lg-run-item[data-run="{charts_fixtures.ZERO}"]')
    assert item.locator("input").is_checked() and frame.locator(".lg-run-item.lg-on").count() == 1
    # Unticking the only run compares none, and says so (no other runs come back by themselves).
    item.locator("input").uncheck()
    frame.wait_for_function(
        "() => document.querySelector('.lg-compare .lg-messages')?.textContent.startsWith('No run chosen')"
    )
    assert frame.locator(".lg-run-item.lg-on").count() == 0 and frame.locator(".lg-compare-body").is_hidden()


def test_a_toggle_that_can_show_nothing_is_disabled_with_its_reason(env, charts_fixtures):
    frame = env["browser"].open(
        env["tb"].base, {"view": "compare", "runs": f'["{charts_fixtures.STEADY}","{charts_fixtures.ZERO}"]'}
    )
    button = frame.locator('.lg-toggle[aria-label="values"] .lg-toggle-btn', has_text="activations")
    button.wait_for()
    assert button.is_disabled()
    assert button.get_attribute("title").startswith(
        "Nothing to compare: none of the selected runs recorded activations"
    )
    frame = env["browser"].open(
        env["tb"].base, {"view": "compare", "runs": f'["{charts_fixtures.STEADY}","{charts_fixtures.ACT}"]'}
    )
    button = frame.locator('.lg-toggle[aria-label="values"] .lg-toggle-btn', has_text="activations")
    button.wait_for()
    assert button.is_enabled() and button.get_attribute("title") is None


def test_colour_bar_labels_do_not_overlap(env, charts_fixtures):
    frame = env["browser"].open(env["tb"].base, {"run": charts_fixtures.STEADY})
    frame.wait_for_selector(".lg-colorbar-tick")
    # No label of the colour bar overlaps another, the title or the swatches beside it.
    ticks = [t.bounding_box() for t in frame.locator(".lg-colorbar-tick").all()]
    others = [
        e.bounding_box()
        for e in frame.locator(".lg-heat-legend .lg-legend-title, .lg-heat-legend .lg-legend-item").all()
    ]
    assert len(ticks) >= 2
    assert not any(charts_fixtures.boxes_overlap(a, b) for i, a in enumerate(ticks) for b in ticks[i + 1 :])
    assert not any(charts_fixtures.boxes_overlap(a, b) for a in ticks for b in others)
    charts_fixtures.assert_four_digits(frame.locator(".lg-colorbar-tick").all_inner_texts())


def test_the_overview_step_axis_has_4_to_6_round_ticks_under_their_steps(env, charts_fixtures):
    frame = env["browser"].open(env["tb"].base, {"run": charts_fixtures.STEADY})
    canvas = frame.locator(".lg-overview .lg-heatmap-canvas")
    canvas.wait_for()
    ticks = frame.locator(".lg-overview svg text.lg-xtick")
    frame.wait_for_function("() => document.querySelectorAll('.lg-overview svg text.lg-xtick').length > 0")
    assert 4 <= ticks.count() <= 6
    steps = [int(t) for t in charts_fixtures.texts(ticks)]
    assert steps == sorted(steps) and all(s % 5 == 0 for s in steps)
    width = float(
        frame.locator(".lg-overview svg text.lg-xtick").first.evaluate("e => e.ownerSVGElement.width.baseVal.value")
    )
    xs = [float(x) for x in ticks.evaluate_all("es => es.map(e => e.getAttribute('x'))")]
    assert xs == pytest.approx(
        [(s + 0.5) * width / charts_fixtures.STEPS for s in steps], abs=0.01
    )  # steps 0…39, a column each


def test_every_axis_gets_4_to_6_ticks_inside_its_range(env, charts_fixtures):
    """The tab's own tick functions (run in the page) over many ranges: linear, integer (steps) and log."""
    rng = np.random.default_rng(0)
    linear = [
        (float(a), float(a + s)) for a, s in zip(rng.normal(scale=10.0, size=200), 10.0 ** rng.uniform(-6, 6, 200))
    ]
    integer = [(int(a), int(a + s)) for a, s in zip(rng.integers(0, 10**6, 200), rng.integers(3, 10**6, 200))]
    logs = [(float(10**a), float(10 ** (a + s))) for a, s in zip(rng.uniform(-12, 3, 200), rng.uniform(0.05, 15, 200))]
    frame = env["browser"].open(env["tb"].base, {"run": charts_fixtures.STEADY})
    frame.wait_for_selector(".lg-overview")
    got = frame.evaluate(
        """async ([linear, integer, logs]) => {
            const m = await import('./charts/scale.js');
            return {
                linear: linear.map(([a, b]) => m.niceTicks(a, b)),
                integer: integer.map(([a, b]) => m.niceTicks(a, b, { integer: true })),
                logs: logs.map(([a, b]) => m.niceLogDomain(a, b)),
            };
        }""",
        [linear, integer, logs],
    )
    for (lo, hi), ticks in zip(linear, got["linear"]):
        assert 4 <= len(ticks) <= 6 and lo - 1e-9 * (hi - lo) <= ticks[0] and ticks[-1] <= hi + 1e-9 * (hi - lo)
    for (lo, hi), ticks in zip(integer, got["integer"]):
        assert 4 <= len(ticks) <= 6 and lo <= ticks[0] and ticks[-1] <= hi and all(t == int(t) for t in ticks)
    for (lo, hi), (d0, d1, ticks) in zip(logs, got["logs"]):
        assert 4 <= len(ticks) <= 6, (lo, hi, ticks)
        assert d0 <= lo * (1 + 1e-12) and d1 >= hi * (1 - 1e-12)  # the domain holds the range
        assert d0 * (1 - 1e-9) <= ticks[0] and ticks[-1] <= d1 * (1 + 1e-9) and ticks == sorted(ticks)
        assert d1 / d0 <= max(hi / lo, 1) * 100  # grown by at most a decade at each end


# -- only what is in the data is drawn (generated series: tests/truth_fixtures.py) ----------------------------

# Each line chart of the layer view: its title, frame, axes' ranges, note, and the points of every line and dot.
READ_LINES = r"""() => Array.from(document.querySelectorAll('.lg-panel-charts .lg-chart')).map((c) => {
  const svg = c.querySelector('svg.lg-lines');
  const f = svg.querySelector('rect.lg-frame');
  const points = (d) => (d && d !== 'M0,0' ? d.match(/[ML][^ML]+/g).map((p) => p.slice(1).split(',').map(Number)) : []);
  const num = (k) => Number(svg.dataset[k]);
  return {
    title: c.querySelector('.lg-chart-title').textContent, note: c.querySelector('.lg-chart-note').innerText,
    empty: svg.dataset.empty === '1', x0: num('x0'), x1: num('x1'), y0: num('y0'), y1: num('y1'), log: svg.dataset.log === '1',
    frame: f && ['x', 'y', 'width', 'height'].map((k) => Number(f.getAttribute(k))),
    lines: Array.from(svg.querySelectorAll('path.lg-line, path.lg-line-raw')).map((p) => ({
      raw: p.classList.contains('lg-line-raw'), name: p.dataset.series ?? p.dataset.raw, points: points(p.getAttribute('d'))})),
    dots: Array.from(svg.querySelectorAll('circle.lg-dot')).map((e) => [Number(e.getAttribute('cx')), Number(e.getAttribute('cy'))]),
  };
})"""
# The `stats` answer the page drew from (asked again: the same URL, warm).
PAGE_STATS = """async () => {
  const e = performance.getEntriesByType('resource').filter((r) => new URL(r.name).pathname.endsWith('/stats'))
    .filter((r) => !new URL(r.name).searchParams.has('start') || new URL(r.name).searchParams.has('points'));
  return (await fetch(e[e.length - 1].name)).json();
}"""
CHART_STATS = {
    "L2 norm": "norm",
    "mean |g|": "mean_abs",
    "std": "std",
    "zero fraction": "zero_frac",
    "non-finite fraction": "nonfinite_frac",
}
PX = 0.051  # the path's one decimal


def chart_series(chart: dict, body: dict) -> dict:
    """{line name: (steps, values)} of what `chart` draws from the `stats` answer `body` (frontend/views/layer_charts.js)."""
    title = chart["title"]
    if title.startswith("min · mean · max"):
        if body.get("binned"):
            return {
                "max": (body["steps"], body["max"]["max"]),
                "mean (bin's largest)": (body["steps"], body["max"]["mean"]),
                "min": (body["steps"], body["min"]["min"]),
            }
        return {k: (body["steps"], body["stats"][k]) for k in ("max", "mean", "min")}
    stat = next(v for k, v in CHART_STATS.items() if title.startswith(k))
    if body.get("binned"):
        return {"output": (body["steps"], body["max"][stat]), "output (bin min)": (body["steps"], body["min"][stat])}
    return {"output": (body["steps"], body["stats"][stat])}


def to_pixels(chart: dict, steps, values) -> list:
    """The pixel of each value the chart's axes can draw (finite; above 0 on a log axis), in step order."""
    fx, fy, fw, fh = chart["frame"]
    out = []
    for s, v in zip(steps, values):
        if v is None or not np.isfinite(v) or (chart["log"] and v <= 0):
            continue
        px = fx + (s - chart["x0"]) / (chart["x1"] - chart["x0"]) * fw if chart["x1"] > chart["x0"] else fx
        if chart["log"]:
            f = (np.log10(v) - np.log10(chart["y0"])) / (np.log10(chart["y1"]) - np.log10(chart["y0"]))
        else:
            f = (v - chart["y0"]) / (chart["y1"] - chart["y0"])
        out.append((s, v, px, fy + fh - f * fh))
    return out


def tb_ema(values, w: float) -> list:
    """TensorBoard's smoothing: a debiased EMA over the finite values, None elsewhere."""
    out, last, n = [], 0.0, 0
    for v in values:
        if v is None or not np.isfinite(v):
            out.append(None)
            continue
        last, n = last * w + (1 - w) * v, n + 1
        out.append(last / (1 - w**n))
    return out


def assert_only_data_drawn(charts: list, body: dict, w: float) -> int:
    """Every point drawn is a data point of its series (raw: exactly the drawable ones, in order); a smoothed line
    has a point at exactly the raw line's steps, at numpy's EMA. Returns how many points were checked."""
    checked = 0
    for chart in charts:
        if chart["empty"]:
            assert chart["lines"] == [] or all(not line["points"] for line in chart["lines"]), chart["title"]
            continue
        data = chart_series(chart, body)
        smooth = w > 0 and not chart["title"].startswith("non-finite fraction")
        drawn = {}
        for line in chart["lines"]:
            drawn.setdefault(line["name"], {})["raw" if line["raw"] or not smooth else "smooth"] = line["points"]
        assert set(drawn) == set(data), (chart["title"], set(drawn), set(data))
        for name, (steps, values) in data.items():
            want = to_pixels(chart, steps, values)
            got = drawn[name]["raw"]
            assert len(got) == len(want), (chart["title"], name, len(got), len(want))
            for (s, v, px, py), (gx, gy) in zip(want, got):
                assert abs(gx - px) <= PX and abs(gy - py) <= PX, (chart["title"], name, s, v, (gx, gy), (px, py))
            checked += len(got)
            if smooth:
                ema = tb_ema(values, w)
                drawable = {s for s, *_ in want}
                sm = to_pixels(chart, steps, [e if s in drawable else None for s, e in zip(steps, ema)])
                got = drawn[name]["smooth"]
                assert [s for s, *_ in sm] == [s for s, *_ in want], (chart["title"], name)  # only where the raw is
                assert len(got) == len(sm), (chart["title"], name)
                for (s, v, px, py), (gx, gy) in zip(sm, got):
                    assert abs(gx - px) <= PX and abs(gy - py) <= PX, (chart["title"], name, s, v, (gx, gy), (px, py))
                checked += len(got)
        for cx, cy in chart["dots"]:  # a lone point's dot sits on a point of a line
            assert any(abs(cx - x) <= PX and abs(cy - y) <= PX for line in chart["lines"] for x, y in line["points"]), (
                chart["title"]
            )
    return checked


@pytest.mark.parametrize(
    "run,layer",
    [
        ("gaps", "net/nan"),  # the runs of tests/truth_fixtures.py: GAPS, ONE and LONG
        ("gaps", "net/zero"),
        ("gaps", "net/big"),
        ("gaps", "net/allinf"),
        ("one", "net/nan"),
        ("long", "net/nan"),
    ],
)
def test_every_point_drawn_is_a_data_point_of_its_series(env, run, layer, truth_fixtures):
    frame = env["browser"].open(env["tb"].base, {"run": run, "view": "layer", "layer": layer})
    frame.wait_for_selector(f'.lg-stats-table[data-layer="{layer}"]')
    frame.wait_for_function("() => document.querySelectorAll('.lg-panel-charts svg.lg-lines[data-empty]').length === 6")
    body = frame.evaluate(PAGE_STATS)
    steps = truth_fixtures.steps_of(run)
    if run == truth_fixtures.LONG:
        assert body["binned"]  # 100,000 steps: each drawn value is a bin's largest or smallest, a recorded value
        whole = frame.evaluate(f"async () => (await fetch('./stats?run={run}&layer={layer}')).json()")
        assert whole["steps"] == steps
        norm = np.array([np.nan if v is None else v for v in whole["stats"]["norm"]])
        for j, (a, z) in enumerate(zip(body["steps"], body["last_steps"])):
            assert body["max"]["norm"][j] == np.nanmax(norm[a : z + 1]) and body["min"]["norm"][j] == np.nanmin(
                norm[a : z + 1]
            )
    else:
        assert body["steps"] == steps
    for w in (0.0, 0.6):
        frame.locator(".lg-layer-smoothing").fill(str(w))
        frame.wait_for_function(f"() => document.querySelector('.lg-layer-smoothing-value')?.textContent === '{w:.3f}'")
        charts = frame.evaluate(READ_LINES)
        assert len(charts) == 6
        assert assert_only_data_drawn(charts, body, w) > 0 or layer == "net/allinf"
    by_title = {c["title"].split(" (")[0]: c for c in charts}
    if layer == "net/nan" and run == truth_fixtures.GAPS:
        # No finite element over steps 40-59: nothing drawn there, smoothed or not, and the chart says so.
        note = by_title["mean |g|"]["note"]
        assert "not drawn: output: no value at 20 steps (40–59) — no finite element there" in note, note
        fx, _, fw, _ = by_title["L2 norm"]["frame"]
        at40 = fx + (40 - by_title["L2 norm"]["x0"]) / (by_title["L2 norm"]["x1"] - by_title["L2 norm"]["x0"]) * fw
        assert all(x < at40 - 1 for line in by_title["L2 norm"]["lines"] for x, _ in line["points"])
    if layer == "net/zero":
        # Zeros on a log axis: marked under the plot and named; the smoothed line not drawn over them either.
        assert "output: 0 (not drawn on a log scale) at 5 steps" in by_title["L2 norm"]["note"]
    if layer == "net/big":
        assert "no value at 1 step (12)" in by_title["L2 norm"]["note"]
    if layer == "net/allinf":
        assert by_title["mean |g|"]["empty"]
    frame.locator(".lg-layer-smoothing").fill("0.6")


def test_histogram_ridges_across_decades_get_an_axis_each_and_labels_apart(env, charts_fixtures, tab_fixtures):
    """A gradient growing 10x every 10 steps: by default each ridge on its own range (its label says it), a click
    puts them on one axis; ridge labels never overlap either way."""
    frame = layer_view(env, charts_fixtures.STEADY, "net/a")
    panel = frame.locator(".lg-panel-hist")
    svg = panel.locator("svg.lg-hist")
    assert svg.get_attribute("data-per-step") == "0"  # within 20%: one axis
    assert panel.locator(".lg-hist-spread").inner_text() == ""
    labels = [b for b in (t.bounding_box() for t in panel.locator("text.lg-ridge-label").all())]
    assert len(labels) >= 4 and not any(
        charts_fixtures.boxes_overlap(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]
    )
    # The tab's own chart, on buckets whose range grows 1000-fold over the steps.
    got = frame.evaluate(
        """async () => {
            const m = await import('./charts/histograms.js');
            const lists = Array.from({length: 20}, (_, k) => { const r = 10 ** (k / 6.3) * 1e-4; return [[-r, 0, 3], [0, r, 5]]; });
            return {spread: m.rangeSpread(lists), own: m.ownRange([[-1, 0, 1], [0, 3, 2]]), pos: m.ownRange([[1, 2, 1]]),
                    labels: [...m.labelledRidges([10, 25, 40, 55, 62, 70], 3)].sort((a, b) => a - b)};
        }"""
    )
    assert got["spread"] == pytest.approx(10 ** (19 / 6.3)) and got["own"] == [-3, 3] and got["pos"] == [0, 2]
    assert got["labels"] == [0, 1, 2, 3, 5]  # 62 is within 12 px of the chosen (55)
    frame.locator('.lg-toggle[aria-label="histogram x axis"] .lg-toggle-btn', has_text="axis per step").click()
    frame.wait_for_selector('.lg-panel-hist svg.lg-hist[data-per-step="1"]')
    assert tab_fixtures.parent_state(env["browser"].page)["hx"] == "step"
    texts = charts_fixtures.texts(panel.locator("text.lg-ridge-label"))
    assert all(re.fullmatch(r"step \d+ ±[\d.e-]+", t) for t in texts), texts
    assert charts_fixtures.texts(panel.locator("text.lg-xtick")) == ["−max", "0", "+max"]
    labels = [t.bounding_box() for t in panel.locator("text.lg-ridge-label").all()]
    assert not any(charts_fixtures.boxes_overlap(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :])
    frame.locator('.lg-toggle[aria-label="histogram x axis"] .lg-toggle-btn', has_text="one axis").click()
    frame.wait_for_selector('.lg-panel-hist svg.lg-hist[data-per-step="0"]')


def test_an_axis_has_one_number_format(env, charts_fixtures):
    """The tab's axis format: every tick in exponent form as soon as one needs it (a log axis 1e4…1e6)."""
    frame = env["browser"].open(env["tb"].base, {"run": charts_fixtures.STEADY})
    frame.wait_for_selector(".lg-overview")
    got = frame.evaluate(
        """async () => {
            const m = await import('./format.js');
            const f = (ts) => { const g = m.axisFormat(ts); return ts.map(g); };
            return [f([1e4, 1e5, 1e6]), f([10, 100, 1000]), f([0, 5e5, 1e6, 1.5e6]), f([1e-4, 1e-3, 1e-2]), f([0.2, 0.4])];
        }"""
    )
    assert got == [
        ["1e4", "1e5", "1e6"],
        ["10", "100", "1000"],
        ["0", "5e5", "1e6", "1.5e6"],
        ["1e-4", "1e-3", "1e-2"],
        ["0.2", "0.4"],
    ]


def test_compare_breaks_a_runs_line_where_it_recorded_no_value_and_joins_steps_it_did_not_record(
    env, charts_fixtures, truth_fixtures
):
    """Compare: `gaps` tells a step recorded without a value (the norm overflowed at BIG_STEP: the line breaks)
    from one not recorded (steps 20-24: joined, as TensorBoard joins a run logged at other steps)."""
    frame = env["browser"].open(
        env["tb"].base, {"view": "compare", "runs": f'["{truth_fixtures.GAPS}"]', "layer": "net/big", "stat": "norm"}
    )
    frame.wait_for_selector(f'.lg-panel-wide path.lg-line[data-series="{truth_fixtures.GAPS}"]')
    body = frame.evaluate(
        """async () => {
            const e = performance.getEntriesByType('resource').filter((r) => new URL(r.name).pathname.endsWith('/compare'));
            return (await fetch(e[e.length - 1].name)).json();
        }"""
    )
    assert body["steps"] == truth_fixtures.GAP_STEPS and body["gaps"] == [
        [truth_fixtures.GAP_STEPS.index(truth_fixtures.BIG_STEP)]
    ]
    for w in (0.6, 0.0):
        frame.locator(".lg-compare-smoothing").fill(str(w))
        frame.wait_for_function(
            f"() => document.querySelector('.lg-compare-smoothing-value')?.textContent === '{w:.3f}'"
        )
        svg = frame.locator(".lg-panel-wide svg.lg-lines")
        for sel in ("path.lg-line", "path.lg-line-raw") if w else ("path.lg-line",):
            d = svg.locator(sel).first.get_attribute("d")
            parts = [charts_fixtures.path_points("M" + p) for p in d.split("M")[1:]]
            assert [len(p) for p in parts] == [
                truth_fixtures.BIG_STEP,
                len(truth_fixtures.GAP_STEPS) - truth_fixtures.BIG_STEP - 1,
            ], (sel, w)
    assert "no value at 1 step (12)" in frame.locator(".lg-panel-wide .lg-chart-note").inner_text()
    frame.locator(".lg-compare-smoothing").fill("0.6")
