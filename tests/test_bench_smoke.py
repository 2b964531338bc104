"""The benchmark scripts keep working (tiny sizes; the figures come from `python bench/run.py`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_run_smoke(tmp_path):
    out = tmp_path / "PERFORMANCE.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "run.py"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    for heading in (
        "Custom training loop",
        "model.fit()",
        "bytes per layer",
        "Tab latency",
        "Per-example gradient norms",
    ):
        assert heading in text, heading
    # Every measured cell is a number with a unit, not a placeholder.
    rows = [line for line in text.splitlines() if line.startswith("| mlp |") or line.startswith("| 3 x 4 x 20 |")]
    assert len(rows) == 5, rows  # loop, fit(), bytes, per-example, tab
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        numbers = cells[2:] if "loader" in text and "load_fast" in row else cells[1:]
        assert numbers and all(any(ch.isdigit() for ch in c) for c in numbers), row
