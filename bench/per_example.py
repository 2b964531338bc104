"""Cost of per-example gradient norms (`capture(..., per_example=True)`): custom-loop steps side by side.

Every variant trains the same model on the same batch in a `tf.function` step
with SGD applied, taking turns with the plain step in interleaved rounds
(`overhead.interleaved`: ratios within a round, median over rounds). Variants:
the capture with weights logging its records (`summary.gradients`), without and
with `per_example=True` (the `examples` records and the noise scale written),
every step and every 10th. With `per_example=True` every step's backward pass
also yields the δs the norms need; the norms themselves, the records and the
noise scale are computed on logged steps only (the capture defers them:
`per_example_map.Deferred`).

    python bench/per_example.py [--models mlp,cnn,transformer] [--rounds N] [--block S]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Callable, Dict, List, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import overhead  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402
from models import MODELS  # noqa: E402

import tb_layergrad  # noqa: E402

TRANSFORMER = dict(batch=32, tokens=32, width=64, heads=4, hidden=256)


def transformer() -> Tuple[keras.Model, tf.Tensor, tf.Tensor]:
    """One pre-norm Transformer block (attention, MLP, residuals, LayerNorm) and a classifier on the mean token."""
    t, d = TRANSFORMER["tokens"], TRANSFORMER["width"]
    inputs = keras.Input((t, d))
    h = layers.LayerNormalization(name="ln_1")(inputs)
    h = layers.MultiHeadAttention(TRANSFORMER["heads"], d // TRANSFORMER["heads"], name="attention")(h, h)
    x = layers.Add(name="residual_1")([inputs, h])
    h = layers.LayerNormalization(name="ln_2")(x)
    h = layers.Dense(TRANSFORMER["hidden"], activation="gelu", name="mlp_in")(h)
    h = layers.Dense(d, name="mlp_out")(h)
    x = layers.Add(name="residual_2")([x, h])
    logits = layers.Dense(10, name="head")(layers.GlobalAveragePooling1D(name="pool")(x))
    model = keras.Model(inputs, logits, name="transformer")
    b = TRANSFORMER["batch"]
    return model, tf.random.normal([b, t, d]), tf.random.uniform([b], 0, 10, tf.int32)


BUILDERS: Dict[str, Callable] = {"mlp": MODELS["mlp"], "cnn": MODELS["cnn"], "transformer": transformer}
DESCRIPTION = {
    "mlp": "MLP 784-256-256-128-10, batch 128",
    "cnn": "CNN (4 Conv2D 3x3, 32-64 channels, on 32x32x3; Dense 128), batch 64",
    "transformer": (
        f"Transformer block (MultiHeadAttention {TRANSFORMER['heads']} heads, MLP {TRANSFORMER['hidden']}, "
        f"2 LayerNorm), T {TRANSFORMER['tokens']}, d {TRANSFORMER['width']}, batch {TRANSFORMER['batch']}"
    ),
}
VARIANTS = (
    "capture (weights), every step",
    "capture (weights), every 10th",
    "per_example, every step",
    "per_example, every 10th",
)


def variants(name: str, logdir: str) -> Dict[str, Callable]:
    """plain, then the capture with weights without / with per_example=True, logged every step / every 10th."""
    model, x, y = BUILDERS[name]()
    model(x)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(1e-4)
    opt.build(model.trainable_variables)
    it = opt.iterations

    @tf.function
    def plain(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    def logged(every: int, per_example: bool) -> Callable:
        writer = tf.summary.create_file_writer(os.path.join(logdir, f"{name}_{int(per_example)}_{every}"))

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

        def prepare(calls: int) -> None:  # untimed, before each run of calls (as bench/overhead.py)
            it.assign(calls)
            writer.set_as_default(step=it)

        step.prepare = prepare
        return step

    plain.prepare = lambda calls: it.assign(calls)
    fns = {"plain": plain}
    for label, (every, per_example) in zip(VARIANTS, ((1, False), (10, False), (1, True), (10, True))):
        fns[label] = logged(every, per_example)
    return {k: overhead._BoundStep(f, x, y) for k, f in fns.items()}  # noqa: SLF001 - the same binding as overhead's


def measure(models: List[str], rounds: int, block_seconds: float) -> List[Tuple[str, float, Dict[str, float]]]:
    rows = []
    for name in models:
        logdir = overhead.new_logdir()
        try:
            base, ratios, _, _ = overhead.interleaved(
                variants(name, logdir), rounds, block_seconds, short_step_rounds=4
            )
        finally:
            shutil.rmtree(logdir, ignore_errors=True)
        rows.append((name, base, ratios))
        print(f"  measured per_example {name}", flush=True)
    return rows


def table(rows: List[Tuple[str, float, Dict[str, float]]]) -> List[str]:
    lines = [
        "### Per-example gradient norms (`per_example=True`), custom loop (tf.function step), ratio to the plain step\n",
        "| model | plain step | " + " | ".join(VARIANTS) + " |",
        "|---|---|" + "---|" * len(VARIANTS),
    ]
    for name, base, ratios in rows:
        lines.append(f"| {name} | {base * 1e3:.2f} ms | " + " | ".join(f"{ratios[k]:.2f}x" for k in VARIANTS) + " |")
    lines += [
        "",
        "Models: " + "; ".join(f"{k}: {DESCRIPTION[k]}" for k, _, _ in rows) + ". Every variant captures "
        "every layer with its weights and writes its records through `summary.gradients`; `per_example` adds "
        "the per-example norms, their `examples` records and the noise-scale scalars, all computed on logged "
        "steps only.",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,cnn,transformer")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=float, default=0.5, help="seconds of plain steps per round")
    args = parser.parse_args()
    print("\n".join(table(measure(args.models.split(","), args.rounds, args.block))))


if __name__ == "__main__":
    main()
