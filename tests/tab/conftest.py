"""The tab room's helpers: the browser driver and the logdirs its tests serve, as fixtures."""

import importlib

import pytest


@pytest.fixture(scope="session")
def runs_view_fixtures():
    """tests/runs_view_fixtures.py, as a namespace: a logdir for the Runs view's browser tests: hyperparameters as
    users log them, and as an attacker would."""
    return importlib.import_module("runs_view_fixtures")


@pytest.fixture(scope="session")
def sweep_fixtures():
    """tests/sweep_fixtures.py, as a namespace: a sweep of RUNS runs for the compare view at scale
    (tests/tab/test_tab_sweep_e2e.py, scripts, bench)."""
    return importlib.import_module("sweep_fixtures")


@pytest.fixture(scope="session")
def tab_fixtures():
    """tests/tab_fixtures.py, as a namespace: helpers for the tab's browser tests and for scripts/screenshots.py."""
    return importlib.import_module("tab_fixtures")


@pytest.fixture(scope="session")
def truth_fixtures():
    """tests/truth_fixtures.py, as a namespace: generated series for the "only what is in the data is drawn" browser
    tests (tests/tab/test_tab_charts_e2e.py)."""
    return importlib.import_module("truth_fixtures")
