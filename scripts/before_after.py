"""Screenshots of the tab's views that the "tab tells the truth" work changed, for docs/screenshots/before-after/.

    python scripts/before_after.py --demo DEMO --many MANY --out DIR --tag after

DEMO: a logdir of `tb-layergrad demo` (the full demo, as the README's first command trains it); MANY: a logdir of
many runs of one model (`python bench/synthetic_logdir.py MANY --sweep --runs 40 --layers 8 --steps 200`). Each view
is shot in a 1600 x 1000 window (the Runs view: 1280 wide), the window then made as tall as the view so the crop
holds all of it, cropped to the view's part named below and saved as a palette PNG (`<name>-<tag>.png`).

The TensorBoard shot is this interpreter's (`python -m tensorboard.main`): run the script with the Python of the
version to show, from a folder outside any checkout (a checkout in the working folder would be imported instead of
the installed package). The earlier version of the tab: a worktree of that commit with its own virtual environment.
Needs Debian's Chromium and Playwright (tests/tab_fixtures.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

sys.path.insert(0, os.path.join(ROOT, "bench"))
import tab_fixtures  # noqa: E402
import tab_sweep  # noqa: E402 - its DRAWN_SCRIPT: when the compare view's charts are drawn, in the page's clock
from tensorboard_process import TensorBoardProcess  # noqa: E402

HEIGHT = 1000
AFTER_S = 1.0  # the compare view: shot this long after its overlay of every run is drawn
TALLEST = 2400  # px: a view taller than this is cut there


class Shot:
    """One view: its `lg_*` state, window width, what says it is drawn, and the part kept (a selector in the
    tab's frame, at most `max_height` px of it; None: the tab's frame as the window shows it)."""

    def __init__(
        self,
        name: str,
        logdir: str,
        state: Dict[str, object],
        ready: List[str],
        crop: Optional[str],
        width: int = 1600,
        max_height: int = TALLEST,
        timed: Optional[int] = None,
    ) -> None:
        """`timed` (the compare view of that many runs): opened once to warm it, then shot AFTER_S after its overlay
        is drawn, and when its histograms were drawn printed (they may not be in the shot: that is what it shows)."""
        self.name, self.logdir, self.state, self.ready = name, logdir, state, ready
        self.crop, self.width, self.max_height, self.timed = crop, width, max_height, timed


def shots(many_runs: List[str], many_layer: str) -> List[Shot]:
    return [
        Shot(
            "layer-nan-backward",
            "demo",
            {"view": "layer", "run": "nan_backward", "layer": "nan_backward/dense_0"},
            [".lg-stats-table", ".lg-panel-charts svg"],
            ".lg-root",
        ),
        Shot("runs-1280", "demo", {"view": "runs"}, [".lg-runs-table tbody tr"], None, width=1280),
        Shot("overview-mislabelled", "demo", {"run": "mislabelled"}, [".lg-overview .lg-heatmap-canvas"], ".lg-root"),
        Shot("overview-gan", "demo", {"run": "gan", "target": "generator"}, [".lg-summary"], ".lg-summary"),
        Shot(
            "histograms-seed-minimalrnn",
            "demo",
            {"view": "layer", "run": "seed_minimalrnn", "layer": "my_model/minimalrnn"},
            [".lg-panel-hist svg path"],
            ".lg-panel-hist",
        ),
        Shot("noise-mislabelled", "demo", {"run": "mislabelled"}, [".lg-panel-noise svg path"], ".lg-panel-noise"),
        Shot(
            f"compare-{len(many_runs)}-runs",
            "many",
            {"view": "compare", "run": many_runs[0], "runs": json.dumps(many_runs), "layer": many_layer},
            [".lg-panel-wide path.lg-line", ".lg-layer-row .lg-panel:first-child svg path"],
            ".lg-root",
            timed=len(many_runs),
        ),
    ]


def _clip(page, frame, selector: Optional[str], max_height: int) -> Dict[str, float]:
    """The page's rectangle of `selector` in the tab's frame (None: the frame as shown), at most `max_height` tall."""
    box = frame.frame_element().bounding_box()
    if selector is not None:
        box = frame.locator(selector).first.bounding_box()
    view = page.viewport_size
    x, y = max(0.0, box["x"]), max(0.0, box["y"])
    width = min(box["width"], view["width"] - x)
    height = min(box["height"], view["height"] - y, max_height)
    return {"x": x, "y": y, "width": width, "height": height}


def _palette(path: str) -> None:
    """The PNG as 256 colours, optimised (a UI's flat colours lose nothing a reader sees)."""
    from PIL import Image

    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, optimize=True)


def take_timed(browser: tab_fixtures.Browser, base: str, shot: Shot, out: str) -> str:
    """The view opened once (warm), then again in a window as tall as its view, shot AFTER_S after its overlay of
    every run is drawn (in the page's clock, `tab_sweep.DRAWN_SCRIPT`); prints when its histograms were drawn."""
    n = shot.timed
    page = browser.page
    page.set_viewport_size({"width": shot.width, "height": HEIGHT})
    browser.context.add_init_script(f"window.__lgWant = {int(n)};")  # the last one added runs last
    frame = browser.open(base, shot.state)
    frame.wait_for_function("() => window.__lgDrawn && window.__lgDrawn.hist", timeout=300_000)
    top = frame.frame_element().bounding_box()["y"]
    tall = frame.evaluate("() => document.querySelector('.lg-root').getBoundingClientRect().height")
    page.set_viewport_size({"width": shot.width, "height": int(min(max(HEIGHT, top + tall + 8), top + TALLEST))})
    frame = browser.open(base, shot.state)
    frame.wait_for_function(
        "(ms) => window.__lgDrawn && window.__lgDrawn.overlay && performance.now() - window.__lgDrawn.overlay >= ms",
        arg=AFTER_S * 1000,
        timeout=300_000,
        polling="raf",
    )
    path = os.path.join(out, shot.name + ".png")
    page.screenshot(path=path, clip=_clip(page, frame, shot.crop, shot.max_height))
    frame.wait_for_function("() => window.__lgDrawn.hist", timeout=300_000)
    t = frame.evaluate("() => window.__lgDrawn")
    print(f"{shot.name}: histograms drawn {t['hist'] - t['overlay']:.0f} ms after the overlay", flush=True)
    _palette(path)
    return path


def take(browser: tab_fixtures.Browser, base: str, shot: Shot, out: str) -> str:
    if shot.timed is not None:
        return take_timed(browser, base, shot, out)
    page = browser.page
    page.set_viewport_size({"width": shot.width, "height": HEIGHT})
    frame = browser.open(base, shot.state)
    for selector in shot.ready:
        frame.wait_for_selector(selector, state="attached", timeout=60_000)
    time.sleep(1.5)  # the view's other panels and requests
    top = frame.frame_element().bounding_box()["y"]
    tall = frame.evaluate("() => document.querySelector('.lg-root').getBoundingClientRect().height")
    page.set_viewport_size({"width": shot.width, "height": int(min(max(HEIGHT, top + tall + 8), top + TALLEST))})
    time.sleep(1.0)  # charts redraw to the new size
    path = os.path.join(out, shot.name + ".png")
    page.screenshot(path=path, clip=_clip(page, frame, shot.crop, shot.max_height))
    _palette(path)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", required=True, help="a logdir of `tb-layergrad demo`")
    parser.add_argument("--many", required=True, help="a logdir of many runs of one model (synthetic sweep)")
    parser.add_argument(
        "--many-layer", default="model/block_0/dense_4", help="the layer compared (default: the middle one of 8)"
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--tag", required=True, help="appended to each file's name: before, after")
    parser.add_argument("--only", default="", help="comma-separated shot names (default: all)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    many_runs = sorted(
        os.path.relpath(os.path.join(d, ""), args.many).rstrip("/")
        for d, _, files in os.walk(args.many)
        if any(f.startswith("events.out.tfevents") for f in files)
    )
    logdirs = {"demo": args.demo, "many": args.many}
    todo = [s for s in shots(many_runs, args.many_layer) if not args.only or s.name in args.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for key, logdir in logdirs.items():
            mine = [s for s in todo if s.logdir == key]
            if not mine:
                continue
            tb = TensorBoardProcess(logdir, os.path.join(tmp, f"tensorboard-{key}.log"))
            browser = None
            try:
                tb.wait_until(lambda p: p.get("/data/plugin/layergrad/runs", 30)[0] == 200, "the plugin", 300)
                _wait_read(tb)
                browser = tab_fixtures.Browser(os.path.join(tmp, f"profile-{key}"), viewport=(1600, HEIGHT))
                browser.context.add_init_script(tab_sweep.DRAWN_SCRIPT)
                for shot in mine:
                    path = take(browser, tb.base, shot, tmp)
                    final = os.path.join(args.out, f"{shot.name}-{args.tag}.png")
                    os.replace(path, final)
                    print("wrote", final, os.path.getsize(final), "bytes", flush=True)
                if browser.errors or browser.dialogs:
                    print("problems in the browser:\n" + "\n".join(browser.errors + browser.dialogs), flush=True)
            finally:
                if browser is not None:
                    browser.close()
                tb.stop()
    return 0


def _wait_read(tb: TensorBoardProcess, timeout: float = 600) -> None:
    """Until every run's statistics are read (the tab's views then draw at once), where the plugin says so."""

    def read(p) -> bool:
        code, body, _ = p.get("/data/plugin/layergrad/runs", 30)
        runs = json.loads(body)["runs"] if code == 200 else []
        return bool(runs) and all(r.get("statistics_read", True) for r in runs)

    tb.wait_until(read, "the statistics read", timeout, interval=1.0)


if __name__ == "__main__":
    sys.exit(main())
