"""A run read while it is written: one reader at a time re-reads what changed, the others answer with what is kept.

Why: a run appended at every step changes between any two requests, and each request that found its statistics
or a histogram block changed read it again, all at once, on the same cores (docs/DESIGN.md, "Reading side").
Checked here by holding the read in progress (no timing): a request made meanwhile answers the tables or
blocks kept, as of the last read, and the next request after it answers the new steps.
"""

from __future__ import annotations

import threading
import types

import numpy as np
from tensorboard import context

from tb_layergrad import metadata
from tb_layergrad.reader import catalog, series
from tb_layergrad.reader.block_cache import BlockCache
from tb_layergrad.reader.stats_store import StatsStore

LAYERS = ["net/a", "net/b"]


def _provider(logdir: str):
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: 0})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    return mux, data_provider.MultiplexerDataProvider(mux, logdir)


def _stats(provider, run: str):
    rc = catalog.load(provider, context.RequestContext(), "", runs=[run]).run(run)
    return [s for s in rc.series if s.info.kind == metadata.KIND_STATS]


def test_statistics_read_meanwhile_are_those_kept(tmp_path, reliability_fixtures):
    f = reliability_fixtures.write_run(str(tmp_path / "live"), LAYERS, range(10))
    mux, provider = _provider(str(tmp_path))
    store = StatsStore(provider)
    ctx = context.RequestContext()
    first = store.read(ctx, "", "live", _stats(provider, "live"))
    assert all(list(rows.steps) == list(range(10)) for rows in first.values())
    for step in range(10, 15):
        f.write(step, LAYERS)
    mux.Reload()
    grown = _stats(provider, "live")
    lock = store._run_lock("", "live")  # noqa: SLF001 - a read of the run in progress
    with lock:
        meanwhile = store.read(ctx, "", "live", grown)
    assert all(list(rows.steps) == list(range(10)) for rows in meanwhile.values())
    after = store.read(ctx, "", "live", grown)
    assert all(list(rows.steps) == list(range(15)) for rows in after.values())
    for s in grown:
        want = np.asarray([reliability_fixtures.stats_vector(LAYERS.index(s.info.layer), step) for step in range(15)])
        np.testing.assert_array_equal(after[s.key].table, want)


def test_a_series_never_read_waits_for_the_read_in_progress(tmp_path, reliability_fixtures):
    reliability_fixtures.write_run(str(tmp_path / "live"), LAYERS, range(5))
    _, provider = _provider(str(tmp_path))
    store = StatsStore(provider)
    lock = store._run_lock("", "live")  # noqa: SLF001 - a read of the run in progress
    got = {}
    lock.acquire()
    reader = threading.Thread(
        target=lambda: got.update(store.read(context.RequestContext(), "", "live", _stats(provider, "live")))
    )
    reader.start()
    reader.join(timeout=0.5)
    assert reader.is_alive() and not got  # nothing kept to answer with: it waits
    lock.release()
    reader.join()
    assert all(list(rows.steps) == list(range(5)) for rows in got.values())


def _part(tag: str, max_step: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(tag=tag, max_step=max_step, max_wall_time=float(max_step))


def _points(n: int) -> series.Points:
    return series.Points(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.float64), [np.zeros(3)] * n)


def test_a_block_read_by_another_thread_is_answered_as_kept():
    cache = BlockCache()
    cache.put("", "run", _part("t/0", 9), _points(10))
    grown = _part("t/0", 14)
    assert cache.get("", "run", grown) is None
    claimed, checked, done = [], threading.Event(), threading.Event()

    def reader() -> None:
        claimed.append(cache.claim("", "run", grown))
        checked.wait()
        cache.put("", "run", grown, _points(15))
        cache.release("", "run", grown)
        done.set()

    other = threading.Thread(target=reader)
    other.start()
    while not claimed:
        other.join(0.01)
    assert claimed == [None]  # that thread reads the block now
    kept, as_listed = cache.claim("", "run", grown)
    assert len(kept) == 10 and not as_listed  # this one answers with the block as kept, of an earlier listing
    checked.set()
    other.join()
    assert len(cache.get("", "run", grown)) == 15
    assert cache.claim("", "run", _part("t/0", 20)) is None  # nobody reads it now: this thread is its reader


def test_a_block_never_kept_is_read_once_while_others_wait_for_it():
    cache = BlockCache()
    part = _part("t/0", 9)
    claimed, got, release = [], [], threading.Event()

    def reader() -> None:
        claimed.append(cache.claim("", "run", part))
        release.wait()
        cache.put("", "run", part, _points(10))
        cache.release("", "run", part)

    first = threading.Thread(target=reader)
    first.start()
    while not claimed:
        first.join(0.01)
    waiter = threading.Thread(target=lambda: got.append(cache.claim("", "run", part)))
    waiter.start()
    waiter.join(0.2)
    assert claimed == [None] and waiter.is_alive() and not got  # nothing kept to answer with: it waits
    release.set()
    first.join()
    waiter.join()
    assert len(got) == 1 and got[0] is not None and len(got[0][0]) == 10 and got[0][1]  # as read, not read again
    again = cache.claim("", "run", part)
    assert again[0] is got[0][0] and again[1]  # kept as listed: nobody reads it again
