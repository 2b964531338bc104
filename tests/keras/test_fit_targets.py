"""Extra targets: d(sum over the batch of fn(y_pred)) / d(layer outputs, weights), each its own series."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad

TARGETS = {
    "class_2": lambda p: p[:, 2],
    "mean_logit": lambda p: tf.reduce_mean(p, axis=1, keepdims=True),  # [batch, 1] is accepted too
}


@pytest.mark.parametrize("mode", ["graph", "xla", "eager"])
@pytest.mark.slow
def test_target_gradients_match_reproduction(tmp_path, mode, fit_helpers):
    fit_helpers.keras.utils.set_random_seed(8)
    model, manual = fit_helpers.bn_residual_mlp()
    loss = fit_helpers.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=fit_helpers.keras.optimizers.SGD(0.1), loss=loss, **fit_helpers.compile_kwargs(mode))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 6)).astype("float32")
    y = rng.integers(0, 3, size=(16,)).astype("int32")
    saver = fit_helpers.WeightsBeforeStep()
    chosen = ["d2", "out"] if mode == "xla" else None  # XLA compiles every captured tensor: keep it short
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), layers=chosen, update_freq=2, weights=True, targets=TARGETS, max_elements=10_000
    )
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[saver, logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    for name in ("loss", *TARGETS):
        assert fit_helpers.layergrad_steps(series, target=name) == [2, 4]  # computed and written on logged steps only
    for tag, (info, _) in series.items():
        assert tag.startswith(info.target + "/")
    for step in (2, 4):
        xb, yb = x[8:], y[8:]  # step 2 and 4 train on the second batch
        for name, fn in TARGETS.items():
            g_out, g_var = fit_helpers.reproduce(model, manual, saver.before[step], xb, yb, loss, target=fn)
            length = fit_helpers.path_length(model, xb, target_terms=int(np.prod(g_out["bnres/out"].shape)))
            for path, g in g_out.items():
                if chosen and path.split("/")[-1] not in chosen:
                    continue
                fit_helpers.assert_close(
                    fit_helpers.one(series, f"{name}/output/{path}/tensor", step),
                    fit_helpers.bounded(g, 10_000),
                    f"{name} {path} step {step}",
                    length,
                )
            for key, g in g_var.items():
                if chosen and key.split("/")[-2] not in chosen:
                    continue
                tag = f"{name}/weight/bnres/{key.split('/')[-2]}/{key.split('/')[-1]}/tensor"
                fit_helpers.assert_close(
                    fit_helpers.one(series, tag, step),
                    fit_helpers.bounded(g, 10_000),
                    f"{name} {key} step {step}",
                    length,
                )
