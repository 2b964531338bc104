"""Shared pytest set-up: deterministic seeds.

TensorFlow's log level is left as the user has it: the tests' subprocesses then see what a user sees
(tb-layergrad's commands must be quiet without TF_CPP_MIN_LOG_LEVEL).
"""

import json
import os
import subprocess
import time

import pytest
from console_script import CLI


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state (Keras initializers, tf.random)."""
    try:
        import keras
    except ImportError:  # plugin-only environments
        return
    keras.utils.set_random_seed(1234)


def pytest_collection_modifyitems(config, items):
    """A test marked `browser` or `kernel` skips, with a one-line reason, where its requirement is missing.

    The reasons start with `kernel_cache.MISSING`, which .ci/run looks for: CI has every requirement,
    so such a skip there is a failure.
    """
    missing = {}
    for item in items:
        for marker in ("browser", "kernel"):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in missing:
                missing[marker] = requirement_missing(marker)
            if missing[marker]:
                item.add_marker(pytest.mark.skip(reason=missing[marker]))


def requirement_missing(marker: str):
    """`kernel_cache.MISSING + why` when this machine lacks what tests marked `marker` need, else None."""
    from tb_layergrad.kernel import cache as kernel_cache

    if marker == "browser":
        from tab_fixtures import CHROMIUM

        if not os.path.exists(CHROMIUM):
            return f"{kernel_cache.MISSING} Chromium ({CHROMIUM}; Debian: apt-get install chromium)"
        return None
    why = kernel_cache.unavailable_reason()
    return f"{kernel_cache.MISSING} {why}" if why else None


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """`tb-layergrad demo --quick`, run once as a real subprocess, and its `tb-layergrad report --format json`."""
    logdir = str(tmp_path_factory.mktemp("demo") / "logs")
    started = time.monotonic()
    r = subprocess.run([CLI, "demo", "--quick", "--logdir", logdir], capture_output=True, text=True, timeout=400)
    elapsed = time.monotonic() - started
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rep = subprocess.run([CLI, "report", logdir, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    runs = {r["run"]: r for r in doc["runs"]}
    layers = {name: {l["layer"].split("/", 1)[1]: l for l in r["layers"]} for name, r in runs.items()}
    print(f"demo --quick: {elapsed:.0f} s")
    return {"logdir": logdir, "stdout": r.stdout, "elapsed": elapsed, "runs": runs, "layers": layers}
