"""Shared pytest set-up: deterministic seeds.

TensorFlow's log level is left as the user has it: the tests' subprocesses then see what a user sees
(tb-layergrad's commands must be quiet without TF_CPP_MIN_LOG_LEVEL).
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

CHECKOUT = pathlib.Path(__file__).resolve().parents[1]


def _is_checkout(entry: str) -> bool:
    return pathlib.Path(entry or os.getcwd()).resolve() == CHECKOUT


# The tests check the package a user installs, not this source tree: `python -m pytest`, started in the
# checkout, puts the checkout first on sys.path, where `import tb_layergrad` would find the sources instead.
# Nothing here has imported tb_layergrad yet (conftest.py loads first); test_packaging.py asserts where it came from.
sys.path[:] = [entry for entry in sys.path if not _is_checkout(entry)]

from console_script import CLI  # noqa: E402 - after the path above is set

# The session fixtures every room shares (logdirs written once): found by pytest, not imported by each test.
pytest_plugins = ["plugin_fixtures", "report_fixtures", "origin_fixtures"]


@pytest.fixture(autouse=True, scope="session")
def _outside_the_checkout(tmp_path_factory):
    """The tests, and the programs they start, run from a folder outside the checkout, as a user's code does: a
    `python -c` or `python -m tb_layergrad` started in the checkout would import its sources, not the package."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state (Keras initializers, tf.random)."""
    try:
        import keras
    except ImportError:  # plugin-only environments
        return
    keras.utils.set_random_seed(1234)


def pytest_collection_modifyitems(config, items):
    """A test marked `browser`, `kernel` or `installed` skips, with a one-line reason, where its requirement is
    missing.

    The reasons start with `kernel_cache.MISSING`, which .ci/run looks for: CI has every requirement (and
    installs the wheel, not an editable checkout), so such a skip there is a failure.
    """
    missing = {}
    for item in items:
        for marker in ("browser", "kernel", "installed"):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in missing:
                missing[marker] = requirement_missing(marker)
            if missing[marker]:
                item.add_marker(pytest.mark.skip(reason=missing[marker]))


def requirement_missing(marker: str):
    """`kernel_cache.MISSING + why` when this machine lacks what tests marked `marker` need, else None."""
    from tb_layergrad.kernel import cache as kernel_cache

    if marker == "installed":
        import tb_layergrad

        if CHECKOUT in pathlib.Path(tb_layergrad.__file__).resolve().parents:
            return (
                f"{kernel_cache.MISSING} a wheel install (tb_layergrad is imported from the checkout: pip install -e)"
            )
        return None
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
    # `runs`: target loss, the demo's runs but one; `by_target`: every (run, target) reported (the gan's two)
    runs = {r["run"]: r for r in doc["runs"] if r["target"] == "loss"}
    by_target = {(r["run"], r["target"]): r for r in doc["runs"]}
    layers = {name: {l["layer"].split("/", 1)[1]: l for l in r["layers"]} for name, r in runs.items()}
    print(f"demo --quick: {elapsed:.0f} s")
    return {
        "logdir": logdir,
        "stdout": r.stdout,
        "elapsed": elapsed,
        "runs": runs,
        "by_target": by_target,
        "layers": layers,
    }
