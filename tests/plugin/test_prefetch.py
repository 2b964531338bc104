"""Reading the runs' statistics ahead of the tab (`plugin.prefetch`): what a pass reads, what it leaves alone.

The figures that made it necessary (the first request of a 100,000-step run) are the bench's
(docs/PERFORMANCE.md); here: that a pass leaves nothing for the routes to read, that it never makes the
store drop a table, that it stops re-reading a changing run while nobody looks, and that TensorBoard
starts with it on and with `--layergrad_prefetch=false`.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tb_layergrad import metadata
from tb_layergrad.plugin import prefetch
from tb_layergrad.plugin.loader import LayerGradLoader
from tb_layergrad.reader import catalog
from tb_layergrad.reader.stats_store import StatsStore

LAYERS = ["model/a", "model/b", "model/c"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reads(tb) -> int:
    return sum(1 for call in tb.provider.calls if call[0] == "read_tensors")


def stats_series(tb, run: str):
    from tensorboard import context

    rc = catalog.load(tb.provider, context.RequestContext(), "", runs=[run]).run(run)
    return [s for s in rc.series if s.info.kind == metadata.KIND_STATS]


@pytest.fixture
def logdir(tmp_path, long_fixtures):
    """Two version-2 runs and a version-1 one; `long` was written last (its wall times are the latest)."""
    long_fixtures.write_run(str(tmp_path / "short"), LAYERS, 20, keep=False)
    long_fixtures.write_run(str(tmp_path / "long"), LAYERS, 50, keep=False)
    long_fixtures.write_run(str(tmp_path / "old_v1"), LAYERS, 10, keep=False, format_version=1)
    return str(tmp_path)


def settle(pre: prefetch.StatsPrefetcher):
    """Two passes: the first sees each run's last block as it is, the second finds it unchanged and reads it."""
    first = pre.warm_once()
    return first, pre.warm_once()


def test_after_two_passes_no_route_reads_a_record(logdir, plugin_fixtures):
    tb = plugin_fixtures.InProcess(logdir)
    pre = prefetch.StatsPrefetcher(tb.plugin._routes.reading.stats, tb.plugin._routes.reading.lister)  # noqa: SLF001 - the plugin's own store

    def statistics_read():
        return {r["run"]: r["statistics_read"] for r in plugin_fixtures.get_json(tb, "runs", {})["runs"]}

    assert statistics_read() == {"long": False, "old_v1": False, "short": False}
    first, second = settle(pre)
    assert first == []  # every tag is new: it may still be being written
    assert sorted(second) == ["long", "old_v1", "short"]
    assert statistics_read() == {"long": True, "old_v1": True, "short": True}
    before = reads(tb)
    for run in ("long", "short", "old_v1"):
        body = plugin_fixtures.get_json(tb, "matrix", {"run": run, "stat": "norm"})
        assert len(body["steps"]) == {"long": 50, "short": 20, "old_v1": 10}[run]
        plugin_fixtures.get_json(tb, "anomalies", {"run": run})
        plugin_fixtures.get_json(tb, "stats", {"run": run, "layer": "model/b"})
    assert reads(tb) == before
    assert pre.warm_once() == []  # nothing changed: nothing read again
    assert reads(tb) == before


def test_a_run_being_written_is_read_now_and_then_up_to_its_last_block(
    tmp_path, tmp_path_factory, long_fixtures, plugin_fixtures
):
    clock = Clock()
    long_fixtures.write_run(str(tmp_path / "blocks"), LAYERS, 50, keep=False, block_steps=16)  # blocks 0, 16, 32, 48
    tb = plugin_fixtures.InProcess(str(tmp_path))
    store = tb.plugin._routes.reading.stats  # noqa: SLF001
    pre = prefetch.StatsPrefetcher(store, tb.provider, clock=clock)
    assert pre.warm_once() == []  # first seen: maybe still being loaded
    # Training goes on: block 48 grows (steps 50-59 arrive in a later file); 0, 16 and 32 stay as they were.
    more = str(tmp_path_factory.mktemp("more"))
    long_fixtures.write_run(more, LAYERS, 60, keep=False, block_steps=16)
    shutil.copy(
        os.path.join(more, "events.out.tfevents.1.long.v2"),
        os.path.join(str(tmp_path), "blocks", "events.out.tfevents.2.long.v2"),
    )
    tb.reload()
    clock.now += prefetch.BUSY_INTERVAL / 2
    assert pre.warm_once() == []  # changing, and first seen a moment ago
    long_fixtures.write_run(more, LAYERS, 64, keep=False, block_steps=16)  # and grows again: steps 60-63
    shutil.copy(
        os.path.join(more, "events.out.tfevents.1.long.v2"),
        os.path.join(str(tmp_path), "blocks", "events.out.tfevents.3.long.v2"),
    )
    tb.reload()
    clock.now += prefetch.BUSY_INTERVAL
    assert pre.warm_once() == ["blocks"]  # still changing, but for long enough: what stopped changing is read
    (united,) = [v for _, v in store._tables.values()]  # noqa: SLF001 - which blocks are kept is what is tested
    assert sorted(int(t.rsplit("/", 1)[1]) for t in united.versions) == [0, 16, 32]
    group = next(iter(united.versions)).rsplit("/", 1)[0]
    calls = len(tb.provider.calls)
    assert (
        plugin_fixtures.get_json(tb, "runs", {})["runs"][0]["statistics_read"] is False
    )  # the last block is not held yet
    assert len(plugin_fixtures.get_json(tb, "matrix", {"run": "blocks", "stat": "norm"})["steps"]) == 64
    assert plugin_fixtures.get_json(tb, "runs", {})["runs"][0]["statistics_read"] is True
    assert [c[3] for c in tb.provider.calls[calls:] if c[0] == "read_tensors"] == [frozenset({group + "/48"})]
    assert pre.warm_once() == []  # the request read the last block; nothing left to read ahead


def test_newest_runs_first_and_never_past_the_budget(logdir, plugin_fixtures):
    tb = plugin_fixtures.InProcess(logdir)
    need = {run: prefetch.estimated_bytes(stats_series(tb, run)) for run in ("long", "short", "old_v1")}
    store = StatsStore(tb.provider, max_bytes=need["long"] + need["short"] // 2)
    pre = prefetch.StatsPrefetcher(store, tb.provider)
    assert settle(pre) == ([], ["long"])  # the latest written; `short` would not fit beside it
    assert store.holds("", "long") and not store.holds("", "short")
    assert store.nbytes <= store.max_bytes


@pytest.mark.parametrize("run", ["long", "old_v1"])
def test_the_estimate_is_an_upper_bound(logdir, run, plugin_fixtures):
    from tensorboard import context

    tb = plugin_fixtures.InProcess(logdir)
    store = StatsStore(tb.provider)
    chosen = stats_series(tb, run)
    store.read(context.RequestContext(), "", run, chosen)
    assert 0 < store.nbytes <= prefetch.estimated_bytes(chosen)


def test_a_changing_run_is_read_again_only_while_the_tab_is_used(
    logdir, tmp_path_factory, long_fixtures, plugin_fixtures
):
    clock = Clock()
    tb = plugin_fixtures.InProcess(logdir)
    store = StatsStore(tb.provider)
    pre = prefetch.StatsPrefetcher(store, tb.provider, idle_after=60.0, clock=clock)
    assert "short" in settle(pre)[1]
    # Training goes on: more steps of `short` arrive in a later event file.
    more = str(tmp_path_factory.mktemp("more"))
    long_fixtures.write_run(more, LAYERS, 30, keep=False)
    shutil.copy(
        os.path.join(more, "events.out.tfevents.1.long.v2"),
        os.path.join(logdir, "short", "events.out.tfevents.2.long.v2"),
    )
    tb.reload()
    assert not store.is_current("", "short", stats_series(tb, "short"))
    clock.now += 61.0  # nobody has asked for anything for a minute
    assert settle(pre) == ([], [])
    pre.request_seen()  # the tab asks again
    assert pre.warm_once() == ["short"]
    assert store.is_current("", "short", stats_series(tb, "short"))


def test_the_plugin_reads_ahead_in_the_background_when_asked(logdir, plugin_fixtures):
    tb = plugin_fixtures.InProcess(logdir, read_ahead=True)
    store = tb.plugin._routes.reading.stats  # noqa: SLF001 - watched, not driven: no request is made until it is full
    deadline = time.monotonic() + 120
    while not all(store.holds("", run) for run in ("long", "short", "old_v1")):
        assert time.monotonic() < deadline, "the background pass never read the runs"
        time.sleep(0.05)
    before = reads(tb)
    assert len(plugin_fixtures.get_json(tb, "matrix", {"run": "long", "stat": "norm"})["steps"]) == 50
    assert reads(tb) == before
    tb.plugin._routes._prefetch.stop()  # noqa: SLF001


def test_no_read_ahead_without_flags():
    from tensorboard.plugins import base_plugin

    from tb_layergrad.plugin.loader import LayerGradPlugin

    plugin = LayerGradPlugin(base_plugin.TBContext(logdir="", data_provider=None))
    assert plugin._routes._prefetch is None  # noqa: SLF001


def test_the_flag_parses_and_defaults_on():
    import argparse

    parser = argparse.ArgumentParser()
    LayerGradLoader().define_flags(parser)
    assert parser.parse_args([]).layergrad_prefetch is True
    assert parser.parse_args(["--layergrad_prefetch=false"]).layergrad_prefetch is False
    assert parser.parse_args(["--layergrad_prefetch", "True"]).layergrad_prefetch is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--layergrad_prefetch=maybe"])


def test_tensorboard_takes_the_flag_even_with_the_loader_listed_twice():
    from tensorboard import default, program

    tb = program.TensorBoard(plugins=default.get_plugins() + [LayerGradLoader()])
    tb.configure(argv=["", "--logdir", "/nonexistent", "--layergrad_prefetch=false"])
    assert tb.flags.layergrad_prefetch is False


def test_a_group_asked_with_fewer_blocks_than_it_holds(tmp_path, long_fixtures, plugin_fixtures):
    """A block no longer listed (a reload dropped it) leaves the group's other blocks; reading ahead those
    same blocks keeps what a request read besides (the run's lock decides, not a race)."""
    import dataclasses

    from tensorboard import context

    long_fixtures.write_run(str(tmp_path / "blocks"), LAYERS, 50, keep=False, block_steps=16)
    tb = plugin_fixtures.InProcess(str(tmp_path))
    store = StatsStore(tb.provider)
    ctx = context.RequestContext()
    whole = stats_series(tb, "blocks")
    first_three = [dataclasses.replace(s, parts=tuple(p for p in s.parts if not p.tag.endswith("/48"))) for s in whole]
    store.read(ctx, "", "blocks", whole)
    calls = len(tb.provider.calls)
    assert store.read_ahead(ctx, "", "blocks", first_three) is False
    assert store.is_current("", "blocks", whole)  # the last block, read by the request, is still held
    rows = store.read(ctx, "", "blocks", first_three)
    assert all(list(r.steps) == list(range(48)) for r in rows.values())
    assert len(tb.provider.calls) == calls  # nothing read: the held blocks serve
