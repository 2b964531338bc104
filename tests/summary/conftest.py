"""The summary room's helper: the statistics recomputed with numpy, as a fixture."""

import importlib

import pytest


@pytest.fixture(scope="session")
def numpy_reference():
    """tests/numpy_reference.py, as a namespace: the statistics of docs/FORMAT.md recomputed with plain numpy in
    float64, independently of the reductions."""
    return importlib.import_module("numpy_reference")
