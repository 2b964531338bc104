"""A long run logged every step: memory per byte on disk, load time, route latency under a live writer.

The run is what `GradientLogger(update_freq=1, weights=True, activations=True)` writes for an 8-layer MLP:
a template of real steps is logged first (`template`: the real callback, a few hundred steps of `fit()`), then
`LongRunWriter` repeats its records for as many steps as asked, each record's step, wall time and block tag
(`metadata.GroupInfo.tag_at`) set to its own, the metadata on each tag's first record as the callback puts
it: the same records, the same bytes per step, framed with their checksums (`reader.damage`), no TensorFlow
in the loop. So a run of 100,000 steps takes seconds to write, and it can be appended at any rate.

Measured, for each loader (`--load_fast=true`: Rust data server; `false`: Python):
- `rss_mb`: resident memory of TensorBoard and its data server once every step is loaded and the plugin
  has read the run's statistics (`statistics_read`), per byte of the event file (`rss_per_byte`), and
  the same with nothing of ours asked yet (`rss_loaded_mb`: TensorBoard's own reservoirs);
- `load_s`: seconds from start until the `runs` route lists the last step;
- live: once the run's statistics are read (the tab open on it), a writer appends `--rate` steps a second while
  `--readers` threads ask the tab's routes in turn, as a browser asks (gzip accepted); p50/p95/max per route,
  and `fresh_s`: how long after a step is written the `runs` route lists it (the largest of the samples taken).

    python bench/long_run.py --steps 100000 [--loaders true,false] [--rate 500 --readers 16 --live-s 60]
    python bench/long_run.py --write-only OUT --steps 100000   # the logdir alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tab_latency  # noqa: E402

from tb_layergrad import metadata  # noqa: E402
from tb_layergrad.reader import damage  # noqa: E402

RUN = "long/train"
TEMPLATE_STEPS = 300
HEADING = "### Long run:"
SMOKE = {"steps": 300, "rate": 100, "readers": 2, "live_s": 2.0}
# The targets of a long run logged every step (docs/PERFORMANCE.md): memory per byte on disk, route latency
# while written, how soon the newest step is served.
RSS_PER_BYTE_TARGET = 2.0
P95_TARGET_S, MAX_TARGET_S, FRESH_TARGET_S = 1.0, 5.0, 5.0
LOADER_NAMES = {"true": "Rust", "false": "Python"}
ROUTES = ("runs", "matrix", "stats", "histograms", "anomalies", "sweep", "csv")


def template(out: str, steps: int = TEMPLATE_STEPS) -> str:
    """The event file of a real `GradientLogger(update_freq=1, weights=True, activations=True)` run of `steps`
    steps on an 8-layer MLP (made once per `out`)."""
    found = _event_file(out)
    if found:
        return found
    import keras

    import tb_layergrad

    layers = [keras.layers.Dense(64, activation="relu") for _ in range(7)] + [keras.layers.Dense(10)]
    model = keras.Sequential([keras.Input((32,))] + layers)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 16, 32)).astype("float32")
    y = rng.integers(0, 10, size=steps * 16)
    logger = tb_layergrad.GradientLogger(out, update_freq=1, weights=True, activations=True)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[logger])
    return _event_file(out)


def _event_file(root: str) -> Optional[str]:
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if damage.is_event_file(name):
                return os.path.join(folder, name)
    return None


def _records(path: str) -> List[bytes]:
    """The payloads of every record of an event file."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = np.frombuffer(data, "<u8", 1, pos)
        out.append(data[pos + 12 : pos + 12 + int(length)])
        pos += 12 + int(length) + 4
    return out


def frame_many(payloads: List[bytes]) -> bytes:
    """TFRecord framing of every payload (length, its masked CRC32C, payload, its masked CRC32C)."""
    lengths = np.asarray([len(p) for p in payloads], np.uint64)
    heads = lengths.astype("<u8").tobytes()
    head_crc = damage.masked_crc32c_many(np.frombuffer(heads, np.uint8), np.arange(len(payloads)) * 8, 8)
    body = np.frombuffer(b"".join(payloads), np.uint8)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    crcs = np.zeros([len(payloads)], np.uint32)
    for length in np.unique(lengths):
        idx = np.flatnonzero(lengths == length)
        crcs[idx] = damage.masked_crc32c_many(body, starts[idx], int(length))
    parts = []
    for i, p in enumerate(payloads):
        parts += [heads[8 * i : 8 * i + 8], head_crc[i].astype("<u4").tobytes(), p, crcs[i].astype("<u4").tobytes()]
    return b"".join(parts)


class LongRunWriter:
    """Appends steps of the template's records to `run_dir`'s event file, as the callback would write them."""

    def __init__(self, template_path: str, run_dir: str) -> None:
        from tensorboard.compat.proto import event_pb2

        events = [event_pb2.Event.FromString(r) for r in _records(template_path)]
        self._first = events[0]  # file_version
        by_step: Dict[int, list] = {}
        self._metadata: Dict[str, object] = {}  # group tag (without block) -> metadata
        self._blocks: Dict[str, int] = {}
        for e in events[1:]:
            for v in e.summary.value:
                base = v.tag.rsplit("/", 1)[0]
                if v.HasField("metadata"):
                    self._metadata[base] = v.metadata
                    info = metadata.parse_plugin_content(v.metadata.plugin_data.content)
                    self._blocks[base] = info.block_steps
            by_step.setdefault(e.step, []).append(e)
        steps = sorted(by_step)
        self._steps = [by_step[s] for s in steps[len(steps) // 3 :]]  # past the first steps' warm-up
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "events.out.tfevents.1700000000.longrun.v2")
        self._file = open(self.path, "ab")
        self._file.write(frame_many([self._first.SerializeToString()]))
        self._tagged: set = set()
        self.bytes = 0

    def write(self, start: int, stop: int, t0: float = 1.7e9, dt: float = 0.002) -> None:
        """Steps [start, stop), flushed."""
        from tensorboard.compat.proto import event_pb2

        payloads = []
        for step in range(start, stop):
            for e in self._steps[step % len(self._steps)]:
                out = event_pb2.Event()
                out.CopyFrom(e)
                out.step, out.wall_time = step, t0 + step * dt
                for v in out.summary.value:
                    base = v.tag.rsplit("/", 1)[0]
                    v.tag = f"{base}/{metadata.block_start(step, self._blocks[base])}"
                    v.ClearField("metadata")
                    if v.tag not in self._tagged:
                        self._tagged.add(v.tag)
                        v.metadata.CopyFrom(self._metadata[base])
                payloads.append(out.SerializeToString())
        data = frame_many(payloads)
        self._file.write(data)
        self._file.flush()
        self.bytes += len(data)

    def close(self) -> None:
        self._file.close()


def write_logdir(out: str, steps: int, template_dir: str, chunk: int = 2000) -> LongRunWriter:
    w = LongRunWriter(template(template_dir), os.path.join(out, RUN))
    for a in range(0, steps, chunk):
        w.write(a, min(steps, a + chunk))
    return w


def _queries(run: str, layer: str) -> Dict[str, dict]:
    return {
        "runs": {},
        "matrix": {"run": run, "points": 600},
        "stats": {"run": run, "layer": layer, "points": 600},
        "histograms": {"run": run, "layer": layer, "max_steps": 50},
        "anomalies": {"run": run, "points": 600},  # as the tab asks: the rules, no step's flags past 600
        "sweep": {},
        "csv": {"run": run, "layer": layer, "start": 0, "end": 1000},
    }


def rss_split(pid: int) -> Tuple[float, float]:
    """(MB resident in TensorBoard's Python process, MB in its children: the Rust data server)."""
    total = tab_latency._rss_mb(pid)
    own = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                own = int(line.split()[1]) / 1024
    return own, total - own


def baseline(load_fast: str) -> Tuple[float, float]:
    """`rss_split` of TensorBoard (with the plugin) on an empty logdir, once it answers."""
    with tempfile.TemporaryDirectory() as d:
        tb = tab_latency.TensorBoard(d, load_fast)
        try:
            tb.process.wait_until(lambda _: tb.get("runs", timeout=30)[0] == 200, "the plugin", 120, interval=0.2)
            time.sleep(2)
            return rss_split(tb.process.proc.pid)
        finally:
            tb.stop()


def loaded(logdir: str, steps: int, load_fast: str, timeout: float) -> Dict[str, float]:
    """Load time and memory of a written run (no writer); memory as TensorBoard's resident memory less that of
    the same TensorBoard on an empty logdir (`baseline`: TensorFlow's import alone is ~0.5 GB), per byte."""
    size = os.path.getsize(_event_file(logdir))
    base_py, base_server = baseline(load_fast)
    tb = tab_latency.TensorBoard(logdir, load_fast)
    try:
        _, load_s = tb.wait_loaded(1, steps - 1, timeout)
        py_loaded, server_loaded = rss_split(tb.process.proc.pid)
        read_s = tb.wait_statistics_read(timeout)
        layer = json.loads(tb.get("runs")[1])["runs"][0]["layers"][0]["layer"]
        for route, q in _queries(RUN, layer).items():
            tb.get(route, q)
        py, server = rss_split(tb.process.proc.pid)
    finally:
        tb.stop()
    mb = size / 2**20
    return {
        "bytes_mb": mb,
        "load_s": load_s,
        "read_s": read_s,
        "baseline_mb": base_py + base_server,
        "python_loaded_mb": py_loaded - base_py,
        "server_loaded_mb": server_loaded - base_server,
        "python_mb": py - base_py,
        "server_mb": server - base_server,
        "rss_per_byte": (py - base_py + server - base_server) / mb,
    }


def live(
    logdir: str, writer: LongRunWriter, start: int, load_fast: str, rate: int, readers: int, seconds: float
) -> Dict[str, object]:
    """Route latencies and freshness while `writer` appends `rate` steps a second from `start` on."""
    tb = tab_latency.TensorBoard(logdir, load_fast, extra=["--reload_interval", "1"])
    times: Dict[str, List[float]] = {r: [] for r in ROUTES}
    fresh: List[float] = []
    written: Dict[int, float] = {}
    stop = threading.Event()
    errors: List[str] = []
    try:
        tb.wait_loaded(1, start - 1, 600)
        # The tab open on the run before training goes on: its first read of the run is `read_s` (`loaded`); what is
        # measured here is the run while written, each new step read once.
        tb.wait_statistics_read(600)
        layer = json.loads(tb.get("runs")[1])["runs"][0]["layers"][0]["layer"]
        queries = _queries(RUN, layer)

        def write() -> None:
            step, t = start, time.perf_counter()
            while not stop.is_set():
                due = start + int((time.perf_counter() - t) * rate)
                if due > step:
                    writer.write(step, due)
                    now = time.perf_counter()
                    for s in range(step, due, 50):
                        written[s] = now
                    step = due
                time.sleep(0.01)

        def read(i: int) -> None:
            k = i
            while not stop.is_set():
                route = ROUTES[k % len(ROUTES)]
                k += 1
                t = time.perf_counter()
                try:
                    code, body = tb.get(route, queries[route], timeout=120, gzip_ok=True)  # as the tab's browser
                except OSError as e:  # a timeout: counted at its length
                    code, body = 0, str(e).encode()
                times[route].append(time.perf_counter() - t)
                if code != 200:
                    errors.append(f"{route}: {code}")
                if route == "runs" and code == 200:
                    top = max(r["max_step"] or 0 for r in json.loads(body)["runs"])
                    seen = [t for s, t in written.copy().items() if s <= top]  # the writer adds to it meanwhile
                    if seen:
                        fresh.append(time.perf_counter() - max(seen))

        threads = [threading.Thread(target=write)] + [threading.Thread(target=read, args=(i,)) for i in range(readers)]
        for th in threads:
            th.start()
        time.sleep(seconds)
        stop.set()
        for th in threads:
            th.join()
    finally:
        tb.stop()

    def pct(xs: List[float], q: float) -> float:
        return float(np.percentile(xs, q)) if xs else float("nan")

    return {
        "routes": {
            r: {"n": len(t), "p50": pct(t, 50), "p95": pct(t, 95), "max": max(t) if t else float("nan")}
            for r, t in times.items()
        },
        "fresh_s": max(fresh) if fresh else float("nan"),
        "fresh_median_s": statistics.median(fresh) if fresh else float("nan"),
        "errors": errors[:10],
    }


_READ_SCRIPT = """
import os, sys, time


def vm(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


logdir, what = sys.argv[1], sys.argv[2]
if what == "tensorboard":
    import tensorflow  # noqa: F401 - its record reader, as a tensorboard with TensorFlow installed reads
    from tensorboard.backend.event_processing import event_file_loader
elif what == "load":
    import pandas  # noqa: F401
    import tb_layergrad
else:
    from tb_layergrad.cli import report
base, t = vm("VmRSS:"), time.perf_counter()
if what == "tensorboard":
    n = 0
    for folder, _, files in os.walk(logdir):
        for f in files:
            if "tfevents" in f:
                n += sum(1 for _ in event_file_loader.EventFileLoader(os.path.join(folder, f)).Load())
    rows, frame = n, 0
elif what == "load":
    df = tb_layergrad.load(logdir)
    rows, frame = len(df), df.memory_usage(deep=True).sum()
else:
    rows, frame = len(report.build(logdir).runs), 0
print(time.perf_counter() - t, vm("VmHWM:") - base, rows, frame)
"""


def readers(logdir: str) -> Dict[str, Dict[str, float]]:
    """Seconds and peak memory over what the imports took, each in a process of its own: TensorBoard's own
    event-file loader (with TensorFlow's record reader: what a `tensorboard` with TensorFlow installed parses
    with), `load()`, `report`."""
    import subprocess

    out = {}
    for what in ("tensorboard", "load", "report"):
        done = subprocess.run(
            [sys.executable, "-c", _READ_SCRIPT, logdir, what], capture_output=True, text=True, check=True
        )
        seconds, peak, rows, frame = done.stdout.split()[-4:]
        out[what] = {
            "s": float(seconds),
            "peak_mb": int(peak) / 2**20,
            "rows": int(rows),
            "frame_mb": int(frame) / 2**20,
        }
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def table(
    steps: int, results: Dict[str, Dict], read: Optional[Dict], date: str, command: str, load: Tuple[float, float]
) -> List[str]:
    """The section of docs/PERFORMANCE.md."""
    first = next(iter(results.values()))
    lines = [
        f"{HEADING} {steps:,} steps of GradientLogger(update_freq=1, weights=True, activations=True), 8-layer MLP, "
        f"{first['bytes_mb']:.0f} MB of event file (measured {date} with {command})\n",
        f"| loader | loaded | TensorBoard's memory per byte (target <= {RSS_PER_BYTE_TARGET:g}) | of which the data "
        "server | of which the Python process (after the tab's reads) |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        # A data server that holds none of the run reads a hair under its empty-logdir baseline: 0, not "-0".
        lines.append(
            f"| {name} | {r['load_s']:.1f} s | {r['rss_per_byte']:.1f} ({_met(r['rss_per_byte'] <= RSS_PER_BYTE_TARGET)}) "
            f"| {max(r['server_mb'], 0.0):.0f} MB | {r['python_mb']:.0f} MB (once loaded: {r['python_loaded_mb']:.0f} MB) |"
        )
    live = {name: r["live"] for name, r in results.items() if "live" in r}
    if live:
        spec = next(iter(results.values()))["live_spec"]
        lines += [
            "",
            f"While written: {spec['rate']} steps/s appended for {spec['seconds']:g} s, {spec['readers']} concurrent "
            f"readers asking the routes in turn, gzip accepted as by a browser (targets: p95 <= {P95_TARGET_S:g} s, "
            f"max <= {MAX_TARGET_S:g} s, newest step listed <= {FRESH_TARGET_S:g} s after written)\n",
            "| loader | route | requests | p50 | p95 | max |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for name, lv in live.items():
            for route, t in lv["routes"].items():
                lines.append(
                    f"| {name} | `{route}` | {t['n']} | {t['p50']:.2f} s | {t['p95']:.2f} s "
                    f"({_met(t['p95'] <= P95_TARGET_S)}) | {t['max']:.2f} s ({_met(t['max'] <= MAX_TARGET_S)}) |"
                )
            lines.append(
                f"| {name} | newest step listed after | | {lv['fresh_median_s']:.2f} s | | {lv['fresh_s']:.2f} s "
                f"({_met(lv['fresh_s'] <= FRESH_TARGET_S)}) |"
            )
    if read:
        tb, ld, rp = read["tensorboard"], read["load"], read["report"]
        lines += [
            "",
            "| reader | seconds (after its imports) | peak memory over its imports |",
            "|---|---:|---:|",
            f"| TensorBoard's event-file loader, TensorFlow's record reader ({tb['rows']:,} events) | {tb['s']:.1f} s "
            f"| {tb['peak_mb']:.0f} MB |",
            f"| `tb_layergrad.load()` ({ld['rows']:,} rows, frame {ld['frame_mb']:.0f} MB) | {ld['s']:.1f} s "
            f"({ld['s'] / tb['s']:.1f}x; target <= 3x) | {ld['peak_mb']:.0f} MB ({ld['peak_mb'] / max(ld['frame_mb'], 1e-9):.1f}x "
            "the frame; target <= 2x) |",
            f"| `tb-layergrad report` | {rp['s']:.1f} s | {rp['peak_mb']:.0f} MB |",
        ]
    lines += [
        "",
        "The run: a real GradientLogger run's records (bench/long_run.py `template`) repeated to every step, each "
        "record's step, wall time and block tag its own: the bytes the callback writes. Memory: resident memory "
        "of TensorBoard and its data server once the run is loaded and the plugin has read it, less that of the "
        "same TensorBoard on an empty logdir, per byte of event file. One shared machine (2 cores, other work on "
        f"it): load average (1 min) at the start {load[0]:.1f}, at the end {load[1]:.1f}. Why the targets not met "
        'are not, and the design that meets them: docs/DESIGN.md, "A long run logged every step".',
        "",
    ]
    return lines


def section(
    steps: int, loaders: List[str], command: str, rate: int, readers_n: int, live_s: float, template_dir: str
) -> Tuple[Dict, List[str]]:
    """(figures, the section of docs/PERFORMANCE.md) of a run of `steps` written anew."""
    load = os.getloadavg()[0]
    results: Dict[str, Dict] = {}
    read = None
    for lf in loaders:
        with tempfile.TemporaryDirectory() as d:
            w = write_logdir(d, steps, template_dir)
            res: Dict = loaded(d, steps, lf, 3600)
            if live_s > 0:
                res["live"] = live(d, w, steps, lf, rate, readers_n, live_s)
                res["live_spec"] = {"rate": rate, "readers": readers_n, "seconds": live_s}
            w.close()
            if read is None:
                with tempfile.TemporaryDirectory() as again:  # the run as written, without the live steps
                    write_logdir(again, steps, template_dir).close()
                    read = readers(again)
        results[LOADER_NAMES[lf]] = res
    lines = table(steps, results, read, time.strftime("%Y-%m-%d"), command, (load, os.getloadavg()[0]))
    print("\n".join(lines), flush=True)
    return results, lines


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--loaders", default="true,false")
    p.add_argument("--rate", type=int, default=500)
    p.add_argument("--readers", type=int, default=16)
    p.add_argument("--live-s", type=float, default=60.0)
    p.add_argument("--template", default=os.path.join(tempfile.gettempdir(), "tb_layergrad_long_template"))
    p.add_argument("--write-only", metavar="OUT")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if args.write_only:
        w = write_logdir(args.write_only, args.steps, args.template)
        print(f"{args.steps} steps, {w.bytes / 2**20:.1f} MB in {w.path}")
        return
    results: Dict[str, Dict[str, object]] = {}
    for lf in args.loaders.split(","):
        with tempfile.TemporaryDirectory() as d:
            w = write_logdir(d, args.steps, args.template)
            res: Dict[str, object] = loaded(d, args.steps, lf, 3600)
            if args.live_s > 0:
                res["live"] = live(d, w, args.steps, lf, args.rate, args.readers, args.live_s)
            w.close()
        results[LOADER_NAMES[lf]] = res
        print(LOADER_NAMES[lf], json.dumps(res, indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
