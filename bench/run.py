"""One command for every benchmark figure; prints a table and writes docs/PERFORMANCE.md.

    python bench/run.py            # everything (quiet machine please)
    python bench/run.py --rounds 6 --skip-format --skip-sweep --skip-tab-sweep   # the training step and the tab;
                                   # the skipped parts' dated sections are kept
    python bench/run.py --smoke    # keeps the scripts working (CI: tests/test_bench_smoke.py)

How long each part takes, and so which flags fit a time slot: docs/DESIGN.md, "Benchmark notes"; the page's
header says what each part of its run took.

Figures:
- training-step overhead, plain step vs ours, MLP / CNN / LSTM, custom loop and
  fit(), capturing every layer every step and every 10 steps; beside it the
  same gradients through tf.summary.histogram (TensorBoard's path) and Keras'
  TensorBoard(histogram_freq=1) (weights only);
- event-file bytes per layer per step;
- per-example gradient norms (`per_example=True`, bench/per_example.py): MLP / CNN / Transformer block, custom
  loop, every step and every 10th;
- tab latency on a synthetic logdir (layers x steps x runs), both loaders, and
  TensorBoard's resident memory, with how they grow with steps and layers;
- the Runs view's `sweep` route on a synthetic sweep of 200 runs (bench/sweep_latency.py), both loaders.
  `--only-sweep` measures that alone and rewrites only its section of docs/PERFORMANCE.md;
- the tab at sweep scale in headless Chromium (bench/tab_sweep.py): the Compare view of 100 runs, its `compare`
  `depth` and `histograms_at` routes warm, the Runs view of 200 runs; `--only-tab-sweep` alone, its section only;
- a long run logged every step (bench/long_run.py, `--only-long-run`, its section only): TensorBoard's memory
  per byte on disk, route latency while the run is written, `load()` and `report` against TensorBoard's parser.
- the cost of `weights=True` in fit() (MLP, every layer every step) against `weights=False`; `--only-fit-weights`
  alone, its section only.
- the path without the fused kernel (TensorFlow's ops: every GPU, macOS, Windows, ARM, `TB_LAYERGRAD_FUSED=0`)
  against its targets, and the kernel beside it (where it still wins); `--only-no-kernel` alone, its section only.
- on a GPU: `bench/gpu.py` writes its own section (a full run here keeps it).
Ratios are medians over interleaved rounds of within-round ratios, in one process; fit() steps are timed
per batch inside each call, the first batches (tracing) excluded. A full run rewrites --out: every section it
measures names its date and command in its heading; of the old page it keeps only the sections it does not
measure that say where their figures come from (`kept_sections`: the JAX fit by bench/jax_fit.py, the long runs,
the GPU's, a skipped part's dated section), nothing else (no old header note, no section no command writes).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The custom loop of a model whose plain step is under 10 ms (the MLP) runs this many times the rounds.
SHORT_STEP_ROUNDS = 4
# fit() runs this many times the rounds, of epochs of ~0.5 s or 14 batches (docs/DESIGN.md, "Benchmark notes");
# a model whose plain step is under 10 ms (the MLP) SHORT_STEP_ROUNDS times more again (180).
FIT_ROUNDS = 3
# --smoke: one round everywhere (it only checks that the scripts run; its figures mean nothing), not the extra
# rounds that steady a figure: (SHORT_STEP_ROUNDS, FIT_ROUNDS) as --smoke uses them.
SMOKE_EXTRA_ROUNDS = (1, 1)
# The section of the cost of weights=True in fit(), and its target (issue: within 1.02x of weights=False).
WEIGHTS_HEADING = "### fit() with weights=True"
WEIGHTS_TARGET = 1.02
# The section of the path without the fused kernel, its targets (every step, per model; every 10th step), and the
# margin by which the kernel must beat it to be kept.
NO_KERNEL_HEADING = "### Without the fused kernel"
NO_KERNEL_TARGETS = {"mlp": 1.10, "cnn": 1.25, "lstm": 1.05}
NO_KERNEL_EVERY_10_TARGET = 1.03
KERNEL_MARGIN = 1.03
NO_KERNEL_VARIANTS = {
    "plain": "plain",
    "ops_1": "ours_every_1, TensorFlow ops (no fused kernel)",
    "ops_10": "ours_every_10, TensorFlow ops (no fused kernel)",
    "kernel_1": "ours_every_1",
    "kernel_10": "ours_every_10",
}
# The targets with the fused kernel, every step (per model; else 1.10x) and every 10th step, custom loop and fit().
EVERY_STEP_TARGETS = {"cnn": 1.50}
EVERY_10_TARGET = 1.03
# fit()'s variant that checks no step for NaN/Inf (bench/overhead.py's key).
FIT_NONFINITE_IGNORED = 'ours_every_10, on_nonfinite="ignore"'
# The targets of `per_example=True` every step (custom loop, ratio to the plain step).
PER_EXAMPLE_TARGETS = {"mlp": 1.20, "cnn": 1.50, "transformer": 1.20}
# The variants' keys (bench/overhead.py) as the page names them: in the public API's words. The custom loop logs
# through `summary.gradients` under `tf.summary.record_if`; fit() through `GradientLogger`'s arguments.
LOOP_LABELS = {
    "ours_every_1": "`summary.gradients` every step",
    "ours_every_10": "`summary.gradients` every 10th step",
    "ours_every_1, TensorFlow ops (no fused kernel)": "every step, `TB_LAYERGRAD_FUSED=0` (TensorFlow ops)",
    "ours_every_10, TensorFlow ops (no fused kernel)": "every 10th step, `TB_LAYERGRAD_FUSED=0` (TensorFlow ops)",
    "tf.summary.histogram_every_1": "`tf.summary.histogram` every step",
    "tf.summary.histogram_every_10": "`tf.summary.histogram` every 10th step",
}
FIT_LABELS = {
    "ours_every_1": "`GradientLogger(update_freq=1)`",
    "ours_every_10": "`update_freq=10`",
    'ours_every_10, on_nonfinite="ignore"': '`update_freq=10, on_nonfinite="ignore"`',
    "ours_every_1+activations": "`update_freq=1, activations=True`",
    "ours_every_10+activations": "`update_freq=10, activations=True`",
    "keras.TensorBoard(histogram_freq=1)": "`keras.callbacks.TensorBoard(histogram_freq=1)`",
}
# Sections a full run keeps where it does not write them, by heading (docs/PERFORMANCE.md): the GPU's, whose text
# names `bench/gpu.py`, and the per-example norms' (skipped), whose text names `bench/per_example.py`. Every other
# section kept names in its heading the date and command that measured it (`dated`, MEASURED): the JAX fit
# (bench/jax_fit.py), the long runs (`--only-long-run`), a part this run skipped.
KEPT_HEADINGS = ("### On a GPU", "### Per-example gradient norms")
# A heading that names when and with what its figures were measured (`dated`, the --only-* sections, bench/*.py).
MEASURED = re.compile(r"[(;] ?measured \d{4}-\d{2}-\d{2} with `[^`]+`")


def instruction_set() -> str:
    """The widest vector instruction set of the CPU, from /proc/cpuinfo's flags: targets hold on both AVX2 and
    AVX-512 machines (the fused kernel is built for the host's, TensorFlow's ops choose theirs at run time)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "instruction set unknown"
    if "avx512f" in flags:
        return "AVX-512"
    return "AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512"


def dated(heading: str, command: str, note: str = "") -> str:
    """`heading` (a `### ` line, with or without its trailing newline) saying when and with what it was measured
    (after `note`, if any): a section kept by a later run that skips its part still says where its figures come
    from."""
    end = "\n" if heading.endswith("\n") else ""
    return f"{heading.rstrip()} ({note}measured {datetime.date.today().isoformat()} with {command}){end}"


def machine() -> str:
    import keras
    import tensorboard
    import tensorflow as tf

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from tb_layergrad.kernel import fused as fused_kernel

    kernel = (
        "built and used" if fused_kernel.op() is not None else f"NOT available ({fused_kernel.unavailable_reason()})"
    )
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}; {instruction_set()}); "
        f"Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, TensorBoard {tensorboard.__version__}; "
        f"tb_layergrad's fused reduction kernel: {kernel}"
    )


def overhead_tables(
    models: List[str],
    rounds: int,
    block_seconds: float,
    fit_steps: int,
    figures: Dict,
    command: str,
    extra_rounds: Tuple[int, int] = (SHORT_STEP_ROUNDS, FIT_ROUNDS),
) -> List[str]:
    import overhead
    from models import MODELS

    lines = []
    loop_rows, fit_rows, byte_rows = [], [], []
    for name in models:
        logdir = overhead.new_logdir()
        base, ratios, per_round, loop_rounds = overhead.interleaved(
            overhead.custom_loop_variants(name, logdir), rounds, block_seconds, short_step_rounds=extra_rounds[0]
        )
        loop_rows.append((name, base, ratios))
        figures.setdefault("loop", {})[name] = ratios
        figures.setdefault("loop_rounds", {})[name] = (base, loop_rounds)
        model, x, _ = MODELS[name]()
        layers = len(model.layers)
        byte_rows.append(
            (
                name,
                layers,
                overhead.bytes_per_layer_step(
                    logdir, f"{name}_ours1", layers, loop_rounds * per_round + overhead.WARMUP_CALLS
                ),
            )
        )
        steps = overhead.fit_epoch_steps(max(fit_steps, int(block_seconds / base)))  # at least ~one block
        fit_rounds = rounds * extra_rounds[1] * (extra_rounds[0] if base < overhead.SHORT_STEP_S else 1)
        base_fit, ratios = overhead.interleaved_results(overhead.fit_variants(name, logdir, steps), fit_rounds)
        fit_rows.append((name, base_fit, ratios))
        figures.setdefault("fit", {})[name] = ratios
        shutil.rmtree(logdir, ignore_errors=True)
        print(f"  measured {name}", flush=True)

    def table(title: str, rows, labels: Dict[str, str]) -> None:
        keys = list(rows[0][2])
        lines.append(dated(f"### {title}\n", command))
        lines.append("| model | plain step | " + " | ".join(labels.get(k, k) for k in keys) + " |")
        lines.append("|---|---|" + "---|" * len(keys))
        for name, base, res in rows:
            lines.append(f"| {name} | {base * 1e3:.2f} ms | " + " | ".join(f"{res[k]:.2f}x" for k in keys) + " |")
        lines.append("")

    table("Custom training loop (tf.function step), ratio to the plain step", loop_rows, LOOP_LABELS)
    table("model.fit(), ratio to fit() without callbacks", fit_rows, FIT_LABELS)
    lines.append(dated("### Event-file bytes per layer per logged step (histogram + stats records)\n", command))
    lines.append("| model | layers | bytes / layer / step |")
    lines.append("|---|---|---|")
    for name, layers, b in byte_rows:
        lines.append(f"| {name} | {layers} | {b:.0f} |")
    lines.append("")
    return lines


def weights_tables(
    rounds: int,
    block_seconds: float,
    fit_steps: int,
    figures: Dict,
    command: str,
    extra_rounds: Tuple[int, int] = (SHORT_STEP_ROUNDS, FIT_ROUNDS),
) -> List[str]:
    """The section of the cost of `weights=True` in fit(): the MLP (the shortest step, where a fixed cost shows
    most), every layer every step, against the same logger with `weights=False`, interleaved in one process; the
    CPU time beside it, and the fused kernel's reduction of the weight gradients alone (what the added time is)."""
    import overhead
    import tensorflow as tf

    logdir = overhead.new_logdir()
    try:
        probe = overhead.weights_fit_variants("mlp", logdir, overhead.fit_epoch_steps(fit_steps))["plain"]
        probe()  # traced: the next call times a warm step
        base = probe()
        steps = overhead.fit_epoch_steps(max(fit_steps, int(block_seconds / base)))
        # The MLP's step is a short one (SHORT_STEP_ROUNDS more rounds) even where a loaded machine makes the probe
        # read more than SHORT_STEP_S: under load a ratio needs more rounds, not fewer.
        fit_rounds = rounds * extra_rounds[1] * extra_rounds[0]
        start_load = os.getloadavg()[0]
        variants = overhead.weights_fit_variants("mlp", logdir, steps)
        step, ratios = overhead.interleaved_results(variants, fit_rounds)
        cpu_ratios = overhead.paired_cpu(variants)
        step_cpu = float(np.median(variants["weights=False"].cpu))
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    ratio = ratios["weights=True"]
    figures["fit_weights"] = ratio
    from models import MODELS

    model, x, _ = MODELS["mlp"]()
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    outputs = int(x.shape[0]) * sum(int(layer.units) for layer in model.layers)
    # The kernel's reduction of tensors of the weight gradients' and the layer outputs' shapes, alone (its time
    # does not depend on the values of clean data).
    weight_grads = [tf.random.normal(v.shape) * 0.01 for v in model.trainable_variables]
    output_grads = [tf.random.normal([int(x.shape[0]), int(layer.units)]) * 0.01 for layer in model.layers]
    weights_alone = overhead.reduction_cpu_seconds(weight_grads)
    outputs_alone = overhead.reduction_cpu_seconds(output_grads)
    extra_cpu = (cpu_ratios["weights=True"] - 1) * step_cpu
    cpu_ratio = cpu_ratios["weights=True"]
    # The target is on the step's time; on a shared machine that also holds the waits for a core, which can hide
    # the work added: met only where the CPU time says so too.
    met = "met" if ratio <= WEIGHTS_TARGET and cpu_ratio <= WEIGHTS_TARGET else "NOT met"
    hidden = (
        "The step's time reads within the target where its CPU time does not: the waits for a core of a shared "
        "machine hide the work added; re-measure on a quiet one. "
        if ratio <= WEIGHTS_TARGET < cpu_ratio
        else ""
    )
    return [
        f"{WEIGHTS_HEADING}: mlp, all layers every step, ratio to `weights=False` "
        f"(measured {datetime.date.today().isoformat()} with {command})\n",
        f"| model | step, weights=False | weights=True (target <= {WEIGHTS_TARGET:.2f}x) | CPU time, weights=True "
        "| weights=False / plain fit() |",
        "|---|---|---|---|---|",
        f"| mlp | {step * 1e3:.2f} ms | {ratio:.3f}x ({met}) | {cpu_ratio:.3f}x | {1 / ratios['plain']:.2f}x |",
        "",
        f"Medians over {fit_rounds} interleaved rounds of within-round ratios, epochs of {steps} batches "
        "(the first batches, tracing, not timed); CPU time: the process's (all threads), per batch, the same rounds. "
        "`weights=True` records the gradients the step's own gradient call returned: what it adds is the weights' "
        "records (their reductions and writes), no backward pass. The MLP's "
        f"weight gradients hold {params:,} elements, its layer-output gradients {outputs:,} (batch {int(x.shape[0])}): "
        f"`weights=True` reduces {(params + outputs) / outputs:.1f}x the elements `weights=False` does, every step.",
        "",
        f"What the added CPU time is made of: {extra_cpu * 1e6:.0f} us per step "
        f"(weights=False: {step_cpu * 1e3:.2f} ms CPU per step), of which the fused kernel's reduction of the "
        f"weight gradients alone takes {weights_alone * 1e6:.0f} us "
        f"({weights_alone / step_cpu * 100:.1f}% of the step; {weights_alone / params * 1e9:.2f} ns per element, "
        f"two reads, one thread, in a loop over the same tensors; the layer outputs' {outputs_alone * 1e6:.0f} us), "
        f"the rest ({(extra_cpu - weights_alone) * 1e6:.0f} us) the same reduction inside the step rather than in "
        "that loop, the weights' group of records (its writes, its first-non-finite and metadata bookkeeping: about "
        "1% of the step in docs/DESIGN.md's A/B) and the noise of a shared machine. "
        f"{hidden}Load average (1 min) at the start {start_load:.1f}, at the end {os.getloadavg()[0]:.1f}: the machine may "
        'be shared. Why the target is not met, and what was tried: docs/DESIGN.md, "The cost of weights=True".',
        "",
    ]


def no_kernel_tables(
    models: List[str],
    rounds: int,
    block_seconds: float,
    figures: Dict,
    command: str,
    extra_rounds: Tuple[int, int] = (SHORT_STEP_ROUNDS, FIT_ROUNDS),
) -> List[str]:
    """The section of the path without the fused kernel: custom loop, every layer, every step and every 10th, through
    TensorFlow's ops and through the kernel, interleaved with the plain step in one process per model."""
    import overhead

    start_load = os.getloadavg()[0]
    rows = []
    for name in models:
        every = overhead.custom_loop_variants(name, overhead.new_logdir())
        variants = {short: every[key] for short, key in NO_KERNEL_VARIANTS.items()}
        base, ratios, _, done = overhead.interleaved(variants, rounds, block_seconds, short_step_rounds=extra_rounds[0])
        rows.append((name, base, ratios, done))
        print(f"  measured {name}: {ratios}", flush=True)
    return no_kernel_section(rows, figures, command, start_load)


def no_kernel_section(
    rows: List[Tuple[str, float, Dict[str, float], int]], figures: Dict, command: str, start_load: float
) -> List[str]:
    """The no-kernel section's lines from (model, plain step s, {NO_KERNEL_VARIANTS key: ratio}, rounds) rows: those
    of `--only-no-kernel`, or the custom loop's of a full run (the same variants, measured in that one process)."""
    figures["no_kernel"] = {name: ratios for name, _, ratios, _ in rows}

    def judged(value: float, target: float) -> str:
        return f"{value:.2f}x (target <= {target:.2f}x, {'met' if value <= target else 'NOT met'})"

    lines = [
        f"{NO_KERNEL_HEADING} (TensorFlow's ops, as with `TB_LAYERGRAD_FUSED=0`): custom loop, all layers, ratio to the "
        f"plain step (measured {datetime.date.today().isoformat()} with {command})\n",
        "| model | plain step | TensorFlow ops, every step | TensorFlow ops, every 10th step | fused kernel, every step "
        "| fused kernel, every 10th step | TensorFlow ops / fused kernel, every step |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, base, r, _ in rows:
        margin = r["ops_1"] / r["kernel_1"]
        verdict = "the kernel wins" if margin > KERNEL_MARGIN else "the kernel does not win"
        lines.append(
            f"| {name} | {base * 1e3:.2f} ms | {judged(r['ops_1'], NO_KERNEL_TARGETS.get(name, 1.10))} | "
            f"{judged(r['ops_10'], NO_KERNEL_EVERY_10_TARGET)} | {r['kernel_1']:.2f}x | {r['kernel_10']:.2f}x | "
            f"{margin:.2f} ({verdict} by more than {(KERNEL_MARGIN - 1) * 100:.0f}%: {'yes' if margin > KERNEL_MARGIN else 'no'}) |"
        )
    lines += [
        "",
        f"Medians of within-round ratios over {', '.join(f'{n}: {d}' for n, _, _, d in rows)} interleaved rounds, in "
        "one process per model; the TensorFlow-ops variants are traced with the kernel disabled, which is what "
        "`TB_LAYERGRAD_FUSED=0`, a GPU, macOS, Windows or ARM get. Load average (1 min) at the start "
        f"{start_load:.1f}, at the end {os.getloadavg()[0]:.1f}: the machine may be shared. The kernel is kept where "
        "it wins by more than 3%; why TensorFlow's ops do not reach these targets on a CPU (one kernel per figure and "
        "per tensor already costs about what the fused kernel does on the MLP, more on the CNN): docs/DESIGN.md, "
        '"Reductions".',
        "",
    ]
    return lines


def kept_sections(old_text: str, new_lines: List[str]) -> List[str]:
    """The sections of the report `old_text` that `new_lines` do not hold and that say where their figures come
    from, so a full run keeps them: those whose heading names the date and command that measured them (`dated`;
    bench/jax_fit.py's JAX fit, `--only-long-run`'s long runs, dated records of earlier versions, a part this run
    skipped) and those of KEPT_HEADINGS. Any other text of the old report (its header, a section no command
    writes any more) is not kept: the page holds no stale figures.

    A section is its `### ` heading up to the next one; two are the same section when their headings agree up to
    the first ":" or " (", the part that names what was measured (the rest holds sizes, dates and notes)."""

    def key(heading: str) -> str:
        cuts = [i for i in (heading.find(":"), heading.find(" (")) if i >= 0]
        return heading[: min(cuts)] if cuts else heading

    written = {key(part) for line in new_lines for part in line.split("\n") if part.startswith("### ")}
    kept: List[str] = []
    keep = False
    for line in old_text.rstrip("\n").split("\n"):
        if line.startswith("### "):
            says_where = bool(MEASURED.search(line)) or line.startswith(KEPT_HEADINGS)
            keep = key(line) not in written and says_where
        if keep:
            kept.append(line)
    if kept and kept[-1] != "":
        kept.append("")
    return kept


def per_example_tables(models: List[str], rounds: int, block_seconds: float, figures: Dict, command: str) -> List[str]:
    """The cost of `per_example=True` against a plain step (bench/per_example.py), as a table, its targets judged."""
    import per_example

    rows = per_example.measure(models, rounds, block_seconds)
    figures["per_example"] = {name: ratios for name, _, ratios in rows}
    heading, *lines = per_example.table(rows)
    judged = [
        f"{name} {ratios['per_example, every step']:.2f}x (target <= {PER_EXAMPLE_TARGETS[name]:.2f}x, "
        f"{'met' if ratios['per_example, every step'] <= PER_EXAMPLE_TARGETS[name] else 'NOT met'})"
        for name, _, ratios in rows
        if name in PER_EXAMPLE_TARGETS
    ]
    return [dated(heading, command), *lines, f"`per_example=True` every step: {', '.join(judged)}.", ""]


def synthetic(runs: int, layers: int, steps: int, version: int) -> str:
    """A new temporary logdir of `runs` synthetic runs (bench/synthetic_logdir.py) in format `version`.

    Written once, copied: latency does not depend on the numbers, and writing is most of the time.
    """
    import synthetic_logdir

    logdir = tempfile.mkdtemp(prefix=f"layergrad_synth_v{version}_")
    synthetic_logdir.write_run(os.path.join(logdir, "run_0"), layers, steps, seed=0, format_version=version)
    for r in range(1, runs):
        shutil.copytree(os.path.join(logdir, "run_0"), os.path.join(logdir, f"run_{r}"))
    return logdir


def sweep_tables(size: tuple, loaders: List[str], figures: Dict, command: str) -> List[str]:
    import sweep_latency

    results, lines = sweep_latency.section(size, loaders, command)
    figures["sweep"] = results
    return lines


def tab_sweep_tables(smoke: bool, loaders: List[str], figures: Dict, command: str) -> List[str]:
    import tab_sweep

    size, compare_runs = (
        (tab_sweep.SMOKE_SIZE, tab_sweep.SMOKE_COMPARE_RUNS) if smoke else (tab_sweep.SIZE, tab_sweep.COMPARE_RUNS)
    )
    results, lines = tab_sweep.section(size, compare_runs, loaders, command)
    figures["tab_sweep"] = results
    return lines


def tab_tables(sizes: List[tuple], loaders: List[str], figures: Dict, command: str) -> List[str]:
    import tab_latency

    lines = [
        dated(
            "### Tab latency (warm, median), real tensorboard process, synthetic logdir (format version 2)\n", command
        )
    ]
    lines.append(
        "| runs x layers x steps | loader | load time | listing | flow matrix | layer detail | 3-run compare | TensorBoard RSS |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for runs, layers, steps in sizes:
        logdir = synthetic(runs, layers, steps, 2)
        for loader in loaders:
            m = tab_latency.measure(logdir, runs, layers, steps, loader)
            figures.setdefault("tab", {})[(runs, layers, steps, loader)] = m
            name = {"true": "Rust (--load_fast=true)", "false": "Python (--load_fast=false)"}[loader]
            lines.append(
                f"| {runs} x {layers} x {steps} | {name} | {m['load_s']:.0f} s | {m['listing_s'] * 1e3:.0f} ms | "
                f"{m['matrix_s'] * 1e3:.0f} ms | {m['layer_detail_s'] * 1e3:.0f} ms | {m['compare_s'] * 1e3:.0f} ms | "
                f"{m['rss_mb']:.0f} MB |"
            )
            print("  " + lines[-1], flush=True)
        shutil.rmtree(logdir, ignore_errors=True)
    lines.append("")
    return lines


# The three large-logdir sizes: (runs, layers, steps); the first is a real fit() at GradientLogger's defaults.
FORMAT_SIZES = [(1, 100, 4000), (3, 200, 5000), (1, 50, 100_000)]
SMOKE_FORMAT_SIZES = [(1, 4, 20), (2, 4, 20), (1, 3, 60)]
# Version 1 of the largest size (10 million records) is left out: TensorBoard's Python loader grows past 21 GB
# on it (this machine has 23) and the Rust one's answers exceed gRPC's 256 MiB.
V1_MAX_RECORDS = 9_000_000
# The tab asks for about as many bins as the heatmap has pixels.
TAB_POINTS = 1000


def format_tables(sizes: List[tuple], loaders: List[str], figures: Dict, command: str) -> List[str]:
    """Bytes by part of a real fit() (the format written, version 2), then format versions 1 and 2 side by side
    in TensorBoard (version 1 laid out by `synthetic_logdir`, as older logdirs hold it): start-up, load time,
    memory and the routes, per size and loader."""
    import format_bytes
    import tab_latency

    real, *others = sizes
    lines = [
        dated(
            f"### Event-file bytes of fit() with GradientLogger's defaults: {real[1]} Dense layers, {real[2]} "
            "steps, every step, format version 2 (the one written)\n",
            command,
        )
    ]
    lines.append("| bytes / layer / step | " + " | ".join(format_bytes.PARTS) + " | fit() time |")
    lines.append("|---|" + "---|" * (len(format_bytes.PARTS) + 1))
    logdir = tempfile.mkdtemp(prefix="layergrad_fit_v2_")
    seconds = format_bytes.write_fit_logdir(logdir, real[1], real[2])
    parts = format_bytes.bytes_by_part(logdir)
    per = real[1] * real[2]
    figures.setdefault("format_bytes", {})[2] = sum(parts.values()) / per
    lines.append(
        f"| {sum(parts.values()) / per:.0f} | "
        + " | ".join(f"{parts[k] / per:.1f}" for k in format_bytes.PARTS)
        + f" | {seconds:.0f} s |"
    )
    print("  " + lines[-1], flush=True)
    logdirs = [(real, 2, logdir, real[2])]  # GradientLogger's steps are 1..steps
    for runs, layers, steps in others:
        for version in (1, 2):
            if version == 1 and runs * layers * steps * 2 > V1_MAX_RECORDS:
                continue
            logdirs.append(((runs, layers, steps), version, synthetic(runs, layers, steps, version), steps - 1))
    lines += [
        "",
        dated(
            "### Format versions 1 and 2 in TensorBoard: start-up, load, memory, routes (warm medians; first "
            "requests; version 1 as earlier releases wrote it, read by today's plugin)\n",
            command,
        ),
        "| runs x layers x steps | version | loader | start-up | loaded after start-up | statistics read ahead after "
        "loading | RSS | listing | flow matrix (first) | layer stats | anomalies | 3-run compare | slowest first "
        "request, read ahead | slowest first request, nothing read ahead |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (runs, layers, steps), version, logdir, last in logdirs:
        for loader in loaders:
            points = TAB_POINTS if steps > TAB_POINTS else None
            name = {"true": "Rust", "false": "Python"}[loader]
            try:
                m = tab_latency.measure(logdir, runs, layers, steps, loader, last_step=last, points=points)
            except Exception as e:  # noqa: BLE001 - one case failing must not lose the others' figures
                lines.append(
                    f"| {runs} x {layers} x {steps} | {version} | {name} | failed: {type(e).__name__}: "
                    f"{str(e)[:120]} |" + " |" * 11
                )
                print("  " + lines[-1], flush=True)
                continue
            figures.setdefault("format_tab", {})[(runs, layers, steps, version, loader)] = m
            if version == 2:  # the default format: also what the tab's targets are read from
                figures.setdefault("tab", {})[(runs, layers, steps, loader)] = m
            ms = lambda v: f"{v * 1e3:.0f} ms"  # noqa: E731
            lines.append(
                f"| {runs} x {layers} x {steps} | {version} | {name} | {m['startup_s']:.1f} s | "
                f"{m['load_s'] - m['startup_s']:.1f} s | {m['read_ahead_s']:.1f} s | {m['rss_mb']:.0f} MB | {ms(m['listing_s'])} | "
                f"{ms(m['matrix_s'])} ({ms(m['matrix_cold_s'])}) | {ms(m['layer_stats_s'])} | {ms(m['anomalies_s'])} | "
                f"{ms(m['compare_s'])} | {ms(m['slowest_cold_s'])} | {ms(m['slowest_cold_unread_s'])} |"
            )
            print("  " + lines[-1], flush=True)
        shutil.rmtree(logdir, ignore_errors=True)
    lines.append("")
    return lines


def format_targets(figures: Dict, sizes: List[tuple], command: str) -> List[str]:
    """The large-logdir targets next to what this run measured, the tab's (warm medians) among them."""
    rows = []
    got = figures.get("format_bytes", {}).get(2)
    if got is not None:
        rows.append(
            f"| {sizes[0][1]} layers x {sizes[0][2]} steps, defaults: bytes / layer / step | <= 320 | {got:.0f} | "
            f"{'met' if got <= 320 else 'NOT met'} |"
        )
    tab = figures.get("format_tab", {})
    for key, limit, what in (
        ((*sizes[0], 2, "true"), 3.5, "loaded after start-up"),
        ((*sizes[1], 2, "true"), 11, "loaded after start-up"),
    ):
        m = tab.get(key)
        if m is not None:
            v = m["load_s"] - m["startup_s"]
            rows.append(
                f"| {key[0]} x {key[1]} x {key[2]}, Rust: {what} | <= {limit} s | {v:.1f} s | {'met' if v <= limit else 'NOT met'} |"
            )
    for key, limit in (((*sizes[0], 2, "true"), 1100), ((*sizes[1], 2, "true"), 2500)):
        m = tab.get(key)
        if m is not None:
            rows.append(
                f"| {key[0]} x {key[1]} x {key[2]}, Rust: TensorBoard RSS | <= {limit} MB | {m['rss_mb']:.0f} MB | "
                f"{'met' if m['rss_mb'] <= limit else 'NOT met'} |"
            )
    for loader in ("true", "false"):
        m = tab.get((*sizes[2], 2, loader))
        if m is not None:
            worst = max(m["matrix_s"], m["layer_stats_s"], m["anomalies_s"], m["compare_s"], m["listing_s"])
            what = f"{sizes[2][0]} x {sizes[2][1]} x {sizes[2][2]}, {'Rust' if loader == 'true' else 'Python'}"
            rows.append(
                f"| {what}: slowest route (warm median) | <= 2 s | {worst:.2f} s | {'met' if worst <= 2 else 'NOT met'} |"
            )
            cold = m["slowest_cold_s"]
            rows.append(
                f"| {what}: slowest first request, statistics read ahead ({m['read_ahead_s']:.1f} s after "
                f"loading) | <= 2 s | {cold:.2f} s | {'met' if cold <= 2 else 'NOT met'} |"
            )
            rows.append(
                f"| {what}: slowest first request right after loading, nothing read ahead "
                f"(`--layergrad_prefetch=false`) | – | {m['slowest_cold_unread_s']:.2f} s | – |"
            )
    for loader in ("true", "false"):  # the tab's targets, at the second size (the format written)
        m = tab.get((*sizes[1], 2, loader))
        if m is None:
            continue
        for field, what, limit in (
            ("matrix_s", "flow matrix", 1.0),
            ("layer_detail_s", "layer detail", 0.3),
            ("listing_s", "listing", 0.2),
        ):
            rows.append(
                f"| tab {sizes[1][0]}x{sizes[1][1]}x{sizes[1][2]}, {'Rust' if loader == 'true' else 'Python'} loader: "
                f"{what} | < {limit * 1e3:.0f} ms | {m[field] * 1e3:.0f} ms | {'met' if m[field] < limit else 'NOT met'} |"
            )
    if not rows:
        return []
    return [
        dated("### Targets for large logdirs, and this run\n", command),
        "| figure | target | measured | |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


def target_table(figures: Dict, command: str) -> List[str]:
    """The training-step targets next to what this run measured (ratios to a plain step): with the fused kernel,
    without it (`TB_LAYERGRAD_FUSED=0`, what a GPU, macOS, Windows and ARM run), and `per_example=True`."""
    rows = []

    def row(what: str, target: Optional[float], value: Optional[float]) -> None:
        """The ratio `value` against `target` (at most it); without a target (or a value), shown, not judged. A value
        that reads as the target to two places gets three: "1.03x ... NOT met" would read as a contradiction."""
        shown = "–" if value is None else f"{value:.2f}x"
        if value is not None and target is not None and f"{value:.2f}" == f"{target:.2f}":
            shown = f"{value:.3f}x"
        if target is None or value is None:
            rows.append(f"| {what} | – | {shown} | – |")
        else:
            rows.append(f"| {what} | <= {target:.2f}x | {shown} | {'met' if value <= target else 'NOT met'} |")

    for name, r in figures.get("loop", {}).items():
        what = f"custom loop, {name}"
        row(f"{what}, {LOOP_LABELS['ours_every_1']}", EVERY_STEP_TARGETS.get(name, 1.10), r.get("ours_every_1"))
        row(f"{what}, {LOOP_LABELS['ours_every_10']}", EVERY_10_TARGET, r.get("ours_every_10"))
        for key, label in (
            ("floor: our records, unreduced", "every step: our records written, nothing reduced (floor)"),
            ("floor: our records as one event per step", "every step: the same records as one event per step (floor)"),
            (
                "floor + one kernel per statistic",
                "every step: + one TensorFlow kernel per statistic and the histogram (floor)",
            ),
        ):
            if key in r:
                row(f"{what}, {label}", None, r[key])
        # Without the fused kernel: TensorFlow's ops, the path of a GPU, macOS, Windows, ARM.
        for key, target in (
            ("ours_every_1, TensorFlow ops (no fused kernel)", NO_KERNEL_TARGETS.get(name, 1.10)),
            ("ours_every_10, TensorFlow ops (no fused kernel)", NO_KERNEL_EVERY_10_TARGET),
        ):
            if key in r:
                row(f"{what}, {LOOP_LABELS[key]}", target, r[key])
    for name, r in figures.get("fit", {}).items():
        what = f"fit(), {name}"
        # The schedule alone; by default every step is also checked for NaN/Inf (the observing step runs always).
        row(
            f'{what}, `GradientLogger(update_freq=10, on_nonfinite="ignore")`',
            EVERY_10_TARGET,
            r.get(FIT_NONFINITE_IGNORED),
        )
        row(f"{what}, `GradientLogger(update_freq=10)` (every step checked for NaN/Inf)", None, r.get("ours_every_10"))
        row(f"{what}, `GradientLogger(update_freq=1, activations=True)`", None, r.get("ours_every_1+activations"))
        row(f"{what}, `GradientLogger(update_freq=1)`", EVERY_STEP_TARGETS.get(name, 1.10), r.get("ours_every_1"))
    cnn = figures.get("loop", {}).get("cnn")
    if cnn:
        ours, hist = cnn["ours_every_1"] - 1, cnn["tf.summary.histogram_every_1"] - 1
        factor = hist / ours if ours > 0 else float("inf")
        rows.append(
            f"| custom loop, cnn: overhead of `tf.summary.histogram` / ours, every step | >= 5 | {factor:.1f} | "
            f"{'met' if factor >= 5 else 'NOT met'} |"
        )
    for name, r in figures.get("per_example", {}).items():
        row(
            f"custom loop, {name}, `capture(weights=True, per_example=True)` every step",
            PER_EXAMPLE_TARGETS.get(name),
            r.get("per_example, every step"),
        )
    if not rows:
        return []
    return [
        dated("### Targets for the training step, and this run\n", command, f"CPU: {instruction_set()}; "),
        "| figure | target | measured | |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


# What the rows of the tables mean; how the figures are taken and what they decided: docs/DESIGN.md.
READING = """### Reading the figures

- *limit: one read per tensor* reads every captured tensor once and writes nothing: the floor of any
  logging that looks at each value.
- *floor: our records, unreduced* writes the same records as ours (a histogram and a stats record per
  layer) with constant contents through `tf.summary.write`, behind one recording condition: what the
  on-disk format costs through TensorFlow's own summary ops. Ours writes its records from one op that
  takes the recording condition as an input, so it can come in under this floor.
- *floor: our records as one event per step* writes the same records as one event per step.
- *floor + min, max, histogram_fixed_width* adds the cheapest histogram TensorFlow has (its range and
  its counts); *floor + one kernel per statistic* adds one TensorFlow kernel for each figure the stats
  record holds (sum, sum of squares, min, max, sum of |x|, non-zero count): the records with nothing but
  the kernels they need, no path choice, no NaN/Inf handling, no edges. Ours minus this floor is what the
  exact, NaN-safe epilogue costs; this floor minus the first is what the statistics cost.
- Custom loop: *`summary.gradients` every 10th step* writes under `tf.summary.record_if(step % 10 == 0)`.
- *`TB_LAYERGRAD_FUSED=0` (TensorFlow ops)*: ours where the fused kernel is not used (that variable, a GPU,
  macOS, Windows, ARM, no C++ compiler). *Without the fused kernel* sets that path against its targets, with
  the kernel beside it: the fused kernel is kept where TensorFlow's ops take more than 3% longer than it
  every step.
- fit(): *`GradientLogger(update_freq=N)`* with its defaults also checks every step for a NaN/Inf (the
  observing step runs at every step); *`on_nonfinite="ignore"`* runs Keras' own step on the steps that
  write nothing; *`activations=True`* also logs the layer outputs.
- Route timings are medians of 11 warm requests. The machine may be shared: compare ratios within one run.

How the figures are taken (interleaving, rounds, epochs) and the decisions they led to, with their
measurements: [docs/DESIGN.md](DESIGN.md), "Benchmark notes" and "Reading side".
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: only checks the scripts run")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-tab", action="store_true")
    parser.add_argument(
        "--skip-per-example", action="store_true", help="skip the per-example norms' cost (bench/per_example.py)"
    )
    parser.add_argument("--skip-format", action="store_true", help="skip format versions 1 vs 2 (bytes, load, memory)")
    parser.add_argument("--skip-sweep", action="store_true", help="skip the Runs view's sweep route (200 runs)")
    parser.add_argument(
        "--only-sweep",
        action="store_true",
        help="measure only the sweep route and rewrite only its section of --out (the other figures are kept)",
    )
    parser.add_argument(
        "--skip-tab-sweep", action="store_true", help="skip the tab at sweep scale in Chromium (bench/tab_sweep.py)"
    )
    parser.add_argument(
        "--only-tab-sweep",
        action="store_true",
        help="measure only the tab at sweep scale and rewrite only its section of --out (the other figures are kept)",
    )
    parser.add_argument(
        "--only-long-run",
        action="store_true",
        help="measure only a long run logged every step (bench/long_run.py: memory, live latency, load() and "
        "report) and rewrite only its section of --out",
    )
    parser.add_argument("--long-run-steps", type=int, default=100_000, help="steps of --only-long-run's run")
    parser.add_argument(
        "--only-fit-weights",
        action="store_true",
        help="measure only the cost of weights=True in fit() and rewrite only its section of --out",
    )
    parser.add_argument(
        "--only-no-kernel",
        action="store_true",
        help="measure only the path without the fused kernel (custom loop) and rewrite only its section of --out",
    )
    parser.add_argument("--models", help="comma-separated subset of mlp,cnn,lstm (default: all)")
    parser.add_argument(
        "--rounds",
        type=int,
        help="interleaved rounds (default 15; x3 for fit(); x4 more when the plain step is under 10 ms; smoke 1, no x)",
    )
    parser.add_argument(
        "--out", default=os.path.join(ROOT, "docs", "PERFORMANCE.md"), help="where to write the report ('-' for none)"
    )
    args = parser.parse_args()

    extra_rounds = (SHORT_STEP_ROUNDS, FIT_ROUNDS)
    if args.smoke:
        models, rounds, block_seconds, fit_steps = ["mlp"], 1, 0.01, 8
        extra_rounds = SMOKE_EXTRA_ROUNDS
        sizes, loaders = [(3, 4, 20)], ["false"]
        format_sizes = SMOKE_FORMAT_SIZES
    else:
        models, rounds, block_seconds, fit_steps = ["mlp", "cnn", "lstm"], 15, 0.5, 14
        sizes = [(3, 50, 1000), (3, 200, 1000)]  # and 3 x 200 x 5000 in both format versions (format_tables)
        loaders = ["true", "false"]
        format_sizes = FORMAT_SIZES
    import sweep_latency

    sweep_size = sweep_latency.SMOKE_SIZE if args.smoke else sweep_latency.SIZE
    if args.only_sweep:  # both loaders, then only this section of --out is rewritten
        command = f"`python bench/run.py --only-sweep{' --smoke' if args.smoke else ''}`"
        sweep_latency.rewrite(args.out, sweep_latency.section(sweep_size, ["true", "false"], command)[1])
        return
    if args.only_tab_sweep:  # both loaders, then only this section of --out is rewritten
        import tab_sweep

        command = f"`python bench/run.py --only-tab-sweep{' --smoke' if args.smoke else ''}`"
        lines = tab_sweep_tables(args.smoke, ["true", "false"], {}, command)
        sweep_latency.rewrite(args.out, lines, tab_sweep.HEADING)
        return
    if args.only_long_run:  # both loaders, then only this section of --out is rewritten
        import long_run

        steps = long_run.SMOKE["steps"] if args.smoke else args.long_run_steps
        command = f"`python bench/run.py --only-long-run{' --smoke' if args.smoke else f' --long-run-steps {steps}'}`"
        live = long_run.SMOKE if args.smoke else {"rate": 500, "readers": 16, "live_s": 60.0}
        template_dir = os.path.join(tempfile.gettempdir(), "tb_layergrad_long_template")
        _, lines = long_run.section(
            steps, ["true", "false"], command, live["rate"], live["readers"], live["live_s"], template_dir
        )
        sweep_latency.rewrite(args.out, lines, long_run.HEADING)
        return
    if args.only_fit_weights:  # only this section of --out is rewritten
        command = f"`python bench/run.py --only-fit-weights{' --smoke' if args.smoke else ''}`"
        lines = weights_tables(args.rounds or rounds, block_seconds, fit_steps, {}, command, extra_rounds)
        print("\n".join(lines), flush=True)
        sweep_latency.rewrite(args.out, lines, WEIGHTS_HEADING)
        return
    if args.models:
        models = args.models.split(",")
    if args.only_no_kernel:  # only this section of --out is rewritten
        command = f"`python bench/run.py --only-no-kernel{' --smoke' if args.smoke else ''}"
        command += f"{f' --rounds {args.rounds}' if args.rounds else ''}`"
        lines = no_kernel_tables(models, args.rounds or rounds, block_seconds, {}, command, extra_rounds)
        print("\n".join(lines), flush=True)
        sweep_latency.rewrite(args.out, lines, NO_KERNEL_HEADING)
        return
    if args.rounds:
        rounds = args.rounds
    flags = f"{' --smoke' if args.smoke else ''}{f' --rounds {args.rounds}' if args.rounds else ''}"
    flags += f" --models {args.models}" if args.models else ""
    command = f"`python bench/run.py{flags}`"  # what re-measures a section this run writes
    lines = [
        "# Performance",
        "",
        f"Measured {datetime.date.today().isoformat()} with {command} on: {machine()}.",
        "",
    ]
    start_load = os.getloadavg()[0]
    figures: Dict = {}
    body: List[str] = []
    took: Dict[str, float] = {}  # seconds per part: what the coordinator of a full run plans with

    def part(name: str, measure: Callable[[], List[str]]) -> List[str]:
        start = time.perf_counter()
        out = measure()
        took[name] = time.perf_counter() - start
        print(f"  {name}: {took[name]:.0f} s", flush=True)
        return out

    if not args.skip_overhead:
        body += part(
            "overhead",
            lambda: overhead_tables(models, rounds, block_seconds, fit_steps, figures, command, extra_rounds),
        )
        body += part(
            "fit weights", lambda: weights_tables(rounds, block_seconds, fit_steps, figures, command, extra_rounds)
        )
        rows = [  # the custom loop's own variants, measured above in one process per model
            (
                name,
                base,
                {short: figures["loop"][name][key] for short, key in list(NO_KERNEL_VARIANTS.items())[1:]},
                done,
            )
            for name, (base, done) in figures["loop_rounds"].items()
        ]
        body += no_kernel_section(rows, figures, command, start_load)
    if not args.skip_per_example:
        per_example_models = ["mlp"] if args.smoke else ["mlp", "cnn", "transformer"]
        body += part(
            "per-example", lambda: per_example_tables(per_example_models, rounds, block_seconds, figures, command)
        )
    if not args.skip_tab:
        body += part("tab", lambda: tab_tables(sizes, loaders, figures, command))
    if not args.skip_format:
        body += part("format", lambda: format_tables(format_sizes, loaders, figures, command))
    if not args.skip_sweep:
        body += part("sweep", lambda: sweep_tables(sweep_size, loaders, figures, command))
    if not args.skip_tab_sweep:
        body += part("tab sweep", lambda: tab_sweep_tables(args.smoke, loaders, figures, command))
    lines += format_targets(figures, format_sizes, command) + target_table(figures, command) + body
    if args.out != "-" and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            lines += kept_sections(f.read(), lines + [READING])
    if not args.smoke:
        lines.append(READING)
    lines.insert(
        3,
        f"Load average (1 min) at the start {start_load:.1f}, at the end {os.getloadavg()[0]:.1f}: "
        "ratios are medians over rounds of within-round ratios, but a busy machine still adds noise. The run took "
        f"{sum(took.values()) / 60:.0f} min ({', '.join(f'{k} {v / 60:.1f}' for k, v in took.items())}). Sections "
        "measured by other commands say which in their heading.\n",
    )
    text = "\n".join(lines)
    print(text)
    if args.out != "-":
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
