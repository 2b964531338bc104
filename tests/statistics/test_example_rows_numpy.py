"""The host-side (numpy) `examples` rows and noise scale a TensorFlow-free writer computes are TensorFlow's:
the same columns, positions and undefined values from the same squared norms, ties included."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.statistics import example_rows, per_example_records


@pytest.mark.parametrize("batch", [0, 1, 2, 5, 9])
def test_rows_are_tensorflows(batch):
    rng = np.random.RandomState(batch)
    squares = rng.rand(3, batch).astype(np.float32) * 10.0
    if batch >= 5:
        squares[1, :] = squares[1, 0]  # every example tied: the lower positions first
        squares[2, 3] = squares[2, 1]  # one tie among the top
        squares[0, :] = 0.0  # no gradient energy: top_share undefined
    want = per_example_records.exact_rows_from_squares(tf.constant(squares)).numpy()
    got = example_rows.exact_rows_from_squares(squares)
    # The same float64 operations on the same float32 inputs (a sum of squares in any order: float64's bound).
    np.testing.assert_allclose(got, want, rtol=batch * np.finfo(np.float64).eps, equal_nan=True)


@pytest.mark.parametrize("status", [metadata.EXAMPLE_UNSUPPORTED, metadata.EXAMPLE_COUPLED])
def test_status_rows_are_tensorflows(status):
    want = per_example_records.status_row(tf.constant(8.0), status).numpy()
    np.testing.assert_array_equal(example_rows.status_row(8.0, status), want)


def test_noise_scale_is_tensorflows():
    sum_sq, batch_sq = np.array([3.0, 5.5, 0.25]), np.array([0.5, 0.125, 0.0625])
    want = per_example_records.noise_scale(tf.constant(sum_sq), tf.constant(batch_sq), tf.constant(6.0))
    got = example_rows.noise_scale(sum_sq, batch_sq, 6)
    for a, b in zip(got, want):
        assert a == pytest.approx(float(b.numpy()), rel=8 * np.finfo(np.float64).eps)
