"""Run the tests/distribute_scripts/*.py in fresh processes and compare their records.

Why subprocesses: logical devices (`tf.config.set_logical_device_configuration`)
must be configured before TensorFlow initialises, which pytest's process did long
ago; and a MultiWorkerMirroredStrategy needs one process per worker.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np
import tb_reading
from tolerances import TWO_SIDES, chain_rtol

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distribute_scripts")
# Every script trains common.tiny_model (Dense 5 -> 16 -> 4) on a global batch of 8 with an MSE over 8 x 4:
# the runs compared compute the same float32 math in other orders (half batches per replica, gathered or
# all-reduced), each within chain_rtol of the reduction path: the batch, the loss's terms, each kernel's
# contraction forward and back, and a record's own reduction over at most 8 x 16 elements.
REDUCTION_PATH = 8 + 8 * 4 + (5 + 16) + (16 + 4) + 8 * 16
RTOL = TWO_SIDES * chain_rtol(np.float32, [REDUCTION_PATH])


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)
    env.update(extra or {})
    return env


def run_script(name: str, args: Sequence[str], timeout: float = 240, env: Optional[Dict[str, str]] = None) -> str:
    """Run one script to completion (killed after `timeout` s); its stdout, or an assertion with its stderr."""
    proc = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, name), *args],
        cwd=SCRIPTS,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def start_script(name: str, args: Sequence[str], env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, name), *args],
        cwd=SCRIPTS,
        env=_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_all(procs: List[subprocess.Popen], timeout: float) -> List[tuple]:
    """[(returncode, stdout, stderr)]; every process still running at the end is killed."""
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def free_ports(n: int) -> List[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def assert_same_records(actual: Dict, expected: Dict, rtol: float = RTOL) -> int:
    """Every series and step of `expected` is in `actual`: counts equal, the rest within rtol.

    `atol` is rtol of the record's largest magnitude: an interior histogram edge or a
    mean near zero is a difference of large numbers, so its relative error is not bounded
    by the inputs' (weight gradients are summed over replicas in another order).
    Returns the number of records compared.
    """
    assert set(actual) == set(expected), sorted(set(actual) ^ set(expected))
    n = 0
    for tag, (info, datums) in expected.items():
        got = {d.step: d.numpy for d in actual[tag][1]}
        assert sorted(got) == sorted(d.step for d in datums), (tag, sorted(got))
        for d in datums:
            a, e = np.asarray(got[d.step]), np.asarray(d.numpy)
            assert a.shape == e.shape, (tag, d.step, a.shape, e.shape)
            if info.kind == "histogram":
                np.testing.assert_array_equal(a[:, 2], e[:, 2], err_msg=f"{tag} step {d.step}: counts")
            if info.kind == "stats":
                np.testing.assert_array_equal(a[:5], e[:5], err_msg=f"{tag} step {d.step}: counts")
            scale = np.nanmax(np.abs(e)) if np.isfinite(e).any() else 0.0
            np.testing.assert_allclose(
                a, e, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=f"{tag} step {d.step}"
            )
            n += 1
    return n


def read(logdir: str) -> Dict:
    return tb_reading.read_all(logdir)


def assert_one_event_file(logdir: str, runs: Sequence[str]) -> None:
    """Each run directory holds exactly one event file (one writer, no duplicate from another replica/worker)."""
    for name in runs:
        files = [f for f in os.listdir(os.path.join(logdir, name)) if "tfevents" in f]
        assert len(files) == 1, (name, files)


def assert_weights_unchanged(logdir: str) -> int:
    """`weights.npz` holds the weights of a run without logging, then with: bitwise equal. Returns their count."""
    w = np.load(os.path.join(logdir, "weights.npz"))
    n = len(w.files) // 2
    for i in range(n):
        np.testing.assert_array_equal(w[f"arr_{i}"], w[f"arr_{i + n}"])
    return n
