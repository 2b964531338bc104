"""Regenerate the screenshots of the tab shown in the README (docs/screenshots/*.png).

    python scripts/screenshots.py                 # trains the runs in a temporary logdir (~2 min on CPU)
    python scripts/screenshots.py --logdir DIR    # reuse DIR if it already holds the runs

The logdir is realistic: the built-in demo (`tb-layergrad demo --quick`: a seed RNN, a deep sigmoid
MLP whose gradients vanish, the same MLP with ReLU + He init, and the other demo runs), plus two runs written here with the
public API: an LSTM model with weight gradients, raw tensors, per-timestep norms and a second
target, and an MLP whose learning rate is too high (its gradients explode, then turn NaN).
Needs Debian's Chromium (`apt-get install chromium`) and Playwright; reuses tests/tab_fixtures.py and
tests/tensorboard_process.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import tab_fixtures  # noqa: E402
from tensorboard_process import TensorBoardProcess  # noqa: E402

WIDTH = 1400


def write_lstm_run(logdir: str, steps: int = 60) -> None:
    """Sequence model: LSTM -> LSTM -> Dense -> Dense, weights captured, raw tensors, timesteps, 2 targets."""
    import keras
    import numpy as np
    import tensorflow as tf

    import tb_layergrad

    keras.utils.set_random_seed(1)
    T, F = 12, 8
    model = keras.Sequential(
        [
            keras.Input((T, F)),
            keras.layers.LSTM(24, return_sequences=True, name="lstm"),
            keras.layers.LSTM(16, name="lstm_2"),
            keras.layers.Dense(16, activation="relu", name="dense"),
            keras.layers.Dense(1, name="out"),
        ],
        name="seq_model",
    )
    optimizer = keras.optimizers.Adam(3e-3)
    rng = np.random.default_rng(0)
    x_all = rng.normal(size=(2048, T, F)).astype(np.float32)
    y_all = (x_all[:, :3, 0].sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
    mse = keras.losses.MeanSquaredError()
    writer = tf.summary.create_file_writer(os.path.join(logdir, "lstm_weights"))
    model(x_all[:2])

    @tf.function
    def train_step(x, y):
        with tf.GradientTape(persistent=True) as tape:
            with tb_layergrad.capture(model, weights=True, tape=tape) as cap:
                pred = model(x)
                loss = mse(y, pred)
                pred_sq = tf.reduce_mean(tf.square(pred))  # a second target
        grads = cap.gradients(tape, loss)
        aux = cap.gradients(tape, pred_sq, name="pred_sq")
        optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
        with writer.as_default(step=optimizer.iterations):
            tb_layergrad.summary.gradients(grads, max_elements=24 * 24)
            for path, g in aux.outputs.items():
                tb_layergrad.summary.ops.write_tensor(path, g, target="pred_sq", index=aux.entry(path).index)
            # Per-timestep norms of the first LSTM's output gradient (return_sequences=True: one h_t per step).
            # An illustration only: GradientLogger(timesteps=True) records the total dL/dh_t.
            g = grads["seq_model/lstm"]
            tb_layergrad.summary.ops.write_timesteps(
                "seq_model/lstm",
                tf.sqrt(tf.reduce_sum(tf.square(g), axis=[0, 2])),
                index=grads.entry("seq_model/lstm").index,
            )

    for step in range(steps):
        lo = (step * 32) % 2048
        train_step(tf.constant(x_all[lo : lo + 32]), tf.constant(y_all[lo : lo + 32]))
    writer.close()


def write_diverging_run(logdir: str, steps: int = 60) -> None:
    """A ReLU MLP with SGD(0.2, momentum 0.9): the gradients grow, then turn NaN around step 25."""
    import keras
    import numpy as np
    import tensorflow as tf

    import tb_layergrad
    from tb_layergrad.cli import demo_models

    keras.utils.set_random_seed(0)
    model = demo_models.deep_mlp(8, 64, "relu", "he_normal", 32, 4, name="mlp_lr_too_high")
    rng = np.random.default_rng(0)
    x_all = rng.normal(size=(4096, 32)).astype(np.float32)
    y_all = (x_all[:, :4].sum(axis=1) > 0).astype(np.int32)
    optimizer = keras.optimizers.SGD(0.2, momentum=0.9)
    xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    writer = tf.summary.create_file_writer(os.path.join(logdir, "mlp_lr_too_high"))
    model(x_all[:2])

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = xent(y, model(x))
        grads = cap.gradients(tape, loss)
        optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
        with writer.as_default(step=optimizer.iterations):
            tb_layergrad.summary.gradients(grads)

    for step in range(steps):
        lo = (step * 64) % 4096
        train_step(tf.constant(x_all[lo : lo + 64]), tf.constant(y_all[lo : lo + 64]))
    writer.close()


RUNS = ["seed_minimalrnn", "mlp_sigmoid", "mlp_relu_he", "gan", "lstm_weights", "mlp_lr_too_high"]


def make_logdir(logdir: str) -> None:
    if all(os.path.isdir(os.path.join(logdir, r)) for r in RUNS):
        print(f"reusing the runs in {logdir}")
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tb_layergrad.cli import demo

    print("training the demo runs ...")
    demo.run(logdir, quick=True)
    print("training lstm_weights ...")
    write_lstm_run(logdir)
    print("training mlp_lr_too_high ...")
    write_diverging_run(logdir)


def last_steps() -> dict:
    """The step each run is complete at (at least): the demo's quick plan for its runs, 60 for the ones written here."""
    from tb_layergrad.cli import demo

    plan = demo.Plan.for_mode(True)
    steps = {"seed_minimalrnn": plan.seed, "mlp_sigmoid": plan.mlp, "mlp_relu_he": plan.mlp, "gan": plan.gan}
    return {r: steps.get(r, 60) - 1 for r in RUNS}


# name, state (lg_* keys), selectors that say the view is drawn, mouse position over the heatmap (or None)
SHOTS = [
    ("runs.png", {"view": "runs"}, [".lg-runs[data-draw-ms]", ".lg-scatter-point"], None),
    ("overview.png", {"run": "mlp_sigmoid"}, [".lg-overview .lg-heatmap-canvas[data-cols='60']"], (0.3, 2.5 / 9)),
    ("overview-nan.png", {"run": "mlp_lr_too_high"}, [".lg-overview .lg-heatmap-canvas[data-cols='60']"], None),
    ("overview-gan.png", {"run": "gan", "target": "generator"}, [".lg-overview .lg-heatmap-canvas"], None),
    (
        "layer.png",
        {"run": "lstm_weights", "view": "layer", "layer": "seq_model/lstm", "step": 30},
        [
            ".lg-panel-ts path.lg-line",
            ".lg-panel-tensor .lg-heatmap-canvas[data-rows='2']",
            ".lg-panel-hist path.lg-ridge",
        ],
        None,
    ),
    (
        "compare.png",
        {
            "run": "mlp_sigmoid",
            "view": "compare",
            "layer": "mlp_sigmoid/dense_3",
            "runs": json.dumps(["mlp_sigmoid", "mlp_relu_he"]),
            "step": 40,
        },
        [".lg-compare path.lg-aligned", ".lg-compare .lg-panel:nth-child(2) path.lg-line"],
        None,
    ),
]


def take(browser: tab_fixtures.Browser, base: str, out_dir: str) -> None:
    page = browser.page
    for name, state, ready, hover in SHOTS:
        page.set_viewport_size({"width": WIDTH, "height": 900})
        frame = browser.open(base, state)
        for selector in ready:
            frame.wait_for_selector(selector, timeout=30_000)
        time.sleep(0.8)  # the other panels of the view
        top = frame.frame_element().bounding_box()["y"]
        height = frame.evaluate("() => document.querySelector('.lg-root').getBoundingClientRect().height")
        page.set_viewport_size({"width": WIDTH, "height": int(top + height + 8)})
        time.sleep(0.6)  # charts redraw to the new size
        if hover:
            canvas = frame.locator(".lg-heatmap-canvas").first
            box = canvas.bounding_box()
            canvas.hover(position={"x": hover[0] * box["width"], "y": hover[1] * box["height"]})
            time.sleep(0.3)
        path = os.path.join(out_dir, name)
        page.screenshot(path=path)
        print("wrote", os.path.relpath(path, ROOT))
    if browser.errors or browser.dialogs:
        raise SystemExit("problems in the browser:\n" + "\n".join(browser.errors + browser.dialogs))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logdir", help="where the runs are (or go); default: a temporary folder")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "screenshots"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        logdir = args.logdir or os.path.join(tmp, "logs")
        make_logdir(logdir)
        tb = TensorBoardProcess(logdir, os.path.join(tmp, "tensorboard.log"))
        browser = None
        try:
            tb.wait_for_runs(last_steps(), timeout=90)
            browser = tab_fixtures.Browser(os.path.join(tmp, "profile"), viewport=(WIDTH, 900))
            take(browser, tb.base, args.out)
        finally:
            if browser is not None:
                browser.close()
            tb.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
