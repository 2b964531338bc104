"""The Runs view (the tab's landing page for a sweep) and its scatter, in headless Chromium on a real TensorBoard.

Under both loaders (`--load_fast=true` and `false`), on two logdirs:
- `tb-layergrad demo --quick`'s (tests/conftest.py): its sweep (learning rate x activation, `hp.KerasCallback`)
  among the demo's other runs. What the table shows is checked against the `sweep` route's JSON and against
  `tb-layergrad report`'s; sorting, the regex and hyperparameter filters, the selection that Compare shows,
  the scatter's points and clicks.
- `runs_view_fixtures`'s: hyperparameters written by `hp.hparams` and `hp.KerasCallback`, a run without any,
  a column mixing numbers and strings, and hostile names and values (HTML, 10,000 characters, NaN).
After every test: no dialog, no console error, no page error, no CSP violation in any frame.
"""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(900), pytest.mark.browser, pytest.mark.slow]

CELL_CHARS = 120  # frontend/views/runs_table.js: characters a cell shows before "…"

# The table as shown: header ids, and per row (in the order shown) its run, visibility, tick and cells.
READ = """() => ({
  heads: Array.from(document.querySelectorAll('.lg-runs-table thead th[data-col]')).map((th) => ({
    col: th.dataset.col, text: th.textContent, sort: th.getAttribute('aria-sort')})),
  rows: Array.from(document.querySelectorAll('.lg-runs-table tbody tr')).map((tr) => ({
    run: tr.dataset.run, hidden: tr.hidden, checked: tr.querySelector('input[type=checkbox]').checked,
    cells: Object.fromEntries(Array.from(tr.querySelectorAll('td[data-col]')).map((td) => [td.dataset.col, {
      text: td.textContent, title: td.title || (td.querySelector('[title]') || {}).title || '',
      state: td.dataset.state ?? null}]))})),
})"""
POINTS = """() => Array.from(document.querySelectorAll('.lg-scatter-point')).map((c) => ({
  run: c.dataset.key, x: c.dataset.x, y: Number(c.dataset.y), cx: Number(c.getAttribute('cx')),
  cy: Number(c.getAttribute('cy')), fill: c.getAttribute('fill')}))"""


def serve(tensorboard_process, logdir: str, load_fast: str, work, wanted: int):
    """A real TensorBoard on `logdir` once its `sweep` route lists `wanted` runs with health."""
    tb = tensorboard_process.TensorBoardProcess(logdir, str(work / "tensorboard.log"), load_fast=load_fast)
    try:

        def ready(p) -> bool:
            runs = p.get_json(tensorboard_process.PLUGIN_API + "sweep")["runs"]
            return len(runs) >= wanted and all(r["layers"] for r in runs)

        tb.wait_until(ready, f"{wanted} runs in the sweep route", timeout=120)
        return tb
    except BaseException:
        tb.stop()
        raise


@pytest.fixture(scope="module")
def browser(tmp_path_factory, tab_fixtures):
    """One headless Chromium for the module (Playwright's sync API runs one at a time)."""
    b = tab_fixtures.Browser(str(tmp_path_factory.mktemp("runs_profile")), poll_ms=60_000)
    yield b
    b.close()


@pytest.fixture(scope="module", params=["true", "false"], ids=["load_fast", "python_loader"])
def demo_tab(request, demo, browser, tmp_path_factory, tensorboard_process, tab_fixtures):
    work = tmp_path_factory.mktemp(f"runs_demo_{request.param}")
    tb = serve(tensorboard_process, demo["logdir"], request.param, work, len({run for run, _ in demo["by_target"]}))
    try:
        sweep = tb.get_json(tensorboard_process.PLUGIN_API + "sweep")
        yield {"tb": tb, "browser": browser, "demo": demo, "sweep": sweep, "digits": tab_fixtures.TABLE_DIGITS}
    finally:
        tb.stop()


@pytest.fixture(scope="module")
def fixtures_logdir(tmp_path_factory, runs_view_fixtures):
    d = str(tmp_path_factory.mktemp("runs_view_logdir"))
    runs_view_fixtures.write_runs_view_logdir(d)
    return d


@pytest.fixture(scope="module", params=["true", "false"], ids=["load_fast", "python_loader"])
def hp_tab(request, fixtures_logdir, browser, tmp_path_factory, tensorboard_process, tab_fixtures):
    work = tmp_path_factory.mktemp(f"runs_hp_{request.param}")
    tb = serve(tensorboard_process, fixtures_logdir, request.param, work, 4 + len(tab_fixtures.HOSTILE_RUNS))
    try:
        sweep = tb.get_json(tensorboard_process.PLUGIN_API + "sweep")
        yield {"tb": tb, "browser": browser, "sweep": sweep, "digits": tab_fixtures.TABLE_DIGITS}
    finally:
        tb.stop()


@pytest.fixture(autouse=True)
def no_browser_errors(browser, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(browser)


def open_runs(env, state=None):
    """Open the tab (with `lg_*` state); wait until the Runs view has drawn its table."""
    frame = env["browser"].open(env["tb"].base, state)
    frame.wait_for_selector(".lg-runs[data-draw-ms]", timeout=30_000)
    return frame


def read(frame) -> dict:
    return frame.evaluate(READ)


def shown(frame) -> list:
    return [r["run"] for r in read(frame)["rows"] if not r["hidden"]]


def number(text: str):
    text = text.strip().replace("−", "-")
    return None if text in ("", "—") else float(text)


def assert_number(text: str, want, digits: int) -> None:
    """`text` shows `want` with the tab's `digits` significant digits (None: shown as '—' or nothing)."""
    got = number(text)
    if want is None:
        assert got is None, text
        return
    assert got == pytest.approx(want, rel=0, abs=0.5 * 10.0 ** (1 - digits) * abs(want)), (text, want)


def worst_state(verdicts, layers: list) -> str:
    """The run's worst layer verdict in `report`'s layers (`verdicts`: the order of docs/ANOMALIES.md)."""
    return min((l["verdict"]["state"] for l in layers), key=verdicts.states.index)


# -- the demo's sweep ------------------------------------------------------------------------------------------


def test_the_tab_lands_on_the_runs_view_with_every_run(demo_tab, tab_fixtures, demo_plan):
    """No state in the URL and several runs: the Runs view, every run once, the most severe first."""
    page = demo_tab["browser"].page
    page.goto("about:blank")
    page.goto(demo_tab["tb"].base + "/")
    page.get_by_role("tab", name=tab_fixtures.TAB_NAME).click()
    frame = demo_tab["browser"].frame()
    frame.wait_for_selector(".lg-runs[data-draw-ms]", timeout=30_000)
    assert frame.locator('.lg-tab[aria-selected="true"]').inner_text() == "Runs"
    t = read(frame)
    route = {r["run"]: r for r in demo_tab["sweep"]["runs"]}
    assert sorted(r["run"] for r in t["rows"]) == sorted(route)
    assert set(demo_plan.sweep_runs) <= set(route)
    severities = [route[r["run"]]["severity"] for r in t["rows"]]
    assert severities == sorted(severities, reverse=True), severities
    assert severities[0] == 4  # the demo's NaN runs lead
    assert frame.locator(".lg-runs-count").inner_text() == f"{len(route)} runs"
    # Its rows were asked once, beside the list of runs (sent before that answer came), not after it.
    asked = frame.evaluate(
        """() => Object.fromEntries(['runs', 'sweep'].map((r) => [r, performance.getEntriesByType('resource')
             .filter((e) => new URL(e.name).pathname.endsWith('/' + r))
             .map((e) => ({start: e.startTime, end: e.responseEnd}))]))"""
    )
    assert len(asked["sweep"]) == 1 and len(asked["runs"]) >= 1, asked
    assert asked["sweep"][0]["start"] < asked["runs"][0]["end"], asked


def test_each_row_shows_the_routes_and_the_reports_hparams_and_health(demo_tab, demo_plan, verdicts):
    frame = open_runs(demo_tab)
    t = read(frame)
    heads = [h["col"] for h in t["heads"]]
    names = [h["name"] for h in demo_tab["sweep"]["hparams"]]
    assert names == ["activation", "learning_rate"]
    # The run, its verdict and worst finding (seen without scrolling sideways), then the hyperparameters.
    assert heads[: 3 + len(names)] == ["run", "verdict", "finding", *(f"hp:{n}" for n in names)]
    report = demo_tab["demo"]["by_target"]
    route = {r["run"]: r for r in demo_tab["sweep"]["runs"]}
    for row in t["rows"]:
        r = route[row["run"]]
        rep = report[(row["run"], r["target"])]
        c = row["cells"]
        assert c["run"]["text"] == row["run"] == c["run"]["title"]
        # Hyperparameters: the report's `hparams` and the route's; a run without them has empty cells.
        assert r["hparams"] == rep["hparams"]
        for n in names:
            v = rep["hparams"].get(n)
            if isinstance(v, str):
                assert c[f"hp:{n}"]["text"] == v
            elif v is None:
                assert c[f"hp:{n}"]["text"] == ""
            else:
                assert_number(c[f"hp:{n}"]["text"], v, demo_tab["digits"])
        # Health: the worst of the report's layer verdicts, its latest counts, its first NaN/Inf and origin.
        assert c["verdict"]["state"] == r["verdict"] == worst_state(verdicts, rep["layers"]), row["run"]
        assert c["verdict"]["title"] == r["line"] == c["finding"]["title"]
        assert c["finding"]["text"] == (r["line"] if len(r["line"]) <= CELL_CHARS else r["line"][:CELL_CHARS] + "…")
        for k, v in rep["summary"]["latest"].items():
            assert_number(c[f"m:latest.{k}"]["text"], v, demo_tab["digits"])
        first = rep["summary"]["first_nonfinite"]
        assert_number(c["m:first_nonfinite.step"]["text"], first and first["step"], demo_tab["digits"])
        origin = rep["summary"]["origin"]
        assert c["pass"]["text"] == (origin["pass"] if origin else "")
        assert c["origin"]["text"] == (origin["origin"] if origin else "")
        for key in ("noise_scale_end", "norm_trend", "dominated_steps", "last_step", "layers"):
            assert_number(c[f"m:{key}"]["text"], r[key], demo_tab["digits"])
        assert r["last_step"] == rep["summary"]["last_step"] and r["layers"] == rep["summary"]["layers"]
    sweep = [row for row in t["rows"] if row["run"] in demo_plan.sweep_runs]
    # The demo's point: the sigmoid trials vanish at every learning rate, the ReLU ones at none.
    for row in sweep:
        sigmoid = row["cells"]["hp:activation"]["text"] == "sigmoid"
        assert (row["cells"]["verdict"]["state"] == "vanishing") == sigmoid, row["run"]


# The Runs view in a window: the panel's and the table's widths, each row's run name, verdict and finding boxes.
FIT = """() => {
  const panel = document.querySelector('.lg-runs-panel');
  const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right}; };
  return {
    width: document.documentElement.clientWidth, panel: panel.clientWidth, scroll: panel.scrollWidth,
    panelBox: box(panel),
    rows: Array.from(document.querySelectorAll('.lg-runs-table tbody tr:not([hidden])')).map((tr) => ({
      run: tr.dataset.run, name: box(tr.querySelector('td[data-col="run"]')),
      verdict: box(tr.querySelector('td[data-col="verdict"]')), finding: box(tr.querySelector('td[data-col="finding"]')),
      summary: tr.querySelector('td[data-col="summary"]').textContent})),
  };
}"""


def test_the_runs_view_fits_a_1280_px_window_with_the_run_column_put(demo_tab):
    """At 1280 x 800 every run's name, verdict and worst finding are in the window without scrolling sideways; the
    measures fold into one column (each run's counts that are not 0); unfolded, the run's name stays put."""
    page = demo_tab["browser"].page
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        frame = open_runs(demo_tab)
        fit = frame.evaluate(FIT)
        assert fit["scroll"] <= fit["panel"], fit  # nothing to scroll sideways
        assert fit["panelBox"]["right"] <= fit["width"]
        route = {r["run"]: r for r in demo_tab["sweep"]["runs"]}
        assert {r["run"] for r in fit["rows"]} == set(route)
        for r in fit["rows"]:
            for cell in ("name", "verdict", "finding"):
                assert 0 <= r[cell]["left"] and r[cell]["right"] <= fit["panelBox"]["right"] + 0.5, (r, cell)
            row = route[r["run"]]
            counts = [m for m in demo_tab["sweep"]["measures"] if m["kind"] == "count" and m["key"] != "layers"]
            for m in counts:  # each count that is not 0 is in the summary, with its label
                v = row
                for part in m["key"].split("."):
                    v = v.get(part) if isinstance(v, dict) else None
                assert (f"{m['label']} {v}" in r["summary"]) == bool(v), (r["run"], m["key"], v, r["summary"])
        assert frame.locator('th[data-col="m:last_step"]').is_hidden()
        # Unfolded: every measure column, the table wider than the window, the run's name stays put.
        frame.locator(".lg-runs-fold").click()
        frame.wait_for_selector('th[data-col="m:last_step"]', state="visible")
        assert frame.locator('th[data-col="summary"]').is_hidden()
        fit = frame.evaluate(FIT)
        assert fit["scroll"] > fit["panel"], fit
        before = fit["rows"][0]
        frame.evaluate("() => { const p = document.querySelector('.lg-runs-panel'); p.scrollLeft = p.scrollWidth; }")
        frame.wait_for_function("() => document.querySelector('.lg-runs-panel').scrollLeft > 0")
        after = frame.evaluate(FIT)["rows"][0]
        assert after["name"] == before["name"] and after["verdict"]["left"] < before["verdict"]["left"]
        frame.locator(".lg-runs-fold").click()
        frame.wait_for_selector('th[data-col="m:last_step"]', state="hidden")
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})


def test_a_header_sorts_ascending_then_descending_empty_cells_last(demo_tab, tab_fixtures, demo_plan):
    frame = open_runs(demo_tab)
    lr = {r["run"]: r["hparams"].get("learning_rate") for r in demo_tab["sweep"]["runs"]}
    header = frame.locator('th[data-col="hp:learning_rate"] .lg-sort')
    for direction in ("ascending", "descending"):
        header.click()
        frame.wait_for_selector(f'th[data-col="hp:learning_rate"][aria-sort="{direction}"]')
        order = shown(frame)
        values = [lr[r] for r in order]
        k = sum(v is not None for v in values)
        assert k == len(demo_plan.sweep_runs) and all(v is None for v in values[k:])  # empty cells last
        assert values[:k] == sorted(values[:k], reverse=direction == "descending")
        want = "hp:learning_rate" if direction == "ascending" else "-hp:learning_rate"
        assert tab_fixtures.parent_state(demo_tab["browser"].page)["sort"] == want
    # A health column: by the route's numbers, the largest first on the second click (the measures' group is
    # folded into one column by default: unfolded first).
    if not frame.locator('th[data-col="m:latest.vanishing"]').is_visible():
        frame.locator(".lg-runs-fold").click()
    frame.locator('th[data-col="m:latest.vanishing"] .lg-sort').click()
    frame.locator('th[data-col="m:latest.vanishing"] .lg-sort').click()
    frame.wait_for_selector('th[data-col="m:latest.vanishing"][aria-sort="descending"]')
    van = {r["run"]: (r["latest"] or {}).get("vanishing") for r in demo_tab["sweep"]["runs"]}
    values = [van[r] for r in shown(frame) if van[r] is not None]
    assert values == sorted(values, reverse=True) and values[0] > 0


def test_regex_filter_on_run_names_and_an_invalid_one(demo_tab, tab_fixtures):
    frame = open_runs(demo_tab)
    box = frame.locator(".lg-runs-filter")
    box.fill("act=relu$")
    frame.wait_for_function("() => document.querySelector('.lg-runs-count').textContent.includes('of')")
    everyone = [r["run"] for r in demo_tab["sweep"]["runs"]]
    assert sorted(shown(frame)) == sorted(r for r in everyone if re.search("act=relu$", r))
    assert len(shown(frame)) == 3
    assert frame.locator(".lg-runs-count").inner_text() == f"3 of {len(everyone)} runs shown"
    assert tab_fixtures.parent_state(demo_tab["browser"].page)["filter"] == "act=relu$"
    box.fill("sweep/(")  # not a regular expression: said so, nothing thrown, nothing filtered out
    frame.wait_for_selector('.lg-runs-filter[aria-invalid="true"]')
    assert "invalid regular expression" in frame.locator(".lg-filter-error").inner_text()
    assert sorted(shown(frame)) == sorted(everyone)
    box.fill("")
    frame.wait_for_selector('.lg-runs-filter[aria-invalid="false"]')
    assert frame.locator(".lg-filter-error").inner_text() == ""


def test_hparam_filter_keeps_the_runs_of_one_value(demo_tab, demo_plan):
    frame = open_runs(demo_tab)
    frame.select_option('select[data-hparam="activation"]', label="sigmoid")
    frame.wait_for_function("() => document.querySelector('.lg-runs-count').textContent.includes('of')")
    want = [r["run"] for r in demo_tab["sweep"]["runs"] if r["hparams"].get("activation") == "sigmoid"]
    assert sorted(shown(frame)) == sorted(want) and len(want) == 3
    # Runs without the hyperparameter: "(none)".
    frame.select_option('select[data-hparam="activation"]', label="(none)")
    frame.wait_for_function(
        "(n) => document.querySelectorAll('.lg-runs-table tbody tr:not([hidden])').length === n",
        arg=len(demo_tab["sweep"]["runs"]) - len(demo_plan.sweep_runs),
    )
    assert not set(shown(frame)) & set(demo_plan.sweep_runs)


def test_the_runs_ticked_are_the_runs_compare_shows(demo_tab, tab_fixtures, demo_plan):
    frame = open_runs(demo_tab)
    picked = [demo_plan.sweep_runs[0], "dead_relu", demo_plan.sweep_runs[4]]
    for run in picked:
        frame.locator(f'.lg-runs-table tr[data-run="{run}"] input[type=checkbox]').check()
    assert [r["run"] for r in read(frame)["rows"] if r["checked"]] == sorted(picked, key=shown(frame).index)
    button = frame.locator(".lg-runs-compare")
    assert button.inner_text() == "Compare 3 selected"
    button.click()
    frame.wait_for_selector(".lg-compare .lg-run-item")
    on = frame.locator(".lg-compare .lg-run-item.lg-on").evaluate_all("els => els.map((e) => e.dataset.run)")
    assert sorted(on) == sorted(picked)
    for run in picked:  # a series each in the charts (the sweep's layers are not dead_relu's: its line is empty)
        frame.wait_for_selector(f'.lg-compare path.lg-line[data-series="{run}"]', state="attached", timeout=20_000)
    assert tab_fixtures.parent_state(demo_tab["browser"].page)["runs"] == '["' + '","'.join(picked) + '"]'
    # Back on the Runs tab, still ticked; unticking one there leaves two in Compare.
    frame.get_by_role("tab", name="Runs", exact=True).click()
    frame.locator('.lg-runs-table tr[data-run="dead_relu"] input[type=checkbox]').uncheck()
    frame.locator(".lg-runs-compare").click()
    frame.wait_for_function("() => document.querySelectorAll('.lg-compare .lg-run-item.lg-on').length === 2")


def test_a_run_name_opens_its_overview(demo_tab, tab_fixtures):
    frame = open_runs(demo_tab)
    frame.locator('.lg-runs-table tr[data-run="nan_backward"] .lg-runs-open').click()
    frame.wait_for_function("() => document.querySelector('.lg-run-name')?.textContent === 'nan_backward'")
    state = tab_fixtures.parent_state(demo_tab["browser"].page)
    assert (state["view"], state["run"]) == ("overview", "nan_backward")


def test_a_run_without_loss_opens_on_the_target_its_row_is_about(demo_tab, tab_fixtures):
    """The demo's GAN (no `loss`): its row is its generator's, whose gradient vanishes over steps, and its name
    opens that target's overview, where the same finding is the banner."""
    row = next(r for r in demo_tab["sweep"]["runs"] if r["run"] == "gan")
    assert (row["target"], row["verdict"]) == ("generator", "vanishing_over_steps")
    frame = open_runs(demo_tab)
    cell = frame.locator('.lg-runs-table tr[data-run="gan"]')
    assert "vanishing over steps" in cell.inner_text()
    cell.locator(".lg-runs-open").click()
    frame.wait_for_function("() => document.querySelector('.lg-run-name')?.textContent === 'gan'")
    state = tab_fixtures.parent_state(demo_tab["browser"].page)
    assert (state["view"], state["run"], state["target"]) == ("overview", "gan", "generator")
    frame.locator('.lg-summary .lg-alert[data-kind="vanishing_over_steps"]').wait_for(timeout=20_000)


def test_scatter_places_one_point_per_run_by_its_values(demo_tab, demo_plan):
    frame = open_runs(demo_tab, {"sx": "learning_rate", "sy": "latest.vanishing", "sc": "activation"})
    frame.wait_for_selector(".lg-scatter-point")
    pts = frame.evaluate(POINTS)
    route = {r["run"]: r for r in demo_tab["sweep"]["runs"]}
    have = [r for r, x in route.items() if isinstance(x["hparams"].get("learning_rate"), float) and x["latest"]]
    assert sorted(p["run"] for p in pts) == sorted(have) and len(pts) == len(demo_plan.sweep_runs)
    for p in pts:
        assert float(p["x"]) == route[p["run"]]["hparams"]["learning_rate"]
        assert p["y"] == route[p["run"]]["latest"]["vanishing"]
    # Positions ordered as the values: x (on a log axis: 0.01, 0.1, 1 equally spaced), y upwards.
    by_x = sorted(pts, key=lambda p: float(p["x"]))
    for a, b in zip(by_x, by_x[1:]):
        assert (a["cx"] < b["cx"]) if float(a["x"]) < float(b["x"]) else a["cx"] == pytest.approx(b["cx"], abs=0.01)
    xs = sorted({float(p["x"]): p["cx"] for p in pts}.items())
    assert xs[1][1] - xs[0][1] == pytest.approx(xs[2][1] - xs[1][1], abs=0.05)  # log spacing
    by_y = sorted(pts, key=lambda p: p["y"])
    for a, b in zip(by_y, by_y[1:]):
        assert (a["cy"] > b["cy"]) if a["y"] < b["y"] else a["cy"] == pytest.approx(b["cy"], abs=0.01)
    # One colour per activation, named in the legend.
    colours = {route[p["run"]]["hparams"]["activation"]: set() for p in pts}
    for p in pts:
        colours[route[p["run"]]["hparams"]["activation"]].add(p["fill"])
    assert all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == 2
    assert frame.locator(".lg-scatter-legend .lg-legend-name").all_inner_texts() == ["relu", "sigmoid"]
    # Hover: the run and its values; a click opens it.
    target = by_y[-1]
    dot = frame.locator(f'.lg-scatter-point[data-key="{target["run"]}"]')
    dot.hover()
    tip = frame.locator(".lg-tooltip")
    tip.wait_for(state="visible")
    assert target["run"] in tip.inner_text()
    assert_number(
        tip.locator("tr", has_text="learning_rate").locator("td").inner_text(), float(target["x"]), demo_tab["digits"]
    )
    dot.click()
    frame.wait_for_function("(n) => document.querySelector('.lg-run-name')?.textContent === n", arg=target["run"])


INSIDE = """() => {
  const f = document.querySelector('.lg-scatter rect.lg-frame');
  if (!f) return [];  // nothing to plot for this measure
  const [x, y, w, h] = ['x', 'y', 'width', 'height'].map((k) => Number(f.getAttribute(k)));
  return Array.from(document.querySelectorAll('.lg-scatter-point')).map((c) => {
    const [cx, cy, r] = ['cx', 'cy', 'r'].map((k) => Number(c.getAttribute(k)));
    return {run: c.dataset.key, inside: cx - r >= x - 0.01 && cx + r <= x + w + 0.01 && cy - r >= y - 0.01 && cy + r <= y + h + 0.01};
  });
}"""


def test_scatter_points_are_whole_inside_the_plot_on_every_axis(demo_tab):
    """Every point's disc inside the plot's frame, for each measure on y and each hyperparameter on x (log, linear,
    categories): a point at an end of an axis is not half clipped."""
    frame = open_runs(demo_tab)
    ys = frame.locator('select[aria-label="health measure on y"] option').evaluate_all("es => es.map((e) => e.value)")
    assert len(ys) >= 5
    for sx, xlog in (("learning_rate", True), ("learning_rate", False), ("activation", None)):
        for sy in ys[:2] + ys[-2:]:  # severity (0 and 4 at the ends), the first NaN step, the trend, the layers
            state = {"view": "runs", "sx": sx, "sy": sy, **({} if xlog is None else {"xlog": "1" if xlog else "0"})}
            frame = demo_tab["browser"].open(demo_tab["tb"].base, state)
            frame.wait_for_selector(".lg-runs[data-draw-ms]", timeout=30_000)
            frame.wait_for_selector(".lg-scatter rect.lg-frame, .lg-scatter .lg-empty-text", state="attached")
            points = frame.evaluate(INSIDE)
            assert [p for p in points if not p["inside"]] == [], (sx, xlog, sy)


def test_scatter_of_a_string_hparam_is_categorical_and_log_says_why_not(demo_tab, demo_plan):
    frame = open_runs(demo_tab, {"sx": "activation", "sy": "severity", "sc": ""})
    frame.wait_for_selector(".lg-scatter-point")
    log = frame.locator('.lg-panel-scatter .lg-toggle-btn[data-value="1"]')
    assert log.is_disabled() and "not numbers" in log.get_attribute("title")
    pts = frame.evaluate(POINTS)
    assert len(pts) == len(demo_plan.sweep_runs)
    cx = {p["x"]: set() for p in pts}
    for p in pts:
        cx[p["x"]].add(round(p["cx"]))
    assert max(cx["relu"]) < min(cx["sigmoid"])  # categories in sorted order, apart
    assert len({p["fill"] for p in pts}) == 1  # one colour


# -- hyperparameters as written by hp.hparams and hp.KerasCallback, and hostile ones ---------------------------


def test_hparams_of_hp_hparams_and_keras_callback_and_runs_without(hp_tab, runs_view_fixtures):
    frame = open_runs(hp_tab)
    rows = {r["run"]: r["cells"] for r in read(frame)["rows"]}
    names = [h["name"] for h in hp_tab["sweep"]["hparams"]]
    kinds = {h["name"]: h["kind"] for h in hp_tab["sweep"]["hparams"]}
    assert kinds["mixed"] == "mixed" and kinds["lr"] == "mixed" and kinds["batch_norm"] == "bool"
    for run, cells in rows.items():
        want = runs_view_fixtures.expected_hparams(run)
        assert {r["run"]: r["hparams"] for r in hp_tab["sweep"]["runs"]}[run] == want
        for n in names:
            text = cells[f"hp:{n}"]["text"]
            v = want.get(n, "absent")
            if v == "absent":
                assert text == "", (run, n)
            elif v is None:
                assert text == "—", (run, n)  # a NaN
            elif isinstance(v, bool):
                assert text == str(v).lower()
            elif isinstance(v, str):
                assert text == (v if len(v) <= CELL_CHARS else v[:CELL_CHARS] + "…"), (run, n)
                assert cells[f"hp:{n}"]["title"] == (v if len(v) > CELL_CHARS else "")
            else:
                assert_number(text, v, hp_tab["digits"])
    assert all(rows["bare/train"][f"hp:{n}"]["text"] == "" for n in names)
    assert rows["top/train"]["hp:activation"]["text"] == "<b>tanh</b>"


def test_a_mixed_column_sorts_numbers_then_text_and_filters_each_apart(hp_tab):
    frame = open_runs(hp_tab, {"sort": "hp:mixed"})
    frame.wait_for_selector('th[data-col="hp:mixed"][aria-sort="ascending"]')
    order = shown(frame)
    assert order[:2] == ["kc/train", "top/train"]  # 3.5, then "three"; the runs without it after
    options = frame.locator('select[data-hparam="mixed"] option').all_inner_texts()
    assert options == ["any", "3.5", "three (text)", "(none)"]
    frame.select_option('select[data-hparam="mixed"]', label="three (text)")
    frame.wait_for_function("() => document.querySelectorAll('.lg-runs-table tbody tr:not([hidden])').length === 1")
    assert shown(frame) == ["top/train"]


def test_hostile_names_and_values_are_text(hp_tab, tab_fixtures, runs_view_fixtures):
    frame = open_runs(hp_tab, {"sx": "act", "sy": "layers"})
    rows = {r["run"]: r["cells"] for r in read(frame)["rows"]}
    for run in tab_fixtures.HOSTILE_RUNS:
        assert rows[run]["run"]["text"] == run and rows[run]["run"]["title"] == run
    assert (
        rows[tab_fixtures.HOSTILE_RUN]["hp:act"]["text"]
        == runs_view_fixtures.HOSTILE_HPARAMS[tab_fixtures.HOSTILE_RUN]["act"]
    )
    long = rows[tab_fixtures.HOSTILE_RUN]["hp:long"]
    assert long["text"] == runs_view_fixtures.LONG[:CELL_CHARS] + "…" and long["title"] == runs_view_fixtures.LONG
    assert rows[tab_fixtures.HOSTILE_ATTR_RUN]["hp:lr"]["text"] == "—"  # NaN
    heads = {h["col"]: h["text"] for h in read(frame)["heads"]}
    assert heads[f"hp:{runs_view_fixtures.HOSTILE_HP_NAME}"] == runs_view_fixtures.HOSTILE_HP_NAME
    # Nothing the values name became an element in the tab (the scatter's categories and legend too).
    injected = frame.evaluate(
        """() => Array.from(document.querySelectorAll('.lg-root *')).filter((e) =>
             ['IMG', 'SCRIPT', 'I', 'B', 'IFRAME'].includes(e.tagName) ||
             Array.from(e.attributes).some((a) => a.name.startsWith('on'))).map((e) => e.outerHTML.slice(0, 80))"""
    )
    assert injected == []
    ticks = frame.locator(".lg-scatter .lg-tick").evaluate_all("els => els.map((e) => e.textContent)")
    assert any(t.startswith("<img src=x") for t in ticks)
    assert frame.locator(".lg-scatter-point").count() == 2  # the runs with an `act`


def test_log_x_is_offered_only_for_positive_numbers(hp_tab):
    frame = open_runs(hp_tab, {"sx": "learning_rate", "sy": "layers"})
    log = frame.locator('.lg-panel-scatter .lg-toggle-btn[data-value="1"]')
    frame.wait_for_selector(".lg-scatter-point")
    assert not log.is_disabled()
    frame = open_runs(hp_tab, {"sx": "lr", "sy": "layers"})
    log = frame.locator('.lg-panel-scatter .lg-toggle-btn[data-value="1"]')
    frame.wait_for_selector(".lg-scatter-point")
    assert log.is_disabled() and "not numbers" in log.get_attribute("title")
    # Numbers, one of them 0: a linear axis only, even when the URL asks for log.
    frame = open_runs(hp_tab, {"sx": "wd", "sy": "layers", "xlog": "1"})
    log = frame.locator('.lg-panel-scatter .lg-toggle-btn[data-value="1"]')
    frame.wait_for_selector(".lg-scatter-point")
    assert log.is_disabled() and "needs values > 0: 'wd' has 0" in log.get_attribute("title")
    assert frame.locator('.lg-panel-scatter .lg-toggle-btn[data-value="0"]').get_attribute("aria-pressed") == "true"
    pts = sorted(frame.evaluate(POINTS), key=lambda p: float(p["x"]))
    assert [float(p["x"]) for p in pts] == [0.0, 1e-4] and pts[0]["cx"] < pts[1]["cx"]


# -- a sweep of 200 runs ----------------------------------------------------------------------------------------

SWEEP_RUNS = 200


def synthetic_logdir():
    """bench/synthetic_logdir.py, the generator of the benchmarks' logdirs."""
    import importlib.util

    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench", "synthetic_logdir.py"
    )
    spec = importlib.util.spec_from_file_location("synthetic_logdir", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sweep200(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("sweep200"))
    grid = synthetic_logdir().write_sweep(d, SWEEP_RUNS, 50, 100)
    return d, grid


@pytest.mark.parametrize("load_fast", ["true", "false"], ids=["load_fast", "python_loader"])
def test_200_runs_are_drawn_and_sorted(sweep200, load_fast, browser, tmp_path, tensorboard_process):
    """Every run of a 200-run sweep in the table and the scatter, and a sort (how fast: bench/tab_sweep.py)."""
    logdir, grid = sweep200
    tb = serve(tensorboard_process, logdir, load_fast, tmp_path, SWEEP_RUNS)
    try:
        env = {"tb": tb, "browser": browser}
        frame = open_runs(env)
        t = read(frame)
        assert sorted(r["run"] for r in t["rows"]) == sorted(name for name, _ in grid)
        assert frame.locator(".lg-scatter-point").count() == SWEEP_RUNS
        frame.locator('th[data-col="hp:learning_rate"] .lg-sort').click()
        frame.wait_for_selector('th[data-col="hp:learning_rate"][aria-sort="ascending"]')
        lr = dict(grid)
        values = [lr[r]["learning_rate"] for r in shown(frame)]
        assert values == sorted(values)
    finally:
        tb.stop()
