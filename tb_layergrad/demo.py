"""The built-in demo: a few small trainings that write gradients, on CPU.

Each run shows one behaviour a person should be able to spot in the tab:
- `seed_minimalrnn`: the seed question's subclassed RNN model (custom loop);
  its `minimalrnn` output gradient is exactly what the question asked for.
- `mlp_sigmoid`: a deep sigmoid MLP; gradient norms shrink toward the input
  (vanishing gradients).
- `mlp_relu_he`: the same depth with ReLU and He init; they do not.
Everything uses the public API the way a user would.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, List, Optional

DEFAULT_LOGDIR = "layergrad_demo"


def _progress(label: str, done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / total)
    bar = "#" * filled + "-" * (width - filled)
    sys.stdout.write(f"\r  {label:<18} [{bar}] {done}/{total} steps  {time.time() - started:5.1f}s")
    if done == total:
        sys.stdout.write("\n")
    sys.stdout.flush()


def _train(label: str, logdir: str, model, make_batch: Callable, loss_fn, steps: int, learning_rate: float, every: int) -> None:
    import tensorflow as tf

    import tb_layergrad

    optimizer = tf.keras.optimizers.SGD(learning_rate)
    writer = tf.summary.create_file_writer(os.path.join(logdir, label))
    x0, _ = make_batch(0)
    model(x0)  # build, so that the optimizer sees every variable

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = loss_fn(y, model(x))
        grads = cap.gradients(tape, loss)
        optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
        with writer.as_default(step=optimizer.iterations), tf.summary.record_if(optimizer.iterations % every == 0):
            tb_layergrad.summary.gradients(grads)
            tf.summary.scalar("loss", loss)
        return loss

    started = time.time()
    for i in range(steps):
        x, y = make_batch(i)
        step(x, y)
        if (i + 1) % max(1, steps // 20) == 0 or i + 1 == steps:
            _progress(label, i + 1, steps, started)
    writer.close()


def run(logdir: str = DEFAULT_LOGDIR, quick: bool = False) -> List[str]:
    """Train the demo runs into `logdir`; returns the run names."""
    import numpy as np
    import tensorflow as tf

    from tb_layergrad import demo_models

    tf.keras.utils.set_random_seed(0)
    steps = 60 if quick else 300
    every = 1 if quick else 2

    seed_x = tf.constant([[[3.0], [0.0], [1.0], [2.0], [3.0]]] * 2)
    seed_y = tf.constant([[0.0, 1.0, 2.0, 3.0]] * 2)
    mse = tf.keras.losses.MeanSquaredError()
    _train("seed_minimalrnn", logdir, demo_models.MyModel(2), lambda i: (seed_x, seed_y), mse, steps, 0.01, every)

    rng = np.random.default_rng(0)
    x_all = rng.normal(size=(4096, 32)).astype(np.float32)
    y_all = (x_all[:, :4].sum(axis=1) > 0).astype(np.int32) + 2 * (x_all[:, 4] > 0).astype(np.int32)

    def batch(i: int):
        lo = (i * 64) % 4096
        return tf.constant(x_all[lo : lo + 64]), tf.constant(y_all[lo : lo + 64])

    xent = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for label, act, init in (("mlp_sigmoid", "sigmoid", "glorot_uniform"), ("mlp_relu_he", "relu", "he_normal")):
        model = demo_models.deep_mlp(12, 64, act, init, 32, 4, name=label)
        _train(label, logdir, model, batch, xent, steps, 0.1, every)
    return ["seed_minimalrnn", "mlp_sigmoid", "mlp_relu_he"]


def serve(logdir: str, port: int = 6006, host: str = "127.0.0.1") -> None:
    """Start TensorBoard on `logdir` and block; prints the URL of the tab."""
    from tensorboard import program

    tb = program.TensorBoard()
    tb.configure(argv=[None, "--logdir", logdir, "--host", host, "--port", str(port)])
    url = tb.launch()
    print(f"TensorBoard is serving the layer-gradient tab at {url}#layergrad  (Ctrl+C to stop)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def main(logdir: str = DEFAULT_LOGDIR, quick: bool = False, do_serve: bool = False, port: Optional[int] = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"Training the demo runs into {os.path.abspath(logdir)} ...")
    runs = run(logdir, quick)
    print(f"Wrote {len(runs)} runs: {', '.join(runs)}")
    if do_serve:
        serve(logdir, port or 6006)
    else:
        print(f"Open them with:  tensorboard --logdir {logdir}   then the 'Layer gradients' tab")
    return 0
