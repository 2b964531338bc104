"""Format version 2 as written (docs/FORMAT.md): one record per step per (target, source), read back raw.

The records are decoded here from the event files (no tb_layergrad reader) and checked against an
independent numpy computation; the data the version-1 writer wrote (tests/data/format_v1), written again now,
holds the same numbers.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_file_loader

import tb_layergrad
from tb_layergrad import metadata
from tb_layergrad.summary import write

# The group kinds every version-2 write has (`examples` only with per_example=True).
DEFAULT_GROUPED_KINDS = (metadata.KIND_HISTOGRAM, metadata.KIND_STATS, metadata.KIND_FIRST_NONFINITE)

S = metadata.STAT_INDEX


def _values(logdir: str) -> list:
    """[(step, Summary.Value)] of every record of every event file under `logdir`, in file order."""
    out = []
    for path in sorted(glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True)):
        for event in event_file_loader.EventFileLoader(path).Load():
            out.extend((event.step, value) for value in event.summary.value)
    return out


def _gradients(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    big = rng.normal(size=(64, 300)).astype(np.float32)
    big[3, 7] = np.nan
    return {
        "m/dense": tf.constant(rng.normal(size=(32, 16)).astype(np.float32) * 1e-3),
        "m/big": tf.constant(big),
        "m/half": tf.constant(rng.normal(size=(8, 8)).astype(np.float16)),
        "m/zeros": tf.zeros([4, 4]),
        "m/one_value": tf.fill([5], 2.5),
    }


def _bucket_counts(x: np.ndarray, buckets: int) -> np.ndarray:
    """docs/FORMAT.md's buckets of the finite elements, indices computed in float32 as the writer does for
    16/32-bit data: (x - min) * (k / (max - min)), clamped to [0, k-1]."""
    fin = x[np.isfinite(x)].astype(np.float32)
    counts = np.zeros(buckets, np.int64)
    if fin.size == 0:
        return counts
    lo, hi = float(fin.min()), float(fin.max())
    if not hi > lo:
        counts[-1] = fin.size
        return counts
    scale = np.float32(buckets / (hi - lo))
    index = np.clip((fin - np.float32(lo)) * scale, 0, buckets - 1).astype(np.int64)
    return np.bincount(index, minlength=buckets)


@pytest.mark.parametrize("fused", [True, False], ids=["fused op", "TensorFlow ops"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_records_decode_to_the_numbers_numpy_computes(
    tmp_path, monkeypatch, fused, graph, numpy_reference, tolerances, fused_kernel
):
    if fused and fused_kernel.write_missing():
        pytest.skip(f"no fused kernel here: {fused_kernel.write_missing()}")
    if not fused:
        monkeypatch.setattr(write, "fused_writer", lambda writer=None: None)
    grads = _gradients(1)
    writer = tf.summary.create_file_writer(str(tmp_path))

    def log(g, step):
        return tb_layergrad.summary.gradients(g, step=step)

    log = tf.function(log) if graph else log
    with writer.as_default():
        for step in (4, 5):
            assert bool(log(grads, tf.constant(step, tf.int64)))
    writer.close()
    records = _values(str(tmp_path))
    group = metadata.GroupInfo.of(
        metadata.KIND_STATS,
        [
            metadata.SeriesInfo(layer=p, kind="stats", index=i, dtype=g.dtype.name)
            for i, (p, g) in enumerate(grads.items())
        ],
    )
    tags = {kind: group.with_kind(kind).tag_at(0) for kind in DEFAULT_GROUPED_KINDS}
    assert sorted({(s, v.tag) for s, v in records}) == sorted((s, t) for s in (4, 5) for t in tags.values())
    by = {(s, v.tag): v for s, v in records}
    for tag in tags.values():  # the metadata in the first record only
        assert by[(4, tag)].HasField("metadata") and not by[(5, tag)].HasField("metadata")
    stats = tf.make_ndarray(by[(4, tags["stats"])].tensor)
    counts = tf.make_ndarray(by[(4, tags["histogram"])].tensor)
    assert stats.dtype == np.float64 and stats.shape == (5, len(metadata.STAT_FIELDS))
    assert counts.dtype == np.uint16 and counts.shape == (5, 30)  # 19,199 finite elements: more than 255 in a bucket
    assert tf.make_ndarray(by[(5, tags["first_nonfinite"])].tensor).tolist() == [-1, 4, -1, -1, -1]
    for row, g in enumerate(grads.values()):
        x = tf.cast(g, tf.float64).numpy().ravel()
        want = numpy_reference.numpy_stats(x)
        for name in ("elements", "nan", "pos_inf", "neg_inf", "zeros", "min", "max", "no_gradient"):
            assert stats[row, S[name]] == pytest.approx(want[name], nan_ok=True, rel=0, abs=0), name
        n = int(np.isfinite(x).sum())
        for name in ("mean", "std", "norm", "mean_abs"):  # float32 moments of n terms against float64 ones
            scale = max(abs(want[name]), want["mean_abs"] if name == "mean" else 0.0)
            assert abs(stats[row, S[name]] - want[name]) <= tolerances.sum_rtol(np.float32, n) * scale + 1e-300, name
        np.testing.assert_array_equal(counts[row].astype(np.int64), _bucket_counts(x, 30))


def test_the_same_numbers_as_the_version_1_writer_wrote(tmp_path, tb_reading, tolerances):
    """tests/data/format_v1 again, written now: the same gradients (its README says how they were drawn) give
    every histogram, stats and first_nonfinite value the version-1 writer wrote, as version 2."""
    import json

    from tb_layergrad.capturing.gradient_map import Entry, GradientMap

    data = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "format_v1")
    layers = [
        ("model/dense", "output", 1, (4, 3)),
        ("model/dense/kernel", "weight", 1, (2, 3)),
        ("model/dense_1", "output", 2, (4, 2)),
    ]
    rng = np.random.default_rng(20261206)
    writer = tf.summary.create_file_writer(str(tmp_path / "train"))
    with writer.as_default():
        for step in range(6):
            entries = {}
            for path, source, index, shape in layers:
                x = rng.normal(scale=1.0 + step, size=shape).astype(np.float32)
                x.reshape(-1)[1] = 0.0
                if step == 3 and path == "model/dense":
                    x.reshape(-1)[0], x.reshape(-1)[5] = np.nan, np.inf
                entries[path] = Entry(tf.constant(x), source, index, x.size, "float32")
            gmap = GradientMap(entries, "loss", target_value=tf.constant(np.float32(2.0 / (1 + step))))
            tb_layergrad.summary.gradients(gmap, step=step, buckets=10)
    writer.close()
    with open(os.path.join(data, "expected.json")) as f:
        records = json.load(f)["records"]
    now = tb_reading.read_all(str(tmp_path))["train"]
    assert sorted(now) == sorted({r["tag"] for r in records})
    for r in records:
        (datum,) = [d for d in now[r["tag"]][1] if d.step == r["step"]]
        value = np.asarray([np.nan if v is None else v for v in r["value"]]).reshape(r["shape"])
        got = np.asarray(datum.numpy, np.float64)
        if r["tag"].endswith("/stats"):
            # The moments are sums of float32 gradients, added in an order the CPU picks (AVX2 and AVX-512 differ):
            # each writer within the any-order bound of its sum, so the two within twice it. Everything else exact.
            moments = [S[name] for name in ("mean", "std", "norm", "mean_abs")]
            n = int(value[S["elements"]] - value[S["nan"]] - value[S["pos_inf"]] - value[S["neg_inf"]])
            for name in ("mean", "std", "norm", "mean_abs"):  # a mean's sum has terms of both signs: scaled by mean |g|
                scale = max(abs(value[S[name]]), value[S["mean_abs"]] if name == "mean" else 0.0)
                bound = tolerances.TWO_SIDES * tolerances.sum_rtol(np.float32, n) * scale
                assert abs(got[S[name]] - value[S[name]]) <= bound, f"{r['tag']} {r['step']} {name}"
            got, value = np.delete(got, moments), np.delete(value, moments)
        np.testing.assert_array_equal(got, value, err_msg=f"{r['tag']} {r['step']}")
    stored = tb_reading.read_all(str(tmp_path), split_groups=False)["train"]
    assert all(isinstance(info, metadata.GroupInfo) for info, _ in stored.values())


def test_a_new_writer_writes_the_metadata_again_and_a_new_layer_list_a_new_tag(tmp_path, tb_reading):
    """Metadata is per writer (a new file must carry it); a layer list that changes writes other tags, the
    earlier ones are left as they are."""
    first = tf.summary.create_file_writer(str(tmp_path / "run"))
    with first.as_default():
        tb_layergrad.summary.gradients({"m/a": tf.ones([3]), "m/b": tf.ones([2])}, step=1)
        tb_layergrad.summary.gradients({"m/a": tf.ones([3]), "m/b": tf.ones([2])}, step=2)
        tb_layergrad.summary.gradients({"m/a": tf.ones([3]), "m/b": tf.ones([2]), "m/c": tf.ones([4])}, step=3)
    first.close()
    second = tf.summary.create_file_writer(str(tmp_path / "run"), filename_suffix=".restarted")
    with second.as_default():
        tb_layergrad.summary.gradients({"m/a": tf.ones([3]), "m/b": tf.ones([2])}, step=4)
    second.close()
    with_metadata = [(s, v.tag) for s, v in _values(str(tmp_path)) if v.HasField("metadata")]
    two = metadata.GroupInfo.of(
        "stats",
        [metadata.SeriesInfo(layer=p, kind="stats", index=i, dtype="float32") for i, p in enumerate(["m/a", "m/b"])],
    )
    three = metadata.GroupInfo.of(
        "stats",
        [
            metadata.SeriesInfo(layer=p, kind="stats", index=i, dtype="float32")
            for i, p in enumerate(["m/a", "m/b", "m/c"])
        ],
    )
    assert two.tag != three.tag
    files = sorted(glob.glob(str(tmp_path / "run" / "events.out.tfevents.*")), key=lambda p: p.endswith(".restarted"))
    assert len(files) == 2
    kinds = (metadata.KIND_HISTOGRAM, metadata.KIND_STATS)
    assert sorted(with_metadata) == sorted(
        [(1, two.with_kind(k).tag_at(0)) for k in kinds]
        + [(3, three.with_kind(k).tag_at(0)) for k in kinds]
        + [(4, two.with_kind(k).tag_at(0)) for k in kinds]
    )
    series = tb_reading.read_all(str(tmp_path))["run"]
    assert [d.step for d in series["loss/output/m/a/stats"][1]] == [1, 2, 3, 4]  # one layer, across the tags
    assert [d.step for d in series["loss/output/m/c/stats"][1]] == [3]


def test_gradient_logger_writes_version_2(tmp_path, tb_reading):
    import keras

    x = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    y = np.zeros([16, 1], np.float32)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="h"), keras.layers.Dense(1, name="out")], name="mlp"
    )
    model.compile(optimizer="sgd", loss="mse")
    logdir = str(tmp_path / "logs")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[tb_layergrad.GradientLogger(logdir)])
    stored = tb_reading.read_all(logdir, split_groups=False)["train"]
    assert {type(info) for info, _ in stored.values()} == {metadata.GroupInfo}
    assert {d.step for d in tb_reading.read_all(logdir)["train"]["loss/output/mlp/h/stats"][1]} == {1, 2}
    with pytest.raises(TypeError, match="format_version"):
        tb_layergrad.GradientLogger(str(tmp_path / "bad"), format_version=1)


@pytest.mark.parametrize("fused", [True, False], ids=["fused op", "TensorFlow ops"])
def test_a_block_of_steps_per_tag_each_with_its_metadata(tmp_path, monkeypatch, fused, tb_reading):
    """The steps are cut into blocks of `block_steps`, a tag each (so that no tag outgrows one answer of the data
    provider): crossing a block starts a tag with its own metadata; readers see one series."""
    if not fused:
        monkeypatch.setattr(write, "fused_writer", lambda writer=None: None)
    grads = {"m/a": tf.ones([3]), "m/b": tf.constant([1.0, np.nan])}
    group = metadata.GroupInfo.of(
        metadata.KIND_STATS,
        [metadata.SeriesInfo(layer=p, kind="stats", index=i, dtype="float32") for i, p in enumerate(grads)],
    )
    b = group.block_steps
    assert b == metadata.block_steps(2) and b & (b - 1) == 0  # a power of two
    writer = tf.summary.create_file_writer(str(tmp_path / "run"))
    log = tf.function(lambda g, s: tb_layergrad.summary.gradients(g, step=s))
    with writer.as_default():
        for step in (b - 1, b, b + 1):
            log(grads, tf.constant(step, tf.int64))
    writer.close()
    with_metadata = sorted((s, v.tag) for s, v in _values(str(tmp_path)) if v.HasField("metadata"))
    kinds = DEFAULT_GROUPED_KINDS
    assert with_metadata == sorted(
        [(b - 1, group.with_kind(k).tag_at(0)) for k in kinds] + [(b, group.with_kind(k).tag_at(b)) for k in kinds]
    )
    assert group.with_kind("stats").tag_at(b) == f"loss/output/layers-{group.digest}/stats/{b}"
    series = tb_reading.read_all(str(tmp_path))["run"]
    assert [d.step for d in series["loss/output/m/a/stats"][1]] == [b - 1, b, b + 1]
    assert [int(d.numpy[0]) for d in series["loss/output/m/b/first_nonfinite"][1]] == [b - 1] * 3


@pytest.mark.parametrize("jit_compile", [False, True], ids=["in-step", "handed out (XLA)"])
def test_histograms_and_statistics_at_every_logged_step(tmp_path, jit_compile, tb_reading):
    """GradientLogger(update_freq=3): statistics and histograms at every third step, and the first step with a
    NaN/Inf written in full whatever its schedule."""
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 4)).astype(np.float32)
    y = np.zeros([80, 1], np.float32)
    x[8 * 7 + 2, 0] = np.nan  # batch 8 (step 8, not a histogram step) holds a NaN: NaN gradients (and weights) on
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="h"), keras.layers.Dense(1, name="out")], name="mlp"
    )
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[tb_layergrad.GradientLogger(str(tmp_path), update_freq=3)],
    )
    series = tb_reading.read_all(str(tmp_path))["train"]
    assert sorted(d.step for d in series["loss/output/mlp/h/stats"][1]) == [3, 6, 8, 9]  # 8: the first NaN
    assert sorted(d.step for d in series["loss/output/mlp/h/histogram"][1]) == [3, 6, 8, 9]
    with pytest.raises(TypeError, match="histogram_every_n_steps"):
        tb_layergrad.GradientLogger(str(tmp_path), histogram_every_n_steps=3)


@pytest.mark.parametrize("fused", [True, False], ids=["fused op", "TensorFlow ops"])
def test_summary_gradients_writes_statistics_alone_when_asked(tmp_path, monkeypatch, fused, tb_reading):
    if not fused:
        monkeypatch.setattr(write, "fused_writer", lambda writer=None: None)
    writer = tf.summary.create_file_writer(str(tmp_path / "run"))
    log = tf.function(lambda g, s: tb_layergrad.summary.gradients(g, step=s, histograms=tf.equal(s % 2, 0)))
    with writer.as_default():
        for step in range(4):
            bad = np.nan if step == 3 else 1.0
            log({"m/a": tf.constant([1.0, bad]), "m/b": tf.ones([3])}, tf.constant(step, tf.int64))
    writer.close()
    series = tb_reading.read_all(str(tmp_path))["run"]
    assert [d.step for d in series["loss/output/m/a/stats"][1]] == [0, 1, 2, 3]
    assert [d.step for d in series["loss/output/m/b/histogram"][1]] == [0, 2, 3]  # 3: a NaN, written in full
