"""Summary ops write what TensorBoard's own readers give back, numbers included."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad import metadata

S = metadata.STAT_INDEX


def assert_stats(reference_checks, got: np.ndarray, t, where: str = "") -> None:
    """Against the independent float64 reference, with bounds derived from the reduction length (check_stats)."""
    reference_checks.check_stats(got, t if isinstance(t, tf.Tensor) else tf.constant(t), where)


def write(logdir, fn, run="run"):
    writer = tf.summary.create_file_writer(str(logdir / run))
    with writer.as_default():
        fn()
    writer.close()


def test_planted_nan_inf_stats_and_histogram(tmp_path, reference_checks, tb_reading):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(64, 10)).astype(np.float32)
    a[0, 0] = np.nan
    a[1, 1] = np.inf
    a[2, 2] = -np.inf
    a[3, 3:6] = 0.0
    a[5, 5] = np.nan
    write(tmp_path, lambda: tb_layergrad.summary.histogram_and_stats("model/dense", tf.constant(a), step=7, buckets=20))
    recs = tb_reading.read_all(str(tmp_path))["run"]
    hist = tb_reading.values_at(recs, "loss/output/model/dense/histogram", 7)
    stats = tb_reading.values_at(recs, "loss/output/model/dense/stats", 7)
    assert stats[S["nan"]] == 2 and stats[S["pos_inf"]] == 1 and stats[S["neg_inf"]] == 1
    assert stats[S["zeros"]] == 3
    assert_stats(reference_checks, stats, a, "planted")
    reference_checks.check_histogram(hist, tf.constant(a), 20, "planted")
    info = recs["loss/output/model/dense/stats"][0]
    assert (info.layer, info.kind, info.target, info.source, info.version) == (
        "model/dense",
        "stats",
        "loss",
        "output",
        metadata.FORMAT_VERSION,
    )


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_float_dtypes(tmp_path, dtype, reference_checks, tb_reading):
    rng = np.random.default_rng(1)
    a = rng.normal(size=(300,)) * 3
    t = tf.cast(tf.constant(a), dtype)
    write(tmp_path, lambda: tb_layergrad.summary.histogram_and_stats("g", t, step=1))
    recs = tb_reading.read_all(str(tmp_path))["run"]
    assert_stats(
        reference_checks, tb_reading.values_at(recs, "loss/output/g/stats", 1), t, dtype.name
    )  # bounds in the compute dtype
    reference_checks.check_histogram(tb_reading.values_at(recs, "loss/output/g/histogram", 1), t, 30, dtype.name)
    assert recs["loss/output/g/stats"][0].dtype == dtype.name


def test_empty_single_value_integer_and_no_gradient(tmp_path, reference_checks, tb_reading):
    def fn():
        tb_layergrad.summary.histogram_and_stats("empty", tf.zeros([0, 4]), step=0)
        tb_layergrad.summary.histogram_and_stats("single", tf.fill([5, 5], 0.25), step=0)
        tb_layergrad.summary.histogram_and_stats("ints", tf.constant([1, 2, 2, 3], tf.int32), step=0)
        tb_layergrad.summary.ops.write_tensor("none", None, step=0, elements=12)
        tb_layergrad.summary.histogram_and_stats("allnan", tf.constant([np.nan, np.inf]), step=0)

    write(tmp_path, fn)
    recs = tb_reading.read_all(str(tmp_path))["run"]
    empty_h = tb_reading.values_at(recs, "loss/output/empty/histogram", 0)
    assert empty_h.shape == (30, 3) and not empty_h.any()
    assert tb_reading.values_at(recs, "loss/output/empty/stats", 0)[S["elements"]] == 0
    single = tb_reading.values_at(recs, "loss/output/single/histogram", 0)
    assert np.all(single[:, :2] == 0.25) and single[-1, 2] == 25 and single[:-1, 2].sum() == 0
    assert_stats(
        reference_checks,
        tb_reading.values_at(recs, "loss/output/ints/stats", 0),
        tf.constant([1, 2, 2, 3], tf.int32),
        "ints",
    )
    none = tb_reading.values_at(recs, "loss/output/none/stats", 0)
    assert none[S["no_gradient"]] == 1 and none[S["elements"]] == 12 and np.isnan(none[S["mean"]])
    assert not tb_reading.values_at(recs, "loss/output/none/histogram", 0).any()
    allnan = tb_reading.values_at(recs, "loss/output/allnan/stats", 0)
    assert allnan[S["nan"]] == 1 and allnan[S["pos_inf"]] == 1 and np.isnan(allnan[S["min"]])
    assert tb_reading.values_at(recs, "loss/output/allnan/histogram", 0)[:, 2].sum() == 0


def test_bounded_raw_tensor(tmp_path, tb_reading):
    a = np.arange(6 * 50, dtype=np.float32).reshape(6, 5, 10)
    write(tmp_path, lambda: tb_layergrad.summary.histogram_and_stats("t", tf.constant(a), step=2, max_elements=120))
    recs = tb_reading.read_all(str(tmp_path))["run"]
    raw = tb_reading.values_at(recs, "loss/output/t/tensor", 2)
    np.testing.assert_array_equal(raw, a.reshape(6, 50)[:2])  # whole rows while they fit
    write(
        tmp_path,
        lambda: tb_layergrad.summary.histogram_and_stats("wide", tf.constant(a), step=2, max_elements=20),
        run="wide",
    )
    wide = tb_reading.values_at(tb_reading.read_all(str(tmp_path))["wide"], "loss/output/wide/tensor", 2)
    np.testing.assert_array_equal(wide, a.reshape(6, 50)[:1, ::3])  # one row, strided columns


def test_gradients_writes_a_capture_result_in_graph_mode(tmp_path, model_zoo, reference_checks, tb_reading):
    model, x, y, _ = model_zoo.seed_model()
    writer = tf.summary.create_file_writer(str(tmp_path / "run"))
    step_var = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape, weights=True) as cap:
                loss = model_zoo.mse(y, model(x))
        grads = cap.gradients(tape, loss)
        with writer.as_default(step=step_var):
            tb_layergrad.summary.gradients(grads)
        step_var.assign_add(1)
        return grads

    kept = [step(x, y) for _ in range(3)]
    writer.close()
    recs = tb_reading.read_all(str(tmp_path))["run"]
    cell = model.minimalrnn.cell.name
    for s, grads in enumerate(kept):
        for path, g in grads.items():
            source = "weight" if path in grads.weights else "output"
            assert_stats(reference_checks, tb_reading.values_at(recs, f"loss/{source}/{path}/stats", s), g, path)
    infos = {tag: info for tag, (info, _) in recs.items()}
    assert infos["loss/output/my_model/minimalrnn/stats"].index < infos["loss/output/my_model/out/stats"].index
    assert infos[f"loss/weight/my_model/minimalrnn/{cell}/kernel/histogram"].source == "weight"


def test_record_if_false_writes_nothing(tmp_path, tb_reading):
    def fn():
        with tf.summary.record_if(False):
            tb_layergrad.summary.histogram_and_stats("g", tf.ones([3]), step=1)
        tb_layergrad.summary.histogram_and_stats("h", tf.ones([3]), step=1)

    write(tmp_path, fn)
    recs = tb_reading.read_all(str(tmp_path))["run"]
    assert not any(tag.startswith("loss/output/g/") for tag in recs)
    assert "loss/output/h/stats" in recs


def test_step_is_required():
    with pytest.raises(ValueError, match="no step given"):
        tb_layergrad.summary.histogram_and_stats("g", tf.ones([2]))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
def test_any_integer_step_is_taken(tmp_path, graph, tb_reading):
    """int32 tensors and variables (tf.constant(3) is int32) and numpy ints name the step; a float step is refused."""
    steps = [tf.constant(3, tf.int32), tf.Variable(4, dtype=tf.int32), np.int64(5), 6]

    def fn():
        for s in steps:
            call = lambda s=s: tb_layergrad.summary.gradients({"a": tf.fill([2], float(s))}, step=s)  # noqa: E731
            (tf.function(call) if graph else call)()
            tb_layergrad.summary.timesteps("rnn", tf.ones([3]), step=s)

    write(tmp_path, fn)
    recs = tb_reading.read_all(str(tmp_path))["run"]
    for s in (3, 4, 5, 6):
        assert tb_reading.values_at(recs, "loss/output/a/stats", s)[metadata.STAT_INDEX["mean"]] == s
        assert tb_reading.values_at(recs, "loss/output/rnn/timesteps", s).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(TypeError, match="step must be an integer, got dtype float32"):
        tb_layergrad.summary.gradients({"a": tf.ones([2])}, step=tf.constant(1.0))


def test_target_name_is_its_own_series(tmp_path, tb_reading):
    write(tmp_path, lambda: (tb_layergrad.summary.gradients({"a": tf.ones([2])}, step=1, target="class_3"), None))
    recs = tb_reading.read_all(str(tmp_path))["run"]
    assert recs["class_3/output/a/stats"][0].target == "class_3"


@pytest.mark.slow
def test_first_nonfinite_is_kept_per_writer_and_tag_across_functions(tmp_path, write_path, tb_reading):
    """Series added later (another function, the same writer) get their own running value; a function
    traced before they were added keeps its own; another writer keeps separate values."""
    writer, other = (tf.summary.create_file_writer(str(tmp_path / r)) for r in ("run", "other"))
    nan = lambda: tf.constant([1.0, np.nan])  # noqa: E731
    ok = lambda: tf.constant([1.0, 2.0])  # noqa: E731
    step = lambda s: tf.constant(s, tf.int64)  # noqa: E731 - a tensor step: one trace per function, not one per value
    log_a = tf.function(lambda a, s: tb_layergrad.summary.gradients({"a": a}, step=s))
    log_ba = tf.function(lambda b, a, s: tb_layergrad.summary.gradients({"b": b, "a": a}, step=s))
    with writer.as_default():
        log_a(nan(), step(1))  # a: first at 1
        log_ba(ok(), ok(), step(2))  # traced now: b gets a slot; a keeps 1
        log_ba(nan(), ok(), step(3))  # b: first at 3
        log_a(ok(), step(4))  # the function traced before b existed, not traced again
        tb_layergrad.summary.gradients({"c": ok(), "a": ok()}, step=5)  # eagerly, c new and clean
    assert log_a.experimental_get_tracing_count() == 1
    with other.as_default():  # the same tag in another writer (a function traced there): clean there
        tf.function(lambda a, s: tb_layergrad.summary.gradients({"a": a}, step=s))(ok(), step(6))
    writer.close()
    other.close()
    recs = tb_reading.read_all(str(tmp_path))

    def firsts(run, layer):
        tag = f"loss/output/{layer}/first_nonfinite"
        return {d.step: int(d.numpy[0]) for d in recs[run][tag][1]} if tag in recs.get(run, {}) else {}

    assert firsts("run", "a") == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    assert firsts("run", "b") == {3: 3}
    assert firsts("run", "c") == {}
    assert firsts("other", "a") == {}


def test_first_nonfinite_records_from_a_tf_function(tmp_path, write_path, tb_reading):
    """The running first NaN/Inf step per series, kept in graph mode with record_if every 2 steps.

    Layer "a" holds a NaN at step 4 only, "b" an Inf from step 7 on, "c" is always finite:
    from its first non-finite logged step on, a series gets a first_nonfinite record naming
    that step; "c" gets none; unlogged steps (odd) write nothing at all.
    """
    writer = tf.summary.create_file_writer(str(tmp_path / "run"))
    step_var = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def log(a, b, c):
        with writer.as_default(step=step_var), tf.summary.record_if(step_var % 2 == 0):
            tb_layergrad.summary.gradients({"m/a": a, "m/b": b, "m/c": c})

    for step in range(12):
        step_var.assign(step)
        a = np.ones([3], np.float32) * (step + 1)
        b = np.ones([3], np.float32)
        if step == 4:
            a[1] = np.nan
        if step >= 7:
            b[0] = np.inf
        log(tf.constant(a), tf.constant(b), tf.constant(np.ones([3], np.float32)))
    writer.close()
    recs = tb_reading.read_all(str(tmp_path))["run"]

    def firsts(layer):
        tag = f"loss/output/{layer}/first_nonfinite"
        return {d.step: int(d.numpy[0]) for d in recs[tag][1]} if tag in recs else {}

    assert firsts("m/a") == {4: 4, 6: 4, 8: 4, 10: 4}
    assert firsts("m/b") == {8: 8, 10: 8}  # step 7 is not logged: the first LOGGED non-finite step
    assert firsts("m/c") == {}
    assert [d.step for d in recs["loss/output/m/c/stats"][1]] == [0, 2, 4, 6, 8, 10]
    assert tb_reading.values_at(recs, "loss/output/m/a/stats", 4)[S["nan"]] == 1
