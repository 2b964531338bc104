"""The logger on a GPU: step cost, the records' values against the CPU, determinism, and peak device memory.

On the first GPU (`--smoke`: on the CPU, tiny batches, one round: keeps the script working), for the MLP and
the CNN of bench/models.py and the Transformer block of bench/per_example.py:

- cost, custom loop (`tf.function` step, SGD) and `fit()`, ratio to the plain step: every layer and weight
  logged every step, every 10th step, and `per_example=True` every step. The batch doubles from the CPU
  benchmarks' until the plain step takes at least `--min-step-ms` on the device (ratios of interleaved rounds,
  medians, as bench/overhead.py);
- the same step's records on the device and on the CPU (the same weights and batch, written, read back with
  `tb_layergrad.load`): every statistic and per-example column within the float32 bound of the step's
  reduction length (tests/tolerances.py: 2 * gamma(length) of the magnitude), TF32 off for that step;
- with `tf.config.experimental.enable_op_determinism()`: two fit() runs with the logger bitwise equal, and
  equal to a run without it;
- peak device memory of a logged step (`per_example=True`, every step) against the plain step's
  (`get_memory_info(...)['peak']` after `reset_memory_stats`).

    python bench/gpu.py [--out docs/PERFORMANCE.md] [--json bench_gpu.json] [--smoke]

Writes the figures (the device's name included) to `--json` and its section of `--out`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import overhead  # noqa: E402
import sweep_latency  # noqa: E402
import tensorflow as tf  # noqa: E402
import tolerances  # noqa: E402
from models import MODELS  # noqa: E402
from per_example import transformer  # noqa: E402

import tb_layergrad  # noqa: E402

HEADING = "### On a GPU"
COMMAND = "python bench/gpu.py"
BUILDERS: Dict[str, Callable] = {"mlp": MODELS["mlp"], "cnn": MODELS["cnn"], "transformer": transformer}
# The largest batch tried: the MLP's step stays launch-bound until its fit() input (batches x 784 floats)
# would fill the device; the table shows the plain step's time at the batch taken.
MAX_BATCH = {"mlp": 16384, "cnn": 4096, "transformer": 4096}
VARIANTS = ("every step", "every 10th", "per_example, every step")
# The records compared with the CPU's: every statistic but the counts of exact values (a zero or a bin can move
# by one rounding), and the per-example columns.
COMPARED = ("min", "max", "mean", "std", "norm", "mean_abs", "example_norm_min", "example_norm_median")
COMPARED += ("example_norm_max",)


def device() -> Tuple[str, str]:
    """(TensorFlow's device, its name): the first GPU, else the CPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "/CPU:0", "CPU (no GPU visible)"
    details = tf.config.experimental.get_device_details(gpus[0])
    return "/GPU:0", str(details.get("device_name", gpus[0].name))


def batched(name: str, batch: int) -> Tuple[keras.Model, tf.Tensor, tf.Tensor]:
    """`name`'s model and a batch of `batch` examples (its inputs tiled from the builder's random batch), seeded:
    the same weights and batch at every call. The batch is drawn on the CPU (a device's random kernels may differ)."""
    keras.utils.set_random_seed(0)
    with tf.device("/CPU:0"):
        _, x, y = BUILDERS[name]()
    keras.utils.set_random_seed(0)
    model, _, _ = BUILDERS[name]()
    reps = -(-batch // int(x.shape[0]))
    x = tf.tile(x, [reps] + [1] * (x.shape.rank - 1))[:batch]
    y = tf.tile(y, [reps])[:batch]
    return model, x, y


def _loss() -> Any:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def loop_steps(model: keras.Model, logdir: str) -> Dict[str, Callable]:
    """plain, then the capture (weights) logged every step / every 10th, and with per_example=True every step."""
    loss_fn, opt = _loss(), keras.optimizers.SGD(1e-4)
    opt.build(model.trainable_variables)
    it = opt.iterations

    @tf.function
    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    def logged(every: int, per_example: bool, tag: str) -> Callable:
        writer = tf.summary.create_file_writer(os.path.join(logdir, tag))

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                with tb_layergrad.capture(model, tape=tape, weights=True, per_example=per_example) as cap:
                    loss = loss_fn(y, model(x))
            grads = cap.gradients(tape, loss)
            opt.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
            with tf.summary.record_if(it % every == 0):
                tb_layergrad.summary.gradients(grads)
            return loss

        step.prepare = lambda calls: (it.assign(calls), writer.set_as_default(step=it))
        return step

    plain.prepare = lambda calls: it.assign(calls)
    return {
        "plain": plain,
        "every step": logged(1, False, "loop_1"),
        "every 10th": logged(10, False, "loop_10"),
        "per_example, every step": logged(1, True, "loop_pe"),
    }


def step_ms(fn: Callable, x: tf.Tensor, y: tf.Tensor, calls: int = 10) -> float:
    """The median of `calls` synchronised calls, after two (tracing)."""
    fn(x, y).numpy()
    fn(x, y).numpy()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(x, y).numpy()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def find_batch(name: str, where: str, min_ms: float, smoke: bool) -> int:
    """The smallest batch (the CPU benchmark's, doubled) whose plain step takes at least `min_ms` on `where`."""
    _, x, _ = BUILDERS[name]()
    batch = 4 if smoke else int(x.shape[0])
    while not smoke:
        with tf.device(where):
            model, x, y = batched(name, batch)
            ms = step_ms(loop_steps(model, tempfile.mkdtemp())["plain"], x, y)
        if ms >= min_ms or batch * 2 > MAX_BATCH[name]:
            break
        batch *= 2
    return batch


def loop_cost(name: str, batch: int, where: str, rounds: int, block: float) -> Tuple[float, Dict[str, float]]:
    """(plain step seconds, {variant: ratio}) of the custom loop on `where`."""
    logdir = tempfile.mkdtemp(prefix="tb_layergrad_gpu_")
    try:
        with tf.device(where):
            model, x, y = batched(name, batch)
            model(x)
            steps = {k: overhead._BoundStep(f, x, y) for k, f in loop_steps(model, logdir).items()}  # noqa: SLF001
            base, ratios, _, _ = overhead.interleaved(steps, rounds, block, short_step_rounds=2)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return base, ratios


def fit_cost(name: str, batch: int, where: str, rounds: int, batches: int) -> Tuple[float, Dict[str, float]]:
    """(plain fit() batch seconds, {variant: ratio}): one fit() epoch of `batches` batches per call, per variant."""
    logdir = tempfile.mkdtemp(prefix="tb_layergrad_gpu_fit_")
    try:
        with tf.device(where):
            model, x, y = batched(name, batch)
            xs = tf.tile(x, [batches] + [1] * (x.shape.rank - 1))
            ys = tf.tile(y, [batches])
            model.compile(optimizer=keras.optimizers.SGD(1e-4), loss=_loss())

            def fit(callbacks: List) -> Callable:
                def run() -> float:
                    timer = overhead.BatchTimer()
                    model.fit(
                        xs, ys, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks + [timer]
                    )
                    return timer.seconds_per_batch

                return run

            def logger(tag: str, **kw: Any) -> Any:
                return tb_layergrad.GradientLogger(os.path.join(logdir, tag), weights=True, **kw)

            variants = {
                "plain": fit([]),
                "every step": fit([logger("fit_1", update_freq=1)]),
                "every 10th": fit([logger("fit_10", update_freq=10)]),
                "per_example, every step": fit([logger("fit_pe", update_freq=1, per_example=True)]),
            }
            for run in variants.values():  # tracing, untimed
                run()
            base, ratios = overhead.interleaved_results(variants, rounds)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return base, ratios


def peak_memory(name: str, batch: int, where: str) -> Optional[Dict[str, float]]:
    """Peak device bytes of the plain step and of the step with per_example=True every step (None: not reported)."""
    if not where.startswith("/GPU"):
        return None
    logdir = tempfile.mkdtemp(prefix="tb_layergrad_gpu_mem_")
    out = {}
    try:
        with tf.device(where):
            model, x, y = batched(name, batch)
            model(x)
            steps = loop_steps(model, logdir)
            for key in ("plain", "per_example, every step"):
                steps[key].prepare(0)
                steps[key](x, y).numpy()  # traced, buffers made
                tf.config.experimental.reset_memory_stats("GPU:0")
                steps[key](x, y).numpy()
                out[key] = float(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return out


def records_on(where: str, name: str, batch: int, weights: List[np.ndarray], logdir: str) -> Any:
    """One logged step (weights and per-example records) of `name` on `where`, read back as a DataFrame."""
    with tf.device(where):
        model, x, y = batched(name, batch)
        model(x)
        model.set_weights(weights)
        loss_fn, opt = _loss(), keras.optimizers.SGD(1e-4)
        writer = tf.summary.create_file_writer(logdir)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
                    loss = loss_fn(y, model(x))
            grads = cap.gradients(tape, loss)
            opt.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
            with writer.as_default(step=0):
                tb_layergrad.summary.gradients(grads)
            return loss

        step(x, y).numpy()
        writer.flush()
        writer.close()
    frame = tb_layergrad.load(logdir)
    return frame, model, x


def values_against_cpu(name: str, batch: int, where: str) -> Dict[str, Any]:
    """The same step's records on `where` and on the CPU: the largest error over the derived bound, per column."""
    tf.config.experimental.enable_tensor_float_32_execution(False)
    base = tempfile.mkdtemp(prefix="tb_layergrad_gpu_values_")
    try:
        with tf.device("/CPU:0"):
            model, x, _ = batched(name, batch)
            model(x)
            weights = model.get_weights()
        got, model, x = records_on(where, name, batch, weights, os.path.join(base, "device"))
        want, _, _ = records_on("/CPU:0", name, batch, weights, os.path.join(base, "cpu"))
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(True)
        shutil.rmtree(base, ignore_errors=True)
    keys = ["layer", "target", "source", "step"]
    joined = got.merge(want, on=keys, suffixes=("", "_cpu"))
    # The float32 bound of the step's longest reduction path (forward, backprop, the weight gradient's sum over
    # the batch and the record's own sum over the tensor), both sides rounding: tests/tolerances.py.
    length = tolerances.reduction_path_length(model, x, target_terms=batch * 10) + int(np.prod(x.shape))
    rtol = tolerances.TWO_SIDES * tolerances.chain_rtol(np.float32, [length])
    # The magnitude an error is relative to: the elements' largest for a statistic of elements, the value itself
    # for a norm (and std, below it) and for a per-example norm.
    elements = np.maximum(joined["min_cpu"].abs(), joined["max_cpu"].abs()).to_numpy(np.float64)
    worst: Dict[str, float] = {}
    for col in COMPARED:
        if col not in joined or f"{col}_cpu" not in joined:
            continue
        a, b = joined[col].to_numpy(np.float64), joined[f"{col}_cpu"].to_numpy(np.float64)
        if col in ("min", "max", "mean", "mean_abs"):
            scale = elements
        elif col == "std":
            scale = joined["norm_cpu"].to_numpy(np.float64)
        else:
            scale = np.abs(b)
        finite = np.isfinite(a) & np.isfinite(b)
        if (np.isfinite(a) != np.isfinite(b)).any():
            worst[col] = float("inf")
            continue
        ratio = np.abs(a - b)[finite] / np.maximum(rtol * scale[finite], np.finfo(np.float32).tiny)
        worst[col] = float(ratio.max(initial=0.0))
    return {
        "rtol": rtol,
        "records": int(len(joined)),
        "worst_over_bound": worst,
        "within": all(v <= 1 for v in worst.values()),
    }


def determinism(name: str, batch: int, where: str, steps: int) -> Dict[str, Any]:
    """Under op determinism: fit() twice with the logger (weights, per-example) and once without, from the same
    weights: final weights bitwise equal. An op without a deterministic kernel on the device: its error."""
    base = tempfile.mkdtemp(prefix="tb_layergrad_gpu_det_")
    try:
        with tf.device(where):
            model, x, y = batched(name, batch)
            model(x)
            start = model.get_weights()
            xs = tf.tile(x, [steps] + [1] * (x.shape.rank - 1))
            ys = tf.tile(y, [steps])

            def run(callbacks: List) -> List[bytes]:
                model.set_weights(start)
                model.compile(optimizer=keras.optimizers.SGD(1e-2), loss=_loss())
                model.fit(xs, ys, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
                return [w.tobytes() for w in model.get_weights()]

            def logger(tag: str) -> Any:
                return tb_layergrad.GradientLogger(
                    os.path.join(base, tag), weights=True, per_example=True, update_freq=1
                )

            try:
                first, second, without = run([logger("a")]), run([logger("b")]), run([])
            except Exception as e:  # noqa: BLE001 - reported: an op without a deterministic kernel
                return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"logger_runs_equal": first == second, "equal_without_logger": first == without}


def measure(args: argparse.Namespace) -> Dict[str, Any]:
    where, name_of_device = device()
    figures: Dict[str, Any] = {
        "device": name_of_device,
        "date": datetime.date.today().isoformat(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "smoke": bool(args.smoke),
        "load_average": os.getloadavg()[0],
        "models": {},
    }
    models = args.models.split(",")
    for name in models:
        batch = find_batch(name, where, args.min_step_ms, args.smoke)
        row: Dict[str, Any] = {"batch": batch}
        row["loop_plain_s"], row["loop"] = loop_cost(name, batch, where, args.rounds, args.block)
        row["fit_plain_s"], row["fit"] = fit_cost(name, batch, where, max(1, args.rounds // 2), args.fit_batches)
        row["peak_bytes"] = peak_memory(name, batch, where)
        row["values"] = values_against_cpu(name, batch, where)
        figures["models"][name] = row
        print(f"  measured {name} (batch {batch})", flush=True)
    # Last: op determinism cannot be turned off again in this process.
    tf.config.experimental.enable_op_determinism()
    for name in models:
        batch = figures["models"][name]["batch"]
        figures["models"][name]["determinism"] = determinism(name, batch, where, 3 if args.smoke else 10)
    figures["load_average_end"] = os.getloadavg()[0]
    return figures


def table(figures: Dict[str, Any], command: str) -> List[str]:
    """The markdown section of `figures`."""
    lines = [
        f"{HEADING}: {figures['device']}, every layer and weight, ratio to the plain step\n",
        f"Measured {figures['date']} with `{command}` (TensorFlow {figures['tensorflow']}, Keras {figures['keras']}). "
        "Targets (device): every step <= 1.10x, every 10th <= 1.02x, per_example <= 1.3x, added peak memory <= 5%.\n",
        "| model | batch | plain step (loop / fit) | loop: "
        + " | loop: ".join(VARIANTS)
        + " | fit: "
        + " | fit: ".join(VARIANTS)
        + " | peak memory added | values vs CPU (worst / bound) | op determinism |",
        "|---|---|---|" + "---|" * (2 * len(VARIANTS) + 3),
    ]
    for name, r in figures["models"].items():
        peak = r["peak_bytes"]
        added = "n/a (CPU)" if not peak else f"{peak['per_example, every step'] / peak['plain'] - 1:+.1%}"
        worst = max(r["values"]["worst_over_bound"].values(), default=0.0)
        det = r.get("determinism", {})
        det_cell = (
            det["error"][:80]
            if "error" in det
            else f"runs {'equal' if det.get('logger_runs_equal') else 'DIFFER'}, "
            f"{'equal' if det.get('equal_without_logger') else 'DIFFERS'} without"
        )
        lines.append(
            f"| {name} | {r['batch']} | {r['loop_plain_s'] * 1e3:.2f} / {r['fit_plain_s'] * 1e3:.2f} ms | "
            + " | ".join(f"{r['loop'][k]:.2f}x" for k in VARIANTS)
            + " | "
            + " | ".join(f"{r['fit'][k]:.2f}x" for k in VARIANTS)
            + f" | {added} | {worst:.2f} ({'within' if r['values']['within'] else 'BEYOND'}) | {det_cell} |"
        )
    lines += [
        "",
        f"Load average (1 min) {figures['load_average']:.1f} at the start, {figures['load_average_end']:.1f} at the "
        "end. The batch is the CPU benchmark's, doubled until the plain step takes at least 5 ms on the device. "
        "Values: one logged step (weights, per-example) on the device and on the CPU from the same weights and "
        "batch, TF32 off, every statistic and per-example column read back with `tb_layergrad.load`; the worst "
        "error as a share of its float32 bound (2 gamma of the step's reduction length, tests/tolerances.py).",
        "",
    ]
    return lines


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU-sized: tiny batches, one round (CI)")
    parser.add_argument("--models", default="mlp,cnn,transformer", help="comma-separated subset")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the custom loop (default 7; smoke 1)")
    parser.add_argument("--block", type=float, help="seconds of plain steps per round (default 0.3)")
    parser.add_argument("--fit-batches", type=int, help="fit() batches per call (default 24)")
    parser.add_argument("--min-step-ms", type=float, default=5.0, help="the plain step's least duration on the device")
    parser.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "tb_layergrad_gpu.json"))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "PERFORMANCE.md"), help="the report ('-': none)")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.smoke else 7)
    args.block = args.block or (0.01 if args.smoke else 0.3)
    args.fit_batches = args.fit_batches or (8 if args.smoke else 24)
    figures = measure(args)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(figures, f, indent=1)
    command = COMMAND + (" --smoke" if args.smoke else "")
    lines = table(figures, command)
    print("\n".join(lines), flush=True)
    if args.out != "-" and not os.path.exists(args.out):
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("# Performance\n")
    sweep_latency.rewrite(args.out, lines, HEADING)


if __name__ == "__main__":
    main()
