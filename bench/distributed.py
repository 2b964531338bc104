"""Overhead of logging under MirroredStrategy (2 logical CPU devices): plain step vs the all-gather merge.

    python bench/distributed.py [--rounds 7] [--steps 20] [--batch 256]

Custom loop, MLP 64-512-512-10, every layer captured. Variants: plain (no
capture); gather/N: summary.gradients in replica context (the replicas'
tensors all-gathered), recorded every N steps (the merge runs at EVERY
step: collectives cannot run inside the recording condition); cross/10: the
layer-output gradients returned from strategy.run and written in cross-replica
context, where strategy.gather runs on recorded steps only. Variants run in interleaved
rounds; the median per-step time of each and its ratio to the plain step are
printed. The numbers are only comparable within one run: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np

    import tb_layergrad

    strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        opt = keras.optimizers.SGD(0.01)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, 64)).astype("float32")
    y = rng.integers(0, 10, size=(args.batch,))
    ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y)).repeat())
    it = iter(ds)
    logdir = tempfile.mkdtemp(prefix="bench_distributed_")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def make(mode, every=1, cross=False):
        writer = tf.summary.create_file_writer(os.path.join(logdir, f"{mode}_{every}_{cross}"))
        record = lambda: tf.equal(opt.iterations % every, 0)  # noqa: E731

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                if mode is None:
                    loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb)), global_batch_size=args.batch)
                    grads = tape.gradient(loss, model.trainable_variables)
                else:
                    with tb_layergrad.capture(model, tape=tape) as cap:
                        loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb)), global_batch_size=args.batch)
            if mode is not None:
                gmap = cap.gradients(tape, loss)
                grads = gmap.variable_gradients
                if not cross:
                    with writer.as_default(step=opt.iterations), tf.summary.record_if(record):
                        tb_layergrad.summary.gradients(gmap)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return gmap.outputs if cross else None

        @tf.function
        def step(xb, yb):
            out = strategy.run(replica_step, (xb, yb))
            if cross:  # cross-replica: strategy.gather inside the recording condition, logged steps only
                with writer.as_default(step=opt.iterations), tf.summary.record_if(record):
                    tb_layergrad.summary.gradients(out, strategy=strategy)

        return step

    variants = {
        "plain": make(None),
        "gather/1": make("gather"),
        "gather/10": make("gather", 10),
        "cross/10": make("gather", 10, cross=True),
    }
    for fn in variants.values():  # trace + warm up
        for _ in range(3):
            fn(*next(it))
    times = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            t = time.perf_counter()
            for _ in range(args.steps):
                fn(*next(it))
            opt.iterations.numpy()
            times[name].append((time.perf_counter() - t) / args.steps)
    base = statistics.median(times["plain"])
    print(
        f"MirroredStrategy, 2 logical CPUs, MLP 64-512-512-10, global batch {args.batch}, "
        f"{args.rounds} rounds x {args.steps} steps (median per step; shared machine)"
    )
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:9s} {m * 1e3:8.2f} ms  {m / base:5.2f}x")


if __name__ == "__main__":
    main()
