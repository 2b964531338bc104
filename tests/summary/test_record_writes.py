"""One op computes and writes a step's histogram and stats records (summary.write, kernel/src/write_records.cc).

The records must be the very bytes `tf.summary.write` writes (docs/FORMAT.md): compared here event by
event, read back through TensorBoard's own event-file loader, against the per-record path.
"""

from __future__ import annotations

import dataclasses
import glob

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_file_loader

import tb_layergrad
from tb_layergrad import metadata
from tb_layergrad.kernel import fused as fused_kernel
from tb_layergrad.kernel.fused import Condition, Groups
from tb_layergrad.summary import write, writer_state
from tb_layergrad.summary.plan import Plan, Series
from tb_layergrad.summary.write import write_step

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module", autouse=True)
def kernel_built():
    assert fused_kernel.write_op() is not None, (
        f"the fused kernel did not build here: {fused_kernel.unavailable_reason()}"
    )


def _tensors() -> list:
    rng = np.random.default_rng(3)
    big = (rng.normal(size=70_000) * 2).astype(np.float32)
    big[[10, 50_000]] = [np.nan, np.inf]
    return [
        tf.constant(rng.normal(size=(32, 64)).astype(np.float32)),
        tf.constant(big),
        tf.constant(rng.normal(size=(8, 8)).astype(np.float16)),
        tf.constant(rng.normal(size=(16,)), tf.bfloat16),
        tf.constant(rng.normal(size=(4, 4))),  # float64: not the kernel's, takes the per-record path
        tf.zeros([3, 3]),
    ]


def _series(n: int) -> list:
    return [
        metadata.SeriesInfo(
            layer=f"model/dense_{i}", kind=metadata.KIND_STATS, target="loss", source="output", index=i, dtype="float32"
        )
        for i in range(n)
    ]


def _events(logdir: str) -> dict:
    """{(step, tag): Summary.Value} of every record in the run's event file."""
    (path,) = glob.glob(f"{logdir}/events.out.tfevents.*")
    out = {}
    for event in event_file_loader.EventFileLoader(path).Load():
        for value in event.summary.value:
            assert (event.step, value.tag) not in out
            out[(event.step, value.tag)] = value
    return out


def _fused(writer, record, step, infos, tensors, track_nonfinite=True, **condition):
    """`write.write_fused` of one group (`infos`, one target and source) at `step`, when `record`."""
    plan = Plan(tuple(Series(i, x) for i, x in zip(infos, tensors)), track_nonfinite=track_nonfinite)
    at = Condition(record=record, step=step, **condition)
    return write.write_fused(writer._resource, plan, [plan.series], at, writer)  # noqa: SLF001


def _write(logdir: str, tensors: list, steps, per_record: bool, monkeypatch) -> None:
    """Write the records of `tensors` at each step, through the fused op or (`per_record`) tf.summary.write."""
    if per_record:
        monkeypatch.setattr(write, "fused_writer", lambda writer=None: None)
    writer = tf.summary.create_file_writer(logdir)

    @tf.function
    def write_at(xs, at):
        with tf.summary.record_if(True):
            series = tuple(Series(info, x) for info, x in zip(_series(len(xs)), xs))
            write_step(Plan(series, buckets=30, description="why"), at)

    with writer.as_default():
        for step in steps:
            write_at(tensors, tf.constant(step, tf.int64))
    writer.close()
    monkeypatch.undo()


@pytest.mark.slow
def test_one_op_writes_the_bytes_tf_summary_write_writes(tmp_path, monkeypatch):
    """One record per kind for the group, the same bytes through the op as through tf.summary.write, the
    metadata in each tag's first record only, the counts in the narrowest type."""
    tensors = [t for t in _tensors() if t.dtype != tf.float64]  # a group is fused only if every tensor is the op's
    _write(str(tmp_path / "fused"), tensors, [7, 9], False, monkeypatch)
    _write(str(tmp_path / "plain"), tensors, [7, 9], True, monkeypatch)
    fused, plain = _events(str(tmp_path / "fused")), _events(str(tmp_path / "plain"))
    group = metadata.GroupInfo.of(metadata.KIND_STATS, _series(len(tensors)))
    tags = {
        kind: group.with_kind(kind).tag_at(0)
        for kind in (metadata.KIND_HISTOGRAM, metadata.KIND_STATS, metadata.KIND_FIRST_NONFINITE)
    }
    assert sorted(fused) == sorted(plain) == sorted((s, tag) for s in (7, 9) for tag in tags.values())
    for key in plain:
        assert fused[key].SerializeToString() == plain[key].SerializeToString(), key
    for tag in tags.values():
        assert fused[(7, tag)].HasField("metadata") and not fused[(9, tag)].HasField("metadata")
        assert metadata.parse_plugin_content(fused[(7, tag)].metadata.plugin_data.content).layers == group.layers
    assert fused[(7, tags["stats"])].metadata.summary_description == "why"
    assert tf.make_ndarray(fused[(9, tags["first_nonfinite"])].tensor).tolist() == [-1, 7, -1, -1, -1]
    stats = tf.make_ndarray(fused[(7, tags["stats"])].tensor)
    counts = tf.make_ndarray(fused[(7, tags["histogram"])].tensor)
    assert stats.shape == (5, 12) and stats.dtype == np.float64
    assert counts.shape == (5, 30) and counts.dtype == np.uint16  # 70,000 elements: no bucket holds 65,536
    assert stats[1, metadata.STAT_INDEX["nan"]] == 1 and stats[1, metadata.STAT_INDEX["pos_inf"]] == 1
    for row, t in enumerate(tensors):  # against numpy: each row's total and range
        x = tf.cast(t, tf.float64).numpy().ravel()
        x = x[np.isfinite(x)]
        assert counts[row].sum() == x.size
        assert stats[row, metadata.STAT_INDEX["min"]] == x.min() and stats[row, metadata.STAT_INDEX["max"]] == x.max()
    x = tensors[0].numpy().astype(np.float64).ravel()
    reference, _ = np.histogram(x, bins=30, range=(x.min(), x.max()))
    assert np.abs(counts[0].astype(np.int64) - reference).sum() <= 2  # float32 bucket indices may move an edge element


def test_a_logged_step_is_one_op_and_no_condition(tmp_path):
    """summary.gradients in a tf.function: one op writes every float32 layer's records, the recording
    condition is its input (no tf.cond, no WriteSummary), and an unlogged step writes nothing."""
    writer = tf.summary.create_file_writer(str(tmp_path))
    grads = {f"m/layer_{i}": tf.random.normal([16, 8]) for i in range(4)}
    step_var = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def step(g):
        with tf.summary.record_if(step_var % 2 == 0):
            return tb_layergrad.summary.gradients(g)

    with writer.as_default(step=step_var):
        graph = step.get_concrete_function(grads).graph
        types = [op.type for op in graph.get_operations()]
        assert types.count(fused_kernel.WRITE_OP_NAME) == 1
        assert not {"If", "StatelessIf", "PartitionedCall", "StatefulPartitionedCall", "WriteSummary"} & set(types)
        assert fused_kernel.OP_NAME not in types  # the write op reduces too
        for s in range(3):
            step_var.assign(s)
            assert bool(step(grads)) == (s % 2 == 0)
    writer.close()
    events = _events(str(tmp_path))
    assert (
        sorted({s for s, _ in events}) == [0, 2] and len(events) == 2 * 2
    )  # version 2: a histogram and a stats record


def test_without_a_file_writer_nothing_is_written_and_nothing_fails():
    """No writer, or a no-op one: no resource to write to; tf.summary's own behaviour applies (nothing written)."""
    assert writer_state.default_writer_resource() is None
    assert bool(tb_layergrad.summary.gradients({"m/d": tf.ones([2, 2])}, step=3)) is False
    with tf.summary.create_noop_writer().as_default():
        assert writer_state.default_writer_resource() is None
        assert bool(tb_layergrad.summary.gradients({"m/d": tf.ones([2, 2])}, step=3)) is False


def test_mismatched_series_are_refused(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    one = (("a", b""),)
    groups = Groups(sizes=(2,), block_steps=(1,), histogram=one + one, stats=one)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="one tag and one metadata per group"):
        fused_kernel.write_histograms_and_stats(
            writer._resource,  # noqa: SLF001
            [tf.ones([3]), tf.ones([2])],
            5,
            groups,
            Condition(record=tf.constant(True), step=tf.constant(1, tf.int64)),
        )
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="add up to the number of input tensors"):
        fused_kernel.write_histograms_and_stats(
            writer._resource,  # noqa: SLF001
            [tf.ones([3])],
            5,
            dataclasses.replace(groups, histogram=one),
            Condition(record=tf.constant(True), step=tf.constant(1, tf.int64)),
        )


@pytest.mark.parametrize("flush", [True, False])
def test_flush_puts_the_step_on_disk_before_the_writer_closes(tmp_path, flush):
    """GradientLogger's in-step writes flush (records before a crash are kept); without flush they wait in the queue."""
    writer = tf.summary.create_file_writer(str(tmp_path), max_queue=1000, flush_millis=10**9)
    series = _series(1)
    _fused(writer, tf.constant(True), tf.constant(5, tf.int64), series, [tf.ones([4])], flush=flush)
    group = metadata.GroupInfo.of(metadata.KIND_STATS, series)
    tags = [group.with_kind(k).tag_at(5) for k in (metadata.KIND_HISTOGRAM, metadata.KIND_STATS)]
    assert sorted(_events(str(tmp_path))) == (sorted((5, tag) for tag in tags) if flush else [])
    writer.close()
    assert len(_events(str(tmp_path))) == 2


def test_a_write_op_that_cannot_write_here_leaves_it_to_tf_summary_write(tmp_path, monkeypatch):
    """The op finds TensorFlow's writer across shared libraries; where a self-test at load fails, nothing breaks."""
    assert fused_kernel._write_op_error(fused_kernel._module()) is None  # noqa: SLF001 - it works on this build
    monkeypatch.setitem(fused_kernel._state, "write_error", "simulated")  # noqa: SLF001
    assert fused_kernel.write_op() is None and write.fused_writer() is None
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=1):
        assert bool(tb_layergrad.summary.gradients({"m/d": tf.ones([3])}))
    writer.close()
    assert len(_events(str(tmp_path))) == 2


def test_first_nonfinite_is_kept_per_writer_written_to(tmp_path):
    """A writer handed to write_step (GradientLogger's in-step path, no default writer) keeps its own first NaN
    step: a clean run written after a NaN run, to another writer, gets no first_nonfinite record."""
    runs = {name: tf.summary.create_file_writer(str(tmp_path / name)) for name in ("nan_run", "clean_run")}
    info = _series(1)[0]
    for step, (name, data) in enumerate((("nan_run", [1.0, np.nan]), ("clean_run", [1.0, 2.0])), start=3):
        written = write_step(
            Plan((Series(info, tf.constant(data)),)), step, record=tf.constant(True), writer=runs[name]
        )
        assert bool(written)
        runs[name].close()
    group = metadata.GroupInfo.of(metadata.KIND_STATS, [info])
    first_tag = group.with_kind(metadata.KIND_FIRST_NONFINITE).tag_at(3)
    nan_run, clean_run = _events(str(tmp_path / "nan_run")), _events(str(tmp_path / "clean_run"))
    assert tf.make_ndarray(nan_run[(3, first_tag)].tensor).tolist() == [3]
    kinds = (metadata.KIND_HISTOGRAM, metadata.KIND_STATS)
    assert sorted(clean_run) == sorted((4, group.with_kind(k).tag_at(4)) for k in kinds)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("size", [7, 1 << 20])  # one thread; and enough elements to spread over the worker threads
def test_the_check_of_an_unrecorded_step_finds_each_nan_and_inf(tmp_path, dtype, size):
    """With `record_if_nonfinite`, an unrecorded step's tensors are scanned: the flags name exactly the tensors
    holding a NaN or an Inf (anywhere, also the last element of a chunk), and the step is written after all only
    when asked to; the largest finite values, subnormals and -0 are not non-finite."""
    writer = tf.summary.create_file_writer(str(tmp_path))
    big = float(tf.as_dtype(dtype).max)
    finite = np.full(size, big, np.float32)
    finite[0], finite[-1] = -big, -0.0
    tensors = [finite.copy() for _ in range(5)]
    tensors[1][size // 2] = np.nan
    tensors[2][-1] = np.inf
    tensors[3][(1 << 15) - 1 if size > 1 << 15 else 1] = -np.inf  # the last element of the first chunk
    tensors[4][1] = 1e-45 if dtype == tf.float32 else 0.0  # a subnormal float32
    xs = [tf.cast(tf.constant(t), dtype) for t in tensors]
    series = _series(5)
    for record_if in (False, True):
        out = _fused(
            writer,
            tf.constant(False),
            tf.constant(3, tf.int64),
            series,
            xs,
            track_nonfinite=False,
            record_if_nonfinite=tf.constant(record_if),
        )
        written, nonfinite, stats = out.written, out.nonfinite, out.stats
        assert nonfinite.numpy().tolist() == [False, True, True, True, False]
        assert bool(written) == record_if
        # The stats as written come out too (zeros when nothing was): the NaN/Inf counts name the same tensors.
        counts = stats.numpy()[:, [metadata.STAT_INDEX[k] for k in ("nan", "pos_inf", "neg_inf")]].sum(axis=1)
        assert counts.tolist() == ([0, 1, 1, 1, 0] if record_if else [0] * 5)
    writer.close()
    assert sorted({step for step, _ in _events(str(tmp_path))}) == [3]  # written once: when asked to
    other = tf.summary.create_file_writer(str(tmp_path / "clean"))
    out = _fused(
        other,
        tf.constant(False),
        tf.constant(4, tf.int64),
        series[:1],
        xs[:1],
        track_nonfinite=False,
        record_if_nonfinite=tf.constant(True),
    )
    clean_written, clean = out.written, out.nonfinite
    assert not bool(clean_written) and clean.numpy().tolist() == [False]  # all finite: nothing written
