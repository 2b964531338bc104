"""Per-timestep dL/dh_t of RNN layers equals an eager, unrolled ground truth (within the derived float32 bound).

The ground truth runs the layer's own cell step by step in Python, eagerly,
`tape.watch`es every h_t and differentiates the same loss: the total
derivative, through the output and the recurrence. Four kinds of cell (the
seed MinimalRNNCell, SimpleRNN, LSTM, GRU), return_sequences True and False,
in eager, tf.function and XLA, and inside model.fit() via
GradientLogger(timesteps=True). Runs under Keras 3 and tf_keras.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad.capturing import rnn_probe

KINDS = ("minimal", "simple", "lstm", "gru")
T, UNITS, FEATURES, BATCH = 5, 3, 2, 4


def _rnn(fit_helpers, kind: str, return_sequences: bool):
    if kind == "minimal":
        return fit_helpers.layers.RNN(fit_helpers.MinimalRNNCell(UNITS), return_sequences=return_sequences, name="rnn")
    cls = {"simple": fit_helpers.layers.SimpleRNN, "lstm": fit_helpers.layers.LSTM, "gru": fit_helpers.layers.GRU}[kind]
    return cls(UNITS, return_sequences=return_sequences, name="rnn")


def _model(fit_helpers, kind: str, return_sequences: bool):
    inp = fit_helpers.keras.Input((T, FEATURES))
    h = _rnn(fit_helpers, kind, return_sequences)(inp)
    if return_sequences:
        h = fit_helpers.layers.Flatten(name="flat")(h)
    out = fit_helpers.layers.Dense(4, name="out")(h)
    return fit_helpers.keras.Model(inp, out, name="net")


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(BATCH, T, FEATURES)).astype("float32"),
        rng.normal(size=(BATCH, 4)).astype("float32"),
    )


def _length(fit_helpers, model, x, y) -> int:
    """The reduction path of one step (fit_helpers.path_length), the loss a mean over every element of y;
    LSTM/GRU cells contract their kernels once per gate, which `reduction_path_length` counts by shape."""
    return fit_helpers.path_length(model, x, target_terms=int(np.prod(np.shape(y))))


def _mse(y, p):
    return tf.reduce_mean(tf.square(p - y))


def ground_truth(model, x, y) -> np.ndarray:
    """dL/dh_t [batch, T, units] by unrolling the cell eagerly and watching each h_t."""
    rnn = model.get_layer("rnn")
    cell = rnn.cell
    n_states = 2 if "LSTM" in type(cell).__name__ else 1
    states = [tf.zeros((x.shape[0], UNITS)) for _ in range(n_states)]
    hs = []
    with tf.GradientTape() as tape:
        for t in range(x.shape[1]):
            h, new_states = cell(tf.constant(x[:, t]), states)
            tape.watch(h)
            hs.append(h)
            new_states = list(new_states) if isinstance(new_states, (list, tuple)) else [new_states]
            states = [h] + new_states[1:]  # the state that is the output IS h_t
        z = tf.reshape(tf.stack(hs, 1), [x.shape[0], -1]) if rnn.return_sequences else hs[-1]
        loss = _mse(y, model.get_layer("out")(z))
    return tf.stack(tape.gradient(loss, hs), 1).numpy()


def _probe_step(model, x, y):
    with tf.GradientTape() as tape:
        with rnn_probe.timestep_probe(model, tape=tape) as probe:
            loss = _mse(y, model(x, training=True))
    _, per_step = probe.gradients(tape, loss)
    return per_step["net/rnn"]


@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_probe_equals_unrolled_ground_truth(kind, return_sequences, fit_helpers):
    fit_helpers.keras.utils.set_random_seed(11)
    model = _model(fit_helpers, kind, return_sequences)
    x, y = _data()
    truth = ground_truth(model, x, y)
    assert np.all(np.linalg.norm(truth, axis=(0, 2)) > 0)
    xt, yt = tf.constant(x), tf.constant(y)
    for mode in ("eager", "graph", "xla"):
        fn = _probe_step if mode == "eager" else tf.function(_probe_step, jit_compile=(mode == "xla"))
        got = fn(model, xt, yt)
        assert got.shape == (BATCH, T, UNITS)
        fit_helpers.assert_close(
            got.numpy(), truth, f"{kind} return_sequences={return_sequences} {mode}", _length(fit_helpers, model, x, y)
        )
    # The probe leaves no trace on the layers.
    assert "call" not in model.get_layer("rnn").cell.__dict__
    assert "inner_loop" not in model.get_layer("rnn").__dict__ and "call" not in model.get_layer("rnn").__dict__


def test_total_differs_from_direct_path(fit_helpers):
    """With return_sequences=True, d loss / d(output sequence) is the direct path only; h_t's total is larger."""
    fit_helpers.keras.utils.set_random_seed(2)
    model = _model(fit_helpers, "simple", True)
    x, y = _data()
    with tf.GradientTape() as tape:
        with (
            tb_layergrad.capture(model, layers=["rnn"], tape=tape) as cap,
            rnn_probe.timestep_probe(model, tape=tape) as probe,
        ):
            loss = _mse(y, model(tf.constant(x)))
    grads, per_step = probe.gradients(tape, loss, capture=cap)
    direct = grads["net/rnn"].numpy()
    total = per_step["net/rnn"].numpy()
    fit_helpers.assert_close(
        total[:, -1], direct[:, -1], "last step: no recurrence left", _length(fit_helpers, model, x, y)
    )
    assert not np.allclose(total[:, 0], direct[:, 0])
    assert grads.variable_gradients and all(g is not None for g in grads.variable_gradients)


@pytest.mark.parametrize(
    "kind,return_sequences,mode",
    [
        ("minimal", False, "graph"),
        ("simple", True, "xla"),
        ("lstm", False, "graph"),
        ("lstm", True, "xla"),
        ("gru", True, "eager"),
        ("gru", False, "graph"),
    ],
)
@pytest.mark.slow
def test_fit_timesteps_equal_ground_truth(tmp_path, kind, return_sequences, mode, fit_helpers):
    fit_helpers.keras.utils.set_random_seed(4)
    model = _model(fit_helpers, kind, return_sequences)
    model.compile(optimizer=fit_helpers.keras.optimizers.SGD(0.1), loss="mse", **fit_helpers.compile_kwargs(mode))
    x1, y1 = _data(1)
    x2, y2 = _data(2)
    x, y = np.concatenate([x1, x2]), np.concatenate([y1, y2])
    saver = fit_helpers.WeightsBeforeStep()
    logger = tb_layergrad.GradientLogger(
        fit_helpers.log_dir(tmp_path), layers=["rnn"], timesteps=True, max_elements=1000
    )
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[saver, logger])
    series = fit_helpers.read_series(fit_helpers.log_dir(tmp_path))
    info, _ = series["loss/output/net/rnn/timesteps"]
    assert (info.kind, info.dtype, info.layer) == ("timesteps", "float64", "net/rnn")
    for step, (xb, yb) in ((1, (x1, y1)), (2, (x2, y2))):
        saved = model.get_weights()
        model.set_weights(saver.before[step])
        truth = ground_truth(model, xb, yb)
        model.set_weights(saved)
        norms = fit_helpers.one(series, "loss/output/net/rnn/timesteps", step)
        assert norms.dtype == np.float64 and norms.shape == (T,)
        length = _length(fit_helpers, model, xb, yb)
        # a norm over batch x units is one more reduction, of BATCH * UNITS squares
        fit_helpers.assert_close(
            norms,
            np.linalg.norm(truth.astype(np.float64), axis=(0, 2)),
            f"{kind} norms at step {step}",
            length + BATCH * UNITS,
        )
        # Example 0's [T, units] gradient, the optional bounded tensor.
        fit_helpers.assert_close(
            fit_helpers.one(series, "loss/output/net/rnn[h_t]/tensor", step),
            truth[0],
            f"{kind} [T, units] at step {step}",
            length,
        )


@pytest.mark.slow
def test_timesteps_keep_training_unchanged(tmp_path, fit_helpers):
    """The zero probe does not move training (LSTM, graph mode)."""
    x, y = _data(3)

    def run(callbacks):
        fit_helpers.keras.utils.set_random_seed(9)
        model = _model(fit_helpers, "lstm", True)
        model.compile(optimizer=fit_helpers.keras.optimizers.SGD(0.1), loss="mse")
        model.fit(
            np.concatenate([x, x]),
            np.concatenate([y, y]),
            batch_size=BATCH,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
        return model.get_weights()

    plain = run([])
    probed = run([tb_layergrad.GradientLogger(fit_helpers.log_dir(tmp_path), timesteps=True)])
    for a, b in zip(plain, probed):
        np.testing.assert_array_equal(a, b)
