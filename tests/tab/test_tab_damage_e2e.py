"""Damaged event files said in the tab, in headless Chromium on a real TensorBoard, under both loaders.

A logdir of an intact run, a run whose last record was cut (a writer killed mid-write, long ago) and a run
whose only file is random bytes (TensorBoard lists nothing of it). The tab's banner shows the `runs`
route's sentence for each damaged file (the last step read named), on whatever view; the Runs view marks the
cut run's row, its sentence in the mark's title, and not the intact one's. The intact run and the cut run's
whole steps are served as before (tests/reader/test_reliability_logdirs.py checks them value by value).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)

import numpy as np  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.browser, pytest.mark.slow]

READ = """() => ({
  banner: Array.from(document.querySelectorAll('.lg-banner .lg-warning')).map((e) => e.textContent),
  marks: Object.fromEntries(Array.from(document.querySelectorAll('.lg-runs-table tbody tr')).map((tr) => [
    tr.dataset.run, Array.from(tr.querySelectorAll('.lg-chip-damage')).map((c) => [c.textContent, c.title])])),
})"""


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, reliability_fixtures):
    d = str(tmp_path_factory.mktemp("damage_logdir"))
    reliability_fixtures.write_run(os.path.join(d, "intact"), reliability_fixtures.DAMAGE_LAYERS, range(8))
    f = reliability_fixtures.write_run(os.path.join(d, "cut"), reliability_fixtures.DAMAGE_LAYERS, range(8))
    reliability_fixtures.cut(f)
    reliability_fixtures.age(f.path)
    noise = reliability_fixtures.EventFile(os.path.join(d, "noise"))
    with open(noise.path, "wb") as fh:
        fh.write(np.random.default_rng(7).bytes(400))
    return d


@pytest.mark.parametrize("load_fast", ["true", "false"])
def test_the_tab_says_which_file_and_step(logdir, load_fast, tmp_path, tab_fixtures, tensorboard_process):
    tb = tensorboard_process.TensorBoardProcess(logdir, str(tmp_path / "tensorboard.log"), load_fast=load_fast)
    browser = None
    try:
        tb.wait_for_runs({"intact": 7, "cut": 6})

        def named(p) -> bool:
            body = p.get_json(tensorboard_process.PLUGIN_API + "runs")
            return len(body["warnings"]) == 2

        tb.wait_until(named, "the damage named", timeout=60)
        runs = tb.get_json(tensorboard_process.PLUGIN_API + "runs")
        lines = runs["warnings"]
        cut = [r for r in runs["runs"] if r["run"] == "cut"][0]["damage"]
        assert [(d["kind"], d["step"]) for d in cut] == [("truncated", 6)]
        assert lines == sorted(lines) and lines[0].startswith("run 'cut': event file 'cut/events.out.tfevents.")
        assert "read up to step 6" in lines[0]
        assert lines[1].startswith("run 'noise': event file") and "nothing was read" in lines[1]

        browser = tab_fixtures.Browser(str(tmp_path / "profile"), poll_ms=60_000)
        frame = browser.open(tb.base, {"view": "runs"})
        frame.wait_for_selector(".lg-runs-table tbody tr[data-run=intact]", timeout=30_000)
        shown = frame.evaluate(READ)
        assert shown["banner"] == lines
        assert shown["marks"] == {"intact": [], "cut": [["damaged", cut[0]["line"]]]}
        frame = browser.open(tb.base, {"view": "overview", "run": "intact"})  # every view: the banner
        frame.wait_for_selector(".lg-banner .lg-warning", timeout=30_000)
        assert frame.evaluate(READ)["banner"] == lines
        tab_fixtures.assert_no_browser_errors(browser)
    finally:
        if browser is not None:
            browser.close()
        tb.stop()
