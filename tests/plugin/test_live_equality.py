"""A run read while it is written answers as a fresh read of the same bytes.

Why: a run being written is read from where the last read stopped (`series.read_since`: only a block's new
records, appended to the tables kept), never whole at every step. The reference is a new plugin over the same
logdir, which reads every record: after each append (NaN/Inf steps, an exploding and a dead episode, a new
block begun, half a record, a step written again as a restarted run writes it, the file cut back and written
again), every route answers the same body, the anomaly findings and verdicts included. The anomaly rules are
applied once per change of the run, whoever asks (`lookups.AnswerCache`), to its new steps only
(`reader.rule_fold`; tests/reader/test_rule_fold.py compares them with a whole evaluation field by field).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import types

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2

from tb_layergrad import metadata
from tb_layergrad.plugin.lookups import AnswerCache
from tb_layergrad.reader import record_index

RUN = "live"
LAYERS = ("net/in", "net/mid", "net/out")
BLOCK = 64  # steps per block: appends cross blocks within a few hundred steps
S = metadata.STAT_INDEX


def _stats(step: int, wall_shift: float = 0.0) -> np.ndarray:
    """[layers, fields] at `step`: a norm shrinking with depth; episodes: NaN and Inf, exploding, dead."""
    rows = np.zeros((len(LAYERS), len(metadata.STAT_FIELDS)))
    for i in range(len(LAYERS)):
        scale = 1e-2 * 0.5**i * (1 + 0.3 * np.sin(step / 7.0 + i)) * (1 + wall_shift)
        rows[i, S["elements"]] = 256
        rows[i, S["std"]] = scale
        rows[i, S["min"]], rows[i, S["max"]] = -3 * scale, 3 * scale
        rows[i, S["mean_abs"]] = 0.8 * scale
        rows[i, S["norm"]] = scale * 16
    if 150 <= step < 160:  # net/in explodes for a while
        rows[0, [S["std"], S["norm"], S["max"]]] *= 1e6
    if 200 <= step < 205:  # net/out is dead for a while
        rows[2, [S["std"], S["norm"], S["mean_abs"], S["min"], S["max"]]] = 0
        rows[2, S["zeros"]] = 256
    if step in (230, 231):  # a NaN, then an Inf in net/mid
        rows[1, S["nan"] if step == 230 else S["pos_inf"]] = 2
        rows[1, S["norm"]] = np.nan
    return rows


class _Writer:
    """Version-2 group records (stats and histograms of every layer, one event per step), appended as asked."""

    def __init__(self, logdir: str, lf, rf) -> None:
        self._lf, self._rf = lf, rf
        infos = [
            metadata.SeriesInfo(layer=layer, kind=metadata.KIND_STATS, index=i + 1, dtype="float32")
            for i, layer in enumerate(LAYERS)
        ]
        self.group = dataclasses.replace(metadata.GroupInfo.of(metadata.KIND_STATS, infos), block_steps=BLOCK)
        hists = [dataclasses.replace(info, kind=metadata.KIND_HISTOGRAM) for info in infos]
        self.hgroup = dataclasses.replace(metadata.GroupInfo.of(metadata.KIND_HISTOGRAM, hists), block_steps=BLOCK)
        self.file = rf.EventFile(os.path.join(logdir, RUN))
        self._tagged: set = set()

    def event(self, step: int, wall_shift: float = 0.0) -> bytes:
        values = []
        for group, array in (
            (self.group, _stats(step, wall_shift)),
            (self.hgroup, (np.arange(8) + np.arange(len(LAYERS))[:, None] + step % 5).astype(np.uint16) * 32),
        ):
            value = summary_pb2.Summary.Value(tag=group.tag_at(step), tensor=self._lf._tensor(array))  # noqa: SLF001 - the same framing
            if value.tag not in self._tagged:
                self._tagged.add(value.tag)
                value.metadata.CopyFrom(metadata.create_group_metadata(group))
            values.append(value)
        return event_pb2.Event(
            step=step, wall_time=1.7e9 + step + wall_shift, summary=summary_pb2.Summary(value=values)
        ).SerializeToString()

    def write(self, steps, wall_shift: float = 0.0) -> None:
        self.file.append_raw(b"".join(self._rf.frame(self.event(s, wall_shift)) for s in steps))

    def shrink(self, size: int, first_step: int) -> None:
        """The file cut back to `size` bytes, which held the steps before `first_step` (a run restarted over it)."""
        with open(self.file.path, "r+b") as f:
            f.truncate(size)
        self._tagged = {t for t in self._tagged if int(t.rsplit("/", 1)[1]) + BLOCK <= first_step}


def _bodies(tb) -> dict:
    runs = json.loads(tb.get("runs").data)
    layer = LAYERS[1]
    q = {"run": RUN}
    asked = {
        "runs": {},
        "matrix": {**q, "stat": "rms"},
        "matrix_binned": {**q, "stat": "norm", "points": 50},
        "matrix_binned_range": {**q, "stat": "norm", "points": 50, "start": 0},
        "stats": {**q, "layer": layer},
        "stats_binned": {**q, "layer": layer, "points": 40},
        "stats_binned_range": {**q, "layer": layer, "points": 40, "start": 0},  # binned by `downsample`
        "histograms": {**q, "layer": layer},
        "histograms_thinned": {**q, "layer": layer, "max_steps": 7},  # steps of several blocks picked by position
        "anomalies": q,
        "anomalies_window": {**q, "points": 100, "flags_start": 90, "flags_end": 150},
        "anomalies_binned": {**q, "points": 10},
        "sweep": {},
        "csv": q,
    }
    out = {"runs": runs}
    for name, query in asked.items():
        if name == "runs":
            continue
        got = tb.get(name.split("_")[0], query)
        assert got.status_code == 200, (name, got.data[:300])
        out[name] = got.data if name == "csv" else json.loads(got.data)
    for name in ("matrix_binned", "stats_binned"):  # the whole run's bins, appended to, are `downsample`'s
        whole, ranged = out[name], out[name + "_range"]
        assert ranged["binned"] and len(ranged["steps"]) > 1, name
        assert {k: v for k, v in whole.items() if k not in ("start", "end")} == {
            k: v for k, v in ranged.items() if k not in ("start", "end")
        }, name
    whole, thinned = out["histograms"], out["histograms_thinned"]  # the steps thinning the whole series keeps
    picked = np.round(np.linspace(0, len(whole["steps"]) - 1, 7)).astype(int) if len(whole["steps"]) > 7 else None
    for field in ("steps", "wall_times", "histograms"):
        assert thinned[field] == (whole[field] if picked is None else [whole[field][i] for i in picked]), field
    for row in out["runs"]["runs"]:  # what the plugin has read so far, not what the run holds
        row.pop("sweep_read", None)
        row.pop("statistics_read", None)
    return out


@pytest.mark.slow  # ~15 s: eleven fresh plugins read the run
def test_a_run_read_while_written_answers_as_a_fresh_read(
    tmp_path, plugin_fixtures, long_fixtures, reliability_fixtures
):
    rf, InProcess = reliability_fixtures, plugin_fixtures.InProcess  # noqa: N806 - the class, by its name
    logdir = str(tmp_path)
    w = _Writer(logdir, long_fixtures, rf)
    w.write(range(100))
    live = InProcess(logdir)
    compared = 0

    def same() -> None:
        nonlocal compared
        got, want = _bodies(live), _bodies(InProcess(logdir))
        for name in want:
            assert got[name] == want[name], name
        compared += 1

    same()
    w.write(range(100, 140))  # within the second block
    same()
    w.write(range(140, 240))  # the exploding and dead episodes, NaN and Inf, two new blocks
    body = json.loads(live.get("anomalies", {"run": RUN}).data)
    assert [f["kind"] for f in body["summary"]["findings"]] == ["nonfinite"]
    assert [v["verdict"]["text"] for v in body["layers"]] == ["exploding 10/240", "NaN/Inf @230", "dead 5/240"]
    same()
    whole = rf.frame(w.event(240))
    w.file.append_raw(whole[:10])  # half a record: not read yet
    same()
    w.file.append_raw(whole[10:])
    same()
    w.file.append_raw(rf.frame(w.event(238, wall_shift=0.5)))  # a step written again: its later record wins
    w.write(range(241, 250))
    same()
    kept, rng, step = os.path.getsize(w.file.path), np.random.default_rng(0), 250
    for _ in range(3):  # appends of a few steps, one of them crossing into a new block
        k = int(rng.integers(2, 12))
        w.write(range(step, step + k))
        step += k
        same()
    w.shrink(kept, 250)  # the file cut back and written again with other values: read whole, not extended
    w.write(range(250, 262), wall_shift=1.0)
    same()
    assert compared == 10


def _n(body) -> object:
    """The `n` of an answer kept by `AnswerCache` (its JSON body, `responses.encode`)."""
    return json.loads(body.data)["n"]


def _at(signature: int, behind: bool = False) -> types.SimpleNamespace:
    """What `AnswerCache.answer` reads of a `RunSource`: its listing's signature, whether a read was behind it."""
    return types.SimpleNamespace(rc=types.SimpleNamespace(signature=(signature,)), behind=behind)


@pytest.mark.slow  # ~10 s: routes asked from eight threads through five appends
def test_a_run_read_by_many_at_once_while_written_answers_as_a_fresh_read(
    tmp_path, plugin_fixtures, long_fixtures, reliability_fixtures
):
    """The tab's readers at once: every route asked from eight threads while the run grows (appends of a few steps,
    one ending in half a record, then completed); once it stops changing, every route answers as a fresh plugin
    reading the same bytes. Why: a request that found the run being read answers as of an earlier read, and that
    answer must not stay once the run has stopped changing (a finished run, or a record completed last)."""
    rf, InProcess = reliability_fixtures, plugin_fixtures.InProcess  # noqa: N806 - the class, by its name
    logdir = str(tmp_path)
    w = _Writer(logdir, long_fixtures, rf)
    w.write(range(60))
    live = InProcess(logdir)
    queries = [
        ("matrix", {"run": RUN, "stat": "rms"}),
        ("matrix", {"run": RUN, "stat": "norm", "points": 50}),
        ("stats", {"run": RUN, "layer": LAYERS[1]}),
        ("histograms", {"run": RUN, "layer": LAYERS[1]}),
        ("anomalies", {"run": RUN}),
        ("sweep", {}),
        ("csv", {"run": RUN}),
        ("runs", {}),
    ]
    rng = np.random.default_rng(3)
    step = 60
    for last in range(5):
        stop = threading.Event()
        errors: list = []

        def ask(route: str, query: dict) -> None:
            while not stop.is_set():
                code = live.get(route, query).status_code
                if code != 200:
                    errors.append((route, code))

        threads = [threading.Thread(target=ask, args=q) for q in queries]
        for t in threads:
            t.start()
        k = int(rng.integers(1, 8))
        w.write(range(step, step + k))
        step += k
        if last == 4:  # the last record written in two halves, the second while the routes are asked
            whole = rf.frame(w.event(step))
            w.file.append_raw(whole[:20])
            threading.Event().wait(0.05)
            w.file.append_raw(whole[20:])
            step += 1
        threading.Event().wait(0.3)
        stop.set()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
    got, want = _bodies(live), _bodies(InProcess(logdir))
    for name in want:
        assert got[name] == want[name], name
    assert json.loads(live.get("matrix", {"run": RUN}).data)["steps"][-1] == step - 1


def test_an_answer_is_computed_once_per_change_of_the_run():
    cache = AnswerCache()
    calls = []

    def compute() -> dict:
        calls.append(1)
        return {"n": len(calls)}

    assert _n(cache.answer("q", _at(1), compute)) == 1
    assert _n(cache.answer("q", _at(1), compute)) == 1  # the run unchanged: nothing computed
    assert _n(cache.answer("q", _at(2), compute)) == 2
    started, release, got = threading.Event(), threading.Event(), []

    def slow() -> dict:
        started.set()
        release.wait()
        return {"n": "as of step 3"}

    other = threading.Thread(target=lambda: got.append(cache.answer("q", _at(3), slow)))
    other.start()
    started.wait()
    assert _n(cache.answer("q", _at(4), compute)) == 2  # being computed: the kept answer, not a second computation
    release.set()
    other.join()
    assert [_n(b) for b in got] == ["as of step 3"] and len(calls) == 2
    assert _n(cache.answer("q", _at(4), compute)) == 3  # asked after: the newest steps

    started.clear(), release.clear(), got.clear()  # a first answer, none kept: the others wait for it
    first = threading.Thread(target=lambda: got.append(cache.answer("new", _at(1), slow)))
    first.start()
    started.wait()
    waiter = threading.Thread(target=lambda: got.append(cache.answer("new", _at(2), compute)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and got == []
    release.set()
    first.join(), waiter.join()
    assert [_n(b) for b in got] == ["as of step 3"] * 2 and len(calls) == 3  # computed once, not again beside it


def test_an_answer_read_behind_its_listing_is_not_kept_as_that_listing():
    cache = AnswerCache()
    calls = []

    def compute() -> dict:
        calls.append(1)
        return {"n": len(calls)}

    assert _n(cache.answer("q", _at(1, behind=True), compute)) == 1  # answered, as of an earlier listing
    assert _n(cache.answer("q", _at(1), compute)) == 2  # the same listing asked again: computed again
    assert _n(cache.answer("q", _at(1), compute)) == 2  # now of that listing: kept


def test_a_record_completed_while_its_run_is_read_is_served(tmp_path, plugin_fixtures, reliability_fixtures):
    """The last record of a run completed while another request reads the run's statistics: that request's
    answer (the tables kept, of the steps before) is not kept as the new listing's, and once nothing changes
    any more every route serves the completed step (a run that stops changing shows its last steps)."""
    f = reliability_fixtures.write_run(str(tmp_path / "cut"), ["net/a", "net/b"], range(10))
    with open(f.path, "rb") as fh:
        data = fh.read()
    cut = f.offsets[-1] + 12 + (len(data) - f.offsets[-1] - 12) // 2  # inside the payload of step 9's record
    with open(f.path, "r+b") as fh:
        fh.truncate(cut)
    tb = plugin_fixtures.InProcess(str(tmp_path))
    asked = {
        "matrix": {"run": "cut"},
        "stats": {"run": "cut", "layer": "net/a"},
        "anomalies": {"run": "cut"},
        "sweep": {},
    }

    def last_steps() -> dict:
        out = {}
        for route, query in asked.items():
            body = plugin_fixtures.strict_json(tb.get(route, query).get_data())
            out[route] = body["runs"][0]["last_step"] if route == "sweep" else body["steps"][-1]
        return out

    assert last_steps() == {"matrix": 8, "stats": 8, "anomalies": 8, "sweep": 8}
    f.append_raw(data[cut:])
    reading = tb.plugin._routes.reading  # noqa: SLF001 - the plugin's shared reading state
    with reading.stats._run_lock("", "cut"):  # noqa: SLF001 - another request reading the run now
        assert last_steps() == {"matrix": 8, "stats": 8, "anomalies": 8, "sweep": 8}  # the tables kept
    assert last_steps() == {"matrix": 9, "stats": 9, "anomalies": 9, "sweep": 9}


def test_each_new_record_is_read_once_whoever_asks(
    tmp_path, monkeypatch, plugin_fixtures, long_fixtures, reliability_fixtures
):
    """Work once per new step: after an append, every route asked (twice) reads the new records of each block,
    not the blocks whole; asked again with nothing new, they read nothing."""
    logdir = str(tmp_path)
    w = _Writer(logdir, long_fixtures, reliability_fixtures)
    w.write(range(100))
    live = plugin_fixtures.InProcess(logdir)
    _bodies(live)
    decoded = []
    real = record_index._data

    def counted(files, picks):  # every record read by offset, whichever way it is decoded: its step and tag
        for file_no, offset, length, value_index in picks:
            with open(files[file_no], "rb") as fh:
                fh.seek(offset)
                event = event_pb2.Event.FromString(fh.read(length))
            decoded.append((int(event.step), event.summary.value[value_index].tag))
        return real(files, picks)

    monkeypatch.setattr(record_index, "_data", counted)
    w.write(range(100, 110))
    _bodies(live)
    _bodies(live)
    assert sorted(decoded) == sorted((s, g.tag_at(s)) for s in range(100, 110) for g in (w.group, w.hgroup))
    decoded.clear()
    _bodies(live)
    assert decoded == []


def test_anomalies_send_the_flags_of_the_steps_asked(tmp_path, plugin_fixtures, long_fixtures, reliability_fixtures):
    """`flags_start`/`flags_end`: each step's fields of those steps only; `points`: none when they are more (the
    tab's binned grid takes its flags from the matrix's bins); the rules and summaries those of the whole run."""
    w = _Writer(str(tmp_path), long_fixtures, reliability_fixtures)
    w.write(range(240))
    tb = plugin_fixtures.InProcess(str(tmp_path))
    whole = json.loads(tb.get("anomalies", {"run": RUN}).data)
    window = json.loads(tb.get("anomalies", {"run": RUN, "flags_start": 200, "flags_end": 235, "points": 36}).data)
    rows = slice(200, 236)  # a record at every step from 0
    assert window["binned"] is False and window["steps"] == whole["steps"][rows] == list(range(200, 236))
    assert window["max_rms"] == whole["max_rms"][rows] and window["vanish_reference"] == whole["vanish_reference"][rows]
    assert [e["flags"] for e in window["layers"]] == [e["flags"][rows] for e in whole["layers"]]
    assert window["layers"][1]["flags"][30:32] == "11"  # the NaN and the Inf of net/mid
    binned = json.loads(tb.get("anomalies", {"run": RUN, "flags_start": 200, "flags_end": 235, "points": 35}).data)
    assert binned["binned"] is True and binned["steps"] == [] and {e["flags"] for e in binned["layers"]} == {""}
    for body in (window, binned):
        assert body["summary"] == whole["summary"]
        assert [{**e, "flags": ""} for e in body["layers"]] == [{**e, "flags": ""} for e in whole["layers"]]
    assert tb.get("anomalies", {"run": RUN, "flags_start": 5, "flags_end": 4}).status_code == 400
