"""The step GradientLogger writes at is the count of batches trained, whatever optimizers the step applies.

Side by side with Keras' own `TensorBoard(update_freq=1)`, both read back through TensorBoard's
readers; across fit() calls and new loggers the count continues; where it cannot be known the
first batch raises and says what to pass.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from tensorboard.backend.event_processing import plugin_event_multiplexer

import tb_layergrad
from tb_layergrad import metadata


def _keras_batch_steps(logdir: str, tag: str) -> list:
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: 0})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    return sorted({e.step for e in mux.Tensors("train", tag)})


def _all_steps(fit_helpers, logdir: str) -> list:
    series = fit_helpers.read_series(logdir)
    return sorted({s for _, by_step in series.values() for s in by_step})


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_own_optimizers_write_at_keras_tensorboard_steps(tmp_path, mode, custom_steps, fit_helpers):
    """The guide's GAN (compile() without an optimizer, its own two): every batch at its own step, the one
    Keras' TensorBoard(update_freq=1) writes that batch's batch_* scalars at."""
    model = custom_steps.gan(**fit_helpers.compile_kwargs(mode))
    tb = fit_helpers.keras.callbacks.TensorBoard(fit_helpers.log_dir(tmp_path), update_freq=1)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))
    model.fit(custom_steps.data(32), batch_size=8, epochs=1, verbose=0, callbacks=[tb, logger])
    assert int(model.optimizer.iterations.numpy()) == 0  # the compiled optimizer is never stepped
    ours = _all_steps(fit_helpers, fit_helpers.log_dir(tmp_path))
    assert ours == [1, 2, 3, 4]
    keras_steps = _keras_batch_steps(fit_helpers.log_dir(tmp_path), "batch_d_loss")
    if len(keras_steps) > 1:  # Keras 3.3's callback writes every batch at step 0: nothing to compare with
        assert keras_steps == ours


def test_update_freq_counts_batches_not_updates(tmp_path, custom_steps, fit_helpers):
    model = custom_steps.gan()
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=2)
    model.fit(custom_steps.data(32), batch_size=8, epochs=2, verbose=0, callbacks=[logger])
    assert _all_steps(fit_helpers, fit_helpers.log_dir(tmp_path)) == [2, 4, 6, 8]


def test_update_freq_epoch_logs_the_last_batch_of_each_epoch(tmp_path, custom_steps, fit_helpers):
    model = custom_steps.gan()
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq="epoch")
    model.fit(custom_steps.data(24), batch_size=8, epochs=3, verbose=0, callbacks=[logger])
    assert _all_steps(fit_helpers, fit_helpers.log_dir(tmp_path)) == [3, 6, 9]


def test_steps_per_execution_every_batch_its_step(tmp_path, fit_helpers):
    """steps_per_execution=2 (graph: the step writes itself): batches 1..8 at steps 1..8; the compiled
    optimizer's count agrees, as tf_keras' TensorBoard step does."""
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    x, y = np.random.default_rng(0).normal(size=(16, 6)).astype(np.float32), np.zeros((16, 3), np.float32)
    model.fit(
        x, y, batch_size=2, epochs=1, verbose=0, callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))]
    )
    assert fit_helpers.layergrad_steps(fit_helpers.read_series(fit_helpers.log_dir(tmp_path))) == list(range(1, 9))
    assert int(model.optimizer.iterations.numpy()) == 8


def test_a_second_fit_continues_with_the_same_logger(tmp_path, custom_steps, fit_helpers):
    model = custom_steps.gan()
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), update_freq=3)
    for _ in range(2):
        model.fit(custom_steps.data(32), batch_size=8, epochs=1, verbose=0, callbacks=[logger])
    assert _all_steps(fit_helpers, fit_helpers.log_dir(tmp_path)) == [3, 6]


def test_a_new_logger_on_a_trained_gan_learns_the_count_from_its_first_batch(tmp_path, custom_steps, fit_helpers):
    """A new logger (as in a new process after restoring weights and optimizers): the batch the optimizers
    update once in says how many came before; that batch runs unlogged, with a warning."""
    model = custom_steps.gan()
    model.fit(custom_steps.data(32), batch_size=8, epochs=1, verbose=0)  # 4 batches, no logger
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))
    with pytest.warns(RuntimeWarning, match="runs unlogged"):
        model.fit(custom_steps.data(32), batch_size=8, epochs=1, verbose=0, callbacks=[logger])
    assert _all_steps(fit_helpers, fit_helpers.log_dir(tmp_path)) == [6, 7, 8]


def test_initial_epoch_gives_the_count_without_an_unlogged_batch(tmp_path, custom_steps, fit_helpers):
    model = custom_steps.gan()
    model.fit(custom_steps.data(32), batch_size=8, epochs=1, verbose=0)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(custom_steps.data(32), batch_size=8, epochs=2, initial_epoch=1, verbose=0, callbacks=[logger])
    assert not [w for w in caught if "runs unlogged" in str(w.message)]
    assert _all_steps(fit_helpers, fit_helpers.log_dir(tmp_path)) == [5, 6, 7, 8]


def test_a_count_learned_at_the_first_batch_is_checked_against_its_run(tmp_path, custom_steps, fit_helpers):
    """Another GAN's steps 1..8 are in the run; a trained GAN with a new logger learns at its first batch that it
    writes from step 6: the steps they share are warned about then."""
    custom_steps.gan().fit(
        custom_steps.data(64),
        batch_size=8,
        epochs=1,
        verbose=0,
        callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))],
    )
    model = custom_steps.gan()
    model.fit(custom_steps.data(32), batch_size=8, epochs=1, verbose=0)  # 4 batches, no logger
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            custom_steps.data(32),
            batch_size=8,
            epochs=1,
            verbose=0,
            callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))],
        )
    messages = [str(w.message) for w in caught]
    assert any("runs unlogged" in m for m in messages)
    shared = [m for m in messages if "already holds steps up to 8 " in m]
    assert len(shared) == 1 and "writes from step 6 on" in shared[0], messages


def test_a_count_that_cannot_be_known_raises_at_the_first_batch(tmp_path, custom_steps, fit_helpers):
    """Two updates per batch of the only optimizer: its count is not the batch count; the error says what to pass."""
    model = custom_steps.TwiceStep()
    model.compile(optimizer=fit_helpers.keras.optimizers.SGD(0.01))
    model.fit(custom_steps.data(16), batch_size=8, epochs=1, verbose=0)
    logger = tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))
    with pytest.warns(RuntimeWarning, match="runs unlogged"), pytest.raises(RuntimeError, match="initial_epoch"):
        model.fit(custom_steps.data(16), batch_size=8, epochs=1, verbose=0, callbacks=[logger])
    assert "train_step" not in model.__dict__
    assert not fit_helpers.read_series(fit_helpers.log_dir(tmp_path))  # nothing written at a guessed step


def test_a_saved_and_loaded_model_continues_with_a_new_logger(tmp_path, fit_helpers):
    """A standard model saved with its optimizer and loaded (as in a new process), then a new logger: its steps
    continue from the restored optimizer's count, none written twice, no batch unlogged."""
    model, _ = fit_helpers.mlp_sequential()
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.random.default_rng(0).normal(size=(32, 6)).astype(np.float32), np.zeros((32, 3), np.float32)
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))])
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = fit_helpers.keras.models.load_model(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored.fit(
            x, y, batch_size=8, verbose=0, callbacks=[tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path))]
        )
    assert not [w for w in caught if "runs unlogged" in str(w.message)]
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    assert fit_helpers.layergrad_steps(series) == list(range(1, 9))
    assert all(len(values) == 1 for _, by_step in series.values() for values in by_step.values())
