"""The `examples` records (docs/FORMAT.md, "Per-example records") written by `summary.gradients` from a custom
loop, read back through TensorBoard's own data provider: eager and inside `tf.function`, at the logged steps
only, metadata in a tag's first record only, each row equal to the contract's row of independent per-example
norms (one tape per example, its own loss on a batch of one).

Tolerance: rtol 1e-4 on each norm, as the issue asks of per-example norms (tests/capturing/test_per_example.py); a
squared sum or a share of two is within twice that per factor (per_example_reference.assert_row).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad import metadata
from tb_layergrad.capturing import per_example_map

keras = tf.keras
layers = keras.layers
RTOL = 1e-4
F = metadata.EXAMPLE_INDEX


def _loss(y, pred):
    return tf.reduce_mean(tf.square(pred - y))


def _mlp():
    tf.random.set_seed(1)
    model = keras.Sequential(
        [keras.Input((5,)), layers.Dense(7, activation="tanh", name="h"), layers.Dense(3, name="out")], name="mlp"
    )
    rng = np.random.RandomState(0)
    return model, tf.constant(rng.normal(size=(9, 5)), tf.float32), tf.constant(rng.normal(size=(9, 3)), tf.float32)


def _step(model, x, y):
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
            loss = _loss(y, model(x, training=True))
    return cap.gradients(tape, loss)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_rows_equal_independent_per_example_norms_at_logged_steps_only(
    tmp_path, mode, per_example_reference, tb_reading
):
    model, x, y = _mlp()
    writer = tf.summary.create_file_writer(str(tmp_path))

    def run(step):
        grads = _step(model, x, y)
        with tf.summary.record_if(tf.equal(step % 2, 0)):
            tb_layergrad.summary.gradients(grads, step=step)

    fn = run if mode == "eager" else tf.function(run)
    with writer.as_default():
        for s in range(1, 5):  # the weights do not change: every logged step holds the same numbers
            fn(tf.constant(s, tf.int64))
    writer.flush()
    found = tb_reading.examples(str(tmp_path))["."]
    assert set(found) == {("loss", "output"), ("loss", "weight")}
    weights = per_example_reference.norms(per_example_reference.per_example_gradients(model, _loss, x, y))
    outputs = per_example_reference.output_norms(model, _loss, x, y)
    for (_target, source), by_step in found.items():
        assert sorted(by_step) == [2, 4], "written at the logged steps only"
        want = outputs if source == "output" else weights
        for step, rows in by_step.items():
            assert set(rows) == set(want), (sorted(rows), sorted(want))
            for layer, row in rows.items():
                per_example_reference.assert_row(row, want[layer], RTOL, f"step {step} {layer}")


def test_metadata_only_in_a_tags_first_record(tmp_path):
    model, x, y = _mlp()
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for s in range(3):
            tb_layergrad.summary.gradients(_step(model, x, y), step=s)
    writer.close()
    from tensorboard.backend.event_processing import event_file_loader

    path = next(p for p in tmp_path.iterdir() if "tfevents" in p.name)
    with_metadata = {}
    for event in event_file_loader.EventFileLoader(str(path)).Load():
        for v in event.summary.value:
            if "/examples/" in v.tag:
                with_metadata.setdefault(v.tag, []).append(bool(v.metadata.plugin_data.content))
    assert with_metadata and all(flags == [True, False, False] for flags in with_metadata.values()), with_metadata


def test_same_layer_list_digest_and_block_as_the_stats(tmp_path, tb_reading):
    model, x, y = _mlp()
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        tb_layergrad.summary.gradients(_step(model, x, y), step=5)
    tags = tb_reading.read_all(str(tmp_path), split_groups=False)["."]
    groups = {
        (i.target, i.source, i.kind): (i, tag) for tag, (i, _) in tags.items() if isinstance(i, metadata.GroupInfo)
    }
    for source in ("output", "weight"):
        stats, stats_tag = groups[("loss", source, "stats")]
        examples, examples_tag = groups[("loss", source, "examples")]
        assert (examples.layers, examples.indexes, examples.dtypes) == (stats.layers, stats.indexes, stats.dtypes)
        assert examples.digest == stats.digest and examples.fields == metadata.EXAMPLE_FIELDS
        assert examples_tag == stats_tag.replace("/stats/", "/examples/")
    assert ("forward", "activation", "examples") not in groups and ("loss", "target", "examples") not in groups


def test_no_writer_writes_and_computes_nothing(tmp_path):
    model, x, y = _mlp()
    assert not bool(tb_layergrad.summary.gradients(_step(model, x, y), step=0))


def test_explicit_mapping_and_unknown_paths(tmp_path, tb_reading):
    """A plain mapping path -> norms is written as given; a captured path missing from it is 'unsupported'."""
    model, x, y = _mlp()
    grads = _step(model, x, y)
    norms = {"mlp/h": tf.constant([3.0, 1.0, 3.0, 0.5, 2.0, 3.0, 0.0, 1.0, 1.0])}
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        tb_layergrad.summary.gradients(grads, step=1, per_example=norms)
    rows = tb_reading.examples(str(tmp_path))["."][("loss", "output")][1]
    h = rows["mlp/h"]
    # ties: the lower position first; five largest: 3, 3, 3 (positions 0, 2, 5), then 2 (4), then 1 (1)
    assert [h[F[f"top_index_{j}"]] for j in range(1, 6)] == [0, 2, 5, 4, 1]
    assert [h[F[f"top_norm_{j}"]] for j in range(1, 6)] == [3, 3, 3, 2, 1]
    assert h[F["median"]] == 1.0 and h[F["min"]] == 0.0 and h[F["max"]] == 3.0 and h[F["sum_sq"]] == 34.25
    assert h[F["top_share"]] == 9 / 34.25
    out = rows["mlp/out"]
    assert out[F["status"]] == metadata.EXAMPLE_UNSUPPORTED and out[F["examples"]] == 9
    assert np.isnan(out[[F["min"], F["median"], F["max"], F["sum_sq"], F["top_share"]]]).all()
    assert (out[[F[f"top_index_{j}"] for j in range(1, 6)]] == -1).all()
    assert np.isnan(out[[F[f"top_norm_{j}"] for j in range(1, 6)]]).all()
    assert ("loss", "weight") in tb_reading.examples(str(tmp_path))["."]  # its rows: all unsupported


def test_batch_normalization_in_training_gets_status_coupled(tmp_path, tb_reading):
    tf.random.set_seed(2)
    model = keras.Sequential(
        [keras.Input((4,)), layers.Dense(6, name="a"), layers.BatchNormalization(name="bn"), layers.Dense(2, name="b")],
        name="bnm",
    )
    rng = np.random.RandomState(1)
    x, y = tf.constant(rng.normal(size=(8, 4)), tf.float32), tf.constant(rng.normal(size=(8, 2)), tf.float32)
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        tb_layergrad.summary.gradients(_step(model, x, y), step=3)
    rows = tb_reading.examples(str(tmp_path))["."]
    weight = rows[("loss", "weight")][3]
    assert weight["bnm/a/kernel"][F["status"]] == metadata.EXAMPLE_COUPLED
    assert np.isnan(weight["bnm/a/kernel"][F["max"]])
    assert weight["bnm/b/kernel"][F["status"]] == metadata.EXAMPLE_EXACT  # after the coupling: each example's own
    assert rows[("loss", "output")][3]["bnm/a"][F["status"]] == metadata.EXAMPLE_COUPLED


def _top_level_ops(fn, *args) -> dict:
    """Op type -> count in `fn`'s own graph, not in the functions it calls (the recording condition's branch)."""
    counts: dict = {}
    for op in fn.get_concrete_function(*args).graph.get_operations():
        counts[op.type] = counts.get(op.type, 0) + 1
    return counts


def test_norms_are_built_on_logged_steps_only(tmp_path, per_example_reference):
    """The capture defers its norms (`per_example_map.Deferred`): inside a tf.function step they are built in
    the recording condition's branch, so an unlogged step computes none of them. The step's own graph holds no
    more squares, roots or rankings than the same step without per_example; the written rows are right
    (test above). Eagerly, an entry stays deferred until read, and reading it gives the independent norms."""
    model, x, y = _mlp()
    writer = tf.summary.create_file_writer(str(tmp_path))

    def step(per_example):
        def run(x, y):
            with tf.GradientTape() as tape:
                with tb_layergrad.capture(model, tape=tape, weights=True, per_example=per_example) as cap:
                    loss = _loss(y, model(x, training=True))
            grads = cap.gradients(tape, loss)
            with writer.as_default(step=3), tf.summary.record_if(tf.reduce_sum(x) > 1e9):  # known at run time only
                tb_layergrad.summary.gradients(grads)
            return loss

        return tf.function(run)

    norm_ops = ("Square", "Sqrt", "TopKV2", "L2Loss")
    with_norms, without = _top_level_ops(step(True), x, y), _top_level_ops(step(False), x, y)
    assert {k: with_norms.get(k, 0) for k in norm_ops} == {k: without.get(k, 0) for k in norm_ops}
    assert with_norms.get("If", 0) + with_norms.get("StatelessIf", 0) >= 1  # the recording condition was built

    grads = _step(model, x, y)
    per_example = grads.per_example
    assert all(
        isinstance(per_example.entry(p), per_example_map.Deferred)
        for p in per_example
        if per_example.entry(p) is not None
    )
    want = {
        **per_example_reference.norms(per_example_reference.per_example_gradients(model, _loss, x, y)),
        **per_example_reference.output_norms(model, _loss, x, y),
    }
    assert set(want) == {p for p in per_example if per_example.entry(p) is not None}
    for path, norms in want.items():
        np.testing.assert_allclose(per_example[path].numpy(), norms, rtol=RTOL)
