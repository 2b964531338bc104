"""More runs ticked than compare takes at once, in headless Chromium against a real `tensorboard`: the view says so
instead of sending a request the route refuses (its own browser: one Playwright per module)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("playwright")
if not os.path.exists("/usr/bin/chromium"):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)


pytestmark = [pytest.mark.timeout(300), pytest.mark.browser, pytest.mark.slow]

LIMIT = 200  # runs compared at once (docs/HTTP_API.md, `compare`)


def test_more_runs_than_compare_takes_says_so_before_asking(tmp_path, long_fixtures, tab_fixtures):
    """201 tiny runs, all ticked: the view says how many it can compare instead of sending a request the route
    refuses; "None" then compares nothing, and says that."""
    names = [f"many/run_{k:03d}" for k in range(LIMIT + 1)]
    for k, name in enumerate(names):
        long_fixtures.write_run(str(tmp_path / "logs" / name), ["net/a"], 2, keep=False, seed=k + 1)
    with tab_fixtures.served(
        str(tmp_path / "logs"), tmp_path, {n: 1 for n in names}, lambda: None, write_first=True, reload_interval=0
    ) as (tb, browser, _):
        asked = []
        browser.page.on("request", lambda r: asked.append(r.url) if "/compare?" in r.url else None)
        frame = browser.open(tb.base, {"view": "compare", "layer": "net/a", "runs": json.dumps(names[:2])})
        frame.wait_for_selector(".lg-panel-wide path.lg-line")
        frame.get_by_role("button", name="All", exact=True).click()
        message = frame.locator(".lg-compare .lg-messages")
        frame.wait_for_function(
            "() => document.querySelector('.lg-compare .lg-messages').textContent.includes('ticked')"
        )
        assert message.inner_text() == (
            f"{LIMIT + 1} runs ticked: at most {LIMIT} can be compared at once. Untick some (the filter and None help)."
        )
        assert frame.locator(".lg-compare-body").is_hidden() and len(asked) == 1  # the first two runs' only
        frame.get_by_role("button", name="None", exact=True).click()
        frame.wait_for_function(
            "() => document.querySelector('.lg-compare .lg-messages').textContent.startsWith('No run')"
        )
        assert json.loads(tab_fixtures.parent_state(browser.page).get("runs", "[]")) == []
        tab_fixtures.assert_no_browser_errors(browser)
