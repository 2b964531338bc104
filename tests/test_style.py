"""The code style is checked, not hoped for: ruff's lint and format (pyproject.toml) pass on the whole checkout."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

CHECKOUT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_passes(command):
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, str(CHECKOUT)],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"`ruff {' '.join(command)} .` in the checkout:\n{done.stdout}{done.stderr}"
