"""The plugin's own reading of a local logdir (`reader.record_index`) answers as TensorBoard's provider.

What TensorBoard's `MultiplexerDataProvider` keeping every record answers over the same bytes is the reference:
the same series and listing, the same records (step, wall time, array) in the same order, the same
downsampling; damaged files read up to their first bad record; a file being written read from where the
last read stopped."""

from __future__ import annotations

import os
import threading

import numpy as np
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

from tb_layergrad import metadata
from tb_layergrad.reader import record_index, series

EID = ""


def _tensorboard(logdir: str):
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: 0})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    return data_provider.MultiplexerDataProvider(mux, logdir)


def _same(tb, ours, ctx) -> int:
    """Asserts that both providers answer the same; returns the records compared."""
    kw = dict(experiment_id=EID, plugin_name=metadata.PLUGIN_NAME)
    listed = tb.list_tensors(ctx, **kw)
    assert ours.list_tensors(ctx, **kw) == listed
    assert listed, "nothing listed: nothing compared"
    compared = 0
    for k in (series.READ_ALL, 1, 3):
        want = tb.read_tensors(ctx, downsample=k, **kw)
        got = ours.read_tensors(ctx, downsample=k, **kw)
        assert got.keys() == want.keys()
        for run in want:
            assert got[run].keys() == want[run].keys()
            for tag, data in want[run].items():
                assert [(d.step, d.wall_time) for d in got[run][tag]] == [(d.step, d.wall_time) for d in data]
                for a, b in zip(got[run][tag], data):
                    assert a.numpy.dtype == b.numpy.dtype
                    np.testing.assert_array_equal(a.numpy, b.numpy)
                    compared += 1
    return compared + _same_latest(tb, ours, ctx)


def _same_latest(tb, ours, ctx) -> int:
    """Asserts that `RecordIndex.latest` finds, for every tag and step (each recorded step, the one before each, and
    None), the records TensorBoard's full read holds at the latest step at or before it; returns the steps asked."""
    kw = dict(experiment_id=EID, plugin_name=metadata.PLUGIN_NAME, downsample=series.READ_ALL)
    asked = 0
    for run, tags in tb.read_tensors(ctx, **kw).items():
        for tag, data in tags.items():
            steps = {int(d.step) for d in data}
            for step in sorted(steps | {s - 1 for s in steps}) + [None]:
                within = [d for d in data if step is None or d.step <= step]
                want = [d for d in within if d.step == max(x.step for x in within)] if within else []
                got = ours.index.latest(run, [tag], step).get(tag, [])
                assert [(d.step, d.wall_time) for d in got] == [(d.step, d.wall_time) for d in want], (run, tag, step)
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a.numpy, b.numpy)
                asked += 1
    return asked


def test_a_damaged_logdir_reads_as_tensorboard_reads_it(tmp_path, reliability_fixtures):
    reliability_fixtures.damaged_logdir(str(tmp_path))
    ctx = context.RequestContext()
    tb = _tensorboard(str(tmp_path))
    ours = record_index.LocalProvider(tb, str(tmp_path))
    assert _same(tb, ours, ctx) > 0
    # A filter by run and tag answers as TensorBoard's does.
    tag = metadata.make_tag(
        metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, reliability_fixtures.DAMAGE_LAYERS[0], metadata.KIND_STATS
    )
    f = record_index.tb_provider.RunTagFilter(runs=["flipped", "intact"], tags=[tag])
    kw = dict(experiment_id=EID, plugin_name=metadata.PLUGIN_NAME, run_tag_filter=f)
    assert ours.list_tensors(ctx, **kw) == tb.list_tensors(ctx, **kw)
    assert {r: len(d[tag]) for r, d in ours.read_tensors(ctx, downsample=series.READ_ALL, **kw).items()} == {
        "flipped": 3,
        "intact": 6,
    }


def test_a_run_being_written_is_read_from_where_the_last_read_stopped(tmp_path, reliability_fixtures):
    run = str(tmp_path / "live")
    f = reliability_fixtures.write_run(run, reliability_fixtures.DAMAGE_LAYERS, range(4))
    ctx = context.RequestContext()
    ours = record_index.LocalProvider(_tensorboard(str(tmp_path)), str(tmp_path))
    _same(_tensorboard(str(tmp_path)), ours, ctx)
    whole = f.event(4, reliability_fixtures.DAMAGE_LAYERS)
    framed = reliability_fixtures.frame(whole)
    f.append_raw(framed[: len(framed) // 2])  # half a record: not read yet
    assert _same(_tensorboard(str(tmp_path)), ours, ctx) > 0
    with open(f.path, "ab") as fh:
        fh.write(framed[len(framed) // 2 :])
    for step in range(5, 9):
        f.write(step, reliability_fixtures.DAMAGE_LAYERS)
    reliability_fixtures.write_run(
        run, reliability_fixtures.DAMAGE_LAYERS, range(9, 12), suffix="b"
    )  # a second file of the run
    # Steps written again (a restart): the later record wins.
    reliability_fixtures.write_run(run, reliability_fixtures.DAMAGE_LAYERS, [10, 11], suffix="c")
    tb = _tensorboard(str(tmp_path))
    assert _same(tb, ours, ctx) > 0
    listed = ours.list_tensors(ctx, experiment_id=EID, plugin_name=metadata.PLUGIN_NAME)
    assert {s.max_step for s in listed["live"].values()} == {11}
    assert os.path.getsize(f.path) > 0


def test_load_and_report_walk_each_file_once(tmp_path, monkeypatch, reliability_fixtures):
    """`event_files.open_provider` (what `load()` and `report` read through) indexes our records in the walk
    TensorBoard's multiplexer makes, which gets only the other records: each file is walked once, the answers are
    those of TensorBoard keeping every record, the other summaries are TensorBoard's, and the damage check reads
    nothing the walk verified."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from tb_layergrad.reader import damage, event_files

    logdir = str(tmp_path)
    reliability_fixtures.damaged_logdir(logdir)
    f = reliability_fixtures.write_run(os.path.join(logdir, "mixed"), reliability_fixtures.DAMAGE_LAYERS, range(3))
    for step in range(3, 6):  # another plugin's scalars between our records
        scalar = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="lr", simple_value=0.1 * step)])
        f.append_raw(
            reliability_fixtures.frame(event_pb2.Event(step=step, wall_time=1.0, summary=scalar).SerializeToString())
        )
        f.write(step, reliability_fixtures.DAMAGE_LAYERS)
    walks = []
    real = damage.read_new_chunks
    monkeypatch.setattr(damage, "read_new_chunks", lambda path, state: walks.append(path) or real(path, state))
    ctx = context.RequestContext()
    with event_files.tensorflow_free(logdir), damage.checked_once():
        ours = event_files.open_provider(logdir)
        walked = list(walks)
        assert len(walked) == len(set(walked)) == 7  # each event file TensorBoard reads (not the unreadable), once
        kw = dict(experiment_id=EID, plugin_name=metadata.PLUGIN_NAME)
        assert not any(ours._provider.list_tensors(ctx, **kw).values())  # noqa: SLF001 - TensorBoard kept none of ours
        assert _same(_tensorboard(logdir), ours, ctx) > 0  # read first as walked, then from the files
        said = damage.Scanner(logdir, known=event_files.walked(ours))
        fresh = damage.Scanner(logdir)
        assert said.scan() == fresh.scan() != {} and said.bytes_read == 0 < fresh.bytes_read
    scalars = dict(experiment_id=EID, plugin_name="scalars", downsample=10)
    got = ours.read_scalars(ctx, **scalars)["mixed"]["lr"]
    assert [(d.step, d.value) for d in got] == [
        (d.step, d.value) for d in _tensorboard(logdir).read_scalars(ctx, **scalars)["mixed"]["lr"]
    ]
    assert [d.step for d in got] == [3, 4, 5]


def test_requests_queued_behind_a_refresh_walk_the_new_records_once(tmp_path, monkeypatch, reliability_fixtures):
    """Two requests that ask while a refresh holds the index, after a record was appended that the refresh did not
    read: the first of them to get the index reads it, the other finds it read (a refresh whose listing began after
    it asked read every byte written before), not a third walk; and a request whose listing shows nothing new walks
    nothing."""
    layers = reliability_fixtures.DAMAGE_LAYERS
    f = reliability_fixtures.write_run(str(tmp_path / "live"), layers, range(3))
    index = record_index.RecordIndex(str(tmp_path))
    index.refresh(["live"])
    walks, inside, go = [], threading.Event(), threading.Event()
    real = index._advance  # noqa: SLF001 - each walk of the run's file counted

    def counted(run, file_no, path):
        walks.append(threading.current_thread().name)
        real(run, file_no, path)
        if len(walks) == 1:
            inside.set()
            go.wait()

    class Counted:  # the index's lock, its takers counted
        def __init__(self, lock) -> None:
            self.lock, self.entered = lock, 0

        def __enter__(self):
            self.entered += 1
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    monkeypatch.setattr(index, "_advance", counted)
    lock = index._lock = Counted(index._lock)  # noqa: SLF001
    f.write(3, layers)
    first = threading.Thread(target=index.refresh, args=(["live"],), name="first")
    first.start()
    inside.wait()  # the first refresh read step 3 and holds the index
    f.write(4, layers)  # appended while the first refresh holds the index, after its read
    queued = [threading.Thread(target=index.refresh, args=(["live"],), name=f"queued{i}") for i in range(2)]
    for t in queued:
        t.start()
    while lock.entered < 3:  # both wait for the lock
        first.join(0.01)
    go.set()
    for t in (first, *queued):
        t.join()
    assert len(walks) == 2 and walks[0] == "first" and walks[1].startswith("queued")
    listed = index.list_tensors(["live"])["live"]
    assert listed and {s.max_step for s in listed.values()} == {4}  # the record appended meanwhile read
    index.refresh(["live"])
    assert len(walks) == 2  # nothing new listed: no walk


def test_a_refresh_listed_before_a_write_does_not_stand_for_a_call_after_it(
    tmp_path, monkeypatch, reliability_fixtures
):
    """A refresh that listed the run's files before a record was appended, and took the index after a call that
    listed them after it: that refresh read nothing new, so the call reads the record (it is not skipped as read)."""
    layers = reliability_fixtures.DAMAGE_LAYERS
    f = reliability_fixtures.write_run(str(tmp_path / "live"), layers, range(3))
    index = record_index.RecordIndex(str(tmp_path))
    index.refresh(["live"])
    listed, go = threading.Event(), threading.Event()
    real = index._list  # noqa: SLF001 - the listing before the lock, held for the early refresh

    def held(runs):
        got = real(runs)
        if threading.current_thread().name == "early":
            listed.set()
            go.wait()
        return got

    monkeypatch.setattr(index, "_list", held)
    early = threading.Thread(target=index.refresh, args=(["live"],), name="early")
    early.start()
    listed.wait()  # listed: steps 0..2
    f.write(3, layers)
    late = {}
    monkeypatch.setattr(index, "_lock", _TakenAfter(index._lock, go, early))  # noqa: SLF001
    late["listed"] = index.list_tensors(["live"])[
        "live"
    ]  # asks after the write; the early refresh holds the index first
    early.join()
    assert {s.max_step for s in late["listed"].values()} == {3}


class _TakenAfter:
    """A lock this thread takes only after `thread` (released by `go`) has taken and let go of it."""

    def __init__(self, lock, go: threading.Event, thread: threading.Thread) -> None:
        self.lock, self.go, self.thread = lock, go, thread

    def __enter__(self):
        if threading.current_thread() is not self.thread and self.thread.is_alive():
            self.go.set()
            self.thread.join()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def _one_value_runs(logdir: str, reliability_fixtures) -> None:
    """Runs whose events hold one summary value each, the layout every step's record is written in (read for many
    records at once), beside the fixtures' events of many values (parsed with protobuf): statistics, histograms,
    a damaged file, and a second file of a run."""
    layers = reliability_fixtures.DAMAGE_LAYERS
    for kind in (metadata.KIND_STATS, metadata.KIND_HISTOGRAM):
        run = os.path.join(logdir, f"one_{kind}")
        reliability_fixtures.write_run(run, layers[:1], range(7), kinds=[kind])
        reliability_fixtures.write_run(run, layers[:1], range(7, 12), suffix="b", kinds=[kind])
    reliability_fixtures.write_run(os.path.join(logdir, "many"), layers, range(5))
    reliability_fixtures.cut(reliability_fixtures.write_run(os.path.join(logdir, "cut"), layers[:1], range(6)))


def test_records_read_together_in_windows_of_any_size_answer_as_tensorboard(
    tmp_path, monkeypatch, reliability_fixtures
):
    """Records near each other are read in one read, up to a window's bytes (`record_index._data`): a window of one
    byte (each record alone), of a few records, with no gap read over, or the defaults, the same answers."""
    logdir = str(tmp_path)
    _one_value_runs(logdir, reliability_fixtures)
    ctx = context.RequestContext()
    tb = _tensorboard(logdir)
    for window, gap in ((1, 0), (700, 0), (2000, 1 << 20), (record_index._WINDOW_BYTES, record_index._GAP_BYTES)):  # noqa: SLF001
        monkeypatch.setattr(record_index, "_WINDOW_BYTES", window)
        monkeypatch.setattr(record_index, "_GAP_BYTES", gap)
        assert _same(tb, record_index.LocalProvider(tb, logdir), ctx) > 0


def test_a_file_changed_after_it_was_indexed_is_read_as_it_is_now(tmp_path, reliability_fixtures):
    """Records are read by offset from the file as it is when asked: rewritten with other values at the same places,
    the answer holds those values (as protobuf parses the bytes there); rewritten with bytes that are no record, the
    run is left out of that answer and read anew at the next refresh."""
    logdir = str(tmp_path)
    layers = reliability_fixtures.DAMAGE_LAYERS[:1]
    f = reliability_fixtures.write_run(os.path.join(logdir, "run"), layers, range(1, 7), kinds=[metadata.KIND_STATS])
    ctx = context.RequestContext()
    ours = record_index.LocalProvider(_tensorboard(logdir), logdir)
    kw = dict(experiment_id=EID, plugin_name=metadata.PLUGIN_NAME, downsample=series.READ_ALL)
    norm = metadata.STAT_INDEX["norm"]
    assert [d.numpy[norm] for d in next(iter(ours.read_tensors(ctx, **kw)["run"].values()))] == [
        reliability_fixtures.norm(0, s) for s in range(1, 7)
    ]
    with open(f.path, "rb") as fh:
        written = fh.read()
    # The same records with other values (the same sizes): the steps of another run, written over the file.
    other = tmp_path / "other"
    g = reliability_fixtures.write_run(str(other / "run"), layers, range(100, 106), kinds=[metadata.KIND_STATS])
    with open(g.path, "rb") as fh:
        rewritten = fh.read()
    assert len(rewritten) == len(written)
    with open(f.path, "r+b") as fh:
        fh.write(rewritten)
    got = next(iter(ours.read_tensors(ctx, **kw)["run"].values()))
    assert [(d.step, d.numpy[norm]) for d in got] == [(s, reliability_fixtures.norm(0, s)) for s in range(100, 106)]
    with open(f.path, "r+b") as fh:  # no record any more: the run is not answered, then read anew (nothing in it)
        fh.write(b"\xff" * len(written))
    assert "run" not in ours.read_tensors(ctx, **kw)
    assert not ours.read_tensors(ctx, **kw).get("run")
