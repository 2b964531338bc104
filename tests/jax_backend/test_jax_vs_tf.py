"""A JAX run against the TensorFlow run of the same model, data and starting weights (tests/data/jax_vs_tf,
written by its `make_tf_run.py`): the same rows, read by `load()`, every value within the derived bound."""

from __future__ import annotations

import os

import numpy as np

import tb_layergrad

STORED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "jax_vs_tf")
VALUES = ("min", "max", "mean", "std", "norm", "mean_abs")
COUNTS = ("elements", "nan", "pos_inf", "neg_inf", "no_gradient")


def _rows(logdir):
    frame = tb_layergrad.load(logdir)
    return {(r.source, r.layer, int(r.step)): r for r in frame.itertuples()}


def test_the_same_rows_as_tensorflow_within_the_bound(logdir, jax_vs_tf_case, tolerances):
    case, tol = jax_vs_tf_case, tolerances
    with np.load(os.path.join(STORED, "start.npz")) as start:
        weights = [start[f"arr_{i}"] for i in range(len(start.files))]
    net = case.model(weights)
    x, y = case.data()
    logger = tb_layergrad.GradientLogger(logdir, **case.LOGGER_OPTIONS)
    net.fit(x, y, batch_size=case.BATCH, epochs=case.EPOCHS, shuffle=False, verbose=0, callbacks=[logger])
    logger.close()
    tf_rows, jax_rows = _rows(os.path.join(STORED, "logs")), _rows(logdir)
    assert sorted(jax_rows) == sorted(tf_rows)
    # Each backend's step is a chain of reductions: forward (FEATURES, HIDDEN, HIDDEN), the loss's mean over the
    # batch and outputs, back (HIDDEN, HIDDEN), a weight gradient's sum over the batch; three SGD steps of it
    # feed the last step's weights. Then the statistics' own sums (of the largest tensor's elements).
    h, b = case.HIDDEN, case.BATCH
    chain = 3 * tol.chain_rtol(np.float32, [case.FEATURES, h, h, b * 3, h, h, b])
    rtol = tol.TWO_SIDES * (chain + tol.sum_rtol(np.float32, h * h))
    for key, want in tf_rows.items():
        got = jax_rows[key]
        for field in COUNTS:
            assert getattr(got, field) == getattr(want, field), (key, field)
        scale = max(abs(want.min), abs(want.max), 1e-30)
        for field in VALUES:
            bound = rtol * scale * (np.sqrt(want.elements) if field == "norm" else 1)
            assert abs(getattr(got, field) - getattr(want, field)) <= bound, (key, field)
