"""Custom loop under MirroredStrategy (2 logical CPUs, in a subprocess): the global batch, written once.

The script (distribute_scripts/custom_loop.py) trains 3 steps and writes through
every distributed path: in replica context (the replicas' tensors all-gathered),
and in cross-replica context on what strategy.run returned; plus a single-device
reference on the same weights and the same global batch at each step.
"""

from __future__ import annotations

import json
import os

import pytest

from tb_layergrad import metadata

GLOBAL_BATCH, STEPS = 8, 3


pytestmark = pytest.mark.slow  # real processes: several workers, or TensorBoard servers


@pytest.fixture(scope="module")
def run(tmp_path_factory, distribute_harness):
    logdir = str(tmp_path_factory.mktemp("custom_loop"))
    distribute_harness.run_script("custom_loop.py", [logdir], timeout=300)
    return logdir, distribute_harness.read(logdir)


@pytest.mark.parametrize("mode", ["gather", "cross"])
def test_equals_single_device_on_the_global_batch(run, mode, distribute_harness):
    _, records = run
    assert (
        distribute_harness.assert_same_records(records[mode], records["single"]) == 17 * STEPS
    )  # 12 records of gradients, 4 of activations, the loss value (source "target")


def test_low_level_op_writes_the_global_batch(run, distribute_harness):
    _, records = run
    wanted = [
        metadata.make_tag("loss", s, p, k)
        for s, p in (("output", "tiny/hidden"), ("weight", "tiny/out/bias"))
        for k in ("histogram", "stats")
    ]
    expected = {tag: records["single"][tag] for tag in wanted}
    assert distribute_harness.assert_same_records(records["low"], expected) == 4 * STEPS


def test_counts_cover_the_global_batch_once_per_step(run):
    _, records = run
    for mode in ("gather", "cross"):
        for layer, units in (("tiny/hidden", 16), ("tiny/out", 4)):
            info, datums = records[mode][metadata.make_tag("loss", "output", layer, "stats")]
            assert [d.step for d in datums] == [1, 2, 3]  # one record per step: written once, right step
            for d in datums:
                assert d.numpy[metadata.STAT_INDEX["elements"]] == GLOBAL_BATCH * units
            hist = records[mode][metadata.make_tag("loss", "output", layer, "histogram")][1]
            assert all(d.numpy[:, 2].sum() == GLOBAL_BATCH * units for d in hist)


def test_one_event_file_per_run(run, distribute_harness):
    distribute_harness.assert_one_event_file(run[0], ("gather", "cross", "low", "single"))


def test_logging_does_not_change_training(run, distribute_harness):
    assert distribute_harness.assert_weights_unchanged(run[0]) > 0  # bitwise: with the three writers vs without


def test_bad_usage_fails_clearly(run):
    logdir, records = run
    with open(os.path.join(logdir, "errors.json")) as f:
        errors = json.load(f)
    assert "RuntimeError" in errors["in_cond"] and "tf.summary.record_if" in errors["in_cond"], errors["in_cond"]
    assert "ValueError" in errors["cross_without_strategy"] and "strategy=" in errors["cross_without_strategy"]
    assert "errors" not in records  # nothing half-written
