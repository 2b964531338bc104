"""Compare at a sweep's scale, in headless Chromium against a real `tensorboard --load_fast=true`.

tests/sweep_fixtures.py's 100 runs x 1,000 steps with hyperparameters logged by `hp.hparams`: all 100 compared
are 100 lines of 1,000 points (how fast they are drawn: bench/tab_sweep.py); hovering a line or its legend entry
highlights that run in the overlay and the depth profile and fades the others; the depth profile of all 100 comes
in one `depth` request, no `matrix` request; their histograms at the step (one `histograms_at` request) are
outlines, with a note, and hovering one highlights that run everywhere (and hovering elsewhere highlights it
there); colouring by a numeric
hyperparameter orders the colours as the values, by a categorical one gives one colour per value, runs without it
grey and counted in the legend; the run list's regular-expression filter, "All" and "None"; hostile names as text.
"""

from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(400), pytest.mark.browser, pytest.mark.slow]

OVERLAY = ".lg-panel-wide"
DEPTH = ".lg-layer-row .lg-panel:last-child"
HIST = ".lg-layer-row .lg-panel:first-child"
NO_VALUE = "rgb(189, 189, 189)"  # frontend/charts/run_colors.js NO_VALUE, as the browser computes it


@pytest.fixture(scope="module")
def env(tmp_path_factory, sweep_fixtures, tab_fixtures, tensorboard_process):
    logdir = str(tmp_path_factory.mktemp("sweep"))
    work = tmp_path_factory.mktemp("work")
    with tab_fixtures.served(
        logdir,
        work,
        {name: sweep_fixtures.STEPS - 1 for name in sweep_fixtures.NAMES},
        lambda: sweep_fixtures.write_sweep_logdir(logdir),
        write_first=True,
        timeout=240,
        load_fast="true",
        reload_interval=0,
    ) as (tb, browser, values):
        logged = sum(1 for v in values.values() if v)
        tb.wait_until(
            lambda p: (
                sum(1 for r in p.get_json(tensorboard_process.PLUGIN_API + "hparams")["runs"] if r["hparams"]) == logged
            ),
            "every run's hyperparameters",
        )
        yield {"tb": tb, "browser": browser, "values": values}


@pytest.fixture(autouse=True)
def no_browser_errors(env, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(env["browser"])


def open_sweep(sweep_fixtures, env, runs=None, **state):
    """The compare view of `runs` (all by default) on net/a, once both line charts hold every run's line and the
    histograms every run's outline."""
    runs = sweep_fixtures.NAMES if runs is None else runs
    frame = env["browser"].open(
        env["tb"].base, {"view": "compare", "layer": "net/a", "runs": json.dumps(runs), **state}
    )
    frame.wait_for_function(
        "([n, ...sel]) => sel.every(s => document.querySelectorAll(s).length === n)",
        arg=[len(runs), f"{OVERLAY} path.lg-line", f"{DEPTH} path.lg-line", f"{HIST} path.lg-aligned"],
        timeout=60_000,
    )
    return frame


def strokes(frame, chart: str):
    """{run: the computed stroke colour of its line}."""
    pairs = frame.locator(f"{chart} path.lg-line").evaluate_all(
        "els => els.map(e => [e.dataset.key, getComputedStyle(e).stroke])"
    )
    return dict(pairs)


def luminance(css: str) -> float:
    r, g, b = (int(v) / 255 for v in re.findall(r"\d+", css)[:3])
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_a_hundred_runs_are_a_hundred_lines_and_one_depth_request(env, charts_fixtures, sweep_fixtures):
    frame = open_sweep(sweep_fixtures, env)
    asked = frame.evaluate(
        """() => ['depth', 'matrix', 'histograms_at', 'histograms'].map(route => performance.getEntriesByType('resource')
                  .filter(e => e.name.includes(`/${route}?`)).length)"""
    )
    assert asked == [1, 0, 1, 0]  # every run's profile in one request, every run's histogram in one
    lines = frame.locator(f"{OVERLAY} path.lg-line").evaluate_all(
        "els => els.map(e => [e.dataset.key, e.getAttribute('d')])"
    )
    assert sorted(k for k, _ in lines) == sorted(sweep_fixtures.NAMES)
    assert all(
        len(charts_fixtures.path_points(d)) == sweep_fixtures.STEPS for _, d in lines
    )  # one path per run, every step
    # The legend: every run by name, as text, scrolling within its own box.
    legend = frame.locator(f"{OVERLAY} .lg-legend")
    assert legend.locator(".lg-legend-name").evaluate_all("els => els.map(e => e.textContent)") == sweep_fixtures.NAMES
    assert legend.evaluate("e => getComputedStyle(e).overflowY === 'auto' && e.scrollHeight > e.clientHeight")
    assert (
        frame.locator(".lg-run-count").inner_text() == f"{sweep_fixtures.RUNS} of {sweep_fixtures.RUNS} runs compared"
    )


def dimmed(frame, chart: str):
    """{run: its line's computed stroke opacity} and the highlighted runs of a chart."""
    rows = frame.locator(f"{chart} path.lg-line").evaluate_all(
        "els => els.map(e => [e.dataset.key, getComputedStyle(e).strokeOpacity, getComputedStyle(e).strokeWidth, e.classList.contains('lg-hi')])"
    )
    return {k: (float(o), w) for k, o, w, _ in rows}, [k for k, _, _, hi in rows if hi]


def assert_highlighted(frame, run: str) -> None:
    hist = frame.locator(f"{HIST} path.lg-aligned").evaluate_all(
        "els => els.map(e => [e.dataset.key, getComputedStyle(e).strokeOpacity, getComputedStyle(e).strokeWidth, e.classList.contains('lg-hi')])"
    )
    assert [k for k, _, _, hi in hist if hi] == [run] and hist[-1][0] == run  # drawn last: on top
    assert {(o, w) for k, o, w, _ in hist if k == run} == {("1", "3px")}
    assert {float(o) for k, o, _, _ in hist if k != run} == {0.12}
    assert frame.locator(f"{HIST} .lg-legend-item.lg-hi .lg-legend-name").all_text_contents() == [run]
    for chart in (OVERLAY, DEPTH):
        style, hi = dimmed(frame, chart)
        assert hi == [run], chart
        assert style[run] == (1.0, "3px"), chart
        others = {o for k, (o, _) in style.items() if k != run}
        assert others == {0.15}, chart
        # Drawn last: on top of the others.
        assert frame.locator(f"{chart} path.lg-line").last.get_attribute("data-key") == run


def test_hovering_a_line_or_its_legend_entry_highlights_the_run_everywhere(env, charts_fixtures, sweep_fixtures):
    page = env["browser"].page
    frame = open_sweep(sweep_fixtures, env)
    svg = frame.locator(f"{OVERLAY} svg.lg-lines")
    svg.scroll_into_view_if_needed()
    # The top line (the largest gain), at the step where it stands furthest from every other line.
    run = sweep_fixtures.NAMES[-1]
    lines = dict(
        frame.locator(f"{OVERLAY} path.lg-line").evaluate_all(
            "els => els.map(e => [e.dataset.key, e.getAttribute('d')])"
        )
    )
    points = {k: charts_fixtures.path_points(d) for k, d in lines.items()}
    gap = lambda n: min(abs(points[run][n][1] - p[n][1]) for k, p in points.items() if k != run)  # noqa: E731
    n = max(range(sweep_fixtures.STEPS), key=gap)
    assert gap(n) > 2.0  # pixels: the pointer cannot be nearer another line
    box = svg.bounding_box()
    page.mouse.move(box["x"] + points[run][n][0], box["y"] + points[run][n][1])
    frame.wait_for_selector(f"{OVERLAY} svg.lg-dimmed")
    assert_highlighted(frame, run)
    assert frame.locator(f"{OVERLAY} .lg-legend-item.lg-hi .lg-legend-name").all_text_contents() == [run]
    # The tooltip: the hovered run first, the lines nearest the pointer, and how many more there are.
    assert frame.locator(".lg-tooltip tr.lg-tooltip-hi th").all_text_contents() == [run]
    assert frame.locator(".lg-tooltip tr").count() == 12
    assert (
        frame.locator(".lg-tooltip-note").inner_text() == f"and {sweep_fixtures.RUNS - 12} more: move closer to a line"
    )
    page.mouse.move(1, 1)
    frame.wait_for_function("() => !document.querySelector('.lg-lines.lg-dimmed')")
    assert dimmed(frame, OVERLAY)[1] == [] and dimmed(frame, DEPTH)[1] == []
    assert frame.locator(f"{HIST} .lg-hi").count() == 0
    # A legend entry (scrolled to, as a person would): the same highlight.
    other = sweep_fixtures.NAMES[37]
    item = frame.locator(f"{OVERLAY} .lg-legend-item").nth(37)
    item.hover()
    frame.wait_for_selector(f"{OVERLAY} svg.lg-dimmed")
    assert_highlighted(frame, other)
    # The run's row in the run list too.
    frame.locator(".lg-run-item").filter(has_text=sweep_fixtures.NAMES[5]).first.hover()
    frame.wait_for_function(
        "(r) => document.querySelector('.lg-panel-wide path.lg-line.lg-hi')?.dataset.key === r",
        arg=sweep_fixtures.NAMES[5],
    )
    assert_highlighted(frame, sweep_fixtures.NAMES[5])
    page.mouse.move(1, 1)


def test_the_histograms_of_a_hundred_runs_are_outlines_and_hovering_one_highlights_it_everywhere(
    env, charts_fixtures, sweep_fixtures
):
    page = env["browser"].page
    frame = open_sweep(sweep_fixtures, env)
    note = frame.locator(f"{HIST} .lg-hist-note").inner_text()
    assert note.startswith(f"{sweep_fixtures.RUNS} runs: each an outline; hover one")
    svg = frame.locator(f"{HIST} svg.lg-hist")
    assert "lg-many" in svg.get_attribute("class")
    assert {
        (o, f)
        for o, f in svg.locator("path.lg-aligned").evaluate_all(
            "els => els.map(e => [getComputedStyle(e).strokeOpacity, getComputedStyle(e).fillOpacity])"
        )
    } == {("0.55", "0")}
    # The outline standing furthest from every other at the middle of one of the common bins.
    outlines = dict(
        svg.locator("path.lg-aligned").evaluate_all("els => els.map(e => [e.dataset.key, e.getAttribute('d')])")
    )
    points = {k: charts_fixtures.path_points(d) for k, d in outlines.items()}
    bins = (len(next(iter(points.values()))) - 2) // 2
    level = lambda k, b: points[k][1 + 2 * b][1]  # noqa: E731 - the y of run k's bin b
    gap = lambda k, b: min(abs(level(k, b) - level(o, b)) for o in points if o != k)  # noqa: E731
    run, b = max(((k, b) for k in points for b in range(bins)), key=lambda kb: gap(*kb))
    assert gap(run, b) > 2.0  # pixels: the pointer cannot be nearer another outline
    box = svg.bounding_box()
    x = (points[run][1 + 2 * b][0] + points[run][2 + 2 * b][0]) / 2
    svg.scroll_into_view_if_needed()
    box = svg.bounding_box()
    page.mouse.move(box["x"] + x, box["y"] + level(run, b))
    frame.wait_for_selector(f"{HIST} svg.lg-dimmed")
    frame.wait_for_selector(f"{OVERLAY} svg.lg-dimmed")
    assert_highlighted(frame, run)
    # The tooltip: the runs nearest the pointer, the hovered one first, and how many more there are.
    assert frame.locator(".lg-tooltip tr.lg-tooltip-hi th").all_text_contents() == [run]
    assert frame.locator(".lg-tooltip tr").count() == 12
    assert (
        frame.locator(".lg-tooltip-note").inner_text()
        == f"and {sweep_fixtures.RUNS - 12} more: move closer to an outline"
    )
    page.mouse.move(1, 1)
    frame.wait_for_function("() => !document.querySelector('.lg-hist.lg-dimmed, .lg-lines.lg-dimmed')")
    # Its legend entry, scrolled to: the same.
    frame.locator(f"{HIST} .lg-legend-item").nth(63).hover()
    frame.wait_for_selector(f"{DEPTH} svg.lg-dimmed")
    assert_highlighted(frame, sweep_fixtures.NAMES[63])
    page.mouse.move(1, 1)


def test_colour_by_a_numeric_hyperparameter_orders_the_colours_as_the_values(env, sweep_fixtures, tab_fixtures):
    page, values = env["browser"].page, env["values"]
    frame = open_sweep(sweep_fixtures, env)
    per_run = strokes(frame, OVERLAY)
    assert len(set(per_run.values())) > 3  # per run by default
    frame.select_option('select[aria-label="colour by"]', "learning_rate")
    frame.wait_for_selector('.lg-color-legend[data-kind="sequential"]')
    assert tab_fixtures.parent_state(page)["color"] == "learning_rate"
    frame.wait_for_function(
        "(c) => getComputedStyle(document.querySelector('.lg-panel-wide path.lg-line')).stroke !== c",
        arg=per_run[sweep_fixtures.NAMES[0]],
    )
    for chart in (OVERLAY, DEPTH):
        got = strokes(frame, chart)
        order = sweep_fixtures.runs_sorted_by(values, "learning_rate")
        lum = [luminance(got[r]) for r in order]
        assert all(a < b for a, b in zip(lum, lum[1:])), chart  # distinct values, in their order
        without = [r for r, hp in values.items() if "learning_rate" not in hp]
        assert without and all(got[r] == NO_VALUE for r in without) and NO_VALUE not in {got[r] for r in order}
    # The legend shows the scale: from the smallest to the largest value, log (three decades), the grey runs.
    lrs = [values[r]["learning_rate"] for r in order]
    bar = frame.locator(".lg-color-bar-wrap")
    assert float(bar.get_attribute("data-lo")) == min(lrs) and float(bar.get_attribute("data-hi")) == max(lrs)
    assert bar.get_attribute("data-log") == "1" and "log scale" in bar.inner_text()
    assert (
        frame.locator(".lg-legend-missing").inner_text()
        == f"grey: {len(without)} of {sweep_fixtures.RUNS} runs without it"
    )
    # Less than a decade: linear. Equal values, equal colours.
    frame.select_option('select[aria-label="colour by"]', "units")
    frame.wait_for_function("() => document.querySelector('.lg-color-bar-wrap')?.dataset.log === '0'")
    got = strokes(frame, OVERLAY)
    by_value = {}
    for r in sweep_fixtures.runs_sorted_by(values, "units"):
        by_value.setdefault(values[r]["units"], set()).add(got[r])
    assert all(len(c) == 1 for c in by_value.values())
    lum = [luminance(next(iter(c))) for _, c in sorted(by_value.items())]
    assert all(a < b for a, b in zip(lum, lum[1:]))
    assert "linear scale" in frame.locator(".lg-color-bar-wrap").inner_text()


def test_colour_by_a_categorical_hyperparameter_gives_one_colour_per_value(env, sweep_fixtures):
    values = env["values"]
    frame = open_sweep(sweep_fixtures, env, color="activation")
    frame.wait_for_selector('.lg-color-legend[data-kind="categorical"]')
    items = frame.locator(".lg-color-legend .lg-legend-item[data-value]")
    names = items.locator(".lg-legend-name").all_text_contents()
    assert names == sorted(sweep_fixtures.ACTIVATIONS)  # as text: one holds HTML
    assert frame.locator(".lg-color-legend b").count() == 0
    swatch = dict(
        zip(names, items.locator(".lg-swatch").evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)"))
    )
    assert len(set(swatch.values())) == len(sweep_fixtures.ACTIVATIONS) and NO_VALUE not in swatch.values()
    for chart in (OVERLAY, DEPTH):
        got = strokes(frame, chart)
        for run, hp in values.items():
            assert got[run] == (swatch[hp["activation"]] if "activation" in hp else NO_VALUE), (chart, run)
    without = sum(1 for hp in values.values() if "activation" not in hp)
    assert (
        frame.locator(".lg-legend-missing").inner_text() == f"grey: {without} of {sweep_fixtures.RUNS} runs without it"
    )
    # The run list shows each run's colour beside its name.
    row = frame.locator(".lg-run-item").filter(has_text=sweep_fixtures.NAMES[1]).first
    assert (
        row.locator(".lg-swatch").evaluate("e => getComputedStyle(e).backgroundColor")
        == swatch[values[sweep_fixtures.NAMES[1]]["activation"]]
    )


def test_the_run_filter_and_all_or_none(env, sweep_fixtures, tab_fixtures):
    page = env["browser"].page
    frame = open_sweep(sweep_fixtures, env)
    listed = lambda: frame.locator(".lg-run-item .lg-run-item-name").all_text_contents()  # noqa: E731
    box = frame.locator(".lg-run-filter")
    box.fill("RUN_00[0-4]$")  # a regular expression, case-insensitive
    frame.wait_for_function("() => document.querySelectorAll('.lg-run-item').length === 5")
    five = [f"sweep/run_00{k}" for k in range(5)]
    assert listed() == five
    assert (
        frame.locator(".lg-run-count").inner_text()
        == f"{sweep_fixtures.RUNS} of {sweep_fixtures.RUNS} runs compared · 5 listed"
    )
    frame.get_by_role("button", name="None", exact=True).click()
    rest = [r for r in sweep_fixtures.NAMES if r not in five]
    frame.wait_for_function(
        "(n) => document.querySelectorAll('.lg-panel-wide path.lg-line').length === n", arg=len(rest)
    )
    assert json.loads(tab_fixtures.parent_state(page)["runs"]) == rest  # the others untouched, in their order
    assert frame.locator(".lg-run-item.lg-on").count() == 0 and listed() == five
    frame.get_by_role("button", name="All", exact=True).click()
    frame.wait_for_function(
        "(n) => document.querySelectorAll('.lg-panel-wide path.lg-line').length === n", arg=sweep_fixtures.RUNS
    )
    assert json.loads(tab_fixtures.parent_state(page)["runs"]) == rest + five
    # An invalid expression says so, and lists nothing to tick.
    box.fill("run_(")
    error = frame.locator(".lg-run-filter-error")
    error.wait_for()
    assert error.inner_text().startswith("not a regular expression: ")
    assert box.get_attribute("aria-invalid") == "true" and frame.locator(".lg-run-item").count() == 0
    assert frame.get_by_role("button", name="All", exact=True).is_disabled()
    assert frame.get_by_role("button", name="None", exact=True).is_disabled()
    box.fill("")
    frame.wait_for_function("(n) => document.querySelectorAll('.lg-run-item').length === n", arg=sweep_fixtures.RUNS)
    assert box.get_attribute("aria-invalid") == "false" and error.inner_text() == ""
    # Unticking one run drops it (and its line).
    frame.locator(".lg-run-item").filter(has_text="sweep/run_050").locator("input").uncheck()
    frame.wait_for_function(
        "(n) => document.querySelectorAll('.lg-panel-wide path.lg-line').length === n", arg=sweep_fixtures.RUNS - 1
    )
    assert "sweep/run_050" not in json.loads(tab_fixtures.parent_state(page)["runs"])
    # The list was updated, not rebuilt: the box keeps the keyboard focus, and Space ticks it again.
    assert frame.evaluate("() => document.activeElement.closest('.lg-run-item')?.dataset.run") == "sweep/run_050"
    page.keyboard.press("Space")
    frame.wait_for_function(
        "(n) => document.querySelectorAll('.lg-panel-wide path.lg-line').length === n", arg=sweep_fixtures.RUNS
    )
    assert json.loads(tab_fixtures.parent_state(page)["runs"])[-1] == "sweep/run_050"


def test_hostile_run_names_are_text_in_the_list_and_the_legends(env, sweep_fixtures, tab_fixtures):
    b = env["browser"]
    hostile = list(sweep_fixtures.HOSTILE.values())
    frame = open_sweep(sweep_fixtures, env, runs=hostile + ["sweep/run_000"], color="activation")
    names = frame.locator(".lg-run-item-name").evaluate_all("els => els.map(e => e.textContent)")
    assert sorted(names) == sorted(sweep_fixtures.NAMES)
    assert frame.locator(".lg-run-item.lg-on .lg-run-item-name").all_text_contents() == sorted(
        hostile + ["sweep/run_000"]
    )
    for chart in (OVERLAY, DEPTH):
        assert frame.locator(f"{chart} .lg-legend-name").all_text_contents() == hostile + ["sweep/run_000"]
    frame.locator(".lg-run-filter").fill("<img")
    frame.wait_for_function("() => document.querySelectorAll('.lg-run-item').length === 1")
    assert frame.locator(".lg-run-item-name").all_text_contents() == [sweep_fixtures.HOSTILE[10]]
    tab_fixtures.assert_nothing_injected(b, frame)
