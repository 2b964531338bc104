"""The tab on a long run (100,000 steps), in headless Chromium: bins, the NaN step, zoom, click-through.

A real `tensorboard --load_fast=true` serves tests/long_fixtures.py's run; the browser helpers are
tests/tab_fixtures.py's. The heatmap asks for one bin per pixel (`points`), must still show the NaN
step in red and open it exactly; a zoom (URL state, or a drag across the heatmap) refetches the range
at full resolution; "Reset zoom" goes back to the whole run.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(300), pytest.mark.browser, pytest.mark.slow]

MID = "loss|output|net/mid"


@pytest.fixture(scope="module")
def env(tmp_path_factory, long_fixtures, tab_fixtures):
    logdir = str(tmp_path_factory.mktemp("long"))
    work = tmp_path_factory.mktemp("work")
    with tab_fixtures.served(
        logdir,
        work,
        {long_fixtures.RUN: long_fixtures.STEPS - 1},
        lambda: long_fixtures.write_long_logdir(logdir),
        write_first=True,
        timeout=120,
        load_fast="true",
        reload_interval=0,
    ) as (tb, browser, written):
        yield {"tb": tb, "browser": browser, "written": written}


@pytest.fixture(autouse=True)
def no_browser_errors(env, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(env["browser"])


def heatmap_cols(frame) -> int:
    return int(frame.locator(".lg-overview .lg-heatmap-canvas").get_attribute("data-cols"))


def red_columns(frame, row: int):
    """Pixel columns of the heatmap row `row` painted the non-finite red (#e4002b, maybe blended with the black
    ring that marks a layer's first non-finite cell; viridis has no red)."""
    return frame.locator(".lg-overview .lg-heatmap-canvas").evaluate(
        """(c, row) => {
            const rows = Number(c.dataset.rows);
            const y = Math.floor((row + 0.5) * c.height / rows);
            const px = c.getContext('2d').getImageData(0, y, c.width, 1).data;
            const out = [];
            for (let x = 0; x < c.width; x++) if (px[4*x] >= 90 && px[4*x+1] < 40 && px[4*x+2] < 60) out.push(x);
            return out;
        }""",
        row,
    )


def test_a_long_run_is_binned_shows_its_nan_and_opens_it_exactly(env, long_fixtures, tab_fixtures):
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": long_fixtures.RUN})
    frame.wait_for_function("() => document.querySelector('.lg-zoom-bar')?.textContent.includes('bins')")
    cols = heatmap_cols(frame)
    assert 100 <= cols < 2000  # one bin per pixel, not 100,000 columns
    assert (
        frame.locator('.lg-row-chip[data-row="1"] .lg-chip-nonfinite').inner_text()
        == f"NaN/Inf @{long_fixtures.NAN_STEP}"
    )
    nan_bin = long_fixtures.NAN_STEP * cols // long_fixtures.STEPS  # bins of equal step ranges over [0, 99999]
    width = frame.locator(".lg-overview .lg-heatmap-canvas").evaluate("c => c.width")
    reds = red_columns(frame, 1)
    assert reds and all(abs(x * cols / width - (nan_bin + 0.5)) <= 2 for x in reds), (reds, nan_bin)
    assert red_columns(frame, 0) == [] and red_columns(frame, 2) == []
    # Over the red pixel, the tooltip says which step a click opens (the bin's NaN step); the click opens it.
    canvas = frame.locator(".lg-overview .lg-heatmap-canvas")
    box = canvas.bounding_box()
    note = frame.locator(".lg-tooltip-note")
    # A pixel is about one bin wide and the iframe's offset may be fractional: try points across the red pixel.
    for at in (
        {"x": (x + d) * box["width"] / width, "y": 1.5 * box["height"] / 3} for x in reds for d in (0.5, 1.0, 0.0)
    ):
        canvas.hover(position=at)
        frame.wait_for_function("() => document.querySelector('.lg-tooltip-note')?.textContent.startsWith('click')")
        if str(long_fixtures.NAN_STEP) in note.inner_text():
            break
    assert note.inner_text() == f"click: this layer at step {long_fixtures.NAN_STEP} (the bin's first non-finite step)"
    canvas.click(position=at)
    frame.wait_for_selector(
        f'.lg-stats-table[data-step="{long_fixtures.NAN_STEP}"][data-layer="net/mid"]', timeout=20_000
    )
    assert tab_fixtures.parent_state(page)["step"] == str(long_fixtures.NAN_STEP)
    frame.wait_for_function(
        f"() => document.querySelector('td[data-series=\"{MID}\"][data-stat=\"nan\"]')?.textContent === '3'"
    )
    want_norm = env["written"].column("net/mid", "norm")[long_fixtures.NAN_STEP]
    shown = float(frame.locator(f'td[data-series="{MID}"][data-stat="norm"]').get_attribute("data-value"))
    assert shown == pytest.approx(want_norm, rel=1e-15)
    # The layer view's charts are binned too, and mark the NaN step exactly.
    frame.wait_for_selector(
        f'.lg-panel-charts .lg-xmark title:text-is("non-finite values at step {long_fixtures.NAN_STEP}")',
        state="attached",
    )
    # A step between kept ones (the slider's neighbour) shows exact numbers, fetched for that step.
    b.page.keyboard.press("ArrowRight")
    frame.wait_for_function(
        f"() => Number(document.querySelector('.lg-step-value').textContent) > {long_fixtures.NAN_STEP}"
    )
    step = int(frame.locator(".lg-step-value").inner_text())
    frame.wait_for_selector(f'.lg-stats-table[data-step="{step}"]')
    frame.wait_for_function(
        f"() => document.querySelector('td[data-series=\"{MID}\"][data-stat=\"nan\"]')?.textContent === '0'"
    )
    shown = float(frame.locator(f'td[data-series="{MID}"][data-stat="norm"]').get_attribute("data-value"))
    assert shown == pytest.approx(env["written"].column("net/mid", "norm")[step], rel=1e-15)


def test_zoom_from_the_url_is_full_resolution(env, long_fixtures, tab_fixtures):
    b, page = env["browser"], env["browser"].page
    start, end = long_fixtures.NAN_STEP - 150, long_fixtures.NAN_STEP + 150
    frame = b.open(env["tb"].base, {"run": long_fixtures.RUN, "zoom": f"{start}-{end}"})
    frame.wait_for_selector(f'.lg-zoom-bar[data-zoom="{start}-{end}"]')
    frame.wait_for_function(
        f"() => document.querySelector('.lg-overview .lg-heatmap-canvas')?.dataset.cols === '{end - start + 1}'"
    )
    assert "bins" not in frame.locator(".lg-zoom-bar").inner_text()
    cols = end - start + 1
    width = frame.locator(".lg-overview .lg-heatmap-canvas").evaluate("c => c.width")
    reds = red_columns(frame, 1)
    assert reds and all(abs(x * cols / width - (long_fixtures.NAN_STEP - start)) <= 1 for x in reds)
    frame.locator(".lg-overview .lg-zoom-reset").click()
    frame.wait_for_function("() => document.querySelector('.lg-zoom-bar')?.textContent.includes('bins')")
    assert "zoom" not in tab_fixtures.parent_state(page)


def test_drag_across_the_heatmap_zooms_in_to_full_resolution(env, long_fixtures, tab_fixtures):
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": long_fixtures.RUN})
    frame.wait_for_function("() => document.querySelector('.lg-zoom-bar')?.textContent.includes('bins')")
    cols = heatmap_cols(frame)
    canvas = frame.locator(".lg-overview .lg-heatmap-canvas")
    box = canvas.bounding_box()
    y = box["y"] + box["height"] / 2
    x0 = box["x"] + (cols // 2 + 0.5) * box["width"] / cols
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(x0 + 8 * box["width"] / cols, y, steps=4)
    page.mouse.up()
    frame.wait_for_selector(".lg-overview .lg-zoom-reset")
    zoom = tab_fixtures.parent_state(page)["zoom"]
    a, z = (int(v) for v in zoom.split("-"))
    assert a < z and z - a + 1 <= 10 * long_fixtures.STEPS / cols  # about nine bins' worth of steps
    frame.wait_for_function(
        f"() => document.querySelector('.lg-overview .lg-heatmap-canvas')?.dataset.cols === '{z - a + 1}'"
    )
    assert frame.locator(".lg-layer").count() == 0  # a drag is not a click: still the overview
