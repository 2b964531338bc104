"""The demo's runs in the overview: from it alone, what is wrong in each run and where is plain.

A real `tensorboard` on `tb-layergrad demo --quick`'s logdir (tests/conftest.py), headless Chromium. Each run was
trained to show one known problem (tb_layergrad/cli/demo.py); the overview must name it in its verdict chips (one
per layer) and its banner (one line per finding), with the `anomalies` route's own texts, and say nothing about
the healthy twins (`mlp_relu_he`, `rnn_lstm`, `explode_clipnorm`). tests/tab/test_tab_verdict_e2e.py checks the same
marks on synthetic runs; tests/cli/test_verdict_demo.py the demo's verdicts through the route, report and load().
"""

from __future__ import annotations

import os
import urllib.parse

import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(600), pytest.mark.browser, pytest.mark.slow]
HEALTHY = ("mlp_relu_he", "rnn_lstm", "explode_clipnorm")

# What the overview reads, per run: each row's layer, verdict state and chips; each banner line.
READ = """() => ({
  rows: Array.from(document.querySelectorAll('.lg-row-label')).map((e) => {
    const chips = Array.from(document.querySelectorAll(`.lg-row-chip[data-row="${e.dataset.row}"] .lg-chip`));
    return {layer: e.dataset.layer, state: e.dataset.state, chips: chips.map((c) => ({
      state: c.dataset.state ?? null, cls: c.className, text: c.textContent,
      background: getComputedStyle(c).backgroundColor}))};
  }),
  banners: Array.from(document.querySelectorAll('.lg-summary .lg-alert')).map((e) => ({
    kind: e.dataset.kind, layer: e.dataset.layer, layers: e.dataset.layers, origin: e.dataset.origin ?? null,
    pass: e.dataset.pass ?? null, text: e.textContent})),
})"""


@pytest.fixture(scope="module")
def demo_tab(demo, tmp_path_factory, tab_fixtures, tensorboard_process):
    work = tmp_path_factory.mktemp("demo_overview")
    tb = tensorboard_process.TensorBoardProcess(demo["logdir"], log_path=str(work / "tensorboard.log"))
    browser = None
    try:
        tb.wait_for_runs({name: run["summary"]["last_step"] for name, run in demo["runs"].items()})
        browser = tab_fixtures.Browser(str(work / "profile"), poll_ms=60_000)
        yield {"tb": tb, "browser": browser}
    finally:
        if browser is not None:
            browser.close()
        tb.stop()


@pytest.fixture(autouse=True)
def no_browser_errors(demo_tab, tab_fixtures):
    yield
    tab_fixtures.assert_no_browser_errors(demo_tab["browser"])


def overview(tensorboard_process, demo_tab, run: str) -> dict:
    """The overview of `run` as shown, checked against the route: each row's state and chip text are the
    route's verdict, each banner line a finding of the route's (same kind, same line, same order)."""
    frame = demo_tab["browser"].open(demo_tab["tb"].base, {"run": run})
    frame.wait_for_function("(name) => document.querySelector('.lg-run-name')?.textContent === name", arg=run)
    frame.wait_for_selector(".lg-row-label[data-state]")
    shown = frame.evaluate(READ)
    body = demo_tab["tb"].get_json(tensorboard_process.PLUGIN_API + "anomalies?run=" + urllib.parse.quote(run))
    verdicts = {e["layer"]: e["verdict"] for e in body["layers"]}
    assert [r["layer"] for r in shown["rows"]] == list(verdicts)
    for row in shown["rows"]:
        v = verdicts[row["layer"]]
        assert row["state"] == v["state"], row
        marked = [c for c in row["chips"] if c["state"] == v["state"]]
        assert ([c["text"] for c in marked] == [v["text"]]) == (v["state"] != "ok"), row
    findings = body["summary"]["findings"]
    assert [(b["kind"], b["text"].rstrip(" →").lower()) for b in shown["banners"]] == [
        (f["kind"], f["line"].lower()) for f in findings
    ]
    rows = {r["layer"].split("/", 1)[1]: r for r in shown["rows"]}
    return {"rows": rows, "states": {k: r["state"] for k, r in rows.items()}, "banners": shown["banners"]}


def test_nan_backward_marks_sqrt_features_as_the_origin(demo_tab, tensorboard_process, demo_plan):
    o = overview(tensorboard_process, demo_tab, "nan_backward")
    step = demo_plan.nan_backward_step
    assert o["states"] == {"dense_0": "nonfinite", "sqrt_features": "nan_origin", "head": "ok"}
    (origin,) = o["rows"]["sqrt_features"]["chips"]
    (reached,) = o["rows"]["dense_0"]["chips"]
    assert (origin["text"], reached["text"]) == (f"NaN/Inf born here @{step}", f"NaN/Inf @{step}")
    assert origin["background"] != reached["background"]  # born here looks apart from reached
    (banner,) = o["banners"]
    assert (banner["kind"], banner["pass"], banner["origin"]) == ("nonfinite", "backward", "nan_backward/sqrt_features")
    assert f"step {step}" in banner["text"] and "sqrt_features" in banner["text"]


def test_explode_noclip_head_is_exploding_not_vanishing(demo_tab, tensorboard_process):
    o = overview(tensorboard_process, demo_tab, "explode_noclip")
    assert o["states"] == {"features": "exploding", "head": "exploding"}
    assert [c["text"] for c in o["rows"]["head"]["chips"]] == ["exploding"]
    assert not [c for r in o["rows"].values() for c in r["chips"] if "vanishing" in c["cls"]]
    assert [b["kind"] for b in o["banners"]] == ["exploding"]


def test_rnn_simplernn_vanishes_through_time(demo_tab, tensorboard_process):
    o = overview(tensorboard_process, demo_tab, "rnn_simplernn")
    assert o["states"] == {"rnn": "vanishing_through_time", "out": "ok"}
    (banner,) = o["banners"]
    assert banner["kind"] == "vanishing_through_time" and "rnn_simplernn/rnn" in banner["text"]


def test_mislabelled_is_one_banner_line_and_no_layer_reads_ok(demo_tab, tensorboard_process):
    """Its only finding is one example dominating: each layer's one chip says so in the verdict's words (not "ok"),
    and the Runs view's row too (the sweep route's `verdict_text`)."""
    o = overview(tensorboard_process, demo_tab, "mislabelled")
    (banner,) = o["banners"]
    assert banner["kind"] == "dominated" and banner["layers"] == str(len(o["rows"]))
    assert set(o["states"].values()) == {"dominated"}  # no gradient is wrong: one example is
    for r in o["rows"].values():
        (chip,) = r["chips"]
        assert chip["cls"] == "lg-chip lg-chip-dominated lg-chip-link" and chip["text"].startswith("one example domin")
    frame = demo_tab["browser"].open(demo_tab["tb"].base, {"view": "runs"})
    cell = frame.wait_for_selector('tr:has(td[data-col="run"][title="mislabelled"]) td[data-col="verdict"] .lg-chip')
    (row,) = demo_tab["tb"].get_json(tensorboard_process.PLUGIN_API + "sweep?run=mislabelled")["runs"]
    assert (cell.get_attribute("data-state"), cell.text_content()) == ("dominated", row["verdict_text"])
    assert row["verdict_text"].startswith("one example domin")


def test_dead_relu_names_the_dead_layer(demo_tab, tensorboard_process):
    o = overview(tensorboard_process, demo_tab, "dead_relu")
    assert o["states"] == {"dense_0": "dead", "relu_0": "ok", "dense_1": "ok", "logits": "ok"}
    assert [c["text"] for c in o["rows"]["dense_0"]["chips"]] == ["dead"]
    (banner,) = o["banners"]
    assert (banner["kind"], banner["layer"]) == ("dead", "dead_relu/dense_0")


def test_mlp_sigmoid_vanishes_from_the_input_side(demo_tab, tensorboard_process):
    """The layers nearest the input vanish, the ones nearest the loss do not: a prefix of the model's layers."""
    o = overview(tensorboard_process, demo_tab, "mlp_sigmoid")
    states = list(o["states"].values())
    k = states.count("vanishing")
    assert k >= 2 and states == ["vanishing"] * k + ["ok"] * (len(states) - k), o["states"]
    assert list(o["states"])[0] == "dense_0" and o["states"]["logits"] == "ok"
    (banner,) = o["banners"]
    assert banner["kind"] == "vanishing" and "dense_0" in banner["text"]


@pytest.mark.parametrize("run", HEALTHY)
def test_the_healthy_twins_show_no_finding(demo_tab, run, tensorboard_process):
    o = overview(tensorboard_process, demo_tab, run)
    assert set(o["states"].values()) == {"ok"} and o["banners"] == []
    assert not [c for r in o["rows"].values() for c in r["chips"]]


def test_an_alert_at_the_latest_step_opens_that_step(demo_tab, tab_fixtures):
    """mlp_sigmoid: "vanishing at the latest step (S)" opens its first layer at S, not where it began to vanish."""
    frame = demo_tab["browser"].open(demo_tab["tb"].base, {"run": "mlp_sigmoid"})
    alert = frame.wait_for_selector('.lg-summary .lg-alert[data-kind="vanishing"]')
    step = alert.text_content().split("latest step (")[1].split(")")[0]
    alert.click()
    frame.wait_for_selector(f'.lg-stats-table[data-step="{step}"]')
    assert tab_fixtures.parent_state(demo_tab["browser"].page)["step"] == step


def test_the_layer_table_says_no_finite_value_where_every_element_is_inf(demo_tab):
    """nan_backward/dense_0 at the last step: every element ±Inf; the statistics of its finite elements have no
    value (the route's null), said in words, not 0 nor a dash; its counts are numbers."""
    frame = demo_tab["browser"].open(
        demo_tab["tb"].base, {"view": "layer", "run": "nan_backward", "layer": "nan_backward/dense_0", "step": 40}
    )
    frame.wait_for_selector('.lg-stats-table[data-step="40"]')
    cells = frame.eval_on_selector_all(
        ".lg-stats-table tbody tr", "(rows) => rows.map((r) => [r.dataset.stat, r.querySelector('td').textContent])"
    )
    shown = dict(cells)
    for stat in ("norm", "rms", "mean_abs", "min", "max", "mean", "std"):
        assert shown[stat] == "no finite value", (stat, shown)
    assert int(shown["pos_inf"]) + int(shown["neg_inf"]) == int(shown["elements"]) == 1024 and shown["nan"] == "0"
