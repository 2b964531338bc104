"""GradientLogger in fit() under MirroredStrategy (2 logical CPUs, in a subprocess) vs one device.

Named test_distribute_* (not test_fit_*): it drives Keras 3 through its own
subprocess; the legacy tf_keras CI run refuses several replicas with a clear error.
"""

from __future__ import annotations

import json
import os

import distribute_harness as dh
import pytest

from tb_layergrad import metadata

GLOBAL_BATCH, STEPS = 8, 3
MODES = ("graph", "eager")


pytestmark = pytest.mark.slow  # real processes: several workers, or TensorBoard servers


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    logdir = str(tmp_path_factory.mktemp("fit_mirrored"))
    dh.run_script("fit_mirrored.py", [logdir, ",".join(MODES)], timeout=300)
    return logdir, dh.read(logdir)


@pytest.mark.parametrize("mode", MODES)
def test_fit_records_equal_single_device(run, mode):
    """Where Keras' own step under the strategy is the single-device step (the script measures it), so are the
    records, value for value; where it is not (Keras 3.3 does not divide the loss by the replica count), there is
    nothing to compare the values with, and the records must still cover the global batch at every step."""
    logdir, records = run
    got = records[f"gather_{mode}/train"]
    with open(os.path.join(logdir, "keras_factor.json")) as f:
        factor = json.load(f)["factor"]
    if factor is not None:
        assert (
            dh.assert_same_records(got, records[f"single_{mode}/train"]) == 17 * STEPS
        )  # 12 of gradients, 4 of activations, the loss value (source "target")
    for layer, units in (("tiny/hidden", 16), ("tiny/out", 4)):
        _, datums = got[metadata.make_tag("loss", "output", layer, "stats")]
        assert [d.step for d in datums] == list(range(1, STEPS + 1))
        assert all(d.numpy[metadata.STAT_INDEX["elements"]] == GLOBAL_BATCH * units for d in datums)


def test_one_event_file_per_run(run):
    logdir, records = run
    dh.assert_one_event_file(logdir, list(records))


def test_logger_does_not_change_training_under_the_strategy(run):
    assert dh.assert_weights_unchanged(run[0]) == 4
