"""A layer's version-2 histograms from a group cut into blocks: thinned before they are laid out, decoded
blocks kept while TensorBoard reports them unchanged (`reader.block_cache`), and the same answers as reading
everything and thinning after."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tb_layergrad.reader import series
from tb_layergrad.reader.block_cache import BlockCache

LAYER = "model/dense"


@pytest.fixture(scope="module")
def tb(tmp_path_factory, plugin_fixtures):
    src = str(tmp_path_factory.mktemp("v1"))
    plugin_fixtures.write_small_logdir(src)
    records = plugin_fixtures.read_run_records(os.path.join(src, "train"))
    records = sorted(records + plugin_fixtures.first_nonfinite_records(records), key=lambda r: r[0])
    logdir = str(tmp_path_factory.mktemp("blocks"))
    plugin_fixtures.write_records(
        os.path.join(logdir, "blocks"), plugin_fixtures.grouped_records(records, block_steps=4)
    )  # steps 0-3, 4-7, 8-9
    return plugin_fixtures.InProcess(logdir)


def histogram_reads(tb):
    return [c for c in tb.provider.calls if c[0] == "read_tensors" and c[3] and any("/histogram/" in t for t in c[3])]


def test_the_blocks_are_three_tags(tb, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "histograms", {"run": "blocks", "layer": LAYER})
    assert body["steps"] == plugin_fixtures.TRAIN_STEPS
    tags = {t for c in histogram_reads(tb) for t in c[3]}
    assert sorted(int(t.rsplit("/", 1)[1]) for t in tags) == [0, 4, 8]


@pytest.mark.parametrize("max_steps", [1, 3, 4, 7])
def test_thinned_before_laid_out_is_thinning_after(tb, max_steps, plugin_fixtures):
    whole = plugin_fixtures.get_json(tb, "histograms", {"run": "blocks", "layer": LAYER})
    thinned = plugin_fixtures.get_json(tb, "histograms", {"run": "blocks", "layer": LAYER, "max_steps": max_steps})
    keep = series.pick_evenly(len(whole["steps"]), max_steps)
    assert thinned["steps"] == [whole["steps"][i] for i in keep]
    assert thinned["histograms"] == [whole["histograms"][i] for i in keep]
    assert thinned["wall_times"] == [whole["wall_times"][i] for i in keep]


def test_a_second_layer_reads_no_block_again(tb, plugin_fixtures):
    plugin_fixtures.get_json(tb, "histograms", {"run": "blocks", "layer": LAYER})
    before = len(histogram_reads(tb))
    for layer in ("model/embedding", "model/rnn", LAYER):
        body = plugin_fixtures.get_json(tb, "histograms", {"run": "blocks", "layer": layer, "max_steps": 5})
        assert len(body["steps"]) == 5
    assert len(histogram_reads(tb)) == before


def test_the_cache_drops_the_least_recently_used_past_its_bytes():
    from tb_layergrad.reader import catalog

    def block(tag: str, n: int):
        part = catalog.Part(tag, 0, n - 1, 1.0, rows=1, group="g")
        return part, series.Points(np.arange(n, dtype=np.int64), np.zeros(n), [np.zeros(8, np.float64)] * n)

    (pa, a), (pb, b), (pc, c) = block("g/0", 10), block("g/10", 10), block("g/20", 10)
    size = 10 * 8 + 10 * 8 + 10 * 64
    cache = BlockCache(max_bytes=2 * size)
    cache.put("", "r", pa, a)
    cache.put("", "r", pb, b)
    assert cache.get("", "r", pa) is a  # now the most recently used
    cache.put("", "r", pc, c)
    assert cache.get("", "r", pb) is None and cache.get("", "r", pa) is a and cache.get("", "r", pc) is c
    grown = catalog.Part("g/20", 0, 12, 1.0, rows=1, group="g")  # the block grew: another version
    assert cache.get("", "r", grown) is None
