"""MultiWorkerMirroredStrategy: 2 worker processes on 127.0.0.1, one set of event files (the chief's).

Both workers get the same log directory (as on a shared file system). The global
batch of every step is split across the workers; the chief's records must count
all of it, once per step, and equal one device's on the whole batch.
"""

from __future__ import annotations

import json
import os

import pytest

from tb_layergrad import metadata

GLOBAL_BATCH, STEPS, WORKERS = 8, 3, 2


pytestmark = pytest.mark.slow  # real processes: several workers, or TensorBoard servers


@pytest.fixture(scope="module")
def run(tmp_path_factory, distribute_harness):
    logdir = str(tmp_path_factory.mktemp("mwms"))
    ports = distribute_harness.free_ports(WORKERS)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = [
        distribute_harness.start_script(
            "mwms_worker.py",
            [logdir],
            env={"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})},
        )
        for i in range(WORKERS)
    ]
    results = distribute_harness.wait_all(procs, timeout=240)
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, f"worker {i} failed ({rc}):\n{out[-2000:]}\n{err[-6000:]}"
    return logdir, [out for _, out, _ in results], distribute_harness.read(logdir)


def test_only_the_chief_writes(run):
    logdir, outputs, _ = run
    assert "OK worker 0 True" in outputs[0] and "OK worker 1 False" in outputs[1]
    files = sorted(os.path.relpath(os.path.join(d, f), logdir) for d, _, fs in os.walk(logdir) for f in fs)
    assert sorted(os.path.dirname(f) for f in files) == ["gather", "single"], files  # one file each


def test_counts_cover_the_global_batch_once_per_step(run):
    _, _, records = run
    for layer, units in (("tiny/hidden", 16), ("tiny/out", 4)):
        _, stats = records["gather"][metadata.make_tag("loss", "output", layer, "stats")]
        _, hists = records["gather"][metadata.make_tag("loss", "output", layer, "histogram")]
        assert [d.step for d in stats] == list(range(1, STEPS + 1))  # no duplicate, none missing
        assert [d.step for d in hists] == list(range(1, STEPS + 1))
        for d in stats:
            assert d.numpy[metadata.STAT_INDEX["elements"]] == GLOBAL_BATCH * units
        for d in hists:
            assert d.numpy[:, 2].sum() == GLOBAL_BATCH * units


def test_equals_one_device_on_the_global_batch(run, distribute_harness):
    _, _, records = run
    assert (
        distribute_harness.assert_same_records(records["gather"], records["single"]) == 13 * STEPS
    )  # 12 records of gradients, and the loss value (source "target")
