"""Tab latency: time the plugin routes of a real `tensorboard` process, both loaders.

Starts `python -m tensorboard.main --logdir D` on a free local port, waits until
every run is loaded, then times (warm: each route asked once before timing) the
routes the tab calls: the run/layer listing, the gradient-flow matrix, one
layer's detail (stats + histograms) and a 3-run comparison. Also reads the
resident memory of TensorBoard and its data-server child.

First requests ("cold") are timed twice: once the plugin has read the runs' statistics ahead (the `runs`
route says `statistics_read`; how long after loading that took is reported too), and, in a second
process started with `--layergrad_prefetch=false`, right after loading with nothing read ahead.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse
from typing import Dict, List, Optional, Tuple

# The tests' TensorBoard process (own process group, free port): one implementation for both.
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from tensorboard_process import PLUGIN_API, TensorBoardProcess  # noqa: E402


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, from /proc (Linux)."""
    total = 0
    pids = [pid]
    try:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        pids += [int(c) for c in children]
    except FileNotFoundError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


class TensorBoard:
    """The routes of one `tensorboard` process that loads the logdir once (no reload while timing)."""

    def __init__(self, logdir: str, load_fast: str, extra: Optional[List[str]] = None):
        self.process = TensorBoardProcess(logdir, None, load_fast=load_fast, reload_interval=0, extra=extra)

    def get(
        self, route: str, query: Optional[Dict] = None, timeout: float = 600, gzip_ok: bool = False
    ) -> Tuple[int, bytes]:
        """(status, body) of a route; `gzip_ok`: asked as a browser asks (`Accept-Encoding: gzip`), the body returned
        decompressed."""
        path = PLUGIN_API + route + ("?" + urllib.parse.urlencode(query, doseq=True) if query else "")
        return self.process.get(path, timeout, gzip_ok)[:2]

    def wait_loaded(self, runs: int, last_step: int, timeout: float) -> Tuple[float, float]:
        """(seconds until the plugin answers at all: start-up; seconds until every run reports `last_step`)."""
        start = time.time()
        self.process.wait_until(
            lambda _: self.get("runs", timeout=30)[0] == 200, "the plugin to answer", timeout, interval=0.2
        )
        started = time.time() - start

        def loaded(_) -> bool:
            code, body = self.get("runs", timeout=30)
            return code == 200 and len([r for r in json.loads(body)["runs"] if r["max_step"] == last_step]) == runs

        self.process.wait_until(loaded, f"{runs} runs up to step {last_step}", timeout, interval=0.2)
        return started, time.time() - start

    def wait_statistics_read(self, timeout: float) -> float:
        """Seconds until the `runs` route says every run's statistics are read ahead (`plugin.prefetch`)."""
        start = time.time()

        def read(_) -> bool:
            code, body = self.get("runs", timeout=30)
            return code == 200 and all(r["statistics_read"] for r in json.loads(body)["runs"])

        self.process.wait_until(read, "the statistics read ahead", timeout, interval=0.1)
        return time.time() - start

    def stop(self) -> None:
        self.process.stop()


def time_route(
    tb: TensorBoard, route: str, query: Dict, repeats: int, cold: Optional[Dict[str, float]] = None
) -> float:
    """The median of `repeats` warm requests; the first (cold) one's time goes in `cold[route]` if given."""
    start = time.perf_counter()
    code, body = tb.get(route, query)
    if cold is not None:
        cold[route] = time.perf_counter() - start
    if code != 200:
        raise RuntimeError(f"{route} {query} -> {code}: {body[:200]!r}")
    times: List[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        tb.get(route, query)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(
    logdir: str,
    runs: int,
    layers: int,
    steps: int,
    load_fast: str,
    repeats: int = 11,
    timeout: float = 3600,
    last_step: Optional[int] = None,
    points: Optional[int] = None,
) -> Dict[str, float]:
    """Start-up, load time, resident memory and warm route latencies of a logdir of `runs` runs.

    `last_step`: the step every run ends at (default `steps - 1`); `points`: ask the
    matrix, stats and compare routes for that many bins (the tab's pixels), not every step.
    """
    tb = TensorBoard(logdir, load_fast)
    binned = {} if points is None else {"points": points}
    cold: Dict[str, float] = {}
    try:
        startup_s, load_s = tb.wait_loaded(runs, steps - 1 if last_step is None else last_step, timeout)
        read_ahead_s = tb.wait_statistics_read(timeout)
        listing = json.loads(tb.get("runs")[1])
        run0 = listing["runs"][0]
        layer = run0["layers"][len(run0["layers"]) // 2]["layer"]
        all_runs = [r["run"] for r in listing["runs"]]
        out = {
            "startup_s": startup_s,
            "load_s": load_s,
            "read_ahead_s": read_ahead_s,
            "listing_s": time_route(tb, "runs", {}, repeats),
            "matrix_s": time_route(tb, "matrix", {"run": run0["run"], "stat": "norm", **binned}, repeats, cold),
            "layer_stats_s": time_route(tb, "stats", {"run": run0["run"], "layer": layer, **binned}, repeats, cold),
            "layer_histograms_s": time_route(
                tb, "histograms", {"run": run0["run"], "layer": layer, "max_steps": 60}, repeats
            ),
            "compare_s": time_route(
                tb, "compare", {"run": all_runs[:3], "layer": layer, "stat": "norm", **binned}, repeats
            ),
            "anomalies_s": time_route(tb, "anomalies", {"run": run0["run"]}, repeats, cold),
            "rss_mb": _rss_mb(tb.process.proc.pid),
        }
        out["layer_detail_s"] = out["layer_stats_s"] + out["layer_histograms_s"]
        out["matrix_cold_s"] = cold["matrix"]  # the first read of the run's statistics
        out["slowest_cold_s"] = max(cold.values())
    finally:
        tb.stop()
    out["slowest_cold_unread_s"] = max(
        first_requests_unread(logdir, runs, steps, load_fast, timeout, last_step, points).values()
    )
    return out


def first_requests_unread(
    logdir: str,
    runs: int,
    steps: int,
    load_fast: str,
    timeout: float,
    last_step: Optional[int] = None,
    points: Optional[int] = None,
) -> Dict[str, float]:
    """The first requests of the overview and a layer right after loading, with nothing read ahead
    (`--layergrad_prefetch=false`): what the statistics' first read costs the request that makes it."""
    tb = TensorBoard(logdir, load_fast, extra=["--layergrad_prefetch=false"])
    binned = {} if points is None else {"points": points}
    try:
        tb.wait_loaded(runs, steps - 1 if last_step is None else last_step, timeout)
        run0 = json.loads(tb.get("runs")[1])["runs"][0]
        layer = run0["layers"][len(run0["layers"]) // 2]["layer"]
        cold: Dict[str, float] = {}
        for route, query in (
            ("matrix", {"run": run0["run"], "stat": "norm", **binned}),
            ("stats", {"run": run0["run"], "layer": layer, **binned}),
            ("anomalies", {"run": run0["run"]}),
        ):
            start = time.perf_counter()
            code, body = tb.get(route, query)
            cold[route] = time.perf_counter() - start
            if code != 200:
                raise RuntimeError(f"{route} {query} -> {code}: {body[:200]!r}")
        return cold
    finally:
        tb.stop()
