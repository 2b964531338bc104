"""The gradient noise scale scalars (docs/FORMAT.md, "the gradient noise scale") equal the formula evaluated on
independent per-example gradients (one tape per example, its own loss on a batch of one) and the batch gradient
of one tape on the whole batch; read back through TensorBoard's scalars data provider.

Tolerance: each per-example norm is held to rtol 1e-4 (tests/capturing/test_per_example.py); how that carries into the
formula's terms is derived in per_example_reference.noise_scale_tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad.summary import per_example_write as pw

keras = tf.keras
layers = keras.layers
RTOL = 1e-4


def _loss(y, pred):
    return tf.reduce_mean(tf.square(pred - y))


def _write(tb_reading, model, x, y, logdir, step=1, **capture):
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True, **capture) as cap:
            loss = _loss(y, model(x, training=True))
    grads = cap.gradients(tape, loss)
    with tf.summary.create_file_writer(logdir).as_default():
        tb_layergrad.summary.gradients(grads, step=step)
    return tb_reading.scalars(logdir).get(".", {})


def _model(seed=3):
    tf.random.set_seed(seed)
    return keras.Sequential(
        [keras.Input((6,)), layers.Dense(8, activation="tanh", name="h"), layers.Dense(2, name="out")], name="ns"
    )


def _check(per_example_reference, got, model, x, y, variables=None):
    per_example = per_example_reference.per_example_gradients(model, _loss, x, y)
    if variables is not None:
        per_example = {p: g for p, g in per_example.items() if p in variables}
    want = per_example_reference.noise_scale(per_example, per_example_reference.batch_gradients(model, _loss, x, y))
    tol = per_example_reference.noise_scale_tolerance(want, RTOL)
    np.testing.assert_allclose(got[pw.TRACE_TAG][1], want["trace"], rtol=0, atol=tol["trace"])
    np.testing.assert_allclose(got[pw.SIGNAL_TAG][1], want["signal"], rtol=0, atol=tol["signal"])
    return want, tol


def test_scalars_equal_the_formula_on_independent_gradients(tmp_path, write_path, per_example_reference, tb_reading):
    model = _model()
    rng = np.random.RandomState(4)
    x = tf.constant(rng.normal(size=(12, 6)), tf.float32)
    y = tf.constant(3.0 + 0.3 * rng.normal(size=(12, 2)), tf.float32)  # far from the outputs: the examples agree
    got = _write(tb_reading, model, x, y, str(tmp_path))
    want, tol = _check(per_example_reference, got, model, x, y)
    assert want["signal"] > 0
    np.testing.assert_allclose(got[pw.NOISE_SCALE_TAG][1], want["b_simple"], rtol=tol["b_simple"])
    assert got[pw.COVERAGE_TAG][1] == 1.0


def test_no_scalars_from_a_gradient_holding_a_nan(tmp_path, write_path, tb_reading):
    """A NaN in an input reaches every gradient: no trace, signal or B_simple is written (coverage still is)."""
    model = _model()
    x = tf.constant(np.where(np.arange(12 * 6).reshape(12, 6) == 7, np.nan, 1.0), tf.float32)
    got = _write(tb_reading, model, x, tf.zeros([12, 2]), str(tmp_path))
    assert got[pw.COVERAGE_TAG][1] == 1.0
    assert not {pw.TRACE_TAG, pw.SIGNAL_TAG, pw.NOISE_SCALE_TAG} & set(got)


def test_no_b_simple_when_the_signal_estimate_is_not_positive(tmp_path, per_example_reference, tb_reading):
    """Two examples with opposite gradients: G_B = 0, so the signal estimate is -S < 0."""
    model = keras.Sequential(
        [keras.Input((1,)), layers.Dense(1, use_bias=False, kernel_initializer="ones", name="d")], name="opp"
    )
    x = tf.constant([[1.0], [1.0]])
    y = tf.constant([[2.0], [0.0]])  # predictions 1: errors -1 and +1
    got = _write(tb_reading, model, x, y, str(tmp_path))
    want, _ = _check(per_example_reference, got, model, x, y)
    assert want["signal"] < 0
    assert pw.NOISE_SCALE_TAG not in got and pw.COVERAGE_TAG in got


def test_coverage_and_restriction_to_the_covered_variables(tmp_path, per_example_reference, tb_reading):
    """A layer without a per-example rule: the estimate covers the others, and says which share that is."""
    tf.random.set_seed(5)
    inputs = keras.Input((4, 3))
    h = layers.SimpleRNN(5, return_sequences=True, name="rnn")(inputs)
    out = layers.Dense(2, name="out")(h)
    model = keras.Model(inputs, out, name="cov")
    rng = np.random.RandomState(6)
    x = tf.constant(rng.normal(size=(10, 4, 3)), tf.float32)
    y = tf.constant(2.0 + 0.2 * rng.normal(size=(10, 4, 2)), tf.float32)
    got = _write(tb_reading, model, x, y, str(tmp_path))
    covered = {"cov/out/kernel", "cov/out/bias"}
    _check(per_example_reference, got, model, x, y, variables=covered)
    total = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    np.testing.assert_allclose(got[pw.COVERAGE_TAG][1], (5 * 2 + 2) / total, rtol=1e-7)


def test_batch_normalization_in_training_gives_no_noise_scale(tmp_path, tb_reading):
    tf.random.set_seed(7)
    model = keras.Sequential(
        [keras.Input((4,)), layers.Dense(6, name="a"), layers.BatchNormalization(name="bn"), layers.Dense(2, name="b")],
        name="bnn",
    )
    rng = np.random.RandomState(8)
    x = tf.constant(rng.normal(size=(8, 4)), tf.float32)
    y = tf.constant(3.0 + rng.normal(size=(8, 2)), tf.float32)
    got = _write(tb_reading, model, x, y, str(tmp_path))
    assert pw.NOISE_SCALE_TAG not in got
    assert got[pw.COVERAGE_TAG][1] < 1.0


def test_only_for_the_target_loss(tmp_path, tb_reading):
    model = _model()
    x = tf.random.normal([5, 6])
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
            value = tf.reduce_mean(model(x))
    grads = cap.gradients(tape, value, name="mean_output")
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        tb_layergrad.summary.gradients(grads, step=1)
    assert tb_reading.scalars(str(tmp_path)).get(".", {}) == {}
    assert ("mean_output", "weight") in tb_reading.examples(str(tmp_path))["."]


@pytest.mark.slow
def test_embedding_in_a_tf_function(tmp_path, per_example_reference, tb_reading):
    """An Embedding's batch gradient is an IndexedSlices (repeated ids add up) and its parameter count is read
    from its dense shape while tracing."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            layers.Embedding(20, 4, name="emb"),
            layers.Flatten(name="flat"),
            layers.Dense(2, name="d"),
        ],
        name="emb_model",
    )
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randint(0, 20, size=(10, 6)), tf.int32)  # repeated ids within and across examples
    y = tf.constant(2.0 + rng.normal(size=(10, 2)), tf.float32)
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
                loss = _loss(y, model(x))
        with writer.as_default(step=1):
            tb_layergrad.summary.gradients(cap.gradients(tape, loss))

    step()
    writer.flush()
    got = tb_reading.scalars(str(tmp_path))["."]
    want, tol = _check(per_example_reference, got, model, x, y)
    np.testing.assert_allclose(got[pw.NOISE_SCALE_TAG][1], want["b_simple"], rtol=tol["b_simple"])
    assert got[pw.COVERAGE_TAG][1] == 1.0
