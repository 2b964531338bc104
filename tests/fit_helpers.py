"""Helpers for the fit()/GradientLogger tests (tests/test_fit_*.py, tests/test_timesteps*.py).

Everything goes through `tf.keras`, so the same tests run against Keras 3 and,
with TF_USE_LEGACY_KERAS=1, against tf_keras (Keras 2).

The independent reproduction of a step: the weights saved just before the
step (a callback copies them in on_train_batch_begin), the same batch
(shuffle=False, batches we slice ourselves), and a forward pass written layer
by layer with `tape.watch` on every exposed output.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Tuple

import numpy as np
import tensorflow as tf
from tolerances import TWO_SIDES, chain_rtol, reduction_path_length

from tb_layergrad import metadata

keras = tf.keras
layers = keras.layers
TF_KERAS = keras.Model.__module__.startswith("tf_keras")

MODES = ("eager", "graph", "xla")
MAX = 10_000  # max_elements large enough for every tensor here: the `tensor` record is the whole gradient


def compile_kwargs(mode: str) -> dict:
    return {"run_eagerly": mode == "eager", "jit_compile": mode == "xla"}


class MinimalRNNCell(layers.Layer):
    """The seed question's cell: output_t = x_t @ kernel + output_{t-1} @ recurrent_kernel."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.state_size = units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="uniform", name="kernel")
        self.recurrent_kernel = self.add_weight(
            shape=(self.units, self.units), initializer="uniform", name="recurrent_kernel"
        )
        self.built = True

    def call(self, inputs, states):
        output = tf.matmul(inputs, self.kernel) + tf.matmul(states[0], self.recurrent_kernel)
        return output, [output]


class SeedModel(keras.Model):
    """The seed question's subclassed model: RNN(MinimalRNNCell) -> Dense(4)."""

    def __init__(self, size: int = 2, **kwargs):
        kwargs.setdefault("name", "my_model")
        super().__init__(**kwargs)
        self.minimalrnn = layers.RNN(MinimalRNNCell(size), name="minimalrnn")
        self.out = layers.Dense(4, name="out")

    def call(self, inputs):
        return self.out(self.minimalrnn(inputs))


# -- models with a by-hand forward -------------------------------------------------
def bn_residual_mlp(name: str = "bnres") -> Tuple[keras.Model, Callable]:
    """Dense -> BatchNorm -> (Dense branch) + Add -> Dense logits, Functional."""
    inp = keras.Input((6,))
    h = layers.Dense(8, activation="relu", name="d1")(inp)
    h = layers.BatchNormalization(name="bn")(h)
    h2 = layers.Dense(8, activation="tanh", name="d2")(h)
    h = layers.Add(name="add")([h, h2])
    out = layers.Dense(3, name="out")(h)
    model = keras.Model(inp, out, name=name)

    def manual(x, tape):
        outs = {}
        h = model.get_layer("d1")(x)
        outs["d1"] = h
        h = model.get_layer("bn")(h, training=True)
        outs["bn"] = h
        h2 = model.get_layer("d2")(h)
        outs["d2"] = h2
        a = model.get_layer("add")([h, h2])
        outs["add"] = a
        o = model.get_layer("out")(a)
        outs["out"] = o
        for t in outs.values():
            tape.watch(t)
        return o, {f"{name}/{k}": v for k, v in outs.items()}

    return model, manual


def mlp_sequential(name: str = "mlp") -> Tuple[keras.Model, Callable]:
    model = keras.Sequential(
        [keras.Input((6,)), layers.Dense(8, activation="relu", name="h1"), layers.Dense(3, name="logits")], name=name
    )

    def manual(x, tape):
        outs = {}
        h = x
        for layer in model.layers:
            h = layer(h)
            tape.watch(h)
            outs[f"{name}/{layer.name}"] = h
        return h, outs

    return model, manual


def seed_model() -> Tuple[keras.Model, Callable]:
    model = SeedModel(2)
    model(tf.zeros((1, 5, 1)))

    def manual(x, tape):
        h = model.minimalrnn(x)
        tape.watch(h)
        o = model.out(h)
        tape.watch(o)
        return o, {"my_model/minimalrnn": h, "my_model/out": o}

    return model, manual


def sqrt_model() -> keras.Model:
    """Finite forward; at a batch that drives a ReLU feature to 0, sqrt's gradient there is infinite: a
    non-finite gradient with a finite loss (`tb_layergrad.cli.demo_nan.inputs_with_one_bad_batch` makes one)."""
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((16,)),
            layers.Dense(
                16,
                activation="relu",
                bias_initializer=keras.initializers.Constant(1.0),
                kernel_initializer=keras.initializers.Constant(0.1),
                name="dense_0",
            ),
            layers.Lambda(tf.sqrt, name="sqrt_features"),
            layers.Dense(1, name="head"),
        ],
        name="sq",
    )


def tiny_conv_bn_residual(name: str = "convres") -> keras.Model:
    """A tiny CNN with BatchNormalization and a residual Add (neutrality tests)."""
    inp = keras.Input((8, 8, 3))
    h = layers.Conv2D(6, 3, padding="same", name="c1")(inp)
    h = layers.BatchNormalization(name="bn1")(h)
    h = layers.ReLU(name="r1")(h)
    h2 = layers.Conv2D(6, 3, padding="same", name="c2")(h)
    h2 = layers.BatchNormalization(name="bn2")(h2)
    h = layers.Add(name="add")([h, h2])
    h = layers.DepthwiseConv2D(3, padding="same", name="dw")(h)
    h = layers.GlobalAveragePooling2D(name="gap")(h)
    out = layers.Dense(4, activation="softmax", name="out")(h)
    return keras.Model(inp, out, name=name)


# -- recording the weights before each step ------------------------------------------
def update_count(optimizer):
    """The optimizer's count of applied updates: a loss-scaling wrapper's inner optimizer counts them
    (Keras 3.3's LossScaleOptimizer leaves its own `iterations` at 0)."""
    return getattr(optimizer, "inner_optimizer", optimizer).iterations


class WeightsBeforeStep(keras.callbacks.Callback):
    """Saves the weights before every train batch, keyed by the step the batch will log at."""

    def __init__(self):
        super().__init__()
        self.before: Dict[int, List[np.ndarray]] = {}

    def on_train_batch_begin(self, batch, logs=None):
        step = int(update_count(self.model.optimizer).numpy()) + 1
        self.before[step] = [w.copy() for w in self.model.get_weights()]


def reproduce(
    model, manual, weights, x, y, loss_fn, target=None
) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """(d/d outputs by path, d/d weights by variable) of one step, from scratch."""
    saved = model.get_weights()
    model.set_weights(weights)
    try:
        variables = list(model.trainable_variables)
        with tf.GradientTape() as tape:
            pred, outs = manual(tf.convert_to_tensor(x), tape)
            value = loss_fn(y, pred) if target is None else tf.reduce_sum(target(pred))
        g_out, g_var = tape.gradient(value, (outs, variables))
    finally:
        model.set_weights(saved)
    return (
        {k: (None if v is None else v.numpy()) for k, v in g_out.items()},
        {_var_key(v): (None if g is None else g.numpy()) for v, g in zip(variables, g_var)},
    )


def _var_key(v) -> str:
    name = getattr(v, "path", None) or v.name
    return name.split(":")[0]


# -- reading what was written ------------------------------------------------------------
def read_series(log_dir: str, run: str = "train") -> Dict[str, Tuple[metadata.SeriesInfo, Dict[int, List[np.ndarray]]]]:
    """{tag: (info, {step: [values...]})} read through TensorBoard's own multiplexer + data provider."""
    import tb_reading

    records = tb_reading.read_all(log_dir)
    out = {}
    for tag, (info, datums) in records.get(run, {}).items():
        by_step: Dict[int, List[np.ndarray]] = {}
        for d in datums:
            by_step.setdefault(int(d.step), []).append(np.asarray(d.numpy))
        out[tag] = (info, by_step)
    return out


def one(series, tag: str, step: int) -> np.ndarray:
    info, by_step = series[tag]
    values = by_step.get(step, [])
    assert len(values) == 1, f"{tag}: {len(values)} records at step {step} (steps: {sorted(by_step)})"
    return values[0]


def stat(values: np.ndarray, name: str) -> float:
    return float(values[metadata.STAT_INDEX[name]])


def _all_layers(layer):
    for child in getattr(layer, "layers", None) or []:
        yield child
        yield from _all_layers(child)


def path_length(model, x, target_terms: int) -> int:
    """The reduction path of one step of `model` on batch `x` (`tolerances.reduction_path_length`), plus the
    batch moments of each BatchNormalization layer (two sums over every position)."""
    bn = sum(1 for layer in _all_layers(model) if type(layer).__name__ == "BatchNormalization")
    positions = int(np.prod(np.shape(x)[:-1]))
    return reduction_path_length(model, np.asarray(x), target_terms=target_terms, other=2 * bn * positions)


def assert_close(actual, expected, what: str, length: int, scale: float = None) -> None:
    """The logged value and the reproduction compute the same float32 math, in other orders.

    The logged step runs graph, XLA or eager kernels, the reproduction eager ones
    layer by layer (and oneDNN/XLA block by the CPU's vector width): each side within
    `chain_rtol(float32, length)` of the exact value, `length` the reduction path
    (`path_length`, plus the record's own reduction over the tensor for a statistic).
    The bound is relative to the magnitudes combined, which the tensor's largest
    element (`scale`) stands for: an element that cancels to ~0 keeps the absolute
    error of its terms.
    """
    rtol = TWO_SIDES * chain_rtol(np.float32, [length])
    expected = np.asarray(expected, np.float64)
    if scale is None:
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), expected, rtol=rtol, atol=rtol * scale + 1e-30, err_msg=what
    )


def expected_stats(g: np.ndarray) -> Dict[str, float]:
    g = np.asarray(g, np.float64).ravel()
    return {
        "elements": g.size,
        "min": g.min(),
        "max": g.max(),
        "mean": g.mean(),
        "std": g.std(),
        "norm": np.sqrt(np.sum(g * g)),
        "mean_abs": np.abs(g).mean(),
    }


def bounded(g: np.ndarray, max_elements: int) -> np.ndarray:
    """What the `tensor` record holds for a gradient small enough to be kept whole."""
    g = np.asarray(g, np.float32)
    rows = g.reshape(1, -1) if g.ndim <= 1 else g.reshape(g.shape[0], -1)
    assert rows.size <= max_elements
    return rows


def layergrad_steps(series, target: str = "loss") -> List[int]:
    steps = set()
    for info, by_step in series.values():
        if info.target == target:
            steps.update(by_step)
    return sorted(steps)


def log_dir(tmp_path) -> str:
    return os.fspath(tmp_path / "logs")


def check_step(
    series, step, model, manual, weights, x, y, loss_fn, *, with_weights=True, target="loss", target_fn=None
):
    """The records of `step` equal an independent reproduction of that step (see `reproduce`)."""
    g_out, g_var = reproduce(model, manual, weights, x, y, loss_fn, target=target_fn)
    length = path_length(model, x, target_terms=max(g.size for g in g_out.values() if g is not None))
    for path, g in g_out.items():
        st = one(series, f"{target}/output/{path}/stats", step)
        exp = expected_stats(g)
        for name in ("elements", "min", "max", "mean", "std", "norm", "mean_abs"):
            # a statistic is one more reduction, over the g.size elements of the gradient
            assert_close(
                stat(st, name),
                exp[name],
                f"{path} {name} at step {step}",
                length + g.size,
                scale=float(np.max(np.abs(g))),
            )
        assert stat(st, "no_gradient") == 0
        assert_close(
            one(series, f"{target}/output/{path}/tensor", step),
            bounded(g, MAX),
            f"{path} tensor at step {step}",
            length,
        )
        hist = one(series, f"{target}/output/{path}/histogram", step)
        assert hist.shape == (30, 3) and hist[:, 2].sum() == g.size
    if with_weights:
        infos = {
            info.layer: tag
            for tag, (info, _) in series.items()
            if info.source == "weight" and info.kind == "tensor" and info.target == target
        }
        assert infos, "no weight records"
        for path, tag in infos.items():
            tail = path.split("/", 1)[1]  # "model/d1/kernel" -> "d1/kernel"
            key = next(k for k in g_var if k == tail or k.endswith("/" + tail))
            assert_close(one(series, tag, step), bounded(g_var[key], MAX), f"weight {path} at step {step}", length)
