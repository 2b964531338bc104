"""GradientLogger in fit() under MirroredStrategy (2 logical CPUs, in a subprocess) vs one device; a custom step
with two tapes (the guide's GAN) vs its replicas' tapes reproduced and merged.

Named test_distribute_* (not test_fit_*): it drives Keras 3 through its own
subprocess; the legacy tf_keras CI run refuses several replicas with a clear error.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tb_layergrad import metadata

GLOBAL_BATCH, STEPS = 8, 3
MODES = ("graph", "eager")


pytestmark = pytest.mark.slow  # real processes: several workers, or TensorBoard servers


@pytest.fixture(scope="module")
def run(tmp_path_factory, distribute_harness):
    logdir = str(tmp_path_factory.mktemp("fit_mirrored"))
    distribute_harness.run_script("fit_mirrored.py", [logdir, ",".join(MODES)], timeout=300)
    return logdir, distribute_harness.read(logdir)


@pytest.mark.parametrize("mode", MODES)
def test_fit_records_equal_single_device(run, mode, distribute_harness):
    """Where Keras' own step under the strategy is the single-device step (the script measures it), so are the
    records, value for value; where it is not (Keras 3.3 does not divide the loss by the replica count), there is
    nothing to compare the values with, and the records must still cover the global batch at every step."""
    logdir, records = run
    got = records[f"gather_{mode}/train"]
    with open(os.path.join(logdir, "keras_factor.json")) as f:
        factor = json.load(f)["factor"]
    if factor is not None:
        assert (
            distribute_harness.assert_same_records(got, records[f"single_{mode}/train"]) == 17 * STEPS
        )  # 12 of gradients, 4 of activations, the loss value (source "target")
    for layer, units in (("tiny/hidden", 16), ("tiny/out", 4)):
        _, datums = got[metadata.make_tag("loss", "output", layer, "stats")]
        assert [d.step for d in datums] == list(range(1, STEPS + 1))
        assert all(d.numpy[metadata.STAT_INDEX["elements"]] == GLOBAL_BATCH * units for d in datums)


def test_one_event_file_per_run(run, distribute_harness):
    logdir, records = run
    distribute_harness.assert_one_event_file(logdir, list(records))


def test_logger_does_not_change_training_under_the_strategy(run, distribute_harness):
    assert distribute_harness.assert_weights_unchanged(run[0]) == 4


# The GAN (tests/distribute_scripts/fit_gan_mirrored.py): two batches of 8, 4 per replica. A record's reduction
# path: the discriminator's batch (generated + real, 16) and its loss's 16 terms, each kernel's contraction
# forward and back (generator 3 -> 5 -> 4, discriminator 4 -> 6 -> 1), the generator's tape through both.
GAN_STEPS = 2
GAN_PATH = 16 + 16 + 2 * ((3 + 5) + (5 + 4) + (4 + 6) + (6 + 1))


@pytest.fixture(scope="module")
def gan_run(tmp_path_factory, distribute_harness):
    logdir = str(tmp_path_factory.mktemp("fit_gan_mirrored"))
    distribute_harness.run_script("fit_gan_mirrored.py", [logdir, ",".join(MODES)], timeout=400)
    return logdir


@pytest.mark.parametrize("mode", MODES)
def test_custom_step_every_tape_of_every_replica(gan_run, mode, fit_helpers):
    """Both targets of the guide's GAN, at every step, equal each replica's own tapes merged by
    `tb_layergrad.distribute.merge` (layer outputs gathered along the batch, weights and losses summed).

    Where the installed Keras leaves the replicas' weights apart after the step's own `apply_gradients` (the
    script measures it: Keras 3.3 does), no single set of weights is what the later tapes ran on: there only the
    first tape of the first batch (every replica on the initial weights) is compared value for value, and every
    record must still cover the global batch."""
    series = fit_helpers.read_series(os.path.join(gan_run, mode))
    expected = np.load(os.path.join(gan_run, f"expected_{mode}.npz"))
    with open(os.path.join(gan_run, f"replicas_agree_{mode}.json")) as f:
        agree = json.load(f)
    assert {info.target for info, _ in series.values()} == {"discriminator", "generator"}
    checked, compared = {}, 0
    for key in expected.files:
        step, target, source, path = key.split("|")
        step, want = int(step), expected[key]
        same_weights = agree or (step == 1 and target == "discriminator")
        if source == "target":
            (layer,) = {i.layer for i, _ in series.values() if i.target == target and i.source == "target"}
            got = fit_helpers.stat(fit_helpers.one(series, f"{target}/target/{layer}/stats", step), "mean")
            if same_weights:
                fit_helpers.assert_close(got, want, f"{target} loss at step {step}", GAN_PATH)
            continue
        st = fit_helpers.one(series, f"{target}/{source}/{path}/stats", step)
        assert fit_helpers.stat(st, "elements") == want.size and fit_helpers.stat(st, "no_gradient") == 0, (key, st)
        checked.setdefault(target, set()).add((source, path))
        if same_weights:
            got = fit_helpers.one(series, f"{target}/{source}/{path}/tensor", step)
            fit_helpers.assert_close(
                got, fit_helpers.bounded(want, 10_000), f"{target} {source} {path} at step {step}", GAN_PATH
            )
            compared += 1
    assert compared == (17 * GAN_STEPS if agree else 7)  # per step: 7 records of the discriminator, 10 of the generator
    for target, paths in checked.items():  # nothing logged beyond the reproduced tapes (and each at every step)
        logged = {(i.source, i.layer) for i, _ in series.values() if i.target == target and i.source != "target"}
        assert logged == paths, (target, sorted(logged ^ paths))
    for info, by_step in series.values():
        assert sorted(by_step) == list(range(1, GAN_STEPS + 1)), info
    assert set(checked) == {"discriminator", "generator"}


@pytest.mark.parametrize("mode", MODES)
def test_custom_step_training_unchanged_under_the_strategy(gan_run, mode):
    w = np.load(os.path.join(gan_run, f"weights_{mode}.npz"))
    n = len(w.files) // 2
    assert n == 8  # both sub-models' kernels and biases
    for i in range(n):
        np.testing.assert_array_equal(w[f"arr_{i}"], w[f"arr_{i + n}"])


# keras.io's CycleGAN (tests/distribute_scripts/fit_calls_mirrored.py): one persistent tape asked four times,
# 4 batches of 8, 4 per replica. A record's reduction path: each loss over its 4 x 4 terms, each sub-model's
# contractions forward and back (generators 4 -> 5 -> 4, discriminators 4 -> 4 -> 1), a generator's loss through
# both generators and a discriminator.
CALLS_PATH = 4 * 4 * 6 + 3 * 2 * ((4 + 5) + (5 + 4) + (4 + 4) + (4 + 1))
CALLS = ("generator_G", "generator_F", "discriminator_X", "discriminator_Y")
# In graph mode only: run eagerly, the step is the same Keras code and the logger takes its eager path under the
# strategy, which the plain fit and the GAN above cross; the rule of several calls on one tape run eagerly is
# crossed without a strategy (tests/keras/test_fit_calls.py, the gallery's CycleGAN).
CALLS_MODES = ("graph",)


@pytest.fixture(scope="module")
def calls_run(tmp_path_factory, distribute_harness):
    logdir = str(tmp_path_factory.mktemp("fit_calls_mirrored"))
    distribute_harness.run_script("fit_calls_mirrored.py", [logdir, ",".join(CALLS_MODES)], timeout=600)
    return logdir


@pytest.mark.parametrize("mode", CALLS_MODES)
def test_every_call_of_a_persistent_tape_on_every_replica(calls_run, mode, fit_helpers):
    """Each of the four calls is a target at every step; at the first (every replica on the initial weights, every
    call before any update) equal to each replica's own tapes merged; training unchanged."""
    series = fit_helpers.read_series(os.path.join(calls_run, mode))
    expected = np.load(os.path.join(calls_run, f"expected_{mode}.npz"))
    assert {info.target for info, _ in series.values()} == set(CALLS)
    for info, by_step in series.values():
        assert sorted(by_step) == [1, 2, 3, 4], info
    checked = {}
    for key in expected.files:
        target, source, path = key.split("|")
        want = expected[key]
        if source == "target":
            (layer,) = {i.layer for i, _ in series.values() if i.target == target and i.source == "target"}
            fit_helpers.assert_close(
                fit_helpers.stat(fit_helpers.one(series, f"{target}/target/{layer}/stats", 1), "mean"),
                want,
                f"{target} loss",
                CALLS_PATH,
            )
            continue
        checked.setdefault(target, set()).add((source, path))
        st = fit_helpers.one(series, f"{target}/{source}/{path}/stats", 1)
        assert fit_helpers.stat(st, "no_gradient") == (want.ndim == 0), key  # a layer its loss does not depend on
        if want.ndim:
            assert fit_helpers.stat(st, "elements") == want.size, key
            got = fit_helpers.one(series, f"{target}/{source}/{path}/tensor", 1)
            fit_helpers.assert_close(got, fit_helpers.bounded(want, 10_000), f"{target} {source} {path}", CALLS_PATH)
    for target, paths in checked.items():
        logged = {(i.source, i.layer) for i, _ in series.values() if i.target == target and i.source != "target"}
        assert logged == paths, (target, sorted(logged ^ paths))
    w = np.load(os.path.join(calls_run, f"weights_{mode}.npz"))
    n = len(w.files) // 2
    for i in range(n):
        np.testing.assert_array_equal(w[f"arr_{i}"], w[f"arr_{i + n}"])
