"""`tb-layergrad demo`: small trainings on CPU, each showing one classic gradient behaviour.

Every run uses the public API as a user would: `tb_layergrad.GradientLogger`
in `model.fit()`, except the seed model, which is trained in a custom loop
with `tb_layergrad.capture` + `tb_layergrad.summary.gradients`.

| run | what to see (overview of the Layer gradients tab, or `tb-layergrad report`) |
|---|---|
| `seed_minimalrnn` | the seed question's subclassed RNN: dL/d(output of `minimalrnn`) at every step |
| `mlp_sigmoid` | deep sigmoid MLP: the gradient shrinks ~4x per layer toward the input (vanishing) |
| `mlp_relu_he` | the same depth with ReLU and He init: it does not |
| `rnn_simplernn` | SimpleRNN, 80 timesteps, the answer is at the first one: dL/dh_t decays ~10^4 back through time |
| `rnn_lstm` | the same with an LSTM (forget-gate bias 3, "remember" at start): dL/dh_t reaches the first timestep |
| `dead_relu` | a Dense layer whose bias starts at -10 feeds a ReLU that is 0 everywhere: no gradient (dead) |
| `nan_log0` | a hand-written cross-entropy takes log(0) once a sigmoid saturates: the gradient turns NaN; born in the **loss** |
| `nan_forward` | a layer takes the log of features that one batch drives negative: born in the **forward** pass, in that layer (logged every 5 steps; the NaN step is written anyway) |
| `nan_backward` | a layer takes the square root of ReLU features: finite forward, but at the batch where one is 0 its gradient is infinite: born in the **backward** pass of that layer (logged every 5 steps) |
| `explode_noclip` | a linear head on frozen features, learning rate too high: every step overshoots, the gradient grows exponentially |
| `explode_clipnorm` | the same with `clipnorm=1.0`: the steps are bounded, it does not |
| `gan` | the guide's GAN (own optimizers, two tapes: two targets) with a saturating generator loss: the discriminator wins and the generator's gradients vanish (`demo_gan.py`) |
| `mislabelled` | an easy classifier whose data hold a few flipped labels, logged with `per_example=True`: once it has learnt, the flipped example carries most of each layer's per-example gradient energy at its step (`top_share`, `top_index_1`) |
| `sweep/lr=..,act=..` | six trials of learning rate x activation, hyperparameters logged with TensorBoard's `hp.KerasCallback`: the sigmoid trials' first layer vanishes whatever the learning rate (`demo_sweep.py`; `report --sort hp/act`) |

Quick mode trains fewer steps (every behaviour still shows); `--serve` then starts
TensorBoard on the logdir. Keras and TensorFlow are imported by the functions that train (here and in
`demo_nan`, `demo_sweep`, `demo_fit`): the demo's plan and names cost no TensorFlow to import.

On JAX (`KERAS_BACKEND=jax`) the same fit() runs train, written without TensorFlow; the runs whose training is
TensorFlow's own (`TENSORFLOW_ONLY`: a custom loop and a step that differentiate with `tf.GradientTape`) are
not trained, and the demo says why. What GradientLogger does not do on JAX yet is left out of a run there
(`demo_fit.on_tensorflow`): the RNN runs' `timesteps`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import time
from typing import Any, List, Optional

from tb_layergrad.cli import demo_fit, demo_nan, demo_sweep
from tb_layergrad.cli.demo_fit import Progress

DEFAULT_LOGDIR = "layergrad_demo"


@dataclasses.dataclass(frozen=True)
class DemoRun:
    name: str
    shows: str


RUNS = (
    DemoRun("seed_minimalrnn", "the seed question's subclassed RNN (custom loop)"),
    DemoRun("mlp_sigmoid", "vanishing: deep sigmoid MLP"),
    DemoRun("mlp_relu_he", "the same with ReLU + He init: no vanishing"),
    DemoRun("rnn_simplernn", "SimpleRNN: dL/dh_t decays back through time"),
    DemoRun("rnn_lstm", "LSTM: it reaches the first timestep"),
    DemoRun("dead_relu", "dead: a ReLU layer that is 0 everywhere"),
    DemoRun("nan_log0", "NaN born in the loss: log(0) in a hand-written loss"),
    DemoRun("nan_forward", "NaN born in the forward pass: log of a negative feature"),
    DemoRun("nan_backward", "Inf born in the backward pass: sqrt at 0"),
    DemoRun("explode_noclip", "exploding: learning rate too high, no clipping"),
    DemoRun("explode_clipnorm", "the same with clipnorm=1.0: stable"),
    DemoRun("mislabelled", "per-example norms: a few flipped labels stand out"),
    DemoRun("gan", "GAN: the discriminator wins, the generator's gradients vanish"),
)
RUN_NAMES = tuple(r.name for r in RUNS)
#: The runs that differentiate with `tf.GradientTape` themselves, and so train on TensorFlow only.
TENSORFLOW_ONLY = {
    "seed_minimalrnn": "a custom training loop with tf.GradientTape",
    "gan": "a train_step with tf.GradientTape",
}

MLP_DEPTH = 8  # hidden layers of the sigmoid / ReLU pair
SEQ_LEN = 80  # timesteps of the long-range task
LSTM_FORGET_BIAS = 3.0  # sigmoid(3) = 0.95: the cell keeps ~2/3 of its memory over 8 steps at the start
EXPLODE_LR = 0.7  # explode_*: above 2 / (largest curvature of the head's loss): each step overshoots
MISLABELLED_EVERY = 4  # mislabelled: one flipped label in every 4th batch (`mislabelled_positions`)
MISLABELLED_BATCH = 32


@dataclasses.dataclass(frozen=True)
class Plan:
    """Training steps (batches) per run."""

    seed: int
    mlp: int
    rnn: int
    dead: int
    nan: int
    explode: int  # the same in both modes: much longer and the unclipped run overflows to Inf
    gan: int

    @staticmethod
    def for_mode(quick: bool) -> "Plan":
        if quick:
            return Plan(seed=40, mlp=60, rnn=30, dead=30, nan=40, explode=45, gan=40)
        return Plan(seed=200, mlp=150, rnn=120, dead=100, nan=100, explode=45, gan=100)


_SHOWS = {r.name: r.shows for r in RUNS}


def _fit(name: str, *args, **kwargs) -> None:
    demo_fit.fit(name, _SHOWS[name], *args, **kwargs)


def _fit_classifier(name: str, logdir: str, hidden: list, data: tuple, steps: int, optimizer, **kwargs) -> None:
    """A two-class classifier: `hidden` layers, then 2 logits, trained on integer labels."""
    import keras

    inputs = keras.Input((data[0].shape[1],))
    model = keras.Sequential([inputs, *hidden, keras.layers.Dense(2, name="logits")], name=name)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    _fit(name, logdir, model, data, steps, optimizer=optimizer, loss=loss, **kwargs)


def _seed_run(logdir: str, steps: int) -> None:
    """The seed question's model in a custom training loop: capture + summary.gradients.

    Eager, like the README's quickstart: for a model this small, tracing a tf.function
    would take longer than the steps themselves.
    """
    import tensorflow as tf

    import tb_layergrad
    from tb_layergrad.cli.demo_models import MyModel

    name = "seed_minimalrnn"
    model, optimizer = MyModel(2), tf.keras.optimizers.Adam(0.01)
    x = tf.constant([[[3.0], [0.0], [1.0], [2.0], [3.0]]] * 2)
    y = tf.constant([[0.0, 1.0, 2.0, 3.0]] * 2)
    writer = tf.summary.create_file_writer(os.path.join(logdir, name))

    def train_step(x, y):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = cap.gradients(tape, loss)  # {"my_model/minimalrnn": dL/d(output), ...}
        optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
        with writer.as_default(step=optimizer.iterations):
            tb_layergrad.summary.gradients(grads)
        return loss

    progress = Progress(name, steps, _SHOWS[name])
    for i in range(steps):
        train_step(x, y)
        progress.update(i + 1)
    writer.close()
    progress.finish()


def _mlp_runs(logdir: str, steps: int) -> None:
    import keras
    import numpy as np

    from tb_layergrad.cli.demo_models import deep_mlp

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 64, 32)).astype(np.float32)
    y = (x[:, :4].sum(axis=1) > 0).astype(np.int32) + 2 * (x[:, 4] > 0).astype(np.int32)
    for name, act, init in (("mlp_sigmoid", "sigmoid", "glorot_uniform"), ("mlp_relu_he", "relu", "he_normal")):
        keras.utils.set_random_seed(1)
        model = deep_mlp(MLP_DEPTH, 64, act, init, 32, 4, name=name)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        _fit(name, logdir, model, (x, y), steps, optimizer=keras.optimizers.SGD(0.1), loss=loss)


def _rnn_runs(logdir: str, steps: int) -> None:
    """The answer is the sign of the FIRST input; the loss sees only the last output."""
    import keras
    import numpy as np
    from keras import layers

    rng = np.random.default_rng(1)
    x = rng.normal(size=(steps * 64, SEQ_LEN, 1)).astype(np.float32)
    y = (x[:, 0, 0] > 0).astype(np.float32)
    for name in ("rnn_simplernn", "rnn_lstm"):
        keras.utils.set_random_seed(2)
        if name == "rnn_lstm":
            rnn = layers.LSTM(32, unit_forget_bias=False, bias_initializer=forget_bias(LSTM_FORGET_BIAS), name="rnn")
        else:
            rnn = layers.SimpleRNN(32, name="rnn")
        model = keras.Sequential([keras.Input((SEQ_LEN, 1)), rnn, layers.Dense(1, name="out")], name=name)
        loss = keras.losses.BinaryCrossentropy(from_logits=True)
        optimizer = keras.optimizers.Adam(0.003)
        _fit(name, logdir, model, (x, y), steps, optimizer=optimizer, loss=loss, timesteps=demo_fit.on_tensorflow())


def forget_bias(value: float):
    """An LSTM bias initializer: `value` for the forget gate, 0 elsewhere (Keras' gate order i, f, c, o)."""
    import keras
    import numpy as np

    def init(shape, dtype=None):
        units = shape[0] // 4
        bias = np.zeros(shape, np.float32)
        bias[units : 2 * units] = value
        return keras.ops.convert_to_tensor(bias, dtype=dtype or "float32")

    return init


def _dead_run(logdir: str, steps: int) -> None:
    """dense_0's pre-activations start near -10: relu_0 outputs 0 for every example, so no
    gradient reaches dense_0 (its output gradient is exactly 0) and it never recovers.
    (dense_1 is tanh so that relu_0 itself still receives a gradient: one dead layer.)"""
    import keras
    import numpy as np
    from keras import layers

    rng = np.random.default_rng(2)
    x = rng.normal(size=(steps * 64, 32)).astype(np.float32)
    y = (x[:, :4].sum(axis=1) > 0).astype(np.int32)
    keras.utils.set_random_seed(3)
    hidden = [
        layers.Dense(64, bias_initializer=keras.initializers.Constant(-10.0), name="dense_0"),
        layers.ReLU(name="relu_0"),
        layers.Dense(64, activation="tanh", name="dense_1"),
    ]
    _fit_classifier("dead_relu", logdir, hidden, (x, y), steps, keras.optimizers.SGD(0.1))


def _explode_runs(logdir: str, steps: int) -> None:
    """A linear head trained on frozen random features (as when fine-tuning) with too high a
    learning rate: the error grows by a constant factor per step, and so does the gradient."""
    import keras
    import numpy as np
    from keras import layers

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 64, 16)).astype(np.float32)
    w = rng.normal(size=(16, 1)).astype(np.float32)
    y = (x @ w).astype(np.float32)
    for name, clipnorm in (("explode_noclip", None), ("explode_clipnorm", 1.0)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((16,)),
                layers.Dense(64, activation="tanh", trainable=False, name="features"),
                layers.Dense(1, name="head"),
            ],
            name=name,
        )
        _fit(
            name,
            logdir,
            model,
            (x, y),
            steps,
            optimizer=keras.optimizers.SGD(EXPLODE_LR, clipnorm=clipnorm),
            loss=keras.losses.MeanSquaredError(),
        )


def mislabelled_positions(steps: int) -> dict:
    """{step: batch position} of the flipped labels of the `mislabelled` run: one in every MISLABELLED_EVERY-th
    batch (steps counted from 1, as the optimizer does), at a position drawn once (seed 7)."""
    import numpy as np

    rng = np.random.default_rng(7)
    return {
        step: int(rng.integers(MISLABELLED_BATCH)) for step in range(MISLABELLED_EVERY, steps + 1, MISLABELLED_EVERY)
    }


def _mislabelled_run(logdir: str, steps: int) -> None:
    """Two well-separated classes (the sign of the first feature, far from 0) and a few flipped labels.

    Why it shows: once the classifier is confident, a correctly labelled example's
    own loss gradient is near 0 and a flipped one's is as large as it gets, so at
    the steps whose batch holds one, that example carries most of each layer's
    sum of squared per-example norms (`top_share` near 1, at `top_index_1`).
    """
    import keras
    import numpy as np
    from keras import layers

    rng = np.random.default_rng(8)
    x = rng.normal(size=(steps * MISLABELLED_BATCH, 16)).astype(np.float32)
    x[:, 0] = np.sign(x[:, 0]) * (2.0 + np.abs(x[:, 0]))  # a margin: every label is easy to learn
    y = (x[:, 0] > 0).astype(np.int32)
    for step, position in mislabelled_positions(steps).items():
        i = (step - 1) * MISLABELLED_BATCH + position
        y[i] = 1 - y[i]
    keras.utils.set_random_seed(4)
    hidden = [layers.Dense(32, activation="relu", name="dense_0"), layers.Dense(32, activation="relu", name="dense_1")]
    optimizer = keras.optimizers.Adam(0.01)
    _fit_classifier("mislabelled", logdir, hidden, (x, y), steps, optimizer, batch=MISLABELLED_BATCH, per_example=True)


def _clear_previous(logdir: str) -> int:
    """Remove the event files of an earlier demo in the demo's own run folders (else both would show)."""
    removed = 0
    for name in RUN_NAMES:
        for path in glob.glob(os.path.join(glob.escape(logdir), name, "events.out.tfevents.*")):
            os.remove(path)
            removed += 1
    return removed


def run(logdir: str = DEFAULT_LOGDIR, quick: bool = False) -> List[str]:
    """Train every demo run into `logdir` (replacing an earlier demo's runs there); returns the run names."""
    import keras

    if _clear_previous(logdir):
        print(f"  (replacing the runs of an earlier demo in {logdir})")
    plan = Plan.for_mode(quick)
    keras.utils.set_random_seed(0)
    on_tf = demo_fit.on_tensorflow()
    if on_tf:
        _seed_run(logdir, plan.seed)
    _mlp_runs(logdir, plan.mlp)
    _rnn_runs(logdir, plan.rnn)
    _dead_run(logdir, plan.dead)
    demo_nan.nan_log0_run(logdir, plan.nan, _SHOWS)
    demo_nan.nan_pass_runs(logdir, plan.nan, _SHOWS)
    _explode_runs(logdir, plan.explode)
    _mislabelled_run(logdir, plan.mlp)
    if on_tf:
        from tb_layergrad.cli import demo_gan  # imports TensorFlow: only when the demo trains on it

        demo_gan.gan_run(logdir, plan.gan, _SHOWS)
    else:
        for name, why in TENSORFLOW_ONLY.items():
            print(f"  {name:<17} not trained: it needs TensorFlow ({why}; KERAS_BACKEND=tensorflow)", flush=True)
    trained = [name for name in RUN_NAMES if on_tf or name not in TENSORFLOW_ONLY]
    return trained + demo_sweep.sweep_runs(logdir, quick)


def serve(logdir: str, port: Optional[int] = None, host: str = "127.0.0.1", block: bool = True) -> Any:
    """Start TensorBoard on `logdir`, print the URL of the tab; block until Ctrl+C (unless `block=False`)."""
    from tensorboard import program

    tb = program.TensorBoard()
    argv = [None, "--logdir", logdir, "--host", host]
    if port is not None:  # 0: any free port; None: TensorBoard takes the first free one from 6006 on
        argv += ["--port", str(port)]
    tb.configure(argv=argv)
    url = tb.launch()
    print(f"TensorBoard is serving the Layer gradients tab at {url}#layergrad   (Ctrl+C to stop)", flush=True)
    if not block:
        return url
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    return url


def main(logdir: str = DEFAULT_LOGDIR, quick: bool = False, do_serve: bool = False, port: Optional[int] = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.time()
    count = len(RUNS) + len(demo_sweep.RUN_NAMES) - (0 if demo_fit.on_tensorflow() else len(TENSORFLOW_ONLY))
    print(f"Training {count} demo runs{' (quick)' if quick else ''} on CPU into {os.path.abspath(logdir)}")
    print("  (the first step of each run builds its graph: a few seconds)", flush=True)
    runs = run(logdir, quick)
    print(f"Done in {time.time() - started:.0f}s: {len(runs)} runs.")
    print(f"In a terminal:  tb-layergrad report {logdir}")
    if do_serve:
        serve(logdir, port)
    else:
        print(f"In the browser: tensorboard --logdir {logdir}   then the 'Layer gradients' tab")
    return 0
