"""The TensorFlow-free writer: format-v2 records read back by TensorBoard's own loader, by the plugin's record
index and by `tb_layergrad.load()`, with the metadata of a tag in its first record of a file only."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader

import tb_layergrad
from tb_layergrad import metadata
from tb_layergrad.writer.event_writer import EventWriter
from tb_layergrad.writer.step_records import GroupStep

LAYERS = ("m/dense", "m/dense_1")
NAN = float("nan")


def _group(source=metadata.SOURCE_OUTPUT, target=metadata.DEFAULT_TARGET, layers=LAYERS):
    return metadata.GroupInfo(
        kind=metadata.KIND_STATS, target=target, source=source, layers=layers,
        indexes=tuple(range(1, len(layers) + 1)), dtypes=("float32",) * len(layers),
    )  # fmt: skip


def _stats(norm: float, nan: float = 0.0) -> list:
    return metadata.stat_values(
        elements=4.0, nan=nan, pos_inf=0.0, neg_inf=0.0, zeros=0.0, min=-1.0, max=2.0, mean=0.5,
        std=1.0, norm=norm, mean_abs=1.0, no_gradient=0.0,
    )  # fmt: skip


def _write(run_dir: str, steps) -> None:
    writer = EventWriter(run_dir)
    for step, norms, nans in steps:
        stats = np.array([_stats(n, b) for n, b in zip(norms, nans)])
        counts = np.zeros((len(LAYERS), 30), np.int32)
        counts[:, 0] = 4 - np.asarray(nans)
        writer.write(step, [GroupStep(_group(), stats, counts)])
    writer.close()


STEPS = [(1, (1.0, 2.0), (0, 0)), (2, (3.0, 4.0), (0, 1)), (3, (5.0, 6.0), (0, 0))]


def test_tensorboard_reads_every_step_and_layer(logdir, tb_reading):
    _write(os.path.join(logdir, "train"), STEPS)
    series = tb_reading.read_all(logdir)["train"]
    for row, layer in enumerate(LAYERS):
        info, datums = series[metadata.make_tag(metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, layer, "stats")]
        assert [d.step for d in datums] == [1, 2, 3]
        norms = [d.numpy[metadata.STAT_INDEX["norm"]] for d in datums]
        assert norms == [s[1][row] for s in STEPS]
        _, hists = series[metadata.make_tag(metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, layer, "histogram")]
        assert [float(d.numpy[0, 2]) for d in hists] == [4.0 - s[2][row] for s in STEPS]
    # The first non-finite step of each layer, from its first one on: dense_1 at step 2, dense never.
    _, first = series[metadata.make_tag(metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, LAYERS[1], "first_nonfinite")]
    assert [(d.step, int(d.numpy[0])) for d in first] == [(2, 2), (3, 2)]
    assert (
        metadata.make_tag(metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, LAYERS[0], "first_nonfinite") not in series
    )


def test_metadata_in_each_tags_first_record_and_counts_in_the_narrowest_type(logdir):
    _write(os.path.join(logdir, "train"), STEPS)
    (path,) = glob.glob(os.path.join(logdir, "train", "events.out.tfevents.*"))
    described, dtypes = [], set()
    for event in event_file_loader.EventFileLoader(path).Load():
        for value in event.summary.value:
            described.append((value.tag, value.HasField("metadata")))
            if "/histogram/" in value.tag:
                dtypes.add(value.tensor.dtype)
    tags = list(dict.fromkeys(tag for tag, _ in described))
    assert [tag for tag, has in described if has] == tags
    assert dtypes == {4}  # DT_UINT8: counts up to 4


def test_load_reads_the_rows_written(logdir):
    _write(os.path.join(logdir, "train"), STEPS)
    frame = tb_layergrad.load(logdir)
    got = frame[frame.source == "output"].sort_values(["layer", "step"])
    assert got.layer.tolist() == [LAYERS[0]] * 3 + [LAYERS[1]] * 3
    np.testing.assert_array_equal(got.norm.to_numpy(), [1.0, 3.0, 5.0, 2.0, 4.0, 6.0])
    assert got.nan.tolist() == [0, 0, 0, 0, 1, 0]


def test_a_write_after_close_says_so(tmp_path):
    writer = EventWriter(os.fspath(tmp_path))
    writer.close()
    writer.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(1, [])
