"""The distribute room's helper: the harness that runs tests/distribute_scripts/ in fresh processes."""

import importlib

import pytest


@pytest.fixture(scope="session")
def distribute_harness():
    """tests/distribute_harness.py, as a namespace: run the tests/distribute_scripts/*.py in fresh processes and
    compare their records."""
    return importlib.import_module("distribute_harness")
