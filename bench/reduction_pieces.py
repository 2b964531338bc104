"""What each piece of the reductions costs per element, on the gradients of one step of the benchmark models.

    python bench/reduction_pieces.py                 # cnn and mlp, 11 rounds (minutes; quiet machine please)
    python bench/reduction_pieces.py --smoke         # seconds: keeps the script working

Each piece (one TensorFlow kernel per statistic, `histogram_fixed_width`, a float32 bucket index counted by
`bincount`, the step's tensors concatenated and reduced by segment ops, XLA, `statistics.reductions` as the
step runs it, the fused kernel) runs `CALLS` times in one `tf.while_loop` (no per-call dispatch from Python);
the pieces take turns in every round, in a shuffled order, and each figure is the median over rounds of its
time divided by a plain `reduce_sum` of the same tensors in the same round (docs/DESIGN.md, "Reductions").
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from typing import Callable, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from models import MODELS  # noqa: E402

import tb_layergrad  # noqa: E402
from tb_layergrad.kernel import fused as fused_kernel  # noqa: E402
from tb_layergrad.statistics import reductions  # noqa: E402

CALLS = 10
BUCKETS = 30


def step_gradients(name: str) -> List[tf.Tensor]:
    """The layer-output and weight gradients of one training step of `name`, flat."""
    model, x, y = MODELS[name]()
    model(x)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = loss_fn(y, model(x))
    grads = cap.gradients(tape, loss)
    tensors = list(grads.outputs.values()) + list(grads.variable_gradients)
    return [tf.reshape(tf.identity(g), [-1]) for g in tensors if g is not None]


def pieces(flat: List[tf.Tensor]) -> Dict[str, Callable]:
    """name -> a function of no arguments computing that piece for every tensor of `flat`."""
    k = BUCKETS
    ranges = [tf.stack([tf.reduce_min(t), tf.reduce_max(t)]) for t in flat]
    ids = tf.constant(np.repeat(np.arange(len(flat), dtype=np.int32), [int(t.shape[0]) for t in flat]))

    def each(f: Callable) -> Callable:
        return lambda: [f(t, r) for t, r in zip(flat, ranges)]

    def magnitudes(t, r):
        a = tf.abs(t)
        return tf.reduce_sum(a), tf.reduce_sum(tf.sign(a))

    def indexed(t, r):  # the fused kernel's float32 bucket index, counted by bincount (the last bucket closed)
        scale = tf.cast(k / (tf.cast(r[1], tf.float64) - tf.cast(r[0], tf.float64)), t.dtype)
        counts = tf.math.bincount(tf.cast((t - r[0]) * scale, tf.int32), minlength=k + 1, maxlength=k + 1)
        return counts[:k] + tf.one_hot(k - 1, k, on_value=counts[k], off_value=0, dtype=tf.int32)

    def six(t, r):
        a = tf.abs(t)
        figures = [tf.reduce_min(t), tf.reduce_max(t), tf.reduce_sum(t), tf.nn.l2_loss(t)]
        return figures + [tf.reduce_sum(a), tf.reduce_sum(tf.sign(a))]

    def six_and_histogram(t, r):
        figures = six(t, r)
        return figures + [tf.histogram_fixed_width(t, tf.stack(figures[:2]), nbins=k)]

    def batched(xla: bool):  # one vector, segment reductions, one count: the op count does not grow with tensors
        def run():
            x = tf.concat(flat, 0)
            n = len(flat)
            if xla:  # XLA compiles the unsorted segment ops only
                seg_min = lambda v: tf.math.unsorted_segment_min(v, ids, n)  # noqa: E731
                seg_max = lambda v: tf.math.unsorted_segment_max(v, ids, n)  # noqa: E731
                seg_sum = lambda v: tf.math.unsorted_segment_sum(v, ids, n)  # noqa: E731
            else:
                seg_min = lambda v: tf.math.segment_min(v, ids)  # noqa: E731
                seg_max = lambda v: tf.math.segment_max(v, ids)  # noqa: E731
                seg_sum = lambda v: tf.math.segment_sum(v, ids)  # noqa: E731
            lo, hi = seg_min(x), seg_max(x)
            a = tf.abs(x)
            sums = [seg_sum(x), seg_sum(x * x), seg_sum(a), seg_sum(tf.sign(a))]
            index = tf.cast((x - tf.gather(lo, ids)) * tf.gather(k / (hi - lo), ids), tf.int32) + ids * (k + 1)
            if xla:
                counts = tf.math.unsorted_segment_sum(tf.ones_like(index), index, n * (k + 1))
            else:
                counts = tf.math.bincount(index, minlength=n * (k + 1), maxlength=n * (k + 1))
            return [lo, hi, counts] + sums

        return run

    out = {
        "a plain sum (reduce_sum)": (each(lambda t, r: tf.reduce_sum(t)), False),
        "min": (each(lambda t, r: tf.reduce_min(t)), False),
        "max": (each(lambda t, r: tf.reduce_max(t)), False),
        "sum of squares (l2_loss)": (each(lambda t, r: tf.nn.l2_loss(t)), False),
        "tf.nn.moments": (each(lambda t, r: tf.nn.moments(t, [0])), False),
        "abs(x) and sign(abs(x)), summed": (each(magnitudes), False),
        "histogram_fixed_width": (each(lambda t, r: tf.histogram_fixed_width(t, r, nbins=k)), False),
        "float32 bucket index + bincount": (each(indexed), False),
        "six statistics, one kernel each": (each(six), False),
        "six statistics + histogram_fixed_width": (each(six_and_histogram), False),
        "statistics.reductions (as the step, counts only)": (
            lambda: reductions.histograms_and_stats(flat, k, edges=False),
            False,
        ),
        "all tensors concatenated: segment ops + one bincount": (batched(False), False),
        "XLA: six statistics": (each(six), True),
        "XLA: all tensors concatenated, segment ops": (batched(True), True),
    }
    if fused_kernel.op() is not None:
        out["the fused kernel"] = (lambda: fused_kernel.histograms_and_stats(flat, k), False)
    return out


def looped(piece: Callable, jit: bool) -> Callable:
    """`piece` CALLS times in one tf.while_loop; jit: `piece` as one XLA-compiled function."""
    inner = tf.function(piece, jit_compile=True, autograph=False) if jit else piece

    @tf.function(autograph=False)
    def loop():
        def body(i, acc):
            outs = tf.nest.flatten(inner())
            total = tf.add_n([tf.cast(tf.reduce_sum(tf.cast(o, tf.float32)), tf.float64) for o in outs])
            return i + 1, acc + total

        return tf.while_loop(lambda i, _: i < CALLS, body, [tf.constant(0), tf.constant(0.0, tf.float64)])

    return loop


def measure(name: str, rounds: int) -> List[str]:
    flat = step_gradients(name)
    n = sum(int(t.shape[0]) for t in flat)
    loops = {key: looped(f, jit) for key, (f, jit) in pieces(flat).items()}
    for loop in loops.values():
        loop()  # tracing and compiling, untimed
    base = next(iter(loops))
    times: Dict[str, List[float]] = {key: [] for key in loops}
    rng = random.Random(0)
    for _ in range(rounds):
        for key in rng.sample(list(loops), len(loops)):
            start = time.perf_counter()
            loops[key]()
            times[key].append((time.perf_counter() - start) / CALLS)
    reference = "statistics.reductions (as the step, counts only)"
    lines = [
        f"{name}: {len(flat)} tensors, {n:,} elements (layer outputs and weights), {rounds} rounds",
        "",
        "| piece | ns per element | x a plain sum | x statistics.reductions |",
        "|---|---|---|---|",
    ]
    for key, values in times.items():
        to_sum = statistics.median(v / b for v, b in zip(values, times[base]))
        to_ours = statistics.median(v / b for v, b in zip(values, times[reference]))
        lines.append(f"| {key} | {statistics.median(values) / n * 1e9:.3f} | {to_sum:.2f}x | {to_ours:.2f}x |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp"], choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--smoke", action="store_true", help="one round of the MLP: keeps the script working")
    args = parser.parse_args()
    models, rounds = (["mlp"], 1) if args.smoke else (args.models, args.rounds)
    start = os.getloadavg()[0]
    for name in models:
        print("\n".join(measure(name, rounds)), flush=True)
    print(f"Load average (1 min) at the start {start:.1f}, at the end {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
