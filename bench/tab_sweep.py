"""The tab at sweep scale, in headless Chromium against a real `tensorboard` process, both loaders.

On a synthetic sweep (bench/synthetic_logdir.py `--sweep`; RUNS runs x LAYERS layers x STEPS steps), once every run
is loaded and read ahead (the `runs` route's `statistics_read` and `sweep_read`):
- the Compare view of the first COMPARE_RUNS runs on one layer: when its overlay holds every run's line after the
  `compare` answer arrived, the depth profile after the overlay, the histograms (outlines, one `histograms_at`
  request; target <= HIST_TARGET_MS) after the overlay; medians over a few openings of the page;
- the `compare`, `depth` and `histograms_at` requests the tab made there, asked again warm (median of 9);
- the Runs view of every run (when the tab has it): its table drawn after the `sweep` answer arrived and after the
  page was opened (first load after the read-ahead), and a re-sort by a hyperparameter column.
Times are taken inside the page (`performance.now()` and the resource timings of the tab's frame), in rAF ticks.

    python bench/tab_sweep.py [--runs 200 --compare-runs 100 --layers 50 --steps 1000] [--loaders true,false]
    python bench/run.py --only-tab-sweep     # writes only this section of docs/PERFORMANCE.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.append(os.path.join(ROOT, "tests"))  # the tests' headless Chromium (tab_fixtures.Browser)
import sweep_latency  # noqa: E402
import synthetic_logdir  # noqa: E402
import tab_latency  # noqa: E402

SIZE = (200, 50, 1000)  # runs (the Runs view), layers, steps
COMPARE_RUNS = 100
SMOKE_SIZE = (4, 3, 20)
SMOKE_COMPARE_RUNS = 4
HEADING = "### Tab at sweep scale:"
RUNS_VIEW_TARGET_MS = 1000.0
HIST_TARGET_MS = 1000.0  # the compare view's histograms of every run, after its overlay
REPEATS = 9
OPENS = 3
RUNS_VIEW = os.path.join(ROOT, "frontend", "views", "runs.js")  # the Runs view, where the tab has one
SORT_COLUMN = "hp:learning_rate"
OVERLAY = ".lg-panel-wide path.lg-line"
DEPTH = ".lg-layer-row .lg-panel:last-child path.lg-line"
HIST = ".lg-layer-row .lg-panel:first-child path.lg-aligned"
ROWS = ".lg-runs-table tbody tr"
# In the tab's frame, before its scripts: when each chart first holds `window.__lgWant` runs (set per page).
DRAWN_SCRIPT = """
if (location.href.includes('plugin_entry.html')) {
  window.__lgDrawn = {};
  const charts = %s;
  const groups = [['overlay', 'depth', 'hist'], ['rows']];
  const tick = () => {
    const n = window.__lgWant || 0;
    for (const [name, sel] of Object.entries(charts)) {
      if (n && !window.__lgDrawn[name] && document.querySelectorAll(sel).length >= n) {
        window.__lgDrawn[name] = performance.now();
      }
    }
    if (!groups.some((g) => g.every((k) => window.__lgDrawn[k]))) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}
""" % json.dumps({"overlay": OVERLAY, "depth": DEPTH, "hist": HIST, "rows": ROWS})
# The response ends of the frame's requests to a route, and their URLs.
ENDS = """(route) => performance.getEntriesByType('resource')
  .filter((e) => new URL(e.name).pathname.endsWith(`/${route}`))
  .map((e) => [e.responseEnd, e.name])"""
# Click a column's sort button; ms until its header says so and the next frame is painted.
RESORT = """async (col) => {
  const th = () => document.querySelector(`th[data-col="${col}"]`);
  const before = th().getAttribute('aria-sort');
  const t0 = performance.now();
  th().querySelector('.lg-sort').click();
  await new Promise((done) => {
    const tick = () => (th()?.getAttribute('aria-sort') !== before ? done() : requestAnimationFrame(tick));
    tick();
  });
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  return performance.now() - t0;
}"""


def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _open(browser, tb: tab_latency.TensorBoard, state: Dict[str, str], want: int, drawn: List[str]):
    """The tab opened with `state`; returns its frame once every chart of `drawn` holds `want` runs."""
    browser.context.add_init_script(f"window.__lgWant = {int(want)};")  # the last one added runs last
    frame = browser.open(tb.process.base, state)
    frame.wait_for_function(
        "(names) => names.every((k) => window.__lgDrawn && window.__lgDrawn[k])", arg=drawn, timeout=600_000
    )
    return frame


def compare_view(browser, tb: tab_latency.TensorBoard, runs: List[str], layer: str, opens: int) -> Dict:
    """Milliseconds (medians over `opens` openings) from the compare answer to the overlay drawn, and from the
    overlay to the depth profile and to the histograms; the tab's compare and depth URLs; its matrix requests."""
    state = {"view": "compare", "layer": layer, "runs": json.dumps(runs)}
    overlay, depth, hist = [], [], []
    urls: Dict[str, str] = {}
    matrix = 0
    for _ in range(opens):
        frame = _open(browser, tb, state, len(runs), ["overlay", "depth", "hist"])
        t = frame.evaluate("() => window.__lgDrawn")
        ends = {
            route: frame.evaluate(ENDS, route)
            for route in ("compare", "depth", "matrix", "histograms", "histograms_at")
        }
        if not ends["compare"] or not ends["depth"]:
            raise RuntimeError(f"the compare view asked no compare or depth request: {ends}")
        overlay.append(t["overlay"] - max(e for e, _ in ends["compare"]))
        depth.append(t["depth"] - t["overlay"])
        hist.append(t["hist"] - t["overlay"])
        urls = {route: ends[route][-1][1] for route in ("compare", "depth", "histograms_at") if ends[route]}
        matrix = max(matrix, len(ends["matrix"]))
    return {
        "overlay_ms": _median(overlay),
        "depth_after_overlay_ms": _median(depth),
        "hist_after_overlay_ms": _median(hist),
        "depth_requests": len(ends["depth"]),
        "matrix_requests": matrix,
        "hist_requests": (len(ends["histograms_at"]), len(ends["histograms"])),
        "urls": urls,
    }


def runs_view(browser, tb: tab_latency.TensorBoard, runs: int) -> Dict[str, float]:
    """Milliseconds from the sweep answer to the Runs view's table of `runs` rows drawn, from the tab's frame
    opening to it, and of a re-sort by a hyperparameter column (the first load after the read-ahead)."""
    frame = _open(browser, tb, {"view": "runs"}, runs, ["rows"])
    t = frame.evaluate("() => window.__lgDrawn")
    ends = frame.evaluate(ENDS, "sweep")
    if not ends:
        raise RuntimeError("the Runs view asked no sweep request")
    return {
        "drawn_after_data_ms": t["rows"] - max(e for e, _ in ends),
        "drawn_after_open_ms": t["rows"],
        "resort_ms": frame.evaluate(RESORT, SORT_COLUMN),
    }


def warm(tb: tab_latency.TensorBoard, url: str, repeats: int) -> float:
    """Seconds: the median of `repeats` requests of the tab's own `url` (asked once before)."""
    path = urllib.parse.urlsplit(url)
    path = path.path + ("?" + path.query if path.query else "")
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        code, body, _ = tb.process.get(path, timeout=600)
        times.append(time.perf_counter() - start)
        if code != 200:
            raise RuntimeError(f"{path[:200]} -> {code}: {body[:300]!r}")
    return statistics.median(times[1:])


def measure(
    logdir: str,
    runs: List[str],
    compare_runs: int,
    layer: str,
    steps: int,
    load_fast: str,
    repeats: int = REPEATS,
    opens: int = OPENS,
    timeout: float = 3600,
) -> Dict:
    """One loader's figures (module docstring): a TensorBoard started, loaded, read ahead; a headless Chromium."""
    import tab_fixtures

    tb = tab_latency.TensorBoard(logdir, load_fast)
    profile = tempfile.mkdtemp(prefix="layergrad_chromium_")
    browser = None
    try:
        _, out = tb.wait_loaded(len(runs), steps - 1, timeout)
        out = {"load_s": out, "read_ahead_s": sweep_latency.wait_rows_read(tb, timeout)}
        browser = tab_fixtures.Browser(profile)
        browser.context.add_init_script(DRAWN_SCRIPT)
        if os.path.exists(RUNS_VIEW):  # first: the first load after the read-ahead
            out["runs_view"] = runs_view(browser, tb, len(runs))
        out["compare"] = compare_view(browser, tb, runs[:compare_runs], layer, opens)
        for route, url in out["compare"].pop("urls").items():
            out[f"{route}_warm_s"] = warm(tb, url, repeats)
        out["rss_mb"] = tab_latency._rss_mb(tb.process.proc.pid)
        out["browser_errors"] = list(browser.errors)
    finally:
        if browser is not None:
            browser.close()
        tb.stop()
        shutil.rmtree(profile, ignore_errors=True)
    return out


def table(size: tuple, compare_runs: int, results: Dict[str, Dict], command: str, load: Tuple[float, float]) -> List:
    """The section of docs/PERFORMANCE.md."""
    runs, layers, steps = size
    ms = lambda v: f"{v:.0f} ms"  # noqa: E731
    lines = [
        f"{HEADING} the Compare view of {compare_runs} runs and the Runs view of {runs} runs, synthetic sweep of "
        f"{runs} runs x {layers} layers x {steps} steps, headless Chromium (measured {time.strftime('%Y-%m-%d')} "
        f"with {command})\n",
        "| loader | loaded | read ahead after loading | Compare: overlay drawn after its data | depth profile after "
        f"the overlay | histograms after the overlay (target <= {HIST_TARGET_MS:.0f} ms) | `compare` warm | "
        "`depth` warm | `histograms_at` warm | TensorBoard RSS |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for loader, m in results.items():
        c = m["compare"]
        at, one = c["hist_requests"]
        met = "met" if c["hist_after_overlay_ms"] <= HIST_TARGET_MS else "NOT met"
        hist_warm = ms(m["histograms_at_warm_s"] * 1e3) if "histograms_at_warm_s" in m else "not asked (0 s)"
        lines.append(
            f"| {sweep_latency.LOADER_NAMES[loader]} (--load_fast={loader}) | {m['load_s']:.1f} s | "
            f"{m['read_ahead_s']:.1f} s | {ms(c['overlay_ms'])} | {ms(c['depth_after_overlay_ms'])} "
            f"({c['depth_requests']} `depth` request, {c['matrix_requests']} `matrix`) | "
            f"{ms(c['hist_after_overlay_ms'])} ({met}; {at} `histograms_at` request, {one} `histograms`) | "
            f"{ms(m['compare_warm_s'] * 1e3)} | {ms(m['depth_warm_s'] * 1e3)} | {hist_warm} | {m['rss_mb']:.0f} MB |"
        )
    lines.append("")
    views = {loader: m["runs_view"] for loader, m in results.items() if "runs_view" in m}
    if views:
        met = lambda v: "met" if v <= RUNS_VIEW_TARGET_MS else "NOT met"  # noqa: E731
        target = f"target <= {RUNS_VIEW_TARGET_MS:.0f} ms"
        lines += [
            f"| loader | Runs view of {runs} runs drawn after its data ({target}) | drawn after the tab's frame opened | "
            f"re-sorted by a hyperparameter ({target}) |",
            "|---|---|---|---|",
        ]
        for loader, v in views.items():
            lines.append(
                f"| {sweep_latency.LOADER_NAMES[loader]} (--load_fast={loader}) | {ms(v['drawn_after_data_ms'])} "
                f"({met(v['drawn_after_data_ms'])}) | {ms(v['drawn_after_open_ms'])} | {ms(v['resort_ms'])} "
                f"({met(v['resort_ms'])}) |"
            )
        lines.append("")
    else:
        lines += ["The Runs view: not in this version of the tab, not measured.", ""]
    lines += [
        f"Medians over {OPENS} openings of the page (the charts) and of {REPEATS} warm requests of the tab's own "
        "`compare`, `depth` and `histograms_at` URLs; times taken in the tab's frame (resource timings, `performance.now()` at the "
        "first animation frame whose DOM holds every run's line, outline or row). The Runs view is the first page "
        f"opened after the read-ahead. Load average (1 min) at the start {load[0]:.1f}, at the end {load[1]:.1f}: "
        "the machine may be shared.",
        "",
    ]
    return lines


def section(size: tuple, compare_runs: int, loaders: List[str], command: str) -> Tuple[Dict, List[str]]:
    """(figures per loader, the section of docs/PERFORMANCE.md) of a sweep of `size` written anew."""
    runs, layers, steps = size
    logdir = tempfile.mkdtemp(prefix="layergrad_tab_sweep_")
    try:
        names = [name for name, _ in synthetic_logdir.write_sweep(logdir, runs, layers, steps)]
        layer = synthetic_logdir._infos(layers)[layers // 2].layer
        load = os.getloadavg()[0]
        results = {loader: measure(logdir, names, compare_runs, layer, steps, loader) for loader in loaders}
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    lines = table(size, compare_runs, results, command, (load, os.getloadavg()[0]))
    print("\n".join(lines), flush=True)
    return results, lines


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=SIZE[0])
    parser.add_argument("--compare-runs", type=int, default=COMPARE_RUNS)
    parser.add_argument("--layers", type=int, default=SIZE[1])
    parser.add_argument("--steps", type=int, default=SIZE[2])
    parser.add_argument("--loaders", default="true,false")
    parser.add_argument("--out", default="-", help="rewrite only this section of a report (default: print only)")
    args = parser.parse_args(argv)
    _, lines = section(
        (args.runs, args.layers, args.steps), args.compare_runs, args.loaders.split(","), "`python bench/tab_sweep.py`"
    )
    sweep_latency.rewrite(args.out, lines, HEADING)


if __name__ == "__main__":
    main()
