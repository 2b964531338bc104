"""Damaged logdirs: the plugin answers and shows every intact step.

One logdir holds every kind of damage, one run each (`Damaged`):

- `truncated`: the last record cut in the middle (a writer killed mid-write), completed later;
- `garbage_random` / `garbage_length`: random bytes appended; a header claiming a 64 MiB record
  that never comes;
- `only_empty` (a run of one empty event file: not listed) and `with_empty` (empty files around a
  good one);
- `two_writers`: two event files in one run dir, one layer each; `restart`: a second file rewriting
  steps 5..9 and going on (the newer file wins);
- `many`: 5,000 layers x 2 kinds = 10,000 tags;
- while TensorBoard serves: `live_two` (two writers appending to their files), `deleted` (the run's
  folder removed, requests racing with the removal), `emptied` (its event file removed, the folder
  kept), `truncated` completed. A removed run may go away or keep what it had, never a part of it;
- observed, not required: `corrupt_middle` (a record with a flipped byte: both loaders stop reading
  the file there) and, for the Rust loader only, `garbage_proto` (a well-framed record that is not an
  Event, with valid records after it: it stops TensorBoard's Python loader as a whole, see
  `test_python_loader_stops_at_a_non_event`).

"Shows everything intact" is checked exactly: for each run the `matrix` route must list exactly the
intact steps of each layer with the exact value written, `histograms` the exact buckets of the
first layer, `csv` one row per intact (layer, step). Checked in-process (TensorBoard's Python
multiplexer) and in two real `tensorboard` processes (`--load_fast=true`, the Rust data server, and
`false`), each started once.

A limitation of TensorBoard's Python loader (not of the plugin, which only reads what the loader
kept) is asserted as such, so that a change shows up: it follows only the newest file of a run
(`live_two`: records appended to the older file afterwards are never read). See docs/RELIABILITY.md.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple
from urllib.parse import urlencode

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from tb_layergrad import metadata
from tb_layergrad.reader import damage

LAYERS = ["net/a", "net/b"]
MANY_LAYERS = [f"big/block_{i // 100}/layer_{i % 100}" for i in range(5000)]
MANY_STEPS = range(3)
REMOVED = ("deleted", "emptied")  # removed while TensorBoard serves: the folder, the file only
API = "/data/plugin/layergrad/"

Expect = Dict[str, Dict[str, Dict[int, float]]]  # run -> layer -> step -> norm
Get = Callable[[str, Optional[dict]], Tuple[int, bytes]]


NOT_AN_EVENT = b"\xff\xfe this is not an Event proto"  # framed by reliability_fixtures.frame: valid CRCs


def record_header(reliability_fixtures, length: int) -> bytes:
    """The start of a record claiming `length` bytes, with a valid header CRC (so readers believe it)."""
    header = struct.pack("<Q", length)
    return header + struct.pack("<I", reliability_fixtures.masked_crc32c(header)) + b"partial"


class Damaged:
    """Builds the damaged logdir; `expect` is what must be served, updated by `go_live`."""

    def __init__(self, reliability_fixtures, logdir: str, rust: bool = False) -> None:
        self.reliability_fixtures = reliability_fixtures  # the runs' writers, for the methods
        self.logdir = logdir
        self.expect: Expect = {}
        self.absent = {"only_empty"}
        self.observed: Expect = {}  # intact records after damage that a loader is known to drop
        self._removed: List[str] = []

        f = reliability_fixtures.write_run(self._dir("truncated"), LAYERS, range(10))
        with open(f.path, "rb") as fh:
            data = fh.read()
        last = f.offsets[-1]
        cut = last + 12 + (len(data) - last - 12) // 2  # inside the payload of step 9's record
        with open(f.path, "r+b") as fh:
            fh.truncate(cut)
        self._truncated = (f, data[cut:])
        self._intact("truncated", LAYERS, range(9))

        f = reliability_fixtures.write_run(self._dir("garbage_random"), LAYERS, range(10))
        f.append_raw(np.random.default_rng(9).bytes(300))
        self._intact("garbage_random", LAYERS, range(10))

        f = reliability_fixtures.write_run(self._dir("garbage_length"), LAYERS, range(10))
        f.append_raw(record_header(reliability_fixtures, 2**26))  # the reader waits for 64 MiB that never come
        self._intact("garbage_length", LAYERS, range(10))
        if rust:  # stops TensorBoard's Python loader as a whole (test_python_loader_stops_at_a_non_event)
            f = reliability_fixtures.write_run(self._dir("garbage_proto"), LAYERS, range(5))
            f.append_raw(reliability_fixtures.frame(NOT_AN_EVENT))
            for step in range(5, 10):
                f.write(step, LAYERS)
            self._intact("garbage_proto", LAYERS, range(5))
            self._observe("garbage_proto", LAYERS, range(5, 10))  # the Rust loader stops at the bad record

        os.makedirs(self._dir("only_empty"))
        open(os.path.join(self._dir("only_empty"), "events.out.tfevents.1600000000.reliability"), "wb").close()
        os.makedirs(self._dir("with_empty"))
        open(os.path.join(self._dir("with_empty"), "events.out.tfevents.1600000000.reliability"), "wb").close()
        reliability_fixtures.write_run(self._dir("with_empty"), LAYERS, range(5))
        open(os.path.join(self._dir("with_empty"), "events.out.tfevents.1900000000.reliability"), "wb").close()
        self._intact("with_empty", LAYERS, range(5))

        a, b = (
            reliability_fixtures.EventFile(self._dir("two_writers"), ".host1"),
            reliability_fixtures.EventFile(self._dir("two_writers"), ".host2"),
        )
        for step in range(10):
            a.write(step, LAYERS[:1])
            b.write(step, LAYERS[1:], first_index=1)
        self._intact("two_writers", LAYERS, range(10))

        reliability_fixtures.write_run(self._dir("restart"), LAYERS, range(10))
        reliability_fixtures.write_run(self._dir("restart"), LAYERS, range(5, 15), shift=0.5)
        self._intact("restart", LAYERS, range(5))
        self._intact("restart", LAYERS, range(5, 15), shift=0.5)

        reliability_fixtures.write_run(self._dir("many"), MANY_LAYERS, MANY_STEPS)
        self._intact("many", MANY_LAYERS, MANY_STEPS)

        self._live = (
            reliability_fixtures.EventFile(self._dir("live_two"), ".host1"),
            reliability_fixtures.EventFile(self._dir("live_two"), ".host2"),
        )
        for step in range(5):
            self._live[0].write(step, LAYERS[:1])
            self._live[1].write(step, LAYERS[1:], first_index=1)
        self._intact("live_two", LAYERS, range(5))

        for run in REMOVED:
            self._removed.append(reliability_fixtures.write_run(self._dir(run), LAYERS, range(5)).path)
            self._intact(run, LAYERS, range(5))

        f = reliability_fixtures.write_run(self._dir("corrupt_middle"), LAYERS, range(10))
        with open(f.path, "r+b") as fh:  # a byte inside the tensor bytes of step 4's record
            fh.seek(f.offsets[1 + 4] + 12 + 60)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0xFF]))
        self._observe("corrupt_middle", LAYERS, [s for s in range(10) if s != 4])

        # What the damage check names (`reader.damage`): run -> [(kind, last step read)], in file order. Not
        # `garbage_proto`: its records are whole, their checksums match. A partial record or an empty file is
        # named once unchanged for `SETTLED_S` (a writer between two flushes): these files are made older.
        self.damage = {
            "truncated": [(damage.TRUNCATED, 8)],
            "garbage_random": [(damage.CORRUPT, 9)],
            "garbage_length": [(damage.TRUNCATED, 9)],
            "only_empty": [(damage.EMPTY, None)],
            "with_empty": [(damage.EMPTY, None), (damage.EMPTY, None)],
            "corrupt_middle": [(damage.CORRUPT, 3)],
        }
        old = time.time() - 2 * damage.SETTLED_S
        for run in ("truncated", "garbage_length", "only_empty", "with_empty"):
            for name in os.listdir(self._dir(run)):
                os.utime(os.path.join(self._dir(run), name), (old, old))

    def _dir(self, run: str) -> str:
        return os.path.join(self.logdir, run)

    def _observe(self, run, layers, steps) -> None:
        for i, layer in enumerate(layers):
            self.observed.setdefault(run, {}).setdefault(layer, {}).update(
                {s: self.reliability_fixtures.norm(i, s) for s in steps}
            )

    def _intact(self, run, layers, steps, shift: float = 0.0) -> None:
        for i, layer in enumerate(layers):
            self.expect.setdefault(run, {}).setdefault(layer, {}).update(
                {s: self.reliability_fixtures.norm(i, s, shift) for s in steps}
            )

    def go_live(self) -> None:
        """What happens while TensorBoard serves: a record completed, two writers go on, a run deleted."""
        f, tail = self._truncated
        f.append_raw(tail)
        self._intact("truncated", LAYERS, [9])
        del self.damage["truncated"]  # completed
        for step in range(5, 10):
            self._live[0].write(step, LAYERS[:1])
            self._live[1].write(step, LAYERS[1:], first_index=1)
        self._intact("live_two", LAYERS, range(5, 10))
        shutil.rmtree(self._dir("deleted"))
        os.remove(self._removed[1])  # emptied

    def python_loader_misses(self) -> set:
        """What TensorBoard's Python loader is known to miss after `go_live` (see the module doc)."""
        return {("live_two", "net/a", s) for s in range(5, 10)}


@dataclasses.dataclass
class Served:
    checked: int = 0  # (run, layer, step) triples that must be served
    missing: set = dataclasses.field(default_factory=set)
    problems: List[str] = dataclasses.field(default_factory=list)
    observed_missing: Dict[str, int] = dataclasses.field(default_factory=dict)  # run -> `observed` records not served
    observed_extra: int = 0  # records served that were damaged (the corrupt one)
    requests: int = 0


def damage_said(plugin_fixtures, get: Get) -> Tuple[Dict[str, list], List[str]]:
    """({run: [(kind, step)] of its row's `damage`}, the listing's warnings) of the `runs` route."""
    code, body = get("runs", None)
    listing = plugin_fixtures.strict_json(body) if code == 200 else {"runs": [], "warnings": []}
    rows = {r["run"]: [(d["kind"], d["step"]) for d in r["damage"]] for r in listing["runs"]}
    return {run: d for run, d in rows.items() if d}, listing["warnings"]


def damage_named(plugin_fixtures, get: Get, damaged: "Damaged", gone: frozenset = frozenset()) -> bool:
    """Whether the `runs` route names exactly the damage `damaged.damage` says: in the rows of the runs listed
    (the intact ones with none), in a warning for a run not listed (nothing of it could be read)."""
    rows, warnings = damage_said(plugin_fixtures, get)
    listed = {r: d for r, d in damaged.damage.items() if r not in damaged.absent and r not in gone}
    unlisted = [r for r in damaged.damage if r in damaged.absent]
    named = all(any(w.startswith(f"run {r!r}: event file") for w in warnings) for r in unlisted)
    return rows == listed and named and len(warnings) == sum(len(d) for d in damaged.damage.values())


def wait_named(plugin_fixtures, get: Get, damaged: "Damaged") -> None:
    """Polls the `runs` route until the check in the background names `damaged.damage` (asserted)."""
    for _ in range(300):
        if damage_named(plugin_fixtures, get, damaged):
            return
        time.sleep(0.1)
    assert damage_said(plugin_fixtures, get) == damaged.damage


def _json(
    plugin_fixtures, get: Get, route: str, query: Optional[dict], served: Served, status: int = 200
) -> Optional[dict]:
    code, body = get(route, query)
    served.requests += 1
    if code >= 500 or code != status:
        served.problems.append(f"{route} {query}: {code} {body[:200]!r}")
        return None
    return plugin_fixtures.strict_json(body)


def check_served(plugin_fixtures, get: Get, damaged: Damaged, gone: frozenset = frozenset()) -> Served:
    """Everything `damaged.expect` says (but the runs `gone`), through the matrix, histograms and csv routes."""
    served = Served()
    listing = _json(plugin_fixtures, get, "runs", None, served)
    runs = {r["run"]: r for r in listing["runs"]} if listing else {}
    for run in damaged.absent | gone:
        if run in runs:
            served.problems.append(f"run {run!r} is listed")
    expect = {r: layers for r, layers in damaged.expect.items() if r not in gone}
    for run in sorted(set(expect) | set(damaged.observed)):
        required, optional = expect.get(run, {}), damaged.observed.get(run, {})
        want = {(layer, s) for layer, steps in required.items() for s in steps}
        maybe = {(layer, s) for layer, steps in optional.items() for s in steps}
        got = _matrix(plugin_fixtures, get, run, served, allow_404=not want)
        served.checked += len(want)
        served.missing |= {(run, layer, s) for layer, s in want if (layer, s) not in got}
        if maybe:
            served.observed_missing[run] = len(maybe - set(got))
        for (layer, s), value in got.items():
            written = required.get(layer, {}).get(s, optional.get(layer, {}).get(s))
            if written is None and run in damaged.observed:
                served.observed_extra += 1  # e.g. the corrupt record itself
            elif written is None:
                served.problems.append(f"{run} {layer} step {s}: served but never written")
            elif written != value:
                served.problems.append(f"{run} {layer} step {s}: {value} != {written}")
        if optional or not want <= set(got) or run == "many":
            continue
        first = next(iter(required))
        hist = _json(plugin_fixtures, get, "histograms", {"run": run, "layer": first}, served)
        if hist and (
            hist["steps"] != sorted(required[first])
            or hist["histograms"] != [damaged.reliability_fixtures.histogram(s).tolist() for s in hist["steps"]]
        ):
            served.problems.append(f"{run}: histograms of {first} are not the intact steps")
        code, body = get("csv", {"run": run})
        served.requests += 1
        rows = body.decode().count("\n") - 1 if code == 200 else -1
        if rows != len(want):
            served.problems.append(f"{run}: csv has {rows} rows, {len(want)} intact records")
    return served


def _matrix(plugin_fixtures, get: Get, run: str, served: Served, allow_404: bool) -> Dict[Tuple[str, int], float]:
    """{(layer, step): value} of the `matrix` route (a 404 is fine for a run with nothing required)."""
    code, raw = get("matrix", {"run": run})
    served.requests += 1
    if code == 404 and allow_404:
        return {}
    if code != 200:
        served.problems.append(f"matrix {run!r}: {code} {raw[:200]!r}")
        return {}
    body = plugin_fixtures.strict_json(raw)
    return {
        (layer, s): v
        for layer, row in zip(body["layers"], body["values"])
        for s, v in zip(body["steps"], row)
        if v is not None
    }


def _gone(plugin_fixtures, get: Get, damaged: Damaged) -> frozenset:
    """The removed runs no longer listed (a removed run may also stay, with all it had)."""
    listed = {r["run"] for r in _json(plugin_fixtures, get, "runs", None, Served())["runs"]}
    return frozenset(run for run in REMOVED if run not in listed)


def assert_served(served: Served, allowed_missing: set = frozenset()) -> None:
    assert not served.problems, served.problems[:10]
    assert served.missing <= allowed_missing, sorted(served.missing - allowed_missing)[:20]


# -- in-process: TensorBoard's Python multiplexer -----------------------------------------------------


@pytest.mark.slow
def test_damaged_logdir_in_process(tmp_path, plugin_fixtures, reliability_fixtures):
    damaged = Damaged(reliability_fixtures, str(tmp_path / "logdir"))
    tb = plugin_fixtures.InProcess(damaged.logdir)

    def get(route, query):
        r = tb.get(route, query)
        return r.status_code, r.get_data()

    start = time.perf_counter()
    many = plugin_fixtures.strict_json(tb.get("runs", {"run": "many"}).get_data())["runs"][0]["layers"]
    listing_seconds = time.perf_counter() - start  # was ~9 s (O(layers x tags)) before catalog.by_layer
    wait_named(plugin_fixtures, get, damaged)
    assert [entry["layer"] for entry in many] == MANY_LAYERS  # model order (index), not name order
    assert all(entry["series"][0]["kinds"] == [metadata.KIND_HISTOGRAM, metadata.KIND_STATS] for entry in many)
    before = check_served(plugin_fixtures, get, damaged)
    assert_served(before)
    assert before.observed_missing == {"corrupt_middle": 10}  # steps 5..9 x 2 layers: reading stops at the bad record

    damaged.go_live()
    racing = [get("matrix", {"run": "deleted"})[0] for _ in range(3)]
    tb.reload()
    racing += [
        get(route, {"run": "deleted", "layer": "net/a"})[0] for route in ("matrix", "stats", "histograms", "csv")
    ]
    assert all(code < 500 for code in racing), racing
    gone = _gone(plugin_fixtures, get, damaged)
    after = check_served(plugin_fixtures, get, damaged, gone=gone)
    wait_named(plugin_fixtures, get, damaged)  # the completed record is no longer named
    # The plugin reads a local logdir's event files itself: a run whose folder or file is gone has nothing left.
    assert gone == {"deleted", "emptied"}
    assert_served(after, allowed_missing=damaged.python_loader_misses())
    reliability_fixtures.record(
        "logdirs",
        "in-process: intact records checked",
        before.checked + after.checked,
        missing=len(before.missing) + len(after.missing - damaged.python_loader_misses()),
        python_loader_limitation=len(after.missing),
        requests=before.requests + after.requests + len(racing),
        removed_runs_gone=sorted(gone),
        runs_listing_10000_tags_seconds=round(listing_seconds, 2),
    )


# -- real tensorboard processes ----------------------------------------------------------------------------


def _http_get(p) -> Get:
    def get(route, query):
        code, body, _ = p.get(API + route + ("?" + urlencode(query) if query else ""), timeout=60)
        return code, body

    return get


def _runs_ready(plugin_fixtures, p, damaged: Damaged, live: bool = False) -> bool:
    code, body, _ = p.get(API + "runs", timeout=60)
    if code != 200:
        return False
    runs = {r["run"]: r for r in plugin_fixtures.strict_json(body)["runs"]}
    want = {r: max(s for steps in layers.values() for s in steps) for r, layers in damaged.expect.items()}
    if live:
        for run in REMOVED:
            want.pop(run)
    return all(r in runs and runs[r]["max_step"] == m for r, m in want.items()) and len(runs["many"]["layers"]) == len(
        MANY_LAYERS
    )


@pytest.mark.slow
def test_damaged_logdir_in_real_tensorboards(tmp_path, plugin_fixtures, reliability_fixtures, tensorboard_process):
    # The Rust loader also gets the two damages that break TensorBoard's Python loader as a whole.
    damaged = {
        "rust": Damaged(reliability_fixtures, str(tmp_path / "rust"), rust=True),
        "python": Damaged(reliability_fixtures, str(tmp_path / "python")),
    }
    logs = tmp_path / "tensorboard_logs"
    logs.mkdir()
    procs = {
        name: tensorboard_process.TensorBoardProcess(
            d.logdir, str(logs / f"{name}.log"), load_fast="true" if name == "rust" else "false"
        )
        for name, d in damaged.items()
    }
    codes: List[int] = []
    before, after, gone = {}, {}, {}
    try:
        for name, p in procs.items():
            p.wait_until(lambda p: _runs_ready(plugin_fixtures, p, damaged[name]), "every run loaded", timeout=120)
        for name, p in procs.items():
            wait_named(plugin_fixtures, _http_get(p), damaged[name])
        for name, p in procs.items():
            before[name] = check_served(plugin_fixtures, _http_get(p), damaged[name])
            assert_served(before[name])
        # Both loaders stop reading a file at a corrupt record (steps 5..9 x 2 layers after it).
        assert before["python"].observed_missing == {"corrupt_middle": 10}
        assert before["rust"].observed_missing == {"corrupt_middle": 10, "garbage_proto": 10}

        # Requests racing with the deletion of a run's folder: never a 5xx.
        stop = threading.Event()

        def hammer():
            while not stop.is_set():
                for p in procs.values():
                    codes.append(p.get(API + "matrix?run=deleted", timeout=60)[0])
                    codes.append(p.get(API + "stats?run=deleted&layer=net/a", timeout=60)[0])

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            for d in damaged.values():
                d.go_live()
            procs["rust"].wait_until(
                lambda p: _runs_ready(plugin_fixtures, p, damaged["rust"], live=True), "the changes", timeout=60
            )
            # The Python loader never reads live_two's older file again: wait for the rest.
            procs["python"].wait_until(lambda p: _python_live_ready(plugin_fixtures, p), "the changes", timeout=60)
            time.sleep(1.5)  # one more reload interval for the deletion to be seen
        finally:
            stop.set()
            thread.join()
        assert codes and all(code < 500 for code in codes), sorted(set(codes))

        for name, p in procs.items():
            get = _http_get(p)
            gone[name] = _gone(plugin_fixtures, get, damaged[name])
            after[name] = check_served(plugin_fixtures, get, damaged[name], gone=gone[name])
        assert_served(after["rust"])
        assert_served(after["python"], allowed_missing=damaged["python"].python_loader_misses())
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.stop()
    for name in procs:
        limitation = damaged[name].python_loader_misses() if name == "python" else set()
        reliability_fixtures.record(
            "logdirs",
            f"real tensorboard ({name}): intact records checked",
            before[name].checked + after[name].checked,
            missing=len(before[name].missing) + len(after[name].missing - limitation),
            python_loader_limitation=len(after[name].missing & limitation),
            **{f"not_read_after_{run}": n for run, n in before[name].observed_missing.items()},
            corrupt_served=before[name].observed_extra,
            removed_runs_gone=sorted(gone[name]),
            requests=before[name].requests + after[name].requests,
        )
    reliability_fixtures.record("logdirs", "requests racing with a run deletion", len(codes))


def _python_live_ready(plugin_fixtures, p) -> bool:
    code, body, _ = p.get(API + "matrix?" + urlencode({"run": "truncated"}), timeout=60)
    code2, body2, _ = p.get(API + "matrix?" + urlencode({"run": "live_two"}), timeout=60)
    if code != 200 or code2 != 200:
        return False
    live = plugin_fixtures.strict_json(body2)
    b = live["values"][live["layers"].index("net/b")]
    return (
        9 in plugin_fixtures.strict_json(body)["steps"] and 9 in live["steps"] and b[live["steps"].index(9)] is not None
    )


@pytest.mark.xfail(
    raises=DecodeError,
    strict=False,
    reason="TensorBoard's Python loader: a well-framed record that is not an Event raises out of "
    "Reload; in a tensorboard process the reload thread dies and no run loads or updates again",
)
def test_python_loader_stops_at_a_non_event(tmp_path, plugin_fixtures, reliability_fixtures):
    """Upstream (TensorBoard 2.21) behaviour, kept visible: XPASS once TensorBoard skips such a record."""
    reliability_fixtures.write_run(str(tmp_path / "good"), LAYERS, range(3))
    reliability_fixtures.write_run(str(tmp_path / "bad"), LAYERS, range(3)).append_raw(
        reliability_fixtures.frame(NOT_AN_EVENT)
    )
    tb = plugin_fixtures.InProcess(str(tmp_path))
    assert [r["run"] for r in plugin_fixtures.strict_json(tb.get("runs").get_data())["runs"]] == ["bad", "good"]
