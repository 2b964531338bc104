"""`keras.distribution.DataParallel` over four devices: the records are the global batch's, as under
`tf.distribute`, equal to the same training on one device within the derived bound, one record per step, in
step order. The four devices are XLA's host-platform split of the CPU, asked for in a subprocess of its own
(XLA_FLAGS is read once, when JAX starts)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import tb_layergrad
from tb_layergrad import metadata

pytestmark = pytest.mark.timeout(600)

BATCH, FEATURES, HIDDEN, STEPS, DEVICES = 16, 5, 16, 4, 4

SCRIPT = """
import sys
import jax, keras, numpy as np
import tb_layergrad
sys.path.insert(0, sys.argv[3])
from test_jax_distribution import fit
assert len(jax.devices()) == {devices}, jax.devices()
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
fit(sys.argv[1], sys.argv[2])
"""


def _model():
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh", name="h1"),
         keras.layers.Dense(HIDDEN, activation="relu", name="h2"), keras.layers.Dense(2, name="out")],
        name="mlp",
    )  # fmt: skip
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def fit(logdir: str, start: str) -> None:
    """The training both runs do: the weights in `start` (an .npz), STEPS batches, every record asked for."""
    rng = np.random.RandomState(5)
    x, y = rng.randn(STEPS * BATCH, FEATURES).astype(np.float32), rng.randn(STEPS * BATCH, 2).astype(np.float32)
    model = _model()
    with np.load(start) as weights:
        model.set_weights([weights[f"arr_{i}"] for i in range(len(weights.files))])
    logger = tb_layergrad.GradientLogger(logdir, weights=True, activations=True, per_example=True)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    logger.close()


def _rows(logdir):
    frame = tb_layergrad.load(logdir)
    keys = [(r.source, r.layer, int(r.step)) for r in frame.itertuples()]
    assert len(keys) == len(set(keys)), "a step written twice"
    return dict(zip(keys, frame.itertuples()))


def _steps_in_file_order(logdir):
    from tensorboard.backend.event_processing import event_file_loader

    (path,) = glob.glob(os.path.join(logdir, "train", "events.out.tfevents.*"))
    return [e.step for e in event_file_loader.EventFileLoader(path).Load() if e.HasField("summary")]


def test_data_parallel_records_the_global_batch_as_one_device_does(tmp_path, tolerances, tb_reading):
    keras.utils.set_random_seed(7)
    start = os.fspath(tmp_path / "start.npz")
    np.savez(start, *_model().get_weights())
    one, four = os.fspath(tmp_path / "one"), os.fspath(tmp_path / "four")
    fit(one, start)
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}")
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(devices=DEVICES), four, start, here],
        env=env, capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    want, got = _rows(one), _rows(four)
    assert sorted(got) == sorted(want)
    assert {k[2] for k in got} == set(range(1, STEPS + 1))
    assert got[("output", "mlp/h1", 1)].elements == BATCH * HIDDEN  # the global batch, not a device's quarter
    assert _steps_in_file_order(four) == sorted(_steps_in_file_order(four))
    # Each run is a chain of float32 reductions (forward FEATURES, HIDDEN, HIDDEN; the loss's mean over the batch
    # and outputs; back HIDDEN, HIDDEN; a weight gradient's sum over the batch, which the devices add up in
    # another order); STEPS SGD updates of it feed the last step. Then the statistics' own sums.
    chain = STEPS * tolerances.chain_rtol(np.float32, [FEATURES, HIDDEN, HIDDEN, BATCH * 2, HIDDEN, HIDDEN, BATCH])
    rtol = tolerances.TWO_SIDES * (chain + tolerances.sum_rtol(np.float32, BATCH * HIDDEN))
    for key, w in want.items():
        g = got[key]
        for field in ("elements", "nan", "pos_inf", "neg_inf", "no_gradient"):
            assert getattr(g, field) == getattr(w, field), (key, field)
        scale = max(abs(w.min), abs(w.max), 1e-30)
        for field in ("min", "max", "mean", "std", "norm", "mean_abs"):
            bound = rtol * scale * (np.sqrt(w.elements) if field == "norm" else 1)
            assert abs(getattr(g, field) - getattr(w, field)) <= bound, (key, field)
    # Per-example rows: the global batch's examples, in global batch order, the same numbers.
    F = metadata.EXAMPLE_INDEX
    examples_want, examples_got = (tb_reading.examples(d)["train"] for d in (one, four))
    assert examples_got.keys() == examples_want.keys() == {("loss", "output"), ("loss", "weight")}
    for group, steps in examples_want.items():
        for step, rows in steps.items():
            for layer, w in rows.items():
                g, scale = examples_got[group][step][layer], max(w[F["max"]], 1e-30)
                assert g[F["examples"]] == BATCH and g[F["status"]] == w[F["status"]], (group, step, layer)
                for field in ("min", "median", "max", "top_norm_1", "top_norm_5"):
                    assert abs(g[F[field]] - w[F[field]]) <= rtol * scale, (group, step, layer, field)
                if w[F["top_norm_1"]] - w[F["top_norm_2"]] > 2 * rtol * scale:  # not a near tie
                    assert g[F["top_index_1"]] == w[F["top_index_1"]], (group, step, layer)
