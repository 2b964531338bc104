"""A KerasTuner search: each trial's gradients in that trial's own run, beside its hyperparameters.

KerasTuner copies the callbacks for each trial (one `copy.deepcopy` of the list) and points the copies of
its `TensorBoard` callbacks at `log_dir/<trial_id>/execution0`, where it also logs the trial's hyperparameters
(`hp.KerasCallback`). A `GradientLogger` given that TensorBoard callback as `log_dir` follows it; one given a
path warns, naming what to pass. Each trial's records are checked against an independent reproduction of
its own steps (`fit_helpers.check_step`), its hyperparameters against the tuner's own trial records, read
back through `tb_layergrad.load()` and the plugin's `hparams` route in a real TensorBoard.
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad.kernel.cache import MISSING

try:
    import keras_tuner
except ImportError:  # CI installs it (the `test` extra): a skip there fails the run (.ci/run)
    pytest.skip(f"{MISSING} keras-tuner (pip install keras-tuner; in the `test` extra)", allow_module_level=True)
keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise, as in fit_helpers
if keras.Model.__module__.startswith("tf_keras"):  # fit_helpers.TF_KERAS
    pytest.skip("KerasTuner builds Keras 3 models while Keras 3 is installed, not tf_keras'", allow_module_level=True)

TRIALS = 3
BATCH, BATCHES, EPOCHS = 8, 4, 2
STEPS = BATCHES * EPOCHS  # a new model per trial: steps 1..STEPS
WARNED = "pass the keras.callbacks.TensorBoard callback itself as log_dir"


def _build(hp) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(
                hp.Choice("units", [2, 4, 8]), activation=hp.Choice("activation", ["relu", "tanh"]), name="hidden"
            ),
            keras.layers.Dense(1, name="out"),
        ],
        name="net",
    )
    model.compile(optimizer=keras.optimizers.SGD(hp.Float("learning_rate", 1e-3, 1e-1, sampling="log")), loss="mse")
    return model


def _manual(model):
    def manual(x, tape):
        outs, h = {}, x
        for layer in model.layers:
            h = layer(h)
            tape.watch(h)
            outs[f"{model.name}/{layer.name}"] = h
        return h, outs

    return manual


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH * BATCHES, 4)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype("float32")


class _PerTrial(keras.callbacks.Callback):
    """What each trial trained: its model, the weights before each step, its epoch logs, keyed by the folder
    its TensorBoard callback was given. KerasTuner deep-copies the callbacks for each trial (and `self.tb` with
    them, onto the copy it redirects): the records live in the class, which is not copied."""

    records: Dict[str, dict] = {}

    def __init__(self, tb):
        super().__init__()
        self.tb = tb

    def on_train_begin(self, logs=None):
        assert self.tb.log_dir not in _PerTrial.records, f"two trainings in {self.tb.log_dir}"
        self.record = _PerTrial.records[self.tb.log_dir] = {"model": self.model, "before": {}, "epochs": []}

    def on_train_batch_begin(self, batch, logs=None):
        before = self.record["before"]
        before[len(before) + 1] = [w.copy() for w in self.model.get_weights()]

    def on_epoch_end(self, epoch, logs=None):
        self.record["epochs"].append(dict(logs))


def _search(directory: str, callbacks, trials: int = TRIALS, epochs: int = EPOCHS, validation: bool = False):
    tuner = keras_tuner.RandomSearch(
        _build, objective="loss", max_trials=trials, directory=directory, overwrite=True, seed=3
    )
    x, y = _data()
    fit = {"validation_data": _data(seed=1)} if validation else {}
    tuner.search(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks, **fit)
    return {t.trial_id: t.hyperparameters.values for t in tuner.oracle.trials.values()}


@pytest.fixture(scope="module")
def searched(tmp_path_factory, fit_helpers):
    """({trial_id: its hyperparameters}, logdir): GradientLogger(tb) beside tb in the search's callbacks."""
    root = tmp_path_factory.mktemp("tuner")
    logdir = os.fspath(root / "logs")
    tb = keras.callbacks.TensorBoard(logdir)
    logger = tb_layergrad.GradientLogger(tb, weights=True, max_elements=fit_helpers.MAX)
    trials = _search(os.fspath(root / "kt"), [tb, logger, _PerTrial(tb)], validation=True)
    assert len(trials) == TRIALS and len({tuple(sorted(v.items())) for v in trials.values()}) == TRIALS
    return trials, logdir


def _run(trial_id: str) -> str:
    return f"{trial_id}/execution0"


def _record(logdir: str, trial_id: str) -> dict:
    return _PerTrial.records[os.path.join(logdir, trial_id, "execution0")]


@pytest.mark.slow
def test_each_trial_writes_its_own_steps_to_its_own_run(searched, fit_helpers):
    trials, logdir = searched
    df = tb_layergrad.load(logdir)
    assert sorted(set(df.run)) == sorted(f"{_run(t)}/train" for t in trials)
    x, y = _data()
    last_out = {}
    for trial_id in trials:
        run = f"{_run(trial_id)}/train"
        assert sorted(set(df[df.run == run].step)) == list(range(1, STEPS + 1))
        series = fit_helpers.read_series(logdir, run)
        record = _record(logdir, trial_id)
        model = record["model"]
        assert sorted(record["before"]) == list(range(1, STEPS + 1))
        for step, weights in record["before"].items():
            batch = slice(((step - 1) % BATCHES) * BATCH, ((step - 1) % BATCHES + 1) * BATCH)
            fit_helpers.check_step(
                series, step, model, _manual(model), weights, x[batch], y[batch], keras.losses.MeanSquaredError()
            )
        last_out[trial_id] = fit_helpers.one(series, "loss/output/net/out/tensor", STEPS)
    # Three trainings, three different gradients: no run holds another trial's steps.
    ids = list(trials)
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            assert not np.allclose(last_out[a], last_out[b]), (a, b)


@pytest.mark.slow  # the search it reads takes seconds
def test_each_run_has_its_trials_hyperparameters(searched):
    trials, logdir = searched
    df = tb_layergrad.load(logdir)
    names = sorted({name for values in trials.values() for name in values})
    assert [c for c in df.columns if c.startswith("hp/")] == [f"hp/{n}" for n in names]
    for trial_id, values in trials.items():
        rows = df[df.run == f"{_run(trial_id)}/train"]
        for name, value in values.items():
            assert rows[f"hp/{name}"].tolist() == [value] * len(rows), (trial_id, name)


@pytest.mark.slow  # the search it reads takes seconds
def test_keras_tensorboard_keeps_its_own_runs(searched, tb_reading):
    """Keras' callback writes each trial's epoch scalars to its train and validation runs, as without us."""
    trials, logdir = searched
    scalars = tb_reading.scalars(logdir)
    assert sorted(run for run, tags in scalars.items() if "epoch_loss" in tags) == sorted(
        f"{_run(t)}/{split}" for t in trials for split in ("train", "validation")
    )
    for trial_id in trials:
        epochs = _record(logdir, trial_id)["epochs"]
        for split, key in (("train", "loss"), ("validation", "val_loss")):
            written = scalars[f"{_run(trial_id)}/{split}"]["epoch_loss"]
            assert sorted(written) == list(range(EPOCHS))
            for epoch, logs in enumerate(epochs):
                assert np.float32(written[epoch]) == np.float32(logs[key]), (trial_id, split, epoch)


@pytest.mark.slow
def test_the_hparams_route_names_each_trials_run(searched, tmp_path, tensorboard_process):
    trials, logdir = searched
    expected = {f"{_run(t)}/train": values for t, values in trials.items()}
    with tensorboard_process.tensorboards(logdir, [("true", []), ("false", [])], str(tmp_path)) as procs:
        for p in procs:
            p.wait_for_runs({run: STEPS for run in expected})
            body = p.get_json(tensorboard_process.PLUGIN_API + "hparams")
            assert body["names"] == sorted({n for v in trials.values() for n in v})
            assert {r["run"]: r["hparams"] for r in body["runs"]} == expected


@pytest.mark.parametrize("form", ["path, no TensorBoard", "path beside TensorBoard", "TensorBoard not in the list"])
@pytest.mark.slow
def test_a_logger_that_cannot_follow_the_trials_says_what_to_pass(tmp_path, form):
    """Every trial would write to one run: the second trial warns, naming the form that works."""
    logdir = os.fspath(tmp_path / "logs")
    tb = keras.callbacks.TensorBoard(logdir)
    callbacks = {
        "path, no TensorBoard": [tb_layergrad.GradientLogger(logdir)],
        "path beside TensorBoard": [tb, tb_layergrad.GradientLogger(logdir)],
        "TensorBoard not in the list": [tb_layergrad.GradientLogger(tb)],
    }[form]
    with pytest.warns(UserWarning, match=WARNED) as caught:
        _search(os.fspath(tmp_path / "kt"), callbacks, trials=2, epochs=1)
    messages = [str(w.message) for w in caught if WARNED in str(w.message)]
    assert len(messages) == 1, messages  # the second trial, and only it
    assert f"already holds steps up to {BATCHES} " in messages[0] and "writes from step 1 on" in messages[0]
