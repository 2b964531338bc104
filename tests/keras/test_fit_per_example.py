"""`GradientLogger(per_example=True)` from Keras' own `fit()` step: the `examples` records hold the norms of each
example's own gradient — equal to an independent computation, one tape per example and its own loss on a batch
of one (rtol 1e-4, as the issue asks) — the noise-scale scalars equal the formula on those gradients, nothing is
written on unlogged steps, a BatchNormalization model is flagged (status 2, no noise scale), training is
bitwise unchanged, and `load()` has the per-example columns.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad import metadata

RTOL = 1e-4
F = metadata.EXAMPLE_INDEX
keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise, as in fit_helpers
layers = keras.layers

NOISE = metadata.NOISE_SCALE_TAGS  # the noise scale's scalar tags (docs/FORMAT.md)


def _loss(y, pred):
    return tf.reduce_mean(tf.square(pred - y))  # = Keras' "mse" with its batch mean: per example, the feature mean


def _mlp(seed=11):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((6,)), layers.Dense(8, activation="tanh", name="h"), layers.Dense(3, name="out")], name="fitmlp"
    )


def _data(n=10, offset=2.0):
    rng = np.random.RandomState(3)
    return rng.normal(size=(n, 6)).astype("float32"), (offset + 0.3 * rng.normal(size=(n, 3))).astype("float32")


def _tokens(seed=12):
    """Embedding (repeated ids within an example) -> LayerNormalization -> Dense per token -> pooled head."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((6,), dtype="int32")
    h = layers.Embedding(9, 5, name="emb")(inp)
    h = layers.LayerNormalization(name="ln")(h)
    h = layers.Dense(4, activation="tanh", name="tok")(h)
    out = layers.Dense(3, name="out")(layers.GlobalAveragePooling1D(name="pool")(h))
    model = keras.Model(inp, out, name="fittok")
    x = np.array(
        [
            [1, 1, 1, 2, 3, 1],
            [4, 5, 4, 5, 4, 5],
            [0, 1, 2, 3, 4, 5],
            [8, 7, 8, 6, 8, 0],
            [2, 2, 7, 7, 3, 3],
            [6, 0, 6, 1, 6, 2],
        ],
        "int32",
    )
    return model, x, _data(n=len(x))[1]


def _cnn(seed=13):
    """Conv2D (same; strided valid) -> LayerNormalization over the channels -> pooled head."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((6, 6, 2))
    h = layers.Conv2D(4, 3, padding="same", activation="relu", name="c1")(inp)
    h = layers.Conv2D(3, 3, strides=2, padding="valid", activation="tanh", name="c2")(h)
    h = layers.LayerNormalization(name="ln")(h)
    out = layers.Dense(3, name="out")(layers.GlobalAveragePooling2D(name="pool")(h))
    model = keras.Model(inp, out, name="fitcnn")
    x = np.random.RandomState(4).normal(size=(6, 6, 6, 2)).astype("float32")
    return model, x, _data(n=len(x))[1]


MODELS = {"mlp": lambda: (_mlp(), *_data()), "tokens": _tokens, "cnn": _cnn}


def _fit(fit_helpers, model, x, y, logdir, mode, batch_size, update_freq=1, epochs=1, per_example=True):
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", **fit_helpers.compile_kwargs(mode))
    callbacks = (
        []
        if logdir is None
        else [tb_layergrad.GradientLogger(logdir, weights=True, per_example=per_example, update_freq=update_freq)]
    )
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)


@pytest.mark.parametrize("mode", ["graph", "xla", "eager"])
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.slow
def test_norms_and_noise_scale_equal_one_tape_per_example(
    tmp_path, kind, mode, per_example_reference, tb_reading, fit_helpers
):
    """Dense, Embedding, LayerNormalization and Conv2D: each has an exact rule (coverage 1) in Keras 3 and tf_keras."""
    model, x, y = MODELS[kind]()
    # at the weights the first (and only) step sees
    weights = per_example_reference.per_example_gradients(model, _loss, x, y)
    outputs = per_example_reference.output_norms(model, _loss, x, y)
    noise = per_example_reference.noise_scale(weights, per_example_reference.batch_gradients(model, _loss, x, y))
    _fit(fit_helpers, model, x, y, str(tmp_path), mode, batch_size=len(x))
    found = tb_reading.examples(str(tmp_path))["train"]
    assert set(found) == {("loss", "output"), ("loss", "weight")}
    for (_, source), by_step in found.items():
        assert sorted(by_step) == [1]
        want = outputs if source == "output" else per_example_reference.norms(weights)
        assert set(by_step[1]) == set(want)
        for layer, row in by_step[1].items():
            per_example_reference.assert_row(row, want[layer], RTOL, f"{mode} {layer}")
    scalars = tb_reading.scalars(str(tmp_path))["train"]
    tol = per_example_reference.noise_scale_tolerance(noise, RTOL)
    np.testing.assert_allclose(scalars[NOISE["trace"]][1], noise["trace"], rtol=0, atol=tol["trace"])
    np.testing.assert_allclose(scalars[NOISE["signal"]][1], noise["signal"], rtol=0, atol=tol["signal"])
    assert noise["signal"] > 0
    np.testing.assert_allclose(scalars[NOISE["noise_scale"]][1], noise["b_simple"], rtol=tol["b_simple"])
    assert scalars[NOISE["coverage"]][1] == 1.0


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.slow
def test_nothing_written_on_unlogged_steps(tmp_path, mode, tb_reading, fit_helpers):
    model = _mlp()
    x, y = _data(n=16)
    _fit(fit_helpers, model, x, y, str(tmp_path), mode, batch_size=4, update_freq=2)
    found = tb_reading.examples(str(tmp_path))["train"]
    assert {k: sorted(v) for k, v in found.items()} == {("loss", "output"): [2, 4], ("loss", "weight"): [2, 4]}
    scalars = tb_reading.scalars(str(tmp_path))["train"]
    assert sorted(scalars[NOISE["coverage"]]) == [2, 4] and sorted(scalars[NOISE["trace"]]) == [2, 4]


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.slow
def test_training_unchanged_bitwise(tmp_path, mode, fit_helpers):
    x, y = _data(n=16)
    plain, logged = _mlp(), _mlp()
    _fit(fit_helpers, plain, x, y, None, mode, batch_size=4, epochs=2)
    _fit(fit_helpers, logged, x, y, str(tmp_path), mode, batch_size=4, update_freq=2, epochs=2)
    for a, b in zip(plain.get_weights(), logged.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_batch_normalization_is_flagged_and_gets_no_noise_scale(tmp_path, tb_reading, fit_helpers):
    keras.utils.set_random_seed(4)
    model = keras.Sequential(
        [keras.Input((6,)), layers.Dense(5, name="a"), layers.BatchNormalization(name="bn"), layers.Dense(3, name="b")],
        name="fitbn",
    )
    x, y = _data()
    _fit(fit_helpers, model, x, y, str(tmp_path), "graph", batch_size=len(x))
    found = tb_reading.examples(str(tmp_path))["train"]
    weight = found[("loss", "weight")][1]
    assert weight["fitbn/a/kernel"][F["status"]] == metadata.EXAMPLE_COUPLED
    assert np.isnan(weight["fitbn/a/kernel"][[F["min"], F["median"], F["max"], F["top_share"]]]).all()
    assert weight["fitbn/bn/gamma"][F["status"]] == metadata.EXAMPLE_COUPLED
    assert found[("loss", "output")][1]["fitbn/a"][F["status"]] == metadata.EXAMPLE_COUPLED
    scalars = tb_reading.scalars(str(tmp_path))["train"]
    assert NOISE["noise_scale"] not in scalars and scalars[NOISE["coverage"]][1] < 1


@pytest.mark.slow
def test_load_has_the_per_example_columns(tmp_path, tb_reading, fit_helpers):
    pytest.importorskip("pandas")
    model = _mlp()
    x, y = _data(n=8)
    _fit(fit_helpers, model, x, y, str(tmp_path), "graph", batch_size=4, update_freq=2)
    df = tb_layergrad.load(str(tmp_path))
    rows = df[(df.source == "output") & (df.layer == "fitmlp/h")]
    assert list(rows.step) == [2] and (rows.example_norm_max >= rows.example_norm_median).all()
    stored = tb_reading.examples(str(tmp_path))["train"][("loss", "output")][2]["fitmlp/h"]
    for column, field in (
        ("example_norm_min", "min"),
        ("example_norm_median", "median"),
        ("example_norm_max", "max"),
        ("example_norm_top_share", "top_share"),
    ):
        assert float(rows[column].iloc[0]) == stored[F[field]]
    assert df[df.source == "target"].example_norm_max.isna().all()


def test_per_example_without_weights_warns_that_no_noise_scale_is_written():
    with pytest.warns(UserWarning, match="noise scale"):
        tb_layergrad.GradientLogger("logs", per_example=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tb_layergrad.GradientLogger("logs", per_example=True, weights=True)


@pytest.mark.parametrize("mode", ["graph", "xla"])
@pytest.mark.slow
def test_with_an_extra_target_the_loss_records_are_unchanged(
    tmp_path, mode, fit_helpers, per_example_reference, tb_reading
):
    """An extra target (its own backward pass) leaves the loss's per-example records as they are: only the loss's
    are written (kind `examples` for target "loss" only)."""
    model = _mlp()
    x, y = _data()
    weights = per_example_reference.norms(per_example_reference.per_example_gradients(model, _loss, x, y))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", **fit_helpers.compile_kwargs(mode))
    model.fit(
        x,
        y,
        batch_size=len(x),
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[
            tb_layergrad.GradientLogger(
                str(tmp_path), weights=True, per_example=True, targets={"unit_0": lambda p: p[:, 0]}
            )
        ],
    )
    found = tb_reading.examples(str(tmp_path))["train"]
    assert set(found) == {("loss", "output"), ("loss", "weight")}
    for layer, row in found[("loss", "weight")][1].items():
        per_example_reference.assert_row(row, weights[layer], RTOL, layer)


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.slow
def test_a_step_written_for_a_nan_off_schedule_has_its_rows(tmp_path, mode, fit_helpers, tb_reading, demo_plan):
    """Every 10th step logged; step 7's batch makes a gradient non-finite while the loss stays finite, so the
    logger writes step 7 in full after all (the first non-finite step of a run). Its `examples` rows are
    computed then: the rows computed ahead under the schedule's condition do not exist for that step (they
    would read as zeros), so the layer whose gradient broke has a non-finite largest norm and the others
    positive ones."""
    x, y = demo_plan.inputs_with_one_bad_batch(12, 7, -50.0, 6)
    model = fit_helpers.sqrt_model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", **fit_helpers.compile_kwargs(mode))
    logger = tb_layergrad.GradientLogger(str(tmp_path), weights=True, per_example=True, update_freq=10)
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[logger])
    rows = tb_reading.examples(str(tmp_path))["train"][("loss", "output")]
    assert sorted(rows) == [7, 10]
    at7 = rows[7]
    assert not np.isfinite(at7["sq/dense_0"][F["max"]])
    assert at7["sq/head"][F["max"]] > 0 and np.isfinite(at7["sq/head"][F["max"]])
    assert all(row[F["examples"]] == 64 and row[F["status"]] == metadata.EXAMPLE_EXACT for row in at7.values())
