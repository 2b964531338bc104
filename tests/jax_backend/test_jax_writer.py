"""The TensorFlow-free writer: format-v2 records read back by TensorBoard's own loader, by the plugin's record
index and by `tb_layergrad.load()`, with the metadata of a tag in its first record of a file only."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2

import tb_layergrad
from tb_layergrad import metadata
from tb_layergrad.writer import event_writer
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
            # The numbers as TensorFlow's summary writer keeps them: bytes, not one field per element.
            assert value.tensor.tensor_content and not value.tensor.int_val and not value.tensor.double_val
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


def test_files_made_in_one_second_are_each_read_to_their_end(tmp_path):
    """Each writer its own file (the counter and suffix keep names apart from each other and from TensorBoard's
    writer's): a `file_version` event first, then every step, nothing after the last record."""
    run_dir = os.fspath(tmp_path / "train")
    for _ in range(3):
        _write(run_dir, STEPS)
    paths = sorted(glob.glob(os.path.join(run_dir, "*tfevents*")))
    assert len(paths) == 3 and all(p.endswith(event_writer.FILE_SUFFIX) for p in paths)
    for path in paths:
        events = list(event_file_loader.RawEventFileLoader(path).Load())
        first = event_pb2.Event.FromString(events[0])
        assert first.file_version == "brain.Event:2"
        assert [event_pb2.Event.FromString(e).step for e in events[1:]] == [s[0] for s in STEPS]
        assert sum(len(e) + 16 for e in events) == os.path.getsize(path)


@pytest.mark.timeout(300)
def test_tensorboard_serves_the_file_with_either_loader(tmp_path, tensorboard_process):
    """`tensorboard --logdir` finds the file (by its `tfevents`, whatever follows) with the Rust data server and
    with the Python loader, and the plugin's `runs` route lists every step written."""
    logdir = tmp_path / "logs"
    _write(os.fspath(logdir / "train"), STEPS)
    with tensorboard_process.tensorboards(os.fspath(logdir), [("true", []), ("false", [])], os.fspath(tmp_path)) as tbs:
        for tb in tbs:
            body = tb.wait_for_runs({"train": STEPS[-1][0]})
            (run,) = [r for r in body["runs"] if r["run"] == "train"]
            assert run["max_step"] == STEPS[-1][0]
