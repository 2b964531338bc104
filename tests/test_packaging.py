"""Packaging as installed: one version, the licence, extras that never bring a second TensorFlow."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import runpy
import subprocess
import sys
import textwrap

import pytest
import setuptools

import tb_layergrad

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIST = importlib.metadata.distribution("tb_layergrad")


def requirements(extra: str) -> list:
    """The distribution names the installed metadata lists for `extra` ("" for the plain install)."""
    names = []
    for req in DIST.requires or []:
        marker = re.search(r';\s*extra\s*==\s*"([^"]+)"', req)
        if (marker.group(1) if marker else "") == extra:
            names.append(re.match(r"[A-Za-z0-9_.\-]+", req).group(0).lower().replace("_", "-"))
    return names


def test_one_version_source(monkeypatch):
    setup_py = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert not re.search(r"""version\s*=\s*["']""", setup_py), "setup.py writes a version of its own"
    given = {}
    monkeypatch.setattr(setuptools, "setup", given.update)  # what setup.py would hand to setuptools
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    assert given["version"] == tb_layergrad.__version__
    assert DIST.version == tb_layergrad.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc)?\d*", tb_layergrad.__version__)


def test_apache_licence_file_and_metadata():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS AND CONDITIONS" in text
    )
    assert DIST.metadata["License"] == "Apache-2.0"
    classifiers = DIST.metadata.get_all("Classifier")
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    assert "Operating System :: OS Independent" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3.") for c in classifiers)


def test_test_extra_brings_no_tensorflow_the_cpu_and_tf_extras_do():
    tensorflows = {"tensorflow", "tensorflow-cpu", "tf-keras", "keras"}
    assert not tensorflows & set(requirements("test")), requirements("test")
    assert not tensorflows & set(requirements(""))
    # TensorFlow, and the oldest Keras 3 that GradientLogger supports (README, "Supported versions").
    # In any order: a PEP 660 editable install and a legacy `setup.py develop` list extras in different orders.
    assert sorted(requirements("cpu")) == ["keras", "tensorflow-cpu"] and sorted(requirements("tf")) == [
        "keras",
        "tensorflow",
    ]
    # The JAX extra: Keras and JAX, and no TensorFlow (GradientLogger on JAX writes without it).
    assert sorted(requirements("jax")) == ["jax", "keras"]
    assert {"pytest", "pytest-timeout", "playwright"} <= set(requirements("test"))
    assert {"filelock", "platformdirs", "tensorboard", "google-crc32c"} <= set(requirements(""))


def collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_markers_are_registered_and_select():
    """`pytest -m "not browser"` leaves out exactly the browser tests (and --strict-markers knows all four)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--markers"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    assert all(f"@pytest.mark.{m}:" in listed for m in ("browser", "kernel", "slow", "installed"))
    browser = collect("-m", "browser", "tests/tab/test_tab_e2e.py", "tests/test_packaging.py")
    others = collect("-m", "not browser", "tests/tab/test_tab_e2e.py", "tests/test_packaging.py")
    ids = lambda done: [line for line in done.stdout.splitlines() if "::" in line]  # noqa: E731
    assert ids(browser) and all(i.startswith("tests/tab/test_tab_e2e.py::") for i in ids(browser))
    assert ids(others) and not any(i.startswith("tests/tab/test_tab_e2e.py::") for i in ids(others))


def test_the_reading_side_needs_no_tensorflow():
    """`tb_layergrad.load` and the report read a logdir without importing TensorFlow (they start fast)."""
    code = textwrap.dedent("""
        import sys
        import tb_layergrad
        from tb_layergrad.cli import report
        from tb_layergrad.reader import anomalies, dataframe
        assert tb_layergrad.load is dataframe.load
        assert callable(anomalies.evaluate) and callable(report.build)
        assert "tensorflow" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
