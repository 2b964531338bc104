"""The plugin's own reading of a local logdir (`reader.record_index`) answers as TensorBoard's provider.

What TensorBoard's `MultiplexerDataProvider` keeping every record answers over the same bytes is the reference:
the same series and listing, the same records (step, wall time, array) in the same order, the same
downsampling; damaged files read up to their first bad record; a file being written read from where the
last read stopped."""

from __future__ import annotations

import os

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
    return compared


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
    tb = _tensorboard(str(tmp_path))
    assert _same(tb, ours, ctx) > 0
    listed = ours.list_tensors(ctx, experiment_id=EID, plugin_name=metadata.PLUGIN_NAME)
    assert {s.max_step for s in listed["live"].values()} == {11}
    assert os.path.getsize(f.path) > 0
