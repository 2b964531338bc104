"""The benchmark scripts keep working (tiny sizes; the figures come from `python bench/run.py`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_run_smoke(tmp_path):
    """A full run (tiny) over an existing report: every section it measures written anew, once, in the public API's
    words, its targets judged; the sections other commands write (the JAX fit, a long run, the GPU's) kept, and no
    other text of the old report (its header's notes, a section no command writes any more)."""
    out = tmp_path / "PERFORMANCE.md"
    others = [
        "### fit() on JAX: old figures (measured 2026-01-02 with `KERAS_BACKEND=jax python bench/jax_fit.py`)",
        "",
        "| jax | 1 |",
        "",
        "### Long run: 5 steps (measured 2026-01-02 with `python bench/run.py --only-long-run`)",
        "",
        "| long | 2 |",
        "",
        "### On a GPU: to be measured",
        "",
        "run `python bench/gpu.py`",
    ]
    stale = ["A note on an old API", "", "### Format versions 1 and 2: event-file bytes, old", "", "| 1 | 1316 |"]
    old = ["# Performance", "", *stale[:2], "### Custom training loop (tf.function step), old", "", *stale[2:], ""]
    out.write_text("\n".join(old + others))
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
        "fit() with weights=True",
        "Without the fused kernel",
    ):
        assert heading in text, heading
    headings = [line for line in text.splitlines() if line.startswith("### ")]
    assert len(headings) == len(set(headings)) and "### Custom training loop (tf.function step), old" not in headings
    assert "\n".join(others) in text
    assert not any(line in text for line in stale if line), text[:2000]
    assert not any(name in text for name in ("check_every_step", "every_n_steps", "ours_every", "format_version=1"))
    assert re.search(r"^Measured .*; (AVX-512|AVX2|neither AVX2 nor AVX-512)\)", text, re.M), text[:600]  # the CPU's
    # fit()'s variants by GradientLogger's arguments; the targets of the path without the fused kernel and of
    # per_example=True judged from this run's figures.
    targets = [line for line in text.splitlines() if line.startswith(("| custom loop, ", "| fit(), "))]
    judged = {line.split(" | ")[0][2:]: line.split(" | ")[1] for line in targets if line.endswith("met |")}
    assert judged == {
        "custom loop, mlp, `summary.gradients` every step": "<= 1.10x",
        "custom loop, mlp, `summary.gradients` every 10th step": "<= 1.03x",
        "custom loop, mlp, every step, `TB_LAYERGRAD_FUSED=0` (TensorFlow ops)": "<= 1.10x",
        "custom loop, mlp, every 10th step, `TB_LAYERGRAD_FUSED=0` (TensorFlow ops)": "<= 1.03x",
        'fit(), mlp, `GradientLogger(update_freq=10, on_nonfinite="ignore")`': "<= 1.03x",
        "fit(), mlp, `GradientLogger(update_freq=1)`": "<= 1.10x",
        "custom loop, mlp, `capture(weights=True, per_example=True)` every step": "<= 1.20x",
    }, targets
    # The tab's targets among the large logdirs' (the format part measures them), judged.
    tab = [line for line in text.splitlines() if line.startswith("| tab 2x4x20, Python loader: ")]
    assert [line.split(" | ")[1] for line in tab] == ["< 1000 ms", "< 300 ms", "< 200 ms"], tab
    assert all(line.endswith(("| met |", "| NOT met |")) for line in tab), tab
    # Every measured cell is a number with a unit, not a placeholder.
    rows = [line for line in text.splitlines() if line.startswith("| mlp |") or line.startswith("| 3 x 4 x 20 |")]
    assert len(rows) == 7, rows  # loop, fit(), fit() with weights=True, no kernel, bytes, per-example, tab
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        numbers = cells[2:] if "loader" in text and "load_fast" in row else cells[1:]
        assert numbers and all(any(ch.isdigit() for ch in c) for c in numbers), row


def rewrite_twice(tmp_path, only: str):
    """(the report's lines before, after): `bench/run.py --smoke ONLY` run twice on a report with other figures (the
    second run replaces the first one's section)."""
    out = tmp_path / "PERFORMANCE.md"
    before = ["# Performance", "", "### Old figures", "", "| a | b |", "", "### Reading the figures", "", "kept"]
    out.write_text("\n".join(before) + "\n")
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, os.path.join(ROOT, "bench", "run.py"), "--smoke", only, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return before, out.read_text().splitlines()


@pytest.mark.slow
def test_sweep_bench_rewrites_only_its_section(tmp_path):
    """`bench/run.py --only-sweep`: a tiny sweep in real TensorBoards (both loaders), its section replaced in an
    existing report whose other figures are kept; every cell a number with its unit, each target judged."""
    before, lines = rewrite_twice(tmp_path, "--only-sweep")
    assert [line for line in lines if line.startswith("### ")] == [
        "### Old figures",
        next(line for line in lines if line.startswith("### Sweep: the Runs view's `sweep` route, 4 runs x 3 layers")),
        "### Reading the figures",
    ]
    assert lines[:6] == before[:6] and lines[-1] == "kept"
    rows = [line for line in lines if line.startswith("| Rust") or line.startswith("| Python")]
    assert len(rows) == 2, rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert len(cells) == 6 and all(any(ch.isdigit() for ch in c) for c in cells), row
        assert cells[2].endswith("met)") and cells[3].endswith("met)"), row


@pytest.mark.slow
def test_fit_weights_bench_rewrites_only_its_section(tmp_path):
    """`bench/run.py --only-fit-weights`: fit() with weights=True against weights=False, its section replaced in an
    existing report whose other figures are kept; a step time, the ratio judged against its target."""
    before, lines = rewrite_twice(tmp_path, "--only-fit-weights")
    headings = [line for line in lines if line.startswith("### ")]
    assert len(headings) == 3 and headings[0] == "### Old figures" and headings[2] == "### Reading the figures"
    assert headings[1].startswith("### fit() with weights=True: mlp, all layers every step")
    assert lines[:6] == before[:6] and lines[-1] == "kept"
    (row,) = [line for line in lines if line.startswith("| mlp |")]
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    assert cells[0].endswith(" ms") and cells[1].endswith(("x (met)", "x (NOT met)")) and cells[2].endswith("x"), row


@pytest.mark.slow
def test_no_kernel_bench_rewrites_only_its_section(tmp_path):
    """`bench/run.py --only-no-kernel`: the custom loop through TensorFlow's ops and through the fused kernel against
    the plain step, its section replaced in an existing report whose other figures are kept; each target judged."""
    before, lines = rewrite_twice(tmp_path, "--only-no-kernel")
    headings = [line for line in lines if line.startswith("### ")]
    assert len(headings) == 3 and headings[0] == "### Old figures" and headings[2] == "### Reading the figures"
    assert headings[1].startswith("### Without the fused kernel (TensorFlow's ops")
    assert lines[:6] == before[:6] and lines[-1] == "kept"
    (row,) = [line for line in lines if line.startswith("| mlp |")]
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    assert cells[0].endswith(" ms") and all(c.endswith(("met)")) for c in cells[1:3]), row
    assert cells[3].endswith("x") and cells[4].endswith("x") and cells[5].endswith(("yes)", "no)")), row


@pytest.mark.slow
@pytest.mark.browser
def test_tab_sweep_bench_rewrites_only_its_section(tmp_path):
    """`bench/run.py --only-tab-sweep`: a tiny sweep in real TensorBoards (both loaders) and headless Chromium,
    its section replaced in an existing report whose other figures are kept; every cell a figure with its unit."""
    before, lines = rewrite_twice(tmp_path, "--only-tab-sweep")
    headings = [line for line in lines if line.startswith("### ")]
    assert len(headings) == 3 and headings[0] == "### Old figures" and headings[2] == "### Reading the figures"
    assert headings[1].startswith("### Tab at sweep scale: the Compare view of 4 runs and the Runs view of 4 runs")
    assert lines[:6] == before[:6] and lines[-1] == "kept"
    rows = [line for line in lines if line.startswith("| Rust") or line.startswith("| Python")]
    assert len(rows) == 4, rows  # the Compare view's table, and the Runs view's
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert cells and all(any(ch.isdigit() for ch in c) for c in cells), row
        assert all(c.endswith(("s", "MB", ")")) for c in cells), row
    assert all("(1 `depth` request, 0 `matrix`)" in row for row in rows[:2]), rows
    assert all("; 1 `histograms_at` request, 0 `histograms`)" in row for row in rows[:2]), rows
    assert all(row.endswith("met) |") for row in rows[2:]), rows  # the Runs view's target judged


@pytest.mark.slow
def test_long_run_writer_writes_what_the_callback_writes(tmp_path, report_json):
    """bench/long_run.py's synthetic run: the records of a real GradientLogger run (its template) at every step,
    each tensor as the callback wrote it, readable by TensorBoard, no damage (`tb-layergrad report` warns of none);
    metadata on each tag's first record."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import long_run
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2

    template = long_run.template(str(tmp_path / "template"), steps=6)
    real = [event_pb2.Event.FromString(r) for r in long_run._records(template)][1:]
    written_by_callback = {}  # tag without its block -> the tensors' bytes it wrote
    for e in real:
        for v in e.summary.value:
            written_by_callback.setdefault(v.tag.rsplit("/", 1)[0], set()).add(v.tensor.tensor_content)
    per_step = len(real) // len({e.step for e in real})
    w = long_run.write_logdir(str(tmp_path / "long"), 40, str(tmp_path / "template"))
    w.close()
    events = [event_pb2.Event.FromString(r) for r in event_file_loader.RawEventFileLoader(w.path).Load()][1:]
    assert len(list(event_file_loader.EventFileLoader(w.path).Load())) == 1 + len(events) == 1 + 40 * per_step
    assert sorted({e.step for e in events}) == list(range(40))
    values = [v for e in events for v in e.summary.value]
    assert all(v.tensor.tensor_content in written_by_callback[v.tag.rsplit("/", 1)[0]] for v in values)
    assert sorted(v.tag for v in values if v.HasField("metadata")) == sorted({v.tag for v in values})
    assert report_json(tmp_path / "long")["warnings"] == []


@pytest.mark.slow
def test_gpu_bench_smoke(tmp_path):
    """`bench/gpu.py --smoke` (on the CPU, tiny batch, the MLP): every figure present, the records equal the CPU's
    (here: the CPU's own, so within the bound), training bitwise unchanged under op determinism, its section
    written into an existing report whose other figures are kept."""
    out, figures_path = tmp_path / "PERFORMANCE.md", tmp_path / "gpu.json"
    out.write_text("# Performance\n\n### Old figures\n\nkept\n")
    command = [sys.executable, os.path.join(ROOT, "bench", "gpu.py"), "--smoke", "--models", "mlp"]
    proc = subprocess.run(
        command + ["--out", str(out), "--json", str(figures_path)], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    figures = json.loads(figures_path.read_text())
    assert figures["device"] and figures["smoke"] is True
    mlp = figures["models"]["mlp"]
    variants = {"every step", "every 10th", "per_example, every step"}
    assert set(mlp["loop"]) >= variants and set(mlp["fit"]) >= variants
    assert all(mlp[kind][k] > 0 for kind in ("loop", "fit") for k in variants)
    assert mlp["values"]["within"] and mlp["values"]["records"] > 0
    assert set(mlp["values"]["worst_over_bound"]) >= {"min", "max", "norm", "example_norm_max"}
    assert mlp["determinism"] == {"logger_runs_equal": True, "equal_without_logger": True}
    lines = out.read_text().splitlines()
    assert "### Old figures" in lines and "kept" in lines
    (row,) = [line for line in lines if line.startswith("| mlp |")]
    assert "(within)" in row and "runs equal, equal without" in row


@pytest.mark.slow
def test_reduction_pieces_smoke():
    """`bench/reduction_pieces.py --smoke` (one round of the MLP): a row per piece, each a time per element."""
    command = [sys.executable, os.path.join(ROOT, "bench", "reduction_pieces.py"), "--smoke"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.strip("|").split("|") for line in proc.stdout.splitlines() if line.startswith("| ")]
    pieces = {cells[0].strip(): cells[1:] for cells in rows if not cells[0].strip().startswith("piece")}
    assert {"statistics.reductions (as the step, counts only)", "histogram_fixed_width"} <= set(pieces), pieces
    assert all(float(cells[0]) > 0 for cells in pieces.values()), pieces
