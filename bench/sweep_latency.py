"""Sweep latency: the Runs view's `sweep` route on a synthetic sweep in a real `tensorboard` process, both loaders.

Writes (or reuses) a sweep logdir (bench/synthetic_logdir.py `--sweep`: hyperparameters as `hp.hparams` writes
them, noise-scale scalars, runs that go wrong), starts `python -m tensorboard.main --logdir D` on a free port,
waits until every run is loaded and until the plugin's read-ahead has read every run's statistics and computed
its row (the `runs` route's `statistics_read` and `sweep_read`), then times the `sweep` route's first request and
the median of warm ones (a poll of an unchanged sweep), and reads TensorBoard's resident memory (with its data
server). A second process started with `--layergrad_prefetch=false` times the first request with nothing read
ahead: what the first read of every run's statistics costs the request that makes it.

    python bench/sweep_latency.py [--runs 200 --layers 50 --steps 1000] [--logdir D] [--loaders true,false]
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
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synthetic_logdir  # noqa: E402
import tab_latency  # noqa: E402

# The sweep's size (runs, layers, steps) and its targets (docs/PERFORMANCE.md); a size for smoke tests.
SIZE = (200, 50, 1000)
SMOKE_SIZE = (4, 3, 20)
HEADING = "### Sweep:"
FIRST_TARGET_S = 1.5
WARM_TARGET_S = 0.5
LOADER_NAMES = {"true": "Rust", "false": "Python"}


def wait_rows_read(tb: tab_latency.TensorBoard, timeout: float) -> float:
    """Seconds until the `runs` route says every run's statistics are read and its sweep row computed."""
    start = time.time()

    def read(_) -> bool:
        code, body = tb.get("runs", timeout=60)
        return code == 200 and all(r["statistics_read"] and r["sweep_read"] for r in json.loads(body)["runs"])

    tb.process.wait_until(read, "the statistics read and the sweep rows computed", timeout, interval=0.2)
    return time.time() - start


def _sweep(tb: tab_latency.TensorBoard, runs: int) -> float:
    """Seconds of one `sweep` request, checked: 200 and one row per run."""
    start = time.perf_counter()
    code, body = tb.get("sweep", timeout=600)
    seconds = time.perf_counter() - start
    if code != 200 or len(json.loads(body)["runs"]) != runs:
        raise RuntimeError(f"sweep -> {code}: {body[:300]!r}")
    return seconds


def measure(
    logdir: str, runs: int, steps: int, load_fast: str, repeats: int = 11, timeout: float = 3600, unread: bool = True
) -> Dict[str, float]:
    """Load time, read-ahead time, the sweep route's first and warm (median) requests, RSS; with `unread`, also
    the first request of a process that reads nothing ahead."""
    tb = tab_latency.TensorBoard(logdir, load_fast)
    try:
        startup_s, load_s = tb.wait_loaded(runs, steps - 1, timeout)
        out = {"startup_s": startup_s, "load_s": load_s, "read_ahead_s": wait_rows_read(tb, timeout)}
        out["first_s"] = _sweep(tb, runs)
        out["warm_s"] = statistics.median(_sweep(tb, runs) for _ in range(repeats))
        out["rss_mb"] = tab_latency._rss_mb(tb.process.proc.pid)
    finally:
        tb.stop()
    if unread:
        tb = tab_latency.TensorBoard(logdir, load_fast, extra=["--layergrad_prefetch=false"])
        try:
            tb.wait_loaded(runs, steps - 1, timeout)
            out["first_unread_s"] = _sweep(tb, runs)
        finally:
            tb.stop()
    return out


def sweep_logdir(runs: int, layers: int, steps: int) -> str:
    """A new temporary logdir of the sweep (bench/synthetic_logdir.py `write_sweep`)."""
    logdir = tempfile.mkdtemp(prefix="layergrad_sweep_")
    synthetic_logdir.write_sweep(logdir, runs, layers, steps)
    return logdir


def table(
    size: tuple,
    results: Dict[str, Dict[str, float]],
    date: str,
    command: str = "`python bench/sweep_latency.py`",
    load: Optional[Tuple[float, float]] = None,
) -> List[str]:
    """The section of docs/PERFORMANCE.md: per loader, the figures against the targets."""
    runs, layers, steps = size
    lines = [
        f"{HEADING} the Runs view's `sweep` route, {runs} runs x {layers} layers x {steps} steps "
        f"(measured {date} with {command})\n",
        "| loader | loaded after start-up | read ahead after loading | first request, read ahead (target "
        f"<= {FIRST_TARGET_S:g} s) | warm, median (target <= {WARM_TARGET_S:g} s) | first request, nothing read "
        "ahead | TensorBoard RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for loader, m in results.items():
        first, warm = m["first_s"], m["warm_s"]
        unread = m.get("first_unread_s")
        lines.append(
            f"| {LOADER_NAMES[loader]} (--load_fast={loader}) | {m['load_s']:.1f} s | {m['read_ahead_s']:.1f} s | "
            f"{first * 1e3:.0f} ms ({'met' if first <= FIRST_TARGET_S else 'NOT met'}) | "
            f"{warm * 1e3:.0f} ms ({'met' if warm <= WARM_TARGET_S else 'NOT met'}) | "
            f"{'–' if unread is None else f'{unread:.1f} s'} | {m['rss_mb']:.0f} MB |"
        )
    lines += [
        "",
        "Synthetic runs (bench/synthetic_logdir.py `--sweep`): learning rate x activation x seed, hyperparameters "
        "written as `hp.hparams` writes them, noise-scale scalars, format version 2 with histograms. *Read ahead*: "
        "until the `runs` route says every run's statistics are read and its row computed (`sweep_read`); the first "
        "request then computes nothing. *Nothing read ahead*: a second process with `--layergrad_prefetch=false`, "
        "whose first request reads every run's statistics."
        + ("" if load is None else f" Load average (1 min) at the start {load[0]:.1f}, at the end {load[1]:.1f}."),
        "",
    ]
    return lines


def section(size: tuple, loaders: List[str], command: str) -> Tuple[Dict[str, Dict[str, float]], List[str]]:
    """(figures per loader, the section of docs/PERFORMANCE.md) of a sweep of `size` written anew."""
    runs, layers, steps = size
    logdir = sweep_logdir(runs, layers, steps)
    load = os.getloadavg()[0]
    try:
        results = {loader: measure(logdir, runs, steps, loader) for loader in loaders}
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    lines = table(size, results, time.strftime("%Y-%m-%d"), command, (load, os.getloadavg()[0]))
    print("\n".join(lines), flush=True)
    return results, lines


def replace_section(text: str, section_lines: List[str], heading: str = HEADING) -> str:
    """`text` with its section whose heading starts with `heading` (up to the next `### ` heading) replaced by
    `section_lines`; without one, they go before "### Reading the figures", or at the end."""
    lines = text.rstrip("\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    if start is None:
        start = next((i for i, line in enumerate(lines) if line.startswith("### Reading the figures")), len(lines))
        end = start
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("### ")), len(lines))
    return "\n".join(lines[:start] + section_lines + lines[end:]) + "\n"


def rewrite(path: str, section_lines: List[str], heading: str = HEADING) -> None:
    """Replace the section under `heading` (the sweep's by default) of the report at `path` ("-": print only),
    keeping every other figure."""
    if path == "-":
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(replace_section(text, section_lines, heading))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=SIZE[0])
    parser.add_argument("--layers", type=int, default=SIZE[1])
    parser.add_argument("--steps", type=int, default=SIZE[2])
    parser.add_argument("--logdir", help="a sweep written before with these sizes (default: written anew, removed)")
    parser.add_argument("--loaders", default="true,false")
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args(argv)
    logdir = args.logdir or sweep_logdir(args.runs, args.layers, args.steps)
    try:
        results = {
            loader: measure(logdir, args.runs, args.steps, loader, args.repeats) for loader in args.loaders.split(",")
        }
    finally:
        if not args.logdir:
            shutil.rmtree(logdir, ignore_errors=True)
    print(json.dumps(results, indent=1))
    print("\n".join(table((args.runs, args.layers, args.steps), results, time.strftime("%Y-%m-%d"))))


if __name__ == "__main__":
    main()
