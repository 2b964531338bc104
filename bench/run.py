"""One command for every benchmark figure; prints a table and writes docs/PERFORMANCE.md.

    python bench/run.py            # the full run (tens of minutes; quiet machine please)
    python bench/run.py --smoke    # seconds: keeps the scripts working (CI runs this)

Figures:
- training-step overhead, plain step vs ours, MLP / CNN / LSTM, custom loop and
  fit(), capturing every layer every step and every 10 steps; beside it the
  same gradients through tf.summary.histogram (TensorBoard's path) and Keras'
  TensorBoard(histogram_freq=1) (weights only);
- event-file bytes per layer per step;
- tab latency on a synthetic logdir (layers x steps x runs), both loaders, and
  TensorBoard's resident memory, with how they grow with steps and layers.
Ratios are medians over interleaved rounds of within-round ratios, in one process; fit() steps are timed
per batch inside each call, the first batches (tracing) excluded.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import tempfile
from typing import Dict, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The custom loop of a model whose plain step is under 10 ms (the MLP) runs this many times the rounds.
SHORT_STEP_ROUNDS = 4
# fit() runs this many times the rounds, of epochs of ~0.5 s or 14 batches (see the notes); a model
# whose plain step is under 10 ms (the MLP) SHORT_STEP_ROUNDS times more again (180).
FIT_ROUNDS = 3


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
    from tb_layergrad import fused_kernel

    kernel = "built and used" if fused_kernel.op() is not None else f"NOT available ({fused_kernel.unavailable_reason()})"
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}); Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, TensorBoard {tensorboard.__version__}; "
        f"tb_layergrad's fused reduction kernel: {kernel}"
    )


def overhead_tables(models: List[str], rounds: int, block_seconds: float, fit_steps: int, figures: Dict) -> List[str]:
    import overhead
    from models import MODELS

    lines = []
    loop_rows, fit_rows, byte_rows = [], [], []
    for name in models:
        logdir = overhead.new_logdir()
        base, ratios, per_round, loop_rounds = overhead.interleaved(
            overhead.custom_loop_variants(name, logdir), rounds, block_seconds, short_step_rounds=SHORT_STEP_ROUNDS
        )
        loop_rows.append((name, base, ratios))
        figures.setdefault("loop", {})[name] = ratios
        model, x, _ = MODELS[name]()
        layers = len(model.layers)
        byte_rows.append((name, layers, overhead.bytes_per_layer_step(logdir, f"{name}_ours1", layers, loop_rounds * per_round + overhead.WARMUP_CALLS)))
        steps = overhead.fit_epoch_steps(max(fit_steps, int(block_seconds / base)))  # at least ~one block
        fit_rounds = rounds * FIT_ROUNDS * (SHORT_STEP_ROUNDS if base < overhead.SHORT_STEP_S else 1)
        base_fit, ratios = overhead.interleaved_results(overhead.fit_variants(name, logdir, steps), fit_rounds)
        fit_rows.append((name, base_fit, ratios))
        figures.setdefault("fit", {})[name] = ratios
        shutil.rmtree(logdir, ignore_errors=True)
        print(f"  measured {name}", flush=True)

    def table(title: str, rows, ratio_of) -> None:
        keys = list(rows[0][2])
        lines.append(f"### {title}\n")
        lines.append("| model | plain step | " + " | ".join(keys) + " |")
        lines.append("|---|---|" + "---|" * len(keys))
        for name, base, res in rows:
            lines.append(f"| {name} | {base * 1e3:.2f} ms | " + " | ".join(f"{ratio_of(res[k], base):.2f}x" for k in keys) + " |")
        lines.append("")

    table("Custom training loop (tf.function step), ratio to the plain step", loop_rows, lambda v, b: v)
    table("model.fit(), ratio to fit() without callbacks", fit_rows, lambda v, b: v)
    lines.append("### Event-file bytes per layer per logged step (histogram + stats records)\n")
    lines.append("| model | layers | bytes / layer / step |")
    lines.append("|---|---|---|")
    for name, layers, b in byte_rows:
        lines.append(f"| {name} | {layers} | {b:.0f} |")
    lines.append("")
    return lines


def tab_tables(sizes: List[tuple], loaders: List[str], figures: Dict) -> List[str]:
    import synthetic_logdir
    import tab_latency

    lines = ["### Tab latency (warm, median), real tensorboard process, synthetic logdir\n"]
    lines.append("| runs x layers x steps | loader | load time | listing | flow matrix | layer detail | 3-run compare | TensorBoard RSS |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for runs, layers, steps in sizes:
        logdir = tempfile.mkdtemp(prefix="layergrad_synth_")
        # Written once, copied: latency does not depend on the numbers, and writing is most of the time.
        synthetic_logdir.write_run(os.path.join(logdir, "run_0"), layers, steps, seed=0)
        for r in range(1, runs):
            shutil.copytree(os.path.join(logdir, "run_0"), os.path.join(logdir, f"run_{r}"))
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


def target_table(figures: Dict, tab_size: tuple) -> List[str]:
    """Issue 7's targets next to what this run measured (ratios to a plain step; tab medians, warm)."""
    rows = []

    def row(what: str, target: str, value: Optional[float], ok: Optional[bool], unit: str = "x") -> None:
        shown = "–" if value is None else (f"{value:.2f}x" if unit == "x" else f"{value * 1e3:.0f} ms")
        rows.append(f"| {what} | {target} | {shown} | {'–' if ok is None else ('met' if ok else 'NOT met')} |")

    for mode, label in (("loop", "custom loop"), ("fit", "fit()")):
        for name, r in figures.get(mode, {}).items():
            every10, every1 = r.get("ours_every_10"), r.get("ours_every_1")
            row(f"{label}, {name}, all layers every 10 steps", "<= 1.03x", every10, every10 <= 1.03)
            limit = 1.5 if name == "cnn" else 1.10
            row(f"{label}, {name}, all layers every step", f"<= {limit:.2f}x", every1, every1 <= limit)
            floor = r.get("floor: our records, unreduced")
            if floor is not None:  # what writing the format's records costs, with nothing reduced
                row(f"{label}, {name}, every step: our records written, nothing reduced (floor)", "–", floor, None)
            one_event = r.get("floor: our records as one event per step")
            if one_event is not None:  # the same, all of a step's records in one event (not how ours writes)
                row(f"{label}, {name}, every step: the same records as one event per step (floor)", "–", one_event, None)
            kernels = r.get("floor + one kernel per statistic")
            if kernels is not None:  # ... plus the one TensorFlow kernel each recorded figure needs
                row(f"{label}, {name}, every step: + one TensorFlow kernel per statistic and the histogram (floor)", "–", kernels, None)
            plain_ops = r.get("ours_every_1, TensorFlow ops (no fused kernel)")
            if plain_ops is not None:  # where the fused kernel cannot be built (no compiler, a GPU)
                row(f"{label}, {name}, every step, without the fused kernel (TensorFlow ops)", "–", plain_ops, None)
    cnn = figures.get("loop", {}).get("cnn")
    if cnn:
        ours, hist = cnn["ours_every_1"] - 1, cnn["tf.summary.histogram_every_1"] - 1
        factor = hist / ours if ours > 0 else float("inf")
        rows.append(f"| custom loop, cnn: overhead of tf.summary.histogram / ours | >= 5 | {factor:.1f} | {'met' if factor >= 5 else 'NOT met'} |")
    for key, m in figures.get("tab", {}).items():
        if key[:3] != tab_size:
            continue
        loader = {"true": "Rust", "false": "Python"}[key[3]]
        for field, what, limit in (("matrix_s", "flow matrix", 1.0), ("layer_detail_s", "layer detail", 0.3), ("listing_s", "listing", 0.2)):
            row(f"tab {tab_size[0]}x{tab_size[1]}x{tab_size[2]}, {loader} loader: {what}", f"< {limit * 1e3:.0f} ms", m[field], m[field] < limit, unit="s")
    if not rows:
        return []
    return ["### Targets (issue 7) and this run\n", "| figure | target | measured | |", "|---|---|---|---|", *rows, ""]


NOTES = """### Reading the figures

- *limit: one read per tensor* reads every captured tensor once and writes nothing: the floor of any
  logging that looks at each value.
- *floor: our records, unreduced* writes the same records as ours (a histogram and a stats record per
  layer) with constant contents through `tf.summary.write`, behind one recording condition: what the
  on-disk format costs through TensorFlow's own summary ops (a `WriteSummary` op is ~10-15 us of kernel
  time, plus scheduling, plus the condition). Ours writes its records from one op that takes the
  recording condition as an input (below), so it can come in under this floor.
- *floor + min, max, histogram_fixed_width* adds the cheapest histogram TensorFlow has (its range and
  its counts); *floor + one kernel per statistic* adds one TensorFlow kernel for each figure the stats
  record holds (sum, sum of squares, min, max, sum of |x|, non-zero count): the records with nothing but
  the kernels they need, no path choice, no NaN/Inf handling, no edges. Ours minus this floor is what the
  exact, NaN-safe epilogue costs; this floor minus the first is what the statistics cost.
- Custom loop: in each round every variant makes ~0.5 s worth of the plain step's calls (a multiple of
  10), taking turns with the others in short runs, in a shuffled order per round (a fixed order made one
  variant always follow the same neighbour: an every-10-steps ratio of 0.98 in one run, 1.07 in the
  next). A run is 1 call of a step of 30 ms or more (the CNN, the LSTM) and 10 calls of the MLP's ~3 ms
  step. Until 2026-12-03 each variant made all of a round's calls in one block: the CNN's per-round
  ratios then had a standard deviation of 8-10% (its plain step moved between 120 and 166 ms from block
  to block), call by call 2.1-2.4%; the MLP's 11-12% in blocks of 150 calls, 3% in runs of 10. Runs of
  one MLP call were quieter still (1.2-1.4%) but biased: every step read 1.040x and 1.044x against
  1.073x and 1.078x in runs of 10 in the same session (a 3 ms step that runs right after a different one
  pays for the switch), so runs last at least 30 ms. Each variant counts its own steps (the optimizer's
  step counter is set to it before each run, untimed, for the plain step too), so "every 10 steps" logs
  exactly one call in ten of its own whatever the turns. The MLP also runs four times the rounds (60):
  its overheads are a few hundredths. The writer is made the default outside the compiled step, before
  each run of calls (`writer.set_as_default`, as a user's loop does once, or `with writer.as_default():`
  around the Python loop); leaving a `with writer.as_default():` block inside a `tf.function` flushes the
  event file at every call (0.05-0.1 ms here), whatever writes the summaries. Timing starts after 12
  warm-up calls (so that the first logged call of "every 10 steps", which instantiates its branch, is
  not timed).
- fit(): one epoch per call, of at least ~0.5 s and 14 batches (the MLP's 40-batch epochs moved its
  ratios by +-5%), three times the custom loop's rounds (45). An epoch cannot take turns with the other
  variants batch by batch, and its per-round ratios are noisy whatever its length: the CNN's standard
  deviation was 7-8% with 14-batch epochs and 10% with 44-batch ones (12 rounds each, 2026-12-03), so
  short epochs and more rounds (until then: 44 batches, 15 rounds; half as many rounds read
  every-10-steps ratios of 1.06-1.10x for all three models in one run on a slow machine). The MLP's
  0.75 s epochs had a per-round standard deviation of 10-11% too (30 rounds, with and without
  `gc.freeze()`: not the garbage collector), so its every-10-steps figure read 0.95x, 1.00x and
  1.03x in three full runs (45 rounds or fewer) and 0.99-1.01x in A/Bs: it runs 180 rounds (~10 min),
  timed from its 5th batch on, over a multiple of 10 batches (every 10 steps logs one in ten of them).
  In graph mode the capturing step reduces and writes its records itself, behind the logging flag, in
  one out-of-line branch; handing the gradients to Python and calling a compiled writer from the
  callback cost ~1.3 ms per logged MLP step (outputs materialized, dict arguments matched, a second
  call): every step 1.47x -> ~1.13x, every 10 steps 1.15x -> ~1.03x, measured by hand with these fit()
  variants before and after (2026-12-03). Under XLA the step still hands out the gradients and one
  compiled writer (never XLA) reduces them (docs/FIT.md): XLA's CPU code sums a tensor in one serial
  chain (~1.7 ns per element and reduction here). Each logged fit() step is flushed to disk
  (records before a crash are kept); `optimizer.iterations` is counted in Python between batches, not
  read (the read per batch cost ~0.15 ms with its wrapper).
- The fused kernel (`tb_layergrad/kernels/`, built on first use, see README): `records.cc` computes the
  histograms and statistics of all of a step's 16- and 32-bit float tensors at once, two reads of each.
  Read 1 takes sum, sum of squares, sum of |x|, min, max and the zero and subnormal counts, branch-free
  and vectorized, the sums of x and |x| in float32 within blocks of 256 elements (float64 across blocks;
  squares in float64); read 2 the bucket index (float32) and the centered sum of squares, then the
  counts in four sets of 32-bit counters, unrolled. A chunk with a NaN, an Inf or a subnormal number,
  whose float32 block sums overflow, or of tiny values (0 < max |x| < 2^-60), is read again by a
  branching float64 loop. By hand (2026-12-03, on the MLP's four gradient shapes, 83,200 elements, one
  thread, 21 rotating sets of tensors so that data come from L3): 155 us before that day's changes,
  111 us with the unrolled 32-bit counters, 93 us (1.1 ns per element: read 1 ~45 us, read 2 ~48) with
  the float32 block sums. Tried and dropped: float32 centered squares in read 2 and eight counter sets
  (no gain: the counting bounds read 2). Measured earlier (standalone C++): a select that flushed
  subnormals inside the vectorized loop made it 7 ns per element (the loop no longer vectorized), so
  subnormals are only counted there; `std::fmin` is a libm call (7 ns per element); and in a
  `tf.function` a ParallelFor over a few chunks cost ~150 us (threads woken), so below 512K elements the
  kernel stays on one thread.
- One op writes a logged step (`write_records.cc`, `tb_layergrad/record_writes.py`): it computes the
  records as above, writes the histogram, stats and first-non-finite records to the writer's resource
  itself (the same bytes as `tf.summary.write`, tested), keeps the first-non-finite steps, and takes the
  recording condition as an input (when false it returns at once). So a logged step builds no `tf.cond`.
  Measured in the MLP's training step (in-step A/B in one process, 200 rounds of 30 calls, 2026-12-03,
  plain 2.8-3.6 ms): through a condition, with the kernel op and eight `WriteSummary` ops, 1.087-1.091x;
  the same with the writes in one op, still in the condition, 1.083-1.100x (the writes are not the
  cost); without the first-NaN/Inf ops 1.074-1.088x; with no condition at all 1.055-1.074x. The
  condition was the cost: its branch is one function call and starts only once every gradient it reads
  exists. Before/after in one run: every step 1.089x -> 1.073x, every 10 steps (300 rounds) 1.034x ->
  1.024x. What is left (same harness): the op present with the condition false 1.013x (the capture and
  the op's dispatch), true 1.078x: ~0.2 ms of reading and writing at the end of the backward pass on a
  machine whose two cores the step already uses. Isolated timings mislead here: in a bare `tf.function`
  a stateful op or a captured resource alone added 45-80 us per call, which a training step (full of
  both) does not pay again. Not built: running the op's work on a background thread after the step
  returns would hide it in the ~0.4 ms per step in which Python dispatches the next call and both cores
  idle, but `writer.flush()` and `close()` would then return before the last step's records are written.
- Where the MLP's logged step went before that op (by hand, 2026-12-03): in isolation, the kernel
  ~0.09 ms, the eight record writes ~0.06-0.08 ms (a writer with `max_queue=1000`, with or without a
  flush per step: 252, 252 and 249 us per call of 8 writes, so flushing every logged step costs nothing
  measurable), the out-of-line branch call ~0.03 ms, the first-NaN/Inf bookkeeping ~0.02 ms. A profile
  of the step (`tf.profiler`, one trace) shows why the in-step cost moves: the executor ran the branch
  either before the last backward MatMul (delaying it by the branch's ~0.3 ms) or beside it, where both
  share the two cores with the MatMul's threads (the kernel: 0.10 ms alone, 0.75 ms beside it). About
  0.4 ms of every step, ours and plain alike, is Python dispatching the call before the executor starts,
  with both cores idle. Tried and dropped then (in-step A/B, 150 rounds of 20 calls): the kernel split
  into two ops, one per core (no gain), an inline condition instead of the out-of-line call (1.092x
  against 1.084x), the branch made to wait for every weight gradient (worse: 1.156x against 1.090x); and
  now one write op per tensor, so that the last layers' records start earlier (1.053x against 1.055x for
  one op: no gain, the first layer's gradient, the largest, comes last anyway), the kernel spread over
  TensorFlow's threads in the step (chunks of 32K or 8K elements: 1.071x and 1.062x against 1.062x and
  1.068x on one thread), and 16 independent accumulators per figure in read 1 (by hand, one thread:
  167-176 us against 151-161 us on 100,864 elements). Every 10 steps costs more
  per logged step than every step: after nine training steps what a logged step touches is cold again.
- *floor: our records as one event per step* writes the same records as ONE event (a serialized
  `Summary` holding every value, `tf.summary.experimental.write_raw_pb`): in the run before today's
  (MLP 1.08x and 1.08x) and by hand (1.05x against 1.06x) no cheaper than the eight `WriteSummary`
  ops, so packing a step's records into fewer events is no lever and the format keeps one record per
  series.
- The MLP's every-step budget: its plain step is ~2.3-3.6 ms on this machine (it moved that much
  between runs on one day), so 1.10x leaves ~0.23-0.36 ms for everything a logged step adds; run-to-run
  noise on this ratio is several hundredths (the same variant twice in one 150-round A/B: 1.058x and
  1.045x). Two reads are needed while the histogram spans the step's own [min, max] (the range must be
  known before bucketing).
- The MLP's custom-loop every-10-steps figure is the one target not met reliably. Its nine
  full runs on 2026-12-03 read 1.03, 1.02, 1.02, 1.02, 1.02, 1.02, 1.01, 1.03 and 1.05x (three over
  the line). Where it goes, by hand the same day (MLP, 40-60 interleaved rounds, ratios to a step that
  captures and logs nothing, which itself reads 0.998x against the plain step): a step that could log
  but does not (`record_if` false at run time) costs 1.004-1.019x, as much as TensorBoard's own
  `tf.summary.scalar` under the same condition (1.003-1.016x); the rest is the one logged step in ten,
  which costs about 3x what a logged step costs among logged steps (0.6 ms against 0.2 ms in one
  A/B): after nine training steps its code and data are cold again.
- Tab listing under the Rust loader: the data server answers `ListTensors` by folding every record of
  every listed series (max step and wall time), so the listing costs at least that fold: 3 x 200 layers x
  5,000 steps is 6 million records, 126-173 ms per call here with the data server alone (1 ms for one
  tag). The plugin splits a listing of several runs by run into a few calls made at once, so the
  server folds on both cores (~145 ms as one call, ~108 ms as three, 2026-12-03), and memoizes the parsing of series
  metadata (the Python side of a listing: ~70 ms -> ~25 ms, of which `list_tensors`' own proto
  conversion ~6 ms and the JSON ~7 ms). The Python loader's listing folds only new records
  (`tb_layergrad/plugin/listing.py`). Route timings are medians of 11 warm requests.
- Shared machine: figures move by several percent between runs; compare ratios within one run.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: only checks the scripts run")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-tab", action="store_true")
    parser.add_argument("--models", help="comma-separated subset of mlp,cnn,lstm (default: all)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; x3 for fit(); x4 more when the plain step is under 10 ms; smoke 1)")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "PERFORMANCE.md"), help="where to write the report ('-' for none)")
    args = parser.parse_args()

    if args.smoke:
        models, rounds, block_seconds, fit_steps = ["mlp"], 1, 0.01, 8
        sizes, loaders = [(3, 4, 20)], ["false"]
    else:
        models, rounds, block_seconds, fit_steps = ["mlp", "cnn", "lstm"], 15, 0.5, 14
        sizes = [(3, 50, 1000), (3, 200, 1000), (3, 200, 5000)]
        loaders = ["true", "false"]
    if args.models:
        models = args.models.split(",")
    if args.rounds:
        rounds = args.rounds
    lines = [
        "# Performance",
        "",
        f"Measured {datetime.date.today().isoformat()} with `python bench/run.py`{' --smoke' if args.smoke else ''} on: {machine()}.",
        "",
    ]
    start_load = os.getloadavg()[0]
    figures: Dict = {}
    body: List[str] = []
    if not args.skip_overhead:
        body += overhead_tables(models, rounds, block_seconds, fit_steps, figures)
    if not args.skip_tab:
        body += tab_tables(sizes, loaders, figures)
    lines += target_table(figures, sizes[-1]) + body
    if not args.smoke:
        lines.append(NOTES)
    lines.insert(3, f"Load average (1 min) at the start {start_load:.1f}, at the end {os.getloadavg()[0]:.1f}: "
                    "ratios are medians over rounds of within-round ratios, but a busy machine still adds noise.\n")
    text = "\n".join(lines)
    print(text)
    if args.out != "-":
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
