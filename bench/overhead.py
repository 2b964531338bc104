"""Training-step overhead of gradient logging, measured side by side in one process.

Every variant trains the same model on the same batch; in each round the
variants take turns in short runs of calls (plain, ours, histogram, plain,
ours, ...); each variant's time is divided by the plain step's time of the same
round, and the median of these ratios over the rounds is reported (the
machine's speed drifts within seconds; turns of ~0.03-0.13 s cancel most of it).
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple
from unittest import mock

import keras
import numpy as np
import tensorflow as tf
from models import MODELS

import tb_layergrad
from tb_layergrad.kernel import cache as kernel_cache
from tb_layergrad.kernel import fused as fused_kernel

Step = Callable[[], object]

# Calls of each variant before timing: past the first logged call of "every 10 steps" (its
# branch function is instantiated and optimized then: ~0.1 s once, not a per-step cost).
WARMUP_CALLS = 12

# A plain step shorter than this takes more interleaved rounds (see `interleaved`).
SHORT_STEP_S = 0.01
# Variants take turns in runs of at least this long (see `interleaved`).
MIN_RUN_S = 0.03
# Calls per round are a multiple of this: every round of "every 10 steps" then holds the same
# number of logged calls. (Blocks of 4 CNN calls held one logged call or none, and the median
# over such rounds read 1.07 in one run.)
LOG_PERIOD = 10


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def custom_loop_variants(name: str, logdir: str) -> Dict[str, Step]:
    """tf.function train steps: plain, ours (every 1 / 10), tf.summary.histogram (every 1 / 10)."""
    model, x, y = MODELS[name]()
    model(x)
    loss_fn = _loss()
    opt = keras.optimizers.SGD(1e-4)
    opt.build(model.trainable_variables)
    it = opt.iterations
    writers = {}

    def writer(tag: str):
        writers.setdefault(tag, tf.summary.create_file_writer(os.path.join(logdir, f"{name}_{tag}")))
        return writers[tag]

    @tf.function
    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def logged(every: int, tag: str, log: Callable) -> Callable:
        """A capturing step that logs its gradients with `log(grads)` every `every` steps.

        Its writer is made the default outside the compiled step, once before each
        block of calls (`prepare`), as a user's loop sets it once: not with `with
        writer.as_default():` inside the step (leaving that block inside a
        tf.function flushes the event file at every call: 0.05-0.1 ms a step here),
        nor per call (Python work a plain step does not do, charged to ours).
        """
        w = writer(f"{tag}{every}")

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                with tb_layergrad.capture(model, tape=tape) as cap:
                    loss = loss_fn(y, model(x))
            grads = cap.gradients(tape, loss)
            opt.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
            with tf.summary.record_if(it % every == 0):
                log(grads)
            return loss

        def prepare(calls: int) -> None:  # before each run of calls, untimed
            it.assign(calls)  # this variant's own step count: "every 10" logs 1 call in 10 of its own
            w.set_as_default(step=it)  # once per run of calls, as a user's loop sets it once

        step.prepare = prepare
        return step

    def tf_histograms(grads) -> None:  # TensorBoard's own path, same tensors
        for path, g in grads.outputs.items():
            if g is not None:
                tf.summary.histogram(path, g)

    sink = tf.Variable(0.0)

    def one_read(grads) -> None:  # the floor: read every captured tensor once, write nothing
        sink.assign(tf.add_n([tf.reduce_sum(g) for g in grads.outputs.values() if g is not None]))

    def records_only(grads) -> None:  # a floor for what we write: the same records, nothing reduced
        def write():
            with tf.summary.record_if(True):
                for path in grads.outputs:
                    tf.summary.write(f"floor/{path}/histogram", tf.zeros([30, 3], tf.float64))
                    tf.summary.write(f"floor/{path}/stats", tf.zeros([12], tf.float64))
            return tf.constant(True)

        tf.cond(tf.summary.should_record_summaries(), write, lambda: tf.constant(False))

    def records_one_event(grads) -> None:  # the same records as ONE event per step (a format-level option, not built)
        summary = tf.compat.v1.Summary()
        for path in grads.outputs:
            for kind, shape in (("histogram", [30, 3]), ("stats", [12])):
                summary.value.add(tag=f"floor1/{path}/{kind}", tensor=tf.make_tensor_proto(np.zeros(shape)))
        serialized = tf.constant(summary.SerializeToString())

        def write():
            with tf.summary.record_if(True):
                tf.summary.experimental.write_raw_pb(serialized)
            return tf.constant(True)

        tf.cond(tf.summary.should_record_summaries(), write, lambda: tf.constant(False))

    def histograms_only(grads) -> None:  # a floor for a histogram record: its range and counts, no statistic
        def write():
            with tf.summary.record_if(True):
                for path, g in grads.outputs.items():
                    x = tf.reshape(g, [-1])
                    lo, hi = tf.reduce_min(x), tf.reduce_max(x)
                    counts = tf.histogram_fixed_width(x, tf.stack([lo, hi]), nbins=30)
                    tf.summary.write(f"floor/{path}/histogram", counts)
                    tf.summary.write(f"floor/{path}/stats", tf.stack([lo, hi]))
            return tf.constant(True)

        tf.cond(tf.summary.should_record_summaries(), write, lambda: tf.constant(False))

    def kernels_only(grads) -> None:  # a floor for our records: one TensorFlow kernel per statistic, no epilogue
        def write():
            with tf.summary.record_if(True):
                for path, g in grads.outputs.items():
                    lo, hi = tf.reduce_min(g), tf.reduce_max(g)
                    a = tf.abs(g)
                    stats = [tf.reduce_sum(g), tf.nn.l2_loss(g), lo, hi, tf.reduce_sum(a), tf.reduce_sum(tf.sign(a))]
                    tf.summary.write(
                        f"floor/{path}/histogram", tf.histogram_fixed_width(g, tf.stack([lo, hi]), nbins=30)
                    )
                    tf.summary.write(f"floor/{path}/stats", tf.stack(stats))
            return tf.constant(True)

        tf.cond(tf.summary.should_record_summaries(), write, lambda: tf.constant(False))

    ours = lambda every: logged(every, "ours", tb_layergrad.summary.gradients)  # noqa: E731

    def without_kernel(grads) -> None:  # ours where the fused kernel cannot be built: TensorFlow's ops
        # TB_LAYERGRAD_FUSED=0, the user's switch, read while the step is traced
        with mock.patch.dict(os.environ, {kernel_cache.ENV_SWITCH: "0"}):
            tb_layergrad.summary.gradients(grads)

    tb_histogram = lambda every: logged(every, "tbhist", tf_histograms)  # noqa: E731

    plain.prepare = lambda calls: it.assign(calls)  # the same untimed work as the others' prepare

    fns = {
        "plain": plain,
        "limit: one read per tensor": logged(1, "limit", one_read),
        "floor: our records, unreduced": logged(1, "floor", records_only),
        "floor: our records as one event per step": logged(1, "floor1", records_one_event),
        "floor + min, max, histogram_fixed_width": logged(1, "floorhist", histograms_only),
        "floor + one kernel per statistic": logged(1, "floorkernels", kernels_only),
        "ours_every_1": ours(1),
        "ours_every_10": ours(10),
        "ours_every_1, TensorFlow ops (no fused kernel)": logged(1, "nokernel", without_kernel),
        "ours_every_10, TensorFlow ops (no fused kernel)": logged(10, "nokernel", without_kernel),
        "tf.summary.histogram_every_1": tb_histogram(1),
        "tf.summary.histogram_every_10": tb_histogram(10),
    }
    return {k: _BoundStep(f, x, y) for k, f in fns.items()}


class _BoundStep:
    """`fn(*args)` as a no-argument step that counts its calls; `prepare()` runs
    `fn.prepare(calls so far)`, if `fn` has one, before each run of calls (untimed)."""

    def __init__(self, fn: Callable, *args) -> None:
        self._fn = fn
        self._args = args
        self._prepare = getattr(fn, "prepare", None)
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        return self._fn(*self._args)

    def prepare(self) -> None:
        if self._prepare is not None:
            self._prepare(self.calls)


FIT_SKIP = 3  # fit() batches not timed at the start of each epoch: tracing, the iterator's start


def fit_epoch_steps(at_least: int) -> int:
    """Batches per fit() epoch: at least `at_least`, its timed batches a whole number of LOG_PERIODs.

    Why: "every 10 steps" then logs exactly one timed batch in ten in every epoch
    (the 36 timed batches of a 40-batch epoch held 3 or 4 logged ones, depending
    on where the epoch started).
    """
    timed = max(1, -(-(at_least - FIT_SKIP - 1) // LOG_PERIOD)) * LOG_PERIOD
    return timed + FIT_SKIP + 1


class BatchTimer(keras.callbacks.Callback):
    """Mean seconds per batch of one fit() epoch, after the first `skip` batches (tracing).

    Timed from the end of batch `skip` to the end of the epoch, so work that
    other callbacks do at the epoch's end (Keras' histograms) is counted too;
    put this callback last.
    """

    def __init__(self, skip: int = FIT_SKIP):
        super().__init__()
        self.skip = skip
        self.start = 0.0
        self.start_cpu = 0.0
        self.batches = 0
        self.seconds_per_batch = float("nan")
        #: the process's CPU seconds (all its threads) per batch over the same span
        self.cpu_seconds_per_batch = float("nan")

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.skip:
            self.start = time.perf_counter()
            self.start_cpu = time.process_time()
        self.batches = batch

    def on_epoch_end(self, epoch, logs=None):
        timed = max(1, self.batches - self.skip)
        self.seconds_per_batch = (time.perf_counter() - self.start) / timed
        self.cpu_seconds_per_batch = (time.process_time() - self.start_cpu) / timed


def fit_variants(name: str, logdir: str, steps: int) -> Dict[str, Step]:
    """One fit() epoch of `steps` batches per call: plain, GradientLogger (every 1 / 10, without and with activations),
    Keras TensorBoard(histogram_freq=1). Each call returns its mean seconds per batch,
    tracing excluded (the first batches of every call are skipped). Each variant keeps
    one callback over all its calls, as a user calling fit() repeatedly would."""
    fit = _fit_runner(name, steps)
    return {
        "plain": fit([]),
        "ours_every_1": fit([tb_layergrad.GradientLogger(os.path.join(logdir, f"fit_{name}_1"), update_freq=1)]),
        "ours_every_10": fit([tb_layergrad.GradientLogger(os.path.join(logdir, f"fit_{name}_10"), update_freq=10)]),
        'ours_every_10, on_nonfinite="ignore"': fit(
            [
                tb_layergrad.GradientLogger(
                    os.path.join(logdir, f"fit_{name}_10u"), update_freq=10, on_nonfinite="ignore"
                )
            ]
        ),
        "ours_every_1+activations": fit(
            [tb_layergrad.GradientLogger(os.path.join(logdir, f"fit_{name}_1a"), update_freq=1, activations=True)]
        ),
        "ours_every_10+activations": fit(
            [tb_layergrad.GradientLogger(os.path.join(logdir, f"fit_{name}_10a"), update_freq=10, activations=True)]
        ),
        "keras.TensorBoard(histogram_freq=1)": fit(
            [keras.callbacks.TensorBoard(os.path.join(logdir, f"fit_{name}_keras"), histogram_freq=1)]
        ),
    }


def weights_fit_variants(name: str, logdir: str, steps: int) -> Dict[str, Step]:
    """fit() logging every layer every step with `weights=False` (first: the baseline of the ratio asked for), the
    same with `weights=True`, and fit() without callbacks; as `fit_variants`."""
    fit = _fit_runner(name, steps)
    logger = tb_layergrad.GradientLogger
    return {
        "weights=False": fit([logger(os.path.join(logdir, f"fit_{name}_w0"), update_freq=1)]),
        "weights=True": fit([logger(os.path.join(logdir, f"fit_{name}_w1"), update_freq=1, weights=True)]),
        "plain": fit([]),
    }


def _fit_runner(name: str, steps: int) -> Callable[[List], Step]:
    """`fit(callbacks)`: a call of one fit() epoch of `steps` batches of `name`'s model (one model for all variants,
    compiled once), returning its mean seconds per batch, tracing excluded (`BatchTimer`); each call's CPU seconds
    per batch (the whole process's) are appended to the call's `cpu` list."""
    model, x, y = MODELS[name]()
    n = int(x.shape[0])
    xs = tf.tile(x, [steps] + [1] * (len(x.shape) - 1))
    ys = tf.tile(y, [steps])
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss=_loss())

    def fit(callbacks: List) -> Step:
        def run():
            timer = BatchTimer()
            model.fit(xs, ys, batch_size=n, epochs=1, verbose=0, shuffle=False, callbacks=callbacks + [timer])
            run.cpu.append(timer.cpu_seconds_per_batch)
            return timer.seconds_per_batch

        run.cpu = []
        return run

    return fit


def paired_cpu(variants: Dict[str, Step]) -> Dict[str, float]:
    """{variant: median over rounds of its CPU seconds per batch / the baseline's}, of `_fit_runner` calls made by
    `interleaved_results` (their `cpu` lists, one entry per round). Why beside the time: on a shared machine a
    step's wall time includes waiting for a core; the process's CPU time is the work the variant adds."""
    return _paired({k: v.cpu for k, v in variants.items()})[1]  # type: ignore[attr-defined]


def reduction_cpu_seconds(tensors: List[tf.Tensor], buckets: int = 30, calls: int = 200) -> float:
    """CPU seconds of one call of the fused kernel's reduction (histograms and stats) of `tensors`, alone: `calls`
    calls in one `tf.while_loop` (no per-call dispatch), the median of 7 such loops."""
    if fused_kernel.op() is None:
        return float("nan")

    @tf.function(autograph=False)
    def loop():
        def body(i, acc):
            _, stats = fused_kernel.histograms_and_stats(tensors, buckets)
            return i + 1, acc + stats[0, 0]

        return tf.while_loop(lambda i, _: i < calls, body, [tf.constant(0), tf.constant(0.0, tf.float64)])

    loop()
    times = []
    for _ in range(7):
        start = time.process_time()
        loop()
        times.append((time.process_time() - start) / calls)
    return statistics.median(times)


def interleaved_results(variants: Dict[str, Step], rounds: int) -> Tuple[float, Dict[str, float]]:
    """(baseline seconds per step, {variant: median over rounds of its value / the baseline's}).

    Each variant returns its own seconds per step; the first variant is the baseline. A ratio is
    taken within one round (variants run next to each other), then the median over rounds: the
    machine's speed drifts between rounds far more than within one.
    """
    values: Dict[str, List[float]] = {k: [] for k in variants}
    for order in _round_orders(list(variants), rounds):
        for key in order:
            values[key].append(variants[key]())
    return _paired(values)


def run_length(per_call: float) -> int:
    """Calls a variant makes in one turn: the fewest of 1, 2, 5, 10 lasting MIN_RUN_S.

    Why: variants alternating call by call pair each call with the baseline's within one
    step, which cancels the machine's drift (the CNN's per-round ratios: sd 9% in blocks of
    10 calls, 2% call by call), but a 3 ms step then runs right after a different step and
    pays for it: the MLP's every-step ratio read 1.04x call by call against 1.07-1.08x in
    runs of 10 (and 1.073-1.076x in long in-step A/Bs). Runs of >= 30 ms keep that below
    noise while still alternating every ~0.1 s. (Divisors of LOG_PERIOD keep the arithmetic
    of a round simple; each variant counts its own steps, so any run length logs "every
    10 steps" once in ten of its calls.)
    """
    for calls in (1, 2, 5):
        if calls * per_call >= MIN_RUN_S:
            return calls
    return LOG_PERIOD


def interleaved(
    variants: Dict[str, Step],
    rounds: int,
    block_seconds: float = 0.5,
    warmup: Optional[int] = None,
    short_step_rounds: int = 1,
) -> Tuple[float, Dict[str, float], int, int]:
    """(baseline seconds per call, {variant: median over rounds of its time / the baseline's}, calls per round, rounds).

    The first variant is the baseline. In every round each variant makes the same number
    of calls (about `block_seconds` of the baseline, a multiple of LOG_PERIOD), taking
    turns in runs of `run_length` calls, in the round's shuffled order; ratios are taken
    within a round, then the median over rounds (see `interleaved_results`). A variant's
    `prepare`, if any, runs before each of its runs (untimed). A baseline step shorter than
    SHORT_STEP_S runs `short_step_rounds` times as many rounds: there the overheads are a few
    hundredths and a round's ratio moves by as much.
    """
    warmup = WARMUP_CALLS if warmup is None else warmup
    for fn in variants.values():
        _prepare(fn)
        for _ in range(warmup):
            fn()
    base = next(iter(variants.values()))
    _prepare(base)
    start = time.perf_counter()
    _sync(base())
    per_call = time.perf_counter() - start
    per_round = max(1, min(100, round(block_seconds / max(per_call, 1e-6) / LOG_PERIOD))) * LOG_PERIOD
    run = run_length(per_call)
    if per_call < SHORT_STEP_S:
        rounds *= short_step_rounds
    times: Dict[str, List[float]] = {k: [] for k in variants}
    for order in _round_orders(list(variants), rounds):
        spent = {k: 0.0 for k in variants}
        for _ in range(per_round // run):
            for key in order:
                fn = variants[key]
                _prepare(fn)
                start = time.perf_counter()
                for _ in range(run):
                    out = fn()
                _sync(out)
                spent[key] += time.perf_counter() - start
        for key in variants:
            times[key].append(spent[key] / per_round)
    base_s, ratios = _paired(times)
    return base_s, ratios, per_round, rounds


def _round_orders(keys: List[str], rounds: int) -> List[List[str]]:
    """The order of the variants in each round: shuffled (seeded), so no variant always runs right
    after the same one (a variant that leaves caches or the allocator in a bad state would otherwise
    always slow the same neighbour; seen here as an every-10-steps ratio below 1)."""
    rng = random.Random(0)
    return [rng.sample(keys, len(keys)) for _ in range(rounds)]


def _prepare(fn: Step) -> None:
    prepare = getattr(fn, "prepare", None)
    if prepare is not None:
        prepare()


def _sync(out) -> None:
    if hasattr(out, "numpy"):
        out.numpy()


def _paired(values: Dict[str, List[float]]) -> Tuple[float, Dict[str, float]]:
    keys = list(values)
    base = values[keys[0]]
    ratios = {k: statistics.median(v / b for v, b in zip(values[k], base)) for k in keys[1:]}
    return statistics.median(base), ratios


def bytes_per_layer_step(logdir: str, run: str, layers: int, logged_steps: int) -> float:
    path = os.path.join(logdir, run)
    total = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return total / max(1, layers * logged_steps)


def new_logdir() -> str:
    return tempfile.mkdtemp(prefix="layergrad_bench_")
