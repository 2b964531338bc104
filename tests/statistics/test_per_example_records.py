"""A layer's per-example record (`statistics/per_example_records`, docs/FORMAT.md): the exact row of a batch's
norms, padded for small batches, and the noise-scale estimate by its formula."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.statistics import per_example_records

F = metadata.EXAMPLE_INDEX


@pytest.mark.parametrize("batch", [0, 1, 2, 3, 7])
def test_small_batches_pad_with_nan_and_minus_one(batch, per_example_reference):
    n = np.arange(batch, dtype=np.float32)[::-1].copy()
    row = per_example_records.exact_row(tf.constant(n)).numpy()
    assert row.shape == (len(metadata.EXAMPLE_FIELDS),)
    assert row[F["examples"]] == batch and row[F["status"]] == 0
    if batch == 0:
        assert np.isnan(row[[F["min"], F["median"], F["max"], F["top_share"]]]).all() and row[F["sum_sq"]] == 0
    else:
        per_example_reference.assert_row(row, n, 0.0)
    k = min(batch, metadata.EXAMPLE_TOP_K)
    assert (row[[F[f"top_index_{j}"] for j in range(k + 1, 6)]] == -1).all()
    assert np.isnan(row[[F[f"top_norm_{j}"] for j in range(k + 1, 6)]]).all()


def test_top_share_nan_when_every_norm_is_zero():
    row = per_example_records.exact_row(tf.zeros([4])).numpy()
    assert row[F["sum_sq"]] == 0 and np.isnan(row[F["top_share"]]) and row[F["max"]] == 0
    assert [row[F[f"top_index_{j}"]] for j in range(1, 5)] == [0, 1, 2, 3]


@pytest.mark.parametrize("b", [2, 5, 64])
def test_estimate_is_the_formula(b):
    rng = np.random.RandomState(b)
    sum_sq, batch_sq = rng.uniform(1, 2, size=3) * b, rng.uniform(0, 1, size=3)
    got = per_example_records.noise_scale(tf.constant(sum_sq), tf.constant(batch_sq), b)
    s, g2 = sum_sq.sum() / b, batch_sq.sum()
    assert float(got.signal) == pytest.approx((b * g2 - s) / (b - 1), rel=1e-12)
    assert float(got.trace) == pytest.approx((s - g2) * b / (b - 1), rel=1e-12)
    assert float(got.b_simple) == pytest.approx(float(got.trace) / float(got.signal), rel=1e-12)
