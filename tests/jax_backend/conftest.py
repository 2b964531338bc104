"""The JAX room's tests run where Keras runs on JAX (`KERAS_BACKEND=jax`, the JAX leg of .ci/run); elsewhere
they are not collected, and pytest's header says why: Keras' backend is fixed at its first import, once per
process, so a TensorFlow run of the suite cannot run them."""

from __future__ import annotations

import importlib
import os

import pytest


def _why_not() -> str:
    try:
        import jax  # noqa: F401
        import keras
    except ImportError as error:
        return f"{error.name} is not installed"
    if keras.config.backend() != "jax":
        return f"Keras runs on {keras.config.backend()!r} here (the JAX tests need KERAS_BACKEND=jax)"
    return ""


WHY_NOT = _why_not()
if WHY_NOT:
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config) -> str:
    return f"tests/jax_backend: not run: {WHY_NOT}" if WHY_NOT else "tests/jax_backend: Keras on JAX"


@pytest.fixture
def logdir(tmp_path) -> str:
    return os.fspath(tmp_path / "logs")


@pytest.fixture(scope="session")
def numpy_reference():
    """tests/numpy_reference.py, as a namespace: the statistics recomputed with plain numpy in float64."""
    return importlib.import_module("numpy_reference")


@pytest.fixture(scope="session")
def jax_vs_tf_case():
    """tests/jax_vs_tf_case.py, as a namespace: the model, data and options of the stored TensorFlow run."""
    return importlib.import_module("jax_vs_tf_case")
