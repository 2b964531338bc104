"""End-to-end tests of the `layergrad` tab: the real `tensorboard` process, headless Chromium.

One TensorBoard and one browser for the whole module. The logdir is written with the real
`tb_layergrad.summary` ops (tests/tab_fixtures.py); every number the tab shows is checked
against numpy applied to the arrays that were written. After every test, no console error,
page error, CSP violation or dialog may have happened in any frame.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
import urllib.parse

import numpy as np
import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)

from tb_layergrad import metadata  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.browser, pytest.mark.slow]

POLL_MS = 1000  # the tab's auto-refresh interval in these tests (12 s by default)
DENSE = "loss|output|net/dense"


@pytest.fixture(scope="module")
def env(tmp_path_factory, tab_fixtures):
    logdir = str(tmp_path_factory.mktemp("logs"))
    work = tmp_path_factory.mktemp("work")
    last = {
        "train": tab_fixtures.STEPS[-1],
        "eval": tab_fixtures.EVAL_STEPS[-1],
        **{r: tab_fixtures.STEPS[-1] for r in tab_fixtures.HOSTILE_RUNS},
    }
    with tab_fixtures.served(logdir, work, last, lambda: tab_fixtures.write_tab_logdir(logdir), poll_ms=POLL_MS) as (
        tb,
        browser,
        written,
    ):
        yield {"tb": tb, "browser": browser, "written": written, "logdir": logdir}


@pytest.fixture(autouse=True)
def no_browser_errors(env, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(env["browser"])


def shown_number(text: str):
    text = text.strip().replace("−", "-")
    if text in ("—", "·", ""):
        return None
    return float(text)


def table_value(frame, series: str, stat: str):
    return shown_number(frame.locator(f'td[data-series="{series}"][data-stat="{stat}"]').inner_text())


def wait_step(frame, step: int, layer: str = ""):
    extra = f'[data-layer="{layer}"]' if layer else ""
    frame.wait_for_selector(f'.lg-stats-table[data-step="{step}"]{extra}', timeout=10_000)
    assert frame.locator(".lg-step-value").inner_text() == str(step)


def assert_table_matches(
    tab_fixtures, frame, written, run: str, step: int, layer: str = "net/dense", target="loss", source="output"
):
    key = f"{target}|{source}|{layer}"
    expected = written.expected_stats(run, layer, step, target, source)
    for stat in ("elements", "nan", "pos_inf", "neg_inf", "zeros"):
        assert table_value(frame, key, stat) == expected[stat], (stat, step)
    for stat in ("min", "max", "mean", "std", "norm", "mean_abs", "rms", "zero_frac"):
        got = table_value(frame, key, stat)
        atol = tab_fixtures.shown_atol(
            written.arrays[(run, target, source, layer)][step], stat, digits=tab_fixtures.TABLE_DIGITS
        )
        assert got == pytest.approx(expected[stat], rel=0, abs=atol), (stat, step, got, expected[stat])


def cell_click(frame, row: int, col: int):
    canvas = frame.locator(".lg-heatmap-canvas").first
    rows = int(canvas.get_attribute("data-rows"))
    cols = int(canvas.get_attribute("data-cols"))
    box = canvas.bounding_box()
    canvas.click(position={"x": (col + 0.5) * box["width"] / cols, "y": (row + 0.5) * box["height"] / rows})


def test_tab_opens_and_overview_shows_every_layer_in_model_order(env, tab_fixtures):
    b, page = env["browser"], env["browser"].page
    page.goto(env["tb"].base + "/")
    page.get_by_role("tab", name=tab_fixtures.TAB_NAME).click()
    frame = b.frame()
    # Several runs: the tab lands on the Runs view, the run with the NaN first; its name opens its overview.
    frame.wait_for_selector(".lg-runs .lg-runs-table tbody tr")
    assert frame.locator(".lg-runs-table tbody tr").first.get_attribute("data-run") == "train"
    frame.locator('.lg-runs-table tr[data-run="train"] .lg-runs-open').click()
    frame.wait_for_function("() => document.querySelector('.lg-run-name')?.textContent === 'train'")
    labels = frame.locator(".lg-row-label")
    assert labels.evaluate_all("els => els.map(e => e.dataset.layer)") == [p for p, _ in tab_fixtures.LAYERS]
    assert labels.all_inner_texts() == ["zeta_embed", "dense", "lstm", "alpha_head"]  # the common "net/" is shown once
    canvas = frame.locator(".lg-heatmap-canvas")
    assert canvas.get_attribute("data-rows") == "4" and canvas.get_attribute("data-cols") == "20"
    # The anomalies the logdir holds: the planted NaN, and an embedding 1e5 times weaker than the head.
    alert = frame.locator(".lg-alert-nonfinite").inner_text()  # where it broke: no loss series here, so pass unknown
    assert f"step {tab_fixtures.NAN_STEP}: {tab_fixtures.NAN_LAYER} (the loss was not recorded: pass unknown)" in alert
    assert (
        frame.locator('.lg-row-chip[data-row="1"] .lg-chip-nonfinite').inner_text()
        == f"NaN/Inf @{tab_fixtures.NAN_STEP}"
    )
    assert frame.locator('.lg-row-chip[data-row="0"] .lg-chip-vanishing').count() == 1
    assert frame.locator(".lg-legend-title").inner_text().startswith("L2 norm")
    assert tab_fixtures.parent_state(page)["run"] == "train"
    # Hover shows the value (layer net/lstm, step 4).
    box = canvas.bounding_box()
    canvas.hover(position={"x": 4.5 * box["width"] / 20, "y": 2.5 * box["height"] / 4})
    tip = frame.locator(".lg-tooltip")
    tip.wait_for(state="visible")
    assert "net/lstm" in tip.inner_text()
    norm_text = tip.locator("tr", has_text="L2 norm").locator("td").inner_text()
    lstm_4 = env["written"].arrays[("train", "loss", "output", "net/lstm")][4]
    assert float(norm_text) == pytest.approx(
        tab_fixtures.numpy_stats(lstm_4)["norm"],
        rel=0,
        abs=tab_fixtures.shown_atol(lstm_4, "norm", digits=tab_fixtures.TABLE_DIGITS),
    )  # the tab's 4 significant digits


def test_click_on_a_cell_opens_the_layer_at_that_step(env, tab_fixtures):
    b, page, written = env["browser"], env["browser"].page, env["written"]
    frame = b.open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas[data-cols='20']")
    cell_click(frame, row=1, col=tab_fixtures.NAN_STEP)
    frame.wait_for_selector(".lg-layer .lg-layer-name")
    assert frame.locator(".lg-layer-name").inner_text() == tab_fixtures.NAN_LAYER
    wait_step(frame, tab_fixtures.NAN_STEP)
    assert tab_fixtures.parent_state(page) == {
        "run": "train",
        "view": "layer",
        "layer": tab_fixtures.NAN_LAYER,
        "step": str(tab_fixtures.NAN_STEP),
    }
    assert_table_matches(tab_fixtures, frame, written, "train", tab_fixtures.NAN_STEP)
    assert table_value(frame, DENSE, "nan") == 1 and table_value(frame, DENSE, "pos_inf") == 1
    # Weight gradients beside the output gradient, one column per target.
    heads = frame.locator(".lg-series-head").all_inner_texts()
    assert heads == ["loss · output", "aux · output", "loss · bias (weight)", "loss · kernel (weight)"]
    assert_table_matches(
        tab_fixtures, frame, written, "train", tab_fixtures.NAN_STEP, layer="net/dense/kernel", source="weight"
    )
    assert_table_matches(tab_fixtures, frame, written, "train", tab_fixtures.NAN_STEP, target="aux")
    # The layer's CSV: one column per stored statistic, in record order, as the `runs` route names them.
    with page.expect_download() as dl:
        frame.locator(".lg-layer .lg-button", has_text="Download CSV").click()
    rows = list(csv.DictReader(io.StringIO(open(dl.value.path(), encoding="utf-8").read())))
    assert list(rows[0]) == ["run", "target", "source", "layer", "step", "wall_time", *metadata.STAT_FIELDS]
    at_nan = [
        r
        for r in rows
        if (r["target"], r["source"], r["layer"], r["step"])
        == ("loss", "output", tab_fixtures.NAN_LAYER, str(tab_fixtures.NAN_STEP))
    ]
    assert [(float(r["nan"]), float(r["pos_inf"])) for r in at_nan] == [(1.0, 1.0)]
    # One line per series in the charts over steps; the raw tensor at this step, with its two non-finite values.
    assert frame.locator(".lg-panel-charts .lg-chart").first.locator("path.lg-line").count() == 4
    frame.wait_for_function(
        "() => /step 7 .*2 non-finite/.test(document.querySelector('.lg-panel-tensor .lg-muted')?.textContent)"
    )
    assert frame.locator(".lg-panel-tensor .lg-heatmap-canvas").get_attribute("data-rows") == "4"
    # Histograms: one ridge per step, the chosen one highlighted.
    assert frame.locator(".lg-panel-hist path.lg-ridge").count() == 20
    assert frame.locator(".lg-panel-hist path.lg-ridge.lg-current").get_attribute("data-step") == str(
        tab_fixtures.NAN_STEP
    )
    frame.locator(".lg-panel-hist .lg-toggle-btn", has_text="overlay").click()
    frame.wait_for_selector(".lg-panel-hist path.lg-overlay-line.lg-current")
    assert tab_fixtures.parent_state(page)["hist"] == "overlay"


def test_slider_and_arrow_keys_change_the_step_and_the_numbers(env, tab_fixtures):
    b, page, written = env["browser"], env["browser"].page, env["written"]
    frame = b.open(env["tb"].base, {"run": "train", "view": "layer", "layer": tab_fixtures.NAN_LAYER, "step": 3})
    wait_step(frame, 3)
    assert_table_matches(tab_fixtures, frame, written, "train", 3)
    frame.locator(".lg-layer-name").click()  # focus in the tab, not on a control
    page.keyboard.press("ArrowRight")
    wait_step(frame, 4)
    assert_table_matches(tab_fixtures, frame, written, "train", 4)
    page.keyboard.press("Shift+ArrowRight")
    wait_step(frame, 14)
    assert_table_matches(tab_fixtures, frame, written, "train", 14)
    page.keyboard.press("ArrowLeft")
    wait_step(frame, 13)
    # The slider itself: focused, the arrow keys move it one logged step.
    slider = frame.locator("input.lg-slider")
    slider.focus()
    page.keyboard.press("ArrowRight")
    wait_step(frame, 14)
    slider.fill("19")
    wait_step(frame, 19)
    assert_table_matches(tab_fixtures, frame, written, "train", 19)
    assert tab_fixtures.parent_state(page)["step"] == "19"
    page.keyboard.press("Home")
    wait_step(frame, 0)
    # No raw tensor at step 1: the tab says which one it shows instead.
    page.keyboard.press("ArrowRight")
    wait_step(frame, 1)
    frame.wait_for_function(
        "() => document.querySelector('.lg-panel-tensor .lg-muted')?.textContent.includes('no raw tensor at step 1; showing step 0')"
    )
    # A recurrent layer: per-timestep norms at the chosen step.
    frame.select_option('select[aria-label="layer"]', "net/lstm")
    wait_step(frame, 1, layer="net/lstm")
    frame.wait_for_selector('.lg-panel-ts path.lg-line[data-series="loss · step 1"]')
    assert frame.locator(".lg-panel-ts").is_visible()
    assert frame.locator(".lg-panel-tensor").is_hidden()


def test_compare_runs_shows_both_with_their_own_colours(env, tab_fixtures):
    b, page, written = env["browser"], env["browser"].page, env["written"]
    frame = b.open(
        env["tb"].base,
        {"run": "train", "view": "compare", "layer": "net/lstm", "runs": json.dumps(["train", "eval"]), "step": 8},
    )
    frame.wait_for_selector('.lg-compare path.lg-line[data-series="eval"]')
    # The run list in name order, the compared runs ticked.
    assert frame.locator(".lg-run-item.lg-on .lg-run-item-name").all_inner_texts() == ["eval", "train"]
    assert frame.locator(".lg-run-item.lg-on input").evaluate_all("els => els.every(e => e.checked)")
    legend = frame.locator(".lg-panel-wide .lg-legend-name").all_inner_texts()
    assert legend == ["train", "eval"]
    colours = frame.locator(".lg-panel-wide path.lg-line").evaluate_all("els => els.map(e => e.getAttribute('stroke'))")
    assert len(colours) == 2 and colours[0] != colours[1]
    # Histograms on common bins and depth profiles, one per run.
    frame.wait_for_selector(".lg-compare path.lg-aligned")
    assert frame.locator(".lg-compare path.lg-aligned").evaluate_all("els => els.map(e => e.dataset.series)") == [
        "train",
        "eval",
    ]
    depth = frame.locator(".lg-compare .lg-panel").nth(2)
    assert depth.locator("path.lg-line").count() == 2
    # The CSV holds what is shown: the statistic of both runs over steps, and the depth profiles.
    with page.expect_download() as dl:
        frame.locator(".lg-compare .lg-button", has_text="Download CSV").click()
    rows = list(csv.DictReader(io.StringIO(open(dl.value.path(), encoding="utf-8").read())))
    over = {(r["run"], int(r["step"])): r["value"] for r in rows if r["chart"] == "over_steps"}
    for run, steps in (("train", tab_fixtures.STEPS), ("eval", tab_fixtures.EVAL_STEPS)):
        for step in steps:
            a = written.arrays[(run, "loss", "output", "net/lstm")][step]
            assert float(over[(run, step)]) == pytest.approx(
                tab_fixtures.numpy_stats(a)["norm"], rel=0, abs=tab_fixtures.shown_atol(a, "norm")
            )
    depth_rows = [r for r in rows if r["chart"] == "depth_profile" and r["run"] == "eval"]
    assert [r["layer"] for r in depth_rows] == [p for p, _ in tab_fixtures.LAYERS]
    zeta = written.arrays[("eval", "loss", "output", "net/zeta_embed")][8]
    assert float(depth_rows[0]["value"]) == pytest.approx(
        tab_fixtures.numpy_stats(zeta)["norm"], rel=0, abs=tab_fixtures.shown_atol(zeta, "norm")
    )
    # Picking a run adds it with a new colour; the others keep theirs.
    frame.locator(".lg-run-item", has_text=tab_fixtures.HOSTILE_RUN).locator("input").check()
    frame.wait_for_function("() => document.querySelectorAll('.lg-run-item.lg-on').length === 3")
    assert json.loads(tab_fixtures.parent_state(page)["runs"]) == ["train", "eval", tab_fixtures.HOSTILE_RUN]
    frame.wait_for_selector(".lg-panel-wide .lg-legend-item:nth-child(3)")
    after = frame.locator(".lg-panel-wide .lg-legend-item .lg-swatch").evaluate_all(
        "els => els.map(e => e.style.background)"
    )
    assert len(set(after)) == 3


def test_hostile_run_and_layer_names_render_as_text(env, tab_fixtures):
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": tab_fixtures.HOSTILE_RUN})
    frame.wait_for_function(
        "(name) => document.querySelector('.lg-run-name')?.textContent === name", arg=tab_fixtures.HOSTILE_RUN
    )
    assert frame.locator('select[aria-label="run"] option:checked').inner_text() == tab_fixtures.HOSTILE_RUN
    assert frame.locator(".lg-row-label").evaluate_all("els => els.map(e => e.textContent)") == [
        "first",
        tab_fixtures.HOSTILE_LAYER.split("/", 1)[1],
    ]
    cell_click(frame, row=1, col=3)
    frame.wait_for_function(
        "(name) => document.querySelector('.lg-layer-name')?.textContent === name", arg=tab_fixtures.HOSTILE_LAYER
    )
    frame.locator(".lg-tab", has_text="Compare runs").click()
    frame.wait_for_selector(".lg-run-item.lg-on")
    time.sleep(0.5)
    for f in (page, frame):
        assert f.evaluate("() => document.querySelectorAll('img').length") == 0
        assert f.evaluate("() => document.querySelectorAll('[onerror]').length") == 0
    assert b.dialogs == []


def test_route_error_shows_a_message(env):
    b = env["browser"]
    frame = b.open(env["tb"].base, {"run": "train", "view": "layer", "layer": "net/nope"})
    box = frame.locator(".lg-layer .lg-error")
    box.wait_for()
    text = box.inner_text()
    assert "net/nope" in text and "not found" in text and "404" in text
    # The rest of the tab still works: pick a layer that exists.
    frame.select_option('select[aria-label="layer"]', "net/dense")
    frame.wait_for_selector('.lg-stats-table[data-layer="net/dense"]')
    assert frame.locator(".lg-layer .lg-error").count() == 0
    # The browser logs the failed requests itself (`stats`, and `anomalies`, which may answer after the message
    # is shown: hence only now); those, and only those, are expected.
    expected = [e for e in b.errors if "status of 404" in e and "layer=net%2Fnope" in e]
    assert len(expected) >= 1
    b.errors[:] = [e for e in b.errors if e not in expected]


def test_empty_state_then_data_arrives_by_polling(env):
    b, page = env["browser"], env["browser"].page
    empty = json.dumps(
        {"api_version": 1, "format_version": 1, "stats": [], "default_stat": "norm", "runs": [], "warnings": []}
    )
    pattern = "**/data/plugin/layergrad/runs*"
    page.route(pattern, lambda route: route.fulfill(status=200, content_type="application/json", body=empty))
    try:
        frame = b.open(env["tb"].base, {"run": "train"})
        frame.wait_for_selector(".lg-empty")
        text = frame.locator(".lg-empty").inner_text()
        assert "No layer gradients" in text and "tb_layergrad.capture(model, tape=tape)" in text
        assert "tb_layergrad.summary.gradients" in text and "tb_layergrad.GradientLogger(" in text
    finally:
        page.unroute(pattern)
    frame.wait_for_selector(".lg-heatmap-canvas[data-cols='20']", timeout=10_000)  # the next poll brings the data


def test_a_run_being_written_refreshes_without_a_reload(env, tab_fixtures):
    b = env["browser"]
    frame = b.open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas[data-cols='20']")
    frame.evaluate("() => { document.querySelector('.lg-heatmap-canvas').__mark = 1; }")
    tab_fixtures.append_steps(env["logdir"], "train", [20, 21])
    frame.wait_for_selector(".lg-heatmap-canvas[data-cols='22']", timeout=20_000)
    # Same canvas element, updated in place (no full re-render); the new steps are on the axis.
    assert frame.evaluate("() => document.querySelector('.lg-heatmap-canvas').__mark") == 1
    assert "0–21" in frame.locator(".lg-summary-head").inner_text()


def test_state_in_the_url_reopens_the_same_view(env, tab_fixtures):
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": "eval", "view": "layer", "layer": "net/alpha_head", "step": 6, "log": "0"})
    wait_step(frame, 6)
    assert_table_matches(tab_fixtures, frame, env["written"], "eval", 6, layer="net/alpha_head")
    assert frame.locator(".lg-toggle-btn.lg-on", has_text="linear").count() == 1
    frame.locator(".lg-layer-name").click()
    page.keyboard.press("ArrowRight")
    wait_step(frame, 8)  # eval logs every other step
    page.reload()
    frame = b.frame()
    wait_step(frame, 8)
    assert frame.locator(".lg-layer-name").inner_text() == "net/alpha_head"
    assert frame.locator('select[aria-label="run"]').input_value() == "eval"


def test_heatmap_draws_200_layers_by_5000_steps(env):
    """Decoding a 200 x 5000 `anomalies` answer onto the grid and drawing it (the rules themselves run
    on the server: tests/reader/test_report_rules.py checks them at this size)."""
    b = env["browser"]
    frame = b.open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas")
    drawn = frame.evaluate(
        """async () => {
          const { Heatmap } = await import('./charts/heatmap.js');
          const { fromRoute, firstNonfinite } = await import('./anomalies.js');
          const { VIRIDIS, lutIndex } = await import('./charts/colors.js');
          const L = 200, S = 5000;
          const rms = [];
          for (let i = 0; i < L; i++) {
            const r = new Array(S);
            for (let j = 0; j < S; j++) r[j] = Math.exp(-i / 20 + Math.sin(j / 50));
            rms.push(r);
          }
          const steps = Array.from({ length: S }, (_, j) => 10 * j);
          const names = Array.from({ length: L }, (_, i) => `m/l${i}`);
          const body = {
            steps, max_rms: steps.map(() => 1), thresholds: { VANISH_REL: 1e-3 },
            layers: names.map((layer, i) => ({
              layer, recorded: S, last_step: steps[S - 1], now: i === 7 ? ['nonfinite'] : (i > 150 ? ['vanishing'] : []),
              counts: { nonfinite: i === 7 ? S - 4001 : 0, vanishing: i > 150 ? S : 0, exploding: 0, dead: 0 },
              first_nonfinite: i === 7 ? steps[4001] : null,
              flags: i === 7 ? '0'.repeat(4001) + '1'.repeat(S - 4001) : (i > 150 ? '2' : '0').repeat(S),
            })),
          };
          const host = document.createElement('div');
          document.body.appendChild(host);
          const an = fromRoute(body, names, steps);
          const map = new Heatmap(host);
          map.draw({ rows: L, cols: S, width: 1000, rowHeight: 3,
            cell: (i, j) => VIRIDIS.packed[lutIndex(Math.log10(rms[i][j]) / -10 + 1)],
            bin: (i, j0) => VIRIDIS.packed[lutIndex(Math.log10(rms[i][j0]) / -10 + 1)] });
          const canvas = host.querySelector(".lg-heatmap-canvas");
          const size = canvas && [canvas.width, canvas.height];
          host.remove();
          const first = firstNonfinite(an);
          if (an.layers[7].firstNonfinite !== 4001 || first.step !== 40010 || first.layers.join() !== '7') throw new Error('wrong anomaly');
          if (an.flags[7 * S + 4000] !== 0 || an.flags[7 * S + 4001] !== 1 || an.flags[199 * S + 9] !== 2) throw new Error('wrong flags');
          return size;
        }"""
    )
    assert drawn is not None and drawn[0] > 0 and drawn[1] > 0  # a canvas was drawn


def test_overview_flags_are_the_routes_and_match_numpy(env, tab_fixtures, report_fixtures):
    """The overview asks the `anomalies` route (it computes no rule), and the flags it places on its grid
    are the cell-by-cell evaluation of docs/ANOMALIES.md on the arrays that were written."""
    b, page = env["browser"], env["browser"].page
    asked = []
    listener = lambda r: asked.append(r.url) if "/layergrad/anomalies?" in r.url else None  # noqa: E731
    page.on("request", listener)
    try:
        frame = b.open(env["tb"].base, {"run": "train"})
        frame.wait_for_selector(".lg-heatmap-canvas")
        frame.wait_for_function("() => document.querySelector('.lg-run-name')?.textContent === 'train'")
    finally:
        page.remove_listener("request", listener)
    assert any("run=train" in u for u in asked)
    assert "detect" not in frame.evaluate("async () => Object.keys(await import('./anomalies.js'))")
    got = frame.evaluate(
        """async () => {
          const { api } = await import('./api.js');
          const { fromRoute } = await import('./anomalies.js');
          const body = await api.anomalies({ run: 'train' });
          const layers = body.layers.map((l) => l.layer);
          const an = fromRoute(body, layers, body.steps);
          return { layers, steps: body.steps, flags: Array.from(an.flags), first: an.layers.map((l) => l.firstNonfiniteStep) };
        }"""
    )
    layers, steps = got["layers"], got["steps"]
    assert (
        layers == [p for p, _ in tab_fixtures.LAYERS] and steps[:20] == tab_fixtures.STEPS
    )  # (an earlier test may have appended 20, 21)
    m = {k: np.full((len(layers), len(steps)), np.nan) for k in ("rms", "norm", "nonfinite", "zero_frac")}
    for i, layer in enumerate(layers):
        for j, step in enumerate(steps):
            for k, v in report_fixtures.numpy_cell(tab_fixtures.layer_array("train", "loss", layer, step)).items():
                m[k][i, j] = v
    expected = report_fixtures.reference_detect(m["rms"], m["norm"], m["nonfinite"], m["zero_frac"])
    np.testing.assert_array_equal(np.asarray(got["flags"], np.uint8).reshape(expected.shape), expected)
    assert (expected[0] & 2).all()  # the embedding, 1e5 times weaker than the head, vanishes at every step
    assert got["first"] == [None, tab_fixtures.NAN_STEP, None, None]


def verdict_chips(frame):
    """The layer view's verdict line: (series key, state, text) per chip."""
    frame.wait_for_selector(".lg-layer-verdict .lg-chip")
    return frame.locator(".lg-layer-verdict .lg-chip").evaluate_all(
        "els => els.map(e => [e.dataset.series, e.dataset.state, e.textContent])"
    )


def test_layer_view_shows_the_layers_verdict(env, tab_fixtures, tensorboard_process):
    """The layer view's chips are the route's verdict of the layer, one per series (target, source, the weights
    it owns), as the overview and the report show it: the vanishing one needs the other layers (a one-layer
    evaluation in the browser could never show it). A chip opens the step its verdict names."""
    b = env["browser"]
    for layer, step, want in ((tab_fixtures.NAN_LAYER, 2, "nonfinite"), ("net/zeta_embed", 3, "vanishing")):
        frame = b.open(env["tb"].base, {"run": "train", "view": "layer", "layer": layer, "step": step})
        wait_step(frame, step, layer)
        chips = verdict_chips(frame)
        keys = [k for k, _, _ in chips]
        assert keys[0] == f"loss|output|{layer}" and len(keys) == len(set(keys))
        assert {tuple(k.split("|")[:2]) for k in keys} >= {("loss", "output")}
        for key, state, text in chips:
            target, source, path = key.split("|", 2)
            query = urllib.parse.urlencode({"run": "train", "target": target, "source": source, "layer": path})
            verdict = env["tb"].get_json(f"{tensorboard_process.PLUGIN_API}anomalies?{query}")["layers"][0]["verdict"]
            assert state == verdict["state"], key
            assert text.endswith(f": {verdict['text']}") and text.startswith(f"{target} · "), (key, text)
        assert chips[0][1] == want
        if layer == tab_fixtures.NAN_LAYER:  # its two targets' outputs and the two weights it owns
            assert len(chips) == 4
    frame = b.open(env["tb"].base, {"run": "train", "view": "layer", "layer": tab_fixtures.NAN_LAYER, "step": 2})
    wait_step(frame, 2)
    chip = frame.locator(f'.lg-layer-verdict .lg-chip[data-series="loss|output|{tab_fixtures.NAN_LAYER}"]')
    assert chip.inner_text() == f"loss · output: NaN/Inf @{tab_fixtures.NAN_STEP}"
    chip.click()
    wait_step(frame, tab_fixtures.NAN_STEP)
    assert tab_fixtures.parent_state(b.page)["step"] == str(tab_fixtures.NAN_STEP)


def test_url_state_round_trips_any_name_and_keeps_tensorboards_keys(env, tab_fixtures):
    frame = env["browser"].open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas")
    names = [*tab_fixtures.HOSTILE_NAMES, "a&b=c#d%25e", "run with spaces/and/slashes", "ünïcødé ✓"]
    out = frame.evaluate(
        """async (names) => {
          const { stateFromHash, hashWithState, parseHash } = await import('./state.js');
          const results = [];
          for (const name of names) {
            const hash = hashWithState('#layergrad&_smoothingWeight=0.6&tagFilter=a%26b', { run: name, layer: name, step: 12, view: 'layer', runs: [name, 'x'] });
            const back = stateFromHash('#' + hash);
            const kept = parseHash('#' + hash);
            results.push([back.run, back.layer, back.step, back.view, back.runs, kept.head, kept.pairs.slice(0, 2)]);
          }
          return results;
        }""",
        names,
    )
    for name, (run, layer, step, view, runs, head, tb_pairs) in zip(names, out):
        assert (run, layer, step, view, runs) == (name, name, 12, "layer", [name, "x"])
        assert head == ["layergrad"] and tb_pairs == [["_smoothingWeight", "0.6"], ["tagFilter", "a&b"]]


def test_polls_only_while_the_tab_is_visible(env, tab_fixtures):
    """TensorBoard hides (height 0) rather than destroys the iframe of a tab that is not shown."""
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas")
    polls = []
    listener = lambda r: polls.append(r.url) if r.url.endswith("/layergrad/runs") else None  # noqa: E731
    page.on("request", listener)
    try:
        page.wait_for_timeout(2 * POLL_MS + 700)
        assert len(polls) >= 1  # visible: polling
        page.evaluate(f"() => {{ document.querySelector('{tab_fixtures.IFRAME}').style.height = '0px'; }}")
        page.wait_for_timeout(500)
        hidden_from = len(polls)
        page.wait_for_timeout(3 * POLL_MS)
        assert len(polls) == hidden_from  # hidden: no request at all
        page.evaluate(f"() => {{ document.querySelector('{tab_fixtures.IFRAME}').style.height = ''; }}")
        page.wait_for_timeout(1500)
        assert len(polls) > hidden_from  # shown again: catches up at once
    finally:
        page.remove_listener("request", listener)


# -- hostile names: attribute breakouts, </script>, javascript:, in every view ---------------


# Anything a payload could have turned into if it had been parsed as HTML.
def texts(frame, selector: str):
    """textContent (not innerText: hidden options count too) of every match."""
    return frame.locator(selector).evaluate_all("els => els.map(e => e.textContent)")


def wait_text(frame, selector: str, text: str, timeout: float = 10_000):
    frame.wait_for_function(
        "([sel, t]) => document.querySelector(sel)?.textContent === t", arg=[selector, text], timeout=timeout
    )


def take_expected_errors(b, *needles: str):
    """Remove (and return) the browser's own 'Failed to load resource' lines for requests made on purpose."""
    expected = [e for e in b.errors if "Failed to load resource" in e and all(n in e for n in needles)]
    b.errors[:] = [e for e in b.errors if e not in expected]
    return expected


def test_attribute_breakout_names_render_as_text_in_every_view(env, tab_fixtures):
    """A run, layers and a target named with attribute breakouts (`" autofocus onfocus="...`, `'><svg onload=...>`),
    a closing `</script>` and `javascript:` URLs: shown as the exact text in the overview, layer view, compare view,
    run/layer/target selectors, tooltips and legends; no element, attribute or script comes out of them."""
    b, page = env["browser"], env["browser"].page
    all_runs = sorted(["train", "eval", *tab_fixtures.HOSTILE_RUNS])
    # Overview.
    frame = b.open(env["tb"].base, {"run": tab_fixtures.HOSTILE_ATTR_RUN})
    wait_text(frame, ".lg-run-name", tab_fixtures.HOSTILE_ATTR_RUN)
    frame.wait_for_function(
        "(n) => document.querySelectorAll('.lg-row-label').length === n", arg=len(tab_fixtures.HOSTILE_ATTR_LAYERS)
    )
    assert texts(frame, 'select[aria-label="run"] option') == all_runs
    assert texts(frame, 'select[aria-label="run"] option:checked') == [tab_fixtures.HOSTILE_ATTR_RUN]
    assert texts(frame, ".lg-row-label") == tab_fixtures.HOSTILE_ATTR_LAYERS  # no common prefix: the full names
    assert (
        frame.locator(".lg-row-label").evaluate_all("els => els.map(e => e.dataset.layer)")
        == tab_fixtures.HOSTILE_ATTR_LAYERS
    )
    assert texts(frame, 'select[aria-label="target"] option') == sorted(["loss", tab_fixtures.HOSTILE_TARGET])
    assert frame.locator('select[aria-label="target"]').is_visible()
    href = frame.locator(".lg-overview a.lg-button").get_attribute("href")
    assert href.startswith("./csv?run=") and urllib.parse.parse_qs(href.split("?", 1)[1])["run"] == [
        tab_fixtures.HOSTILE_ATTR_RUN
    ]
    canvas = frame.locator(".lg-heatmap-canvas")
    box = canvas.bounding_box()
    canvas.hover(position={"x": 2.5 * box["width"] / 20, "y": 0.5 * box["height"] / 3})
    frame.locator(".lg-tooltip").wait_for(state="visible")
    assert texts(frame, ".lg-tooltip-title") == [tab_fixtures.HOSTILE_ATTR_LAYERS[0]]
    page.mouse.move(0, 0)
    tab_fixtures.assert_nothing_injected(b, frame)
    # The hostile target: picked in the selector, its overview has the one layer that has it.
    frame.select_option('select[aria-label="target"]', tab_fixtures.HOSTILE_TARGET)
    frame.wait_for_function("() => document.querySelectorAll('.lg-row-label').length === 1")
    assert texts(frame, ".lg-row-label") == [tab_fixtures.HOSTILE_ATTR_LAYERS[0]]
    assert texts(frame, 'select[aria-label="target"] option:checked') == [tab_fixtures.HOSTILE_TARGET]
    assert tab_fixtures.parent_state(page)["target"] == tab_fixtures.HOSTILE_TARGET
    frame.select_option('select[aria-label="target"]', "loss")
    # Layer view of each hostile layer (picked in the layer selector: no page load in between).
    frame.locator(".lg-row-label").first.click()
    frame.wait_for_selector(".lg-layer .lg-stats-table")
    assert texts(frame, 'select[aria-label="layer"] option') == tab_fixtures.HOSTILE_ATTR_LAYERS
    for layer in tab_fixtures.HOSTILE_ATTR_LAYERS:
        if texts(frame, ".lg-layer-name") != [layer]:
            frame.select_option('select[aria-label="layer"]', layer)
        wait_text(frame, ".lg-layer-name", layer)
        frame.wait_for_function("(l) => document.querySelector('.lg-stats-table')?.dataset.layer === l", arg=layer)
        assert frame.locator(".lg-stats-table").get_attribute("data-run") == tab_fixtures.HOSTILE_ATTR_RUN
        assert texts(frame, 'select[aria-label="layer"] option:checked') == [layer]
        assert (
            frame.locator(".lg-layer-head .lg-muted").text_content().startswith(tab_fixtures.HOSTILE_ATTR_RUN + " · ")
        )
        assert tab_fixtures.parent_state(page)["layer"] == layer
        tab_fixtures.assert_nothing_injected(b, frame)
    # The layer with two targets: the hostile one in the table's heads, the legend, the header, the histogram selector.
    frame.select_option('select[aria-label="layer"]', tab_fixtures.HOSTILE_ATTR_LAYERS[0])
    wait_text(frame, ".lg-layer-name", tab_fixtures.HOSTILE_ATTR_LAYERS[0])
    series = ["loss · output", f"{tab_fixtures.HOSTILE_TARGET} · output"]
    frame.wait_for_function("(n) => document.querySelectorAll('.lg-series-head').length === n", arg=2)
    assert texts(frame, ".lg-series-head") == series
    assert texts(frame, ".lg-panel-charts .lg-panel-head .lg-legend-name") == series
    assert texts(frame, 'select[aria-label="histogram series"] option') == series
    assert (
        frame.locator(".lg-layer-head .lg-muted")
        .text_content()
        .endswith(f"targets: {tab_fixtures.HOSTILE_TARGET}, loss")
    )
    tab_fixtures.assert_nothing_injected(b, frame)
    # Compare: three hostile runs; one lacks the layer and is named in a note.
    frame = b.open(
        env["tb"].base,
        {
            "run": tab_fixtures.HOSTILE_ATTR_RUN,
            "view": "compare",
            "layer": "net/first",
            "runs": json.dumps(list(tab_fixtures.HOSTILE_RUNS)),
        },
    )
    frame.wait_for_selector(".lg-compare path.lg-line")
    assert texts(frame, ".lg-run-item-name") == all_runs
    assert texts(frame, ".lg-run-item.lg-on .lg-run-item-name") == sorted(tab_fixtures.HOSTILE_RUNS)
    assert texts(frame, ".lg-compare .lg-note") == [f"No layer 'first' in: {tab_fixtures.HOSTILE_ATTR_RUN}."]
    assert set(texts(frame, ".lg-panel-wide .lg-legend-name")) <= set(tab_fixtures.HOSTILE_RUNS)
    assert tab_fixtures.HOSTILE_RUN in texts(
        frame, ".lg-panel-wide .lg-legend-name"
    ) and tab_fixtures.HOSTILE_JS_RUN in texts(frame, ".lg-panel-wide .lg-legend-name")
    keys = texts(frame, '.lg-compare select[aria-label="layer"] option')
    assert keys == [
        "first",
        tab_fixtures.HOSTILE_LAYER.split("/", 1)[1],
        *[k.split("/", 1)[-1] for k in tab_fixtures.HOSTILE_ATTR_LAYERS],
    ]  # paths without the model
    assert texts(frame, '.lg-compare select[aria-label="target"] option') == sorted(
        ["loss", tab_fixtures.HOSTILE_TARGET]
    )
    tab_fixtures.assert_nothing_injected(b, frame)
    # The overview of the `javascript:` run: its CSV link stays a relative URL of the plugin.
    frame = b.open(env["tb"].base, {"run": tab_fixtures.HOSTILE_JS_RUN})
    wait_text(frame, ".lg-run-name", tab_fixtures.HOSTILE_JS_RUN)
    link = frame.locator(".lg-overview a.lg-button")
    assert link.get_attribute("href") == "./csv?" + urllib.parse.urlencode(
        {"run": tab_fixtures.HOSTILE_JS_RUN, "target": "loss", "source": "output"}
    )
    assert (
        link.evaluate("a => a.protocol") == "http:"
        and link.get_attribute("download") == f"layergrad-{tab_fixtures.HOSTILE_JS_RUN}.csv"
    )
    tab_fixtures.assert_nothing_injected(b, frame)


def test_hostile_names_inside_error_messages_render_as_text(env, tab_fixtures):
    """Unknown names that are HTML: the route's 404 message quotes them, the tab shows that message as text."""
    b, page = env["browser"], env["browser"].page
    layer = "net/<script>alert(10)</script>"
    frame = b.open(env["tb"].base, {"run": tab_fixtures.HOSTILE_ATTR_RUN, "view": "layer", "layer": layer})
    box = frame.locator(".lg-layer .lg-error")
    box.wait_for()
    assert f"layer '{layer}' of run '{tab_fixtures.HOSTILE_ATTR_RUN}'" in box.text_content()
    assert f"layer '{layer}' not found" in box.text_content() and "(HTTP 404 from 'stats')" in box.text_content()
    assert box.locator("*").evaluate_all("els => els.map(e => e.tagName)") == ["STRONG", "SPAN"]  # nothing else inside
    assert f"{layer} (not in this run)" in texts(frame, 'select[aria-label="layer"] option')
    tab_fixtures.assert_nothing_injected(b, frame)
    # An unknown run, then a target the run does not have.
    run = '"><img src=q onerror=alert(11)>'
    frame = b.open(env["tb"].base, {"run": run})
    box = frame.locator(".lg-overview .lg-error")
    box.wait_for()
    assert f"Could not load the gradient-flow matrix of run '{run}'" in box.text_content()
    assert f"run {run!r} not found" in box.text_content()
    assert f"{run} (not found)" in texts(frame, 'select[aria-label="run"] option')
    tab_fixtures.assert_nothing_injected(b, frame)
    frame = b.open(env["tb"].base, {"run": "train", "target": tab_fixtures.HOSTILE_TARGET})
    box = frame.locator(".lg-overview .lg-error")
    box.wait_for()
    assert f"target {tab_fixtures.HOSTILE_TARGET!r} not found in run 'train'" in box.text_content()
    assert f"{tab_fixtures.HOSTILE_TARGET} (not in run)" in texts(frame, 'select[aria-label="target"] option')
    tab_fixtures.assert_nothing_injected(b, frame)
    # The browser logs each 404 itself: those only. The `anomalies` one may come after the message is shown.
    deadline = time.monotonic() + 10
    while not any("/layergrad/anomalies?run=train" in e for e in b.errors):
        assert time.monotonic() < deadline, b.errors
        page.wait_for_timeout(50)
    # The overview asks for more columns of the unknown target (its flags' statistics): left, so that no late 404
    # of this view lands in the next test's errors.
    page.goto("about:blank")
    assert take_expected_errors(b, "status of 404")


# -- faults injected on the plugin's routes (page.route on top of the real TensorBoard) ---------------

HTML_PAGE = (
    "<!doctype html><html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1>"
    "<img src=x onerror=alert(12)><script>alert(13)</script></body></html>"
)
FAULTS = {
    # kind: (what is sent, text the tab must show)
    "json500": ("500 + the plugin's JSON error", "<b>boom</b> the data server went away (HTTP 500 from '{route}')"),
    "html502": ("502 + an HTML page", "HTTP 502 Bad Gateway: an HTML page instead of the plugin's JSON"),
    "abort": ("no answer (connection refused)", "cannot reach TensorBoard (Failed to fetch). Is it still running?"),
}


class Fault:
    """Makes one of the plugin's routes fail in the browser (`kind` of FAULTS) until `heal()`; then passes through."""

    def __init__(self, page, plugin: str, route: str, kind: str):
        self.page, self.plugin, self.route, self.kind = page, plugin, route, kind
        self.failed = 0
        self.failing = True
        # The route itself, not a static file named alike (`sweep` and `sweep.js`).
        self._match = lambda url: urllib.parse.urlsplit(url).path.endswith(f"/data/plugin/{plugin}/{route}")  # noqa: E731
        page.route(self._match, self._handle)

    def _handle(self, route):
        if not self.failing:
            return route.continue_()
        self.failed += 1
        if self.kind == "abort":
            return route.abort("connectionrefused")
        if self.kind == "html502":
            return route.fulfill(status=502, content_type="text/html", body=HTML_PAGE)
        return route.fulfill(
            status=500,
            content_type="application/json",
            body=json.dumps({"error": "<b>boom</b> the data server went away"}),
        )

    def expected_text(self) -> str:
        return FAULTS[self.kind][1].format(route=self.route)

    def wait_failed(self, n: int, timeout: float = 10.0):
        """Until `n` requests have failed (the tab keeps asking while it fails)."""
        deadline = time.monotonic() + timeout
        while self.failed < n:
            assert time.monotonic() < deadline, f"only {self.failed} requests to '{self.route}' in {timeout} s"
            self.page.wait_for_timeout(100)

    def heal(self):
        self.failing = False

    def remove(self, b):
        self.page.unroute(self._match, self._handle)
        # The browser logs each failed request itself: those, and only those, are expected.
        expected = take_expected_errors(b, f"/{self.plugin}/{self.route}")
        assert len(expected) >= min(1, self.failed), (self.failed, expected)


def assert_readable(box_text: str, fault: Fault):
    assert fault.expected_text() in box_text, box_text
    for junk in ("SyntaxError", "Unexpected token", "JSON.parse", "undefined", "[object", "<!doctype", "<script"):
        assert junk not in box_text, box_text


@pytest.mark.parametrize("kind", list(FAULTS))
def test_runs_route_failing_at_start_shows_a_message_and_recovers(env, kind, tab_fixtures):
    """The very first `runs` request fails: a message instead of a blank tab; the tab keeps asking and fills in
    once the route answers again (and "Retry now" asks at once)."""
    b, page = env["browser"], env["browser"].page
    fault = Fault(page, tab_fixtures.PLUGIN, "runs", kind)
    try:
        frame = b.open(env["tb"].base, {"run": "train"})
        box = frame.locator(".lg-banner .lg-error")
        box.wait_for()
        text = box.text_content()
        assert text.startswith("Could not load the list of runs: ")
        assert_readable(text, fault)
        assert (
            frame.locator(".lg-tabs").is_visible() and frame.locator(".lg-tab[disabled]").count() == 4
        )  # Runs, Overview, Layer, Compare
        assert box.is_visible() and box.bounding_box()["height"] > 10
        fault.wait_failed(fault.failed + 1)  # polling goes on; the message stays
        assert frame.locator(".lg-banner .lg-error").text_content() == text
        assert frame.evaluate(tab_fixtures.INJECTED_JS) == []
        fault.heal()
        if kind == "json500":
            # "Retry now" does not wait for the next poll.
            frame.evaluate("() => window.layergradApp.poller.setInterval(600000)")
            box.locator(".lg-retry").click()
        frame.wait_for_selector(".lg-heatmap-canvas", timeout=10_000)
        wait_text(frame, ".lg-run-name", "train")
        assert frame.locator(".lg-banner .lg-error").count() == 0
        assert frame.locator(".lg-row-label").count() == len(tab_fixtures.LAYERS)
    finally:
        fault.remove(b)


def test_runs_route_failing_mid_session_keeps_the_data_and_says_so(env, tab_fixtures):
    """TensorBoard goes away while the tab is open: the overview stays, a message says why nothing updates,
    and goes once TensorBoard answers again."""
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas")
    wait_text(frame, ".lg-run-name", "train")
    fault = Fault(page, tab_fixtures.PLUGIN, "runs", "abort")
    try:
        box = frame.locator(".lg-banner .lg-error")
        box.wait_for(timeout=10_000)
        assert_readable(box.text_content(), fault)
        assert frame.locator(".lg-row-label").count() == len(
            tab_fixtures.LAYERS
        )  # the data shown before is still there
        fault.heal()
        box.wait_for(state="detached", timeout=10_000)
        assert frame.locator(".lg-status").text_content().startswith("updated ")
    finally:
        fault.remove(b)


VIEW_FAULTS = [
    # (state, route that fails, kind, selector shown once the route works)
    ({"run": "train"}, "matrix", "json500", ".lg-row-label"),
    ({"run": "train"}, "matrix", "html502", ".lg-row-label"),
    ({"run": "train"}, "matrix", "abort", ".lg-row-label"),
    (
        {"run": "train", "view": "layer", "layer": "net/dense"},
        "stats",
        "html502",
        '.lg-stats-table[data-layer="net/dense"]',
    ),
    (
        {"run": "train", "view": "compare", "layer": "net/lstm", "runs": json.dumps(["train", "eval"])},
        "compare",
        "json500",
        '.lg-compare path.lg-line[data-series="eval"]',
    ),
    ({"view": "runs"}, "sweep", "html502", '.lg-runs-table tr[data-run="train"]'),
]


@pytest.mark.parametrize(
    "state,route,kind,ready", VIEW_FAULTS, ids=[f"{s.get('view', 'overview')}-{r}-{k}" for s, r, k, _ in VIEW_FAULTS]
)
def test_view_route_failing_shows_a_message_in_the_view_and_recovers(env, state, route, kind, ready, tab_fixtures):
    """`runs` works, the route a view draws from fails: the view (toolbar and all) says so, asks again on the next
    polls while the failure is one that can pass (5xx, no connection), and draws once the route works."""
    b, page = env["browser"], env["browser"].page
    view = state.get("view", "overview")
    fault = Fault(page, tab_fixtures.PLUGIN, route, kind)
    try:
        frame = b.open(env["tb"].base, state)
        box = frame.locator(f".lg-{view} .lg-messages .lg-error")
        box.wait_for()
        text = box.text_content()
        assert_readable(text, fault)
        assert "the tab tries again by itself" in text and box.locator(".lg-retry").is_visible()
        assert frame.locator(f".lg-{view} .lg-toolbar").first.is_visible()  # not a blank page
        assert frame.locator(".lg-banner .lg-error").count() == 0  # the app itself is fine (no uncaught error)
        tried = fault.failed
        fault.wait_failed(tried + 1)  # asked again by the poll
        fault.heal()
        frame.wait_for_selector(ready, timeout=10_000)
        assert frame.locator(f".lg-{view} .lg-error").count() == 0
    finally:
        fault.remove(b)
