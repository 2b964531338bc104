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

import tab_fixtures as tf_  # noqa: E402
from tab_fixtures import HOSTILE_LAYER, HOSTILE_RUN, NAN_LAYER, NAN_STEP  # noqa: E402

pytestmark = pytest.mark.timeout(300)

POLL_MS = 1000  # the tab's auto-refresh interval in these tests (12 s by default)
DENSE = "loss|output|net/dense"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("logs"))
    work = tmp_path_factory.mktemp("work")
    # TensorBoard starts (~3 s) while the runs are written: it picks them up as they appear.
    tb = tf_.TensorBoard(logdir, log_path=str(work / "tensorboard.log"))
    browser = None
    try:
        written = tf_.write_tab_logdir(logdir)
        tb.wait_for_runs({"train": tf_.STEPS[-1], "eval": tf_.EVAL_STEPS[-1], HOSTILE_RUN: tf_.STEPS[-1]})
        browser = tf_.Browser(str(work / "profile"), poll_ms=POLL_MS)
        yield {"tb": tb, "browser": browser, "written": written, "logdir": logdir}
    finally:
        if browser is not None:
            browser.close()
        tb.stop()


@pytest.fixture(autouse=True)
def no_browser_errors(env):
    b = env["browser"]
    yield
    dialogs, errors = list(b.dialogs), list(b.errors)
    b.dialogs.clear()
    b.errors.clear()  # one failing test must not fail the next ones
    assert dialogs == [], f"a dialog opened (script ran?): {dialogs}"
    assert errors == [], "errors in the browser:\n" + "\n".join(errors)


def parent_state(page) -> dict:
    """The tab's `lg_*` keys in TensorBoard's URL hash."""
    frag = urllib.parse.urlparse(page.url).fragment
    out = {}
    for part in frag.split("&"):
        if "=" in part:
            k, v = part.split("=", 1)
            if k.startswith("lg_"):
                out[k[3:]] = urllib.parse.unquote(v)
    return out


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


def assert_table_matches(frame, written, run: str, step: int, layer: str = "net/dense", target="loss", source="output"):
    key = f"{target}|{source}|{layer}"
    expected = written.expected_stats(run, layer, step, target, source)
    for stat in ("elements", "nan", "pos_inf", "neg_inf", "zeros"):
        assert table_value(frame, key, stat) == expected[stat], (stat, step)
    for stat in ("min", "max", "mean", "std", "norm", "mean_abs", "rms", "zero_frac"):
        got = table_value(frame, key, stat)
        assert got == pytest.approx(expected[stat], rel=2e-4, abs=1e-9), (stat, step, got, expected[stat])


def cell_click(frame, row: int, col: int):
    canvas = frame.locator(".lg-heatmap-canvas").first
    rows = int(canvas.get_attribute("data-rows"))
    cols = int(canvas.get_attribute("data-cols"))
    box = canvas.bounding_box()
    canvas.click(position={"x": (col + 0.5) * box["width"] / cols, "y": (row + 0.5) * box["height"] / rows})


def test_tab_opens_and_overview_shows_every_layer_in_model_order(env):
    b, page = env["browser"], env["browser"].page
    page.goto(env["tb"].base + "/")
    page.get_by_role("tab", name=tf_.TAB_NAME).click()
    frame = b.frame()
    frame.wait_for_selector(".lg-overview .lg-row-label")
    # The default run is the first in name order: the hostile one. Pick "train".
    frame.select_option('select[aria-label="run"]', "train")
    frame.wait_for_function("() => document.querySelector('.lg-run-name')?.textContent === 'train'")
    labels = frame.locator(".lg-row-label")
    assert labels.evaluate_all("els => els.map(e => e.dataset.layer)") == [p for p, _ in tf_.LAYERS]
    assert labels.all_inner_texts() == ["zeta_embed", "dense", "lstm", "alpha_head"]  # the common "net/" is shown once
    canvas = frame.locator(".lg-heatmap-canvas")
    assert canvas.get_attribute("data-rows") == "4" and canvas.get_attribute("data-cols") == "20"
    # The anomalies the logdir holds: the planted NaN, and an embedding 1e5 times weaker than the head.
    alert = frame.locator(".lg-alert-nonfinite").inner_text()
    assert f"step {NAN_STEP} in {NAN_LAYER}" in alert
    assert frame.locator('.lg-row-chip[data-row="1"] .lg-chip-nonfinite').inner_text() == f"NaN/Inf @{NAN_STEP}"
    assert frame.locator('.lg-row-chip[data-row="0"] .lg-chip-vanishing').count() == 1
    assert frame.locator(".lg-legend-title").inner_text().startswith("L2 norm")
    assert parent_state(page)["run"] == "train"
    # Hover shows the exact value (layer net/lstm, step 4).
    box = canvas.bounding_box()
    canvas.hover(position={"x": 4.5 * box["width"] / 20, "y": 2.5 * box["height"] / 4})
    tip = frame.locator(".lg-tooltip")
    tip.wait_for(state="visible")
    assert "net/lstm" in tip.inner_text()
    norm_text = tip.locator("tr", has_text="L2 norm").locator("td").inner_text()
    assert float(norm_text) == pytest.approx(env["written"].expected_stats("train", "net/lstm", 4)["norm"], rel=1e-5)


def test_click_on_a_cell_opens_the_layer_at_that_step(env):
    b, page, written = env["browser"], env["browser"].page, env["written"]
    frame = b.open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas[data-cols='20']")
    cell_click(frame, row=1, col=NAN_STEP)
    frame.wait_for_selector(".lg-layer .lg-layer-name")
    assert frame.locator(".lg-layer-name").inner_text() == NAN_LAYER
    wait_step(frame, NAN_STEP)
    assert parent_state(page) == {"run": "train", "view": "layer", "layer": NAN_LAYER, "step": str(NAN_STEP)}
    assert_table_matches(frame, written, "train", NAN_STEP)
    assert table_value(frame, DENSE, "nan") == 1 and table_value(frame, DENSE, "pos_inf") == 1
    # Weight gradients beside the output gradient, one column per target.
    heads = frame.locator(".lg-series-head").all_inner_texts()
    assert heads == ["loss · output", "aux · output", "loss · bias (weight)", "loss · kernel (weight)"]
    assert_table_matches(frame, written, "train", NAN_STEP, layer="net/dense/kernel", source="weight")
    assert_table_matches(frame, written, "train", NAN_STEP, target="aux")
    # One line per series in the charts over steps; the raw tensor at this step, with its two non-finite values.
    assert frame.locator(".lg-panel-charts .lg-chart").first.locator("path.lg-line").count() == 4
    frame.wait_for_function("() => /step 7 .*2 non-finite/.test(document.querySelector('.lg-panel-tensor .lg-muted')?.textContent)")
    assert frame.locator(".lg-panel-tensor .lg-heatmap-canvas").get_attribute("data-rows") == "4"
    # Histograms: one ridge per step, the chosen one highlighted.
    assert frame.locator(".lg-panel-hist path.lg-ridge").count() == 20
    assert frame.locator(".lg-panel-hist path.lg-ridge.lg-current").get_attribute("data-step") == str(NAN_STEP)
    frame.locator(".lg-panel-hist .lg-toggle-btn", has_text="overlay").click()
    frame.wait_for_selector(".lg-panel-hist path.lg-overlay-line.lg-current")
    assert parent_state(page)["hist"] == "overlay"


def test_slider_and_arrow_keys_change_the_step_and_the_numbers(env):
    b, page, written = env["browser"], env["browser"].page, env["written"]
    frame = b.open(env["tb"].base, {"run": "train", "view": "layer", "layer": NAN_LAYER, "step": 3})
    wait_step(frame, 3)
    assert_table_matches(frame, written, "train", 3)
    frame.locator(".lg-layer-name").click()  # focus in the tab, not on a control
    page.keyboard.press("ArrowRight")
    wait_step(frame, 4)
    assert_table_matches(frame, written, "train", 4)
    page.keyboard.press("Shift+ArrowRight")
    wait_step(frame, 14)
    assert_table_matches(frame, written, "train", 14)
    page.keyboard.press("ArrowLeft")
    wait_step(frame, 13)
    # The slider itself: focused, the arrow keys move it one logged step.
    slider = frame.locator("input.lg-slider")
    slider.focus()
    page.keyboard.press("ArrowRight")
    wait_step(frame, 14)
    slider.fill("19")
    wait_step(frame, 19)
    assert_table_matches(frame, written, "train", 19)
    assert parent_state(page)["step"] == "19"
    page.keyboard.press("Home")
    wait_step(frame, 0)
    # No raw tensor at step 1: the tab says which one it shows instead.
    page.keyboard.press("ArrowRight")
    wait_step(frame, 1)
    frame.wait_for_function("() => document.querySelector('.lg-panel-tensor .lg-muted')?.textContent.includes('no raw tensor at step 1; showing step 0')")
    # A recurrent layer: per-timestep norms at the chosen step.
    frame.select_option('select[aria-label="layer"]', "net/lstm")
    wait_step(frame, 1, layer="net/lstm")
    frame.wait_for_selector('.lg-panel-ts path.lg-line[data-series="loss · step 1"]')
    assert frame.locator(".lg-panel-ts").is_visible()
    assert frame.locator(".lg-panel-tensor").is_hidden()


def test_compare_runs_shows_both_with_their_own_colours(env):
    b, page, written = env["browser"], env["browser"].page, env["written"]
    frame = b.open(env["tb"].base, {"run": "train", "view": "compare", "layer": "net/lstm", "runs": json.dumps(["train", "eval"]), "step": 8})
    frame.wait_for_selector('.lg-compare path.lg-line[data-series="eval"]')
    assert frame.locator(".lg-run-chip.lg-on").all_inner_texts() == ["eval", "train"]  # chips in name order
    legend = frame.locator(".lg-panel-wide .lg-legend-name").all_inner_texts()
    assert legend == ["train", "eval"]
    colours = frame.locator(".lg-panel-wide path.lg-line").evaluate_all("els => els.map(e => e.getAttribute('stroke'))")
    assert len(colours) == 2 and colours[0] != colours[1]
    # Histograms on common bins and depth profiles, one per run.
    frame.wait_for_selector(".lg-compare path.lg-aligned")
    assert frame.locator(".lg-compare path.lg-aligned").evaluate_all("els => els.map(e => e.dataset.series)") == ["train", "eval"]
    depth = frame.locator(".lg-compare .lg-panel").nth(2)
    assert depth.locator("path.lg-line").count() == 2
    # The CSV holds what is shown: the statistic of both runs over steps, and the depth profiles.
    with page.expect_download() as dl:
        frame.locator(".lg-compare .lg-button", has_text="Download CSV").click()
    rows = list(csv.DictReader(io.StringIO(open(dl.value.path(), encoding="utf-8").read())))
    over = {(r["run"], int(r["step"])): r["value"] for r in rows if r["chart"] == "over_steps"}
    for run, steps in (("train", tf_.STEPS), ("eval", tf_.EVAL_STEPS)):
        for step in steps:
            assert float(over[(run, step)]) == pytest.approx(written.expected_stats(run, "net/lstm", step)["norm"], rel=1e-5)
    depth_rows = [r for r in rows if r["chart"] == "depth_profile" and r["run"] == "eval"]
    assert [r["layer"] for r in depth_rows] == [p for p, _ in tf_.LAYERS]
    assert float(depth_rows[0]["value"]) == pytest.approx(written.expected_stats("eval", "net/zeta_embed", 8)["norm"], rel=1e-5)
    # Picking a run adds it with a new colour; the others keep theirs.
    frame.locator(".lg-run-chip", has_text=HOSTILE_RUN).click()
    frame.wait_for_function("() => document.querySelectorAll('.lg-run-chip.lg-on').length === 3")
    assert json.loads(parent_state(page)["runs"]) == ["train", "eval", HOSTILE_RUN]
    frame.wait_for_selector(".lg-panel-wide .lg-legend-item:nth-child(3)")
    after = frame.locator(".lg-panel-wide .lg-legend-item .lg-swatch").evaluate_all("els => els.map(e => e.style.background)")
    assert len(set(after)) == 3


def test_hostile_run_and_layer_names_render_as_text(env):
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": HOSTILE_RUN})
    frame.wait_for_function("(name) => document.querySelector('.lg-run-name')?.textContent === name", arg=HOSTILE_RUN)
    assert frame.locator('select[aria-label="run"] option:checked').inner_text() == HOSTILE_RUN
    assert frame.locator(".lg-row-label").evaluate_all("els => els.map(e => e.textContent)") == ["first", HOSTILE_LAYER.split("/", 1)[1]]
    cell_click(frame, row=1, col=3)
    frame.wait_for_function("(name) => document.querySelector('.lg-layer-name')?.textContent === name", arg=HOSTILE_LAYER)
    frame.locator(".lg-tab", has_text="Compare runs").click()
    frame.wait_for_selector(".lg-run-chip.lg-on")
    time.sleep(0.5)
    for f in (page, frame):
        assert f.evaluate("() => document.querySelectorAll('img').length") == 0
        assert f.evaluate("() => document.querySelectorAll('[onerror]').length") == 0
    assert b.dialogs == []


def test_route_error_shows_a_message(env):
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": "train", "view": "layer", "layer": "net/nope"})
    box = frame.locator(".lg-layer .lg-error")
    box.wait_for()
    text = box.inner_text()
    assert "net/nope" in text and "not found" in text and "404" in text
    # The browser logs the failed request itself; that one, and only that one, is expected.
    expected = [e for e in b.errors if "status of 404" in e and "layer=net%2Fnope" in e]
    assert len(expected) >= 1
    b.errors[:] = [e for e in b.errors if e not in expected]
    # The rest of the tab still works: pick a layer that exists.
    frame.select_option('select[aria-label="layer"]', "net/dense")
    frame.wait_for_selector('.lg-stats-table[data-layer="net/dense"]')
    assert frame.locator(".lg-layer .lg-error").count() == 0


def test_empty_state_then_data_arrives_by_polling(env):
    b, page = env["browser"], env["browser"].page
    empty = json.dumps({"api_version": 1, "format_version": 1, "stats": [], "default_stat": "norm", "runs": [], "warnings": []})
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


def test_a_run_being_written_refreshes_without_a_reload(env):
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas[data-cols='20']")
    frame.evaluate("() => { document.querySelector('.lg-heatmap-canvas').__mark = 1; }")
    tf_.append_steps(env["logdir"], "train", [20, 21])
    frame.wait_for_selector(".lg-heatmap-canvas[data-cols='22']", timeout=20_000)
    # Same canvas element, updated in place (no full re-render); the new steps are on the axis.
    assert frame.evaluate("() => document.querySelector('.lg-heatmap-canvas').__mark") == 1
    assert "0–21" in frame.locator(".lg-summary-head").inner_text()


def test_state_in_the_url_reopens_the_same_view(env):
    b, page = env["browser"], env["browser"].page
    frame = b.open(env["tb"].base, {"run": "eval", "view": "layer", "layer": "net/alpha_head", "step": 6, "log": "0"})
    wait_step(frame, 6)
    assert_table_matches(frame, env["written"], "eval", 6, layer="net/alpha_head")
    assert frame.locator(".lg-toggle-btn.lg-on", has_text="linear").count() == 1
    frame.locator(".lg-layer-name").click()
    page.keyboard.press("ArrowRight")
    wait_step(frame, 8)  # eval logs every other step
    page.reload()
    frame = b.frame()
    wait_step(frame, 8)
    assert frame.locator(".lg-layer-name").inner_text() == "net/alpha_head"
    assert frame.locator('select[aria-label="run"]').input_value() == "eval"


def test_heatmap_stays_fast_at_200_layers_by_5000_steps(env):
    b = env["browser"]
    frame = b.open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas")
    ms = frame.evaluate(
        """async () => {
          const { Heatmap } = await import('./charts/heatmap.js');
          const { detect } = await import('./anomalies.js');
          const { VIRIDIS, lutIndex } = await import('./charts/colors.js');
          const L = 200, S = 5000;
          const rms = [], norm = [], nonfinite = [], zero_frac = [];
          for (let i = 0; i < L; i++) {
            const r = new Array(S), z = new Array(S), n = new Array(S);
            for (let j = 0; j < S; j++) { r[j] = Math.exp(-i / 20 + Math.sin(j / 50)); z[j] = 0.01; n[j] = (i === 7 && j > 4000) ? 1 : 0; }
            rms.push(r); norm.push(r); nonfinite.push(n); zero_frac.push(z);
          }
          const host = document.createElement('div');
          document.body.appendChild(host);
          const t0 = performance.now();
          const an = detect({ rms, norm, nonfinite, zero_frac }, L, S);
          const map = new Heatmap(host);
          map.draw({ rows: L, cols: S, width: 1000, rowHeight: 3,
            cell: (i, j) => VIRIDIS.packed[lutIndex(Math.log10(rms[i][j]) / -10 + 1)],
            bin: (i, j0) => VIRIDIS.packed[lutIndex(Math.log10(rms[i][j0]) / -10 + 1)] });
          const t = performance.now() - t0;
          host.remove();
          if (an.layers[7].firstNonfinite !== 4001) throw new Error('wrong anomaly');
          return t;
        }"""
    )
    assert ms < 1500, f"200 x 5000 took {ms:.0f} ms"


def _anomaly_rules_from_the_docs():
    """The Python version of the rules, exactly as docs/ANOMALIES.md prints it."""
    text = open(os.path.join(os.path.dirname(__file__), "..", "docs", "ANOMALIES.md"), encoding="utf-8").read()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/ANOMALIES.md", "exec"), namespace)
    return namespace["detect"]


def test_anomaly_rules_match_docs_anomalies_md(env):
    """frontend/anomalies.js and the Python rules of docs/ANOMALIES.md flag the same cells."""
    detect = _anomaly_rules_from_the_docs()
    rng = np.random.default_rng(3)
    layers, steps = 9, 40
    rms = np.exp(rng.normal(-4, 3, size=(layers, steps)))
    rms[2, 25:] *= 1e3  # grows: exploding by the growth rule
    rms[4] *= 1e-6  # vanishing
    rms[5, 10] = 5e3  # exploding by the absolute rule
    rms[rng.random(rms.shape) < 0.05] = np.nan  # missing
    norm = rms * 7.0
    norm[6, 3:] = 0.0  # dead: no gradient
    rms[6, 3:] = np.nan
    nonfinite = np.zeros(rms.shape)
    nonfinite[1, 30:] = 4
    zero_frac = rng.uniform(0, 0.2, size=rms.shape)
    zero_frac[7, 20:] = 0.995  # dead: (almost) all zeros
    missing = np.isnan(rms) & (rng.random(rms.shape) < 0.5)
    for a in (norm, nonfinite, zero_frac):
        a[missing] = np.nan  # some cells not recorded at all
    expected = detect(rms, norm, nonfinite, zero_frac)
    as_json = lambda a: [[None if np.isnan(v) else float(v) for v in row] for row in a]  # noqa: E731
    frame = env["browser"].open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas")
    got = frame.evaluate(
        """async ([m, rows, cols]) => {
          const { detect } = await import('./anomalies.js');
          return Array.from(detect(m, rows, cols).flags);
        }""",
        [{"rms": as_json(rms), "norm": as_json(norm), "nonfinite": as_json(nonfinite), "zero_frac": as_json(zero_frac)}, layers, steps],
    )
    got = np.asarray(got, np.uint8).reshape(layers, steps)
    assert (expected > 0).sum() > 40  # every kind of flag occurs
    assert {int(f) for f in np.unique(expected)} >= {0, 1, 2, 4, 8}
    np.testing.assert_array_equal(got, expected)


def test_url_state_round_trips_any_name_and_keeps_tensorboards_keys(env):
    frame = env["browser"].open(env["tb"].base, {"run": "train"})
    frame.wait_for_selector(".lg-heatmap-canvas")
    names = [HOSTILE_RUN, "a&b=c#d%25e", "run with spaces/and/slashes", "ünïcødé ✓", HOSTILE_LAYER]
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


def test_polls_only_while_the_tab_is_visible(env):
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
        page.evaluate(f"() => {{ document.querySelector('{tf_.IFRAME}').style.height = '0px'; }}")
        page.wait_for_timeout(500)
        hidden_from = len(polls)
        page.wait_for_timeout(3 * POLL_MS)
        assert len(polls) == hidden_from  # hidden: no request at all
        page.evaluate(f"() => {{ document.querySelector('{tf_.IFRAME}').style.height = ''; }}")
        page.wait_for_timeout(1500)
        assert len(polls) > hidden_from  # shown again: catches up at once
    finally:
        page.remove_listener("request", listener)
