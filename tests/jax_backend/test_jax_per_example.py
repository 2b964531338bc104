"""`GradientLogger(per_example=True)` in Keras' fit() on JAX: the `examples` records and the noise scale against
each example's own gradient computed apart in pure JAX (a Jacobian of the per-example losses), the statuses
TensorFlow's rules give, and training bitwise unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

import tb_layergrad
from tb_layergrad import metadata

pytestmark = pytest.mark.slow

BATCH, FEATURES, HIDDEN = 8, 5, 16
F = metadata.EXAMPLE_INDEX


def _data(n: int = 2 * BATCH):
    rng = np.random.RandomState(7)
    return rng.randn(n, FEATURES).astype(np.float32), rng.randn(n, 2).astype(np.float32)


def _mlp():
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="tanh", name="h1"),
            keras.layers.Dense(HIDDEN, activation="relu", name="h2"),
            keras.layers.Dense(2, name="out"),
        ],
        name="mlp",
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _per_example_reference(weights, x, y):
    """Each example's own loss gradient, written out in JAX: per layer output (a zero added to it) and per
    weight, as [B, ...] Jacobians of the vector of per-example losses (no batch mean, no rule, no vmap)."""
    params = [jnp.asarray(w) for w in weights]

    def losses(params, eps):
        w1, b1, w2, b2, w3, b3 = params
        h1 = jnp.tanh(x @ w1 + b1) + eps[0]
        h2 = jax.nn.relu(h1 @ w2 + b2) + eps[1]
        out = h2 @ w3 + b3 + eps[2]
        return jnp.mean((out - y) ** 2, axis=-1)

    eps = [jnp.zeros((len(x), HIDDEN)), jnp.zeros((len(x), HIDDEN)), jnp.zeros((len(x), 2))]
    g_params, g_eps = jax.jacrev(losses, argnums=(0, 1))(params, eps)
    # d loss_i / d eps_k is zero for k != i: the diagonal is example i's gradient at its own output.
    outputs = {
        k: np.stack([np.asarray(j[i, i], np.float64) for i in range(len(x))])
        for k, j in zip(["mlp/h1", "mlp/h2", "mlp/out"], g_eps)
    }
    names = ["h1/kernel", "h1/bias", "h2/kernel", "h2/bias", "out/kernel", "out/bias"]
    weight_grads = {f"mlp/{n}": np.asarray(j, np.float64) for n, j in zip(names, g_params)}
    return outputs, weight_grads


def _norms(g):
    return np.sqrt((g.reshape(g.shape[0], -1) ** 2).sum(axis=1))


def _assert_row(row, norms, rtol, what):
    """Every column of an `examples` row against the reference norms (the ranking where it is not a near tie)."""
    scale = float(norms.max())
    order = np.argsort(-norms, kind="stable")
    assert row[F["examples"]] == len(norms) and row[F["status"]] == metadata.EXAMPLE_EXACT, what
    for field, want in (("min", norms.min()), ("median", np.median(norms)), ("max", norms.max())):
        assert abs(row[F[field]] - want) <= rtol * scale, (what, field)
    assert abs(row[F["sum_sq"]] - (norms**2).sum()) <= 2 * rtol * (norms**2).sum(), what
    assert abs(row[F["top_share"]] - norms.max() ** 2 / (norms**2).sum()) <= 4 * rtol, what
    for k in range(metadata.EXAMPLE_TOP_K):
        assert abs(row[F[f"top_norm_{k + 1}"]] - norms[order[k]]) <= rtol * scale, (what, k)
        gap = np.abs(norms - norms[order[k]])
        if np.sort(gap)[1] > 2 * rtol * scale:  # no other example within the bound: the position is decided
            assert row[F[f"top_index_{k + 1}"]] == order[k], (what, k)


def test_rows_and_noise_scale_are_each_examples_own_gradient(logdir, tolerances, tb_reading):
    """Two steps of an MLP: every `examples` column of every output and weight row, and the noise scale's
    scalars, from the pure-JAX per-example gradients of the weights before each step."""
    x, y = _data()
    model = _mlp()
    starts = []

    class Keep(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            starts.append([np.asarray(w) for w in self.model.get_weights()])

    with pytest.warns(UserWarning, match="noise scale needs the weight"):
        tb_layergrad.GradientLogger(logdir + "-unused", per_example=True)
    logger = tb_layergrad.GradientLogger(logdir, weights=True, per_example=True)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[Keep(), logger])
    examples = tb_reading.examples(logdir)["train"]
    scalars = tb_reading.scalars(logdir)["train"]
    # The chain to a per-example gradient: forward (FEATURES, HIDDEN, HIDDEN), the loss's mean over 2 outputs,
    # back (HIDDEN, HIDDEN); then the norm's sum of squares over the largest gradient (HIDDEN * HIDDEN).
    rtol = tolerances.TWO_SIDES * tolerances.chain_rtol(np.float32, [FEATURES, HIDDEN, HIDDEN, 2, HIDDEN, HIDDEN])
    rtol += tolerances.sum_rtol(np.float32, HIDDEN * HIDDEN)
    for step in (1, 2):
        at = slice((step - 1) * BATCH, step * BATCH)
        outputs, weights = _per_example_reference(starts[step - 1], x[at], y[at])
        for source, want in (("output", outputs), ("weight", weights)):
            rows = examples[("loss", source)][step]
            assert sorted(rows) == sorted(want)
            for layer, g in want.items():
                _assert_row(rows[layer], _norms(g), rtol, (step, source, layer))
        # The noise scale from the same per-example gradients and their batch mean (docs/FORMAT.md).
        s = sum((_norms(g) ** 2).mean() for g in weights.values())
        g2 = sum(float((g.mean(axis=0) ** 2).sum()) for g in weights.values())
        trace, signal = (s - g2) * BATCH / (BATCH - 1), (BATCH * g2 - s) / (BATCH - 1)
        assert scalars[metadata.NOISE_SCALE_TAGS["coverage"]][step] == 1.0
        bound = 4 * rtol * s * BATCH / (BATCH - 1)  # both estimates are differences of S and B|G_B|^2
        assert abs(scalars[metadata.NOISE_SCALE_TAGS["trace"]][step] - trace) <= bound
        assert abs(scalars[metadata.NOISE_SCALE_TAGS["signal"]][step] - signal) <= bound
        if signal > bound:
            assert metadata.NOISE_SCALE_TAGS["noise_scale"] in scalars


class _Scaled(keras.layers.Layer):
    """A layer with a weight and no per-example rule."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1],), initializer="ones", name="w")

    def call(self, x):
        return x * self.w


def _mixed(batch_norm_training: bool):
    keras.utils.set_random_seed(3)
    ids = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(11, 4, name="emb")(ids)
    h = keras.layers.Conv1D(5, 3, padding="same", activation="relu", name="conv")(h)
    h = keras.layers.LayerNormalization(name="norm")(h)
    # Keras' fit() calls every layer with training=True; a frozen BatchNormalization runs in inference mode.
    h = keras.layers.BatchNormalization(name="bn", trainable=batch_norm_training)(h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    h = _Scaled(name="scaled")(h)
    out = keras.layers.Dense(2, name="out")(h)
    model = keras.Model(ids, out, name="net")
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


@pytest.mark.parametrize("batch_norm_training", [False, True], ids=["bn-inference", "bn-training"])
def test_each_rule_and_what_has_none_as_on_tensorflow(logdir, tolerances, tb_reading, batch_norm_training):
    """Embedding (a repeated id), Conv1D, LayerNormalization, BatchNormalization: their weights' rows against the
    Jacobian of the per-example losses through Keras' own forward pass on the whole batch; a layer without a
    rule unsupported; a BatchNormalization in training couples every output and weight up to its own, a frozen
    one (inference mode) nothing."""
    rng = np.random.RandomState(2)
    x = rng.randint(0, 11, size=(BATCH, 6)).astype(np.int32)
    x[0, :3] = 4  # a repeated id within one example: its rows of the embedding add up
    y = rng.randn(BATCH, 2).astype(np.float32)
    model = _mixed(batch_norm_training)
    trainable = [np.array(v.value) for v in model.trainable_variables]  # copies: fit() donates its buffers
    non_trainable = [np.array(v.value) for v in model.non_trainable_variables]
    paths = [v.path for v in model.trainable_variables]
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[tb_layergrad.GradientLogger(logdir, weights=True, per_example=True)])  # fmt: skip

    def losses(params):
        out, _ = model.stateless_call(params, non_trainable, x, training=True)
        return jnp.mean((out - y) ** 2, axis=-1)

    jac = jax.jacrev(losses)(trainable)
    weights, outputs = (tb_reading.examples(logdir)["train"][("loss", source)][1] for source in ("weight", "output"))
    coupled_weights = {"emb/embeddings", "conv/kernel", "conv/bias", "norm/gamma", "norm/beta", "bn/gamma", "bn/beta"}
    length = tolerances.reduction_path_length(model, x[..., None], 2, other=6 * 5 * 3)
    for path, j in zip(paths, jac):
        row = weights[f"net/{path}"]
        if path.startswith("scaled/"):
            assert row[F["status"]] == metadata.EXAMPLE_UNSUPPORTED and np.isnan(row[F["max"]]), path
        elif batch_norm_training and path in coupled_weights:
            assert row[F["status"]] == metadata.EXAMPLE_COUPLED and np.isnan(row[F["max"]]), path
        else:
            norms = np.sqrt((np.asarray(j, np.float64).reshape(BATCH, -1) ** 2).sum(axis=1))
            assert row[F["status"]] == metadata.EXAMPLE_EXACT, (path, row)
            tolerances.assert_same_float32_math(row[F["max"]], norms.max(), length, path)
            tolerances.assert_same_float32_math(row[F["sum_sq"]], (norms**2).sum(), 2 * length, path)
    coupled_outputs = {"net/emb", "net/conv", "net/norm", "net/bn"} if batch_norm_training else set()
    for layer, row in outputs.items():
        want = metadata.EXAMPLE_COUPLED if layer in coupled_outputs else metadata.EXAMPLE_EXACT
        assert row[F["status"]] == want, layer
        assert row[F["examples"]] == BATCH


def test_training_is_bitwise_unchanged(logdir, tb_reading):
    x, y = _data(4 * BATCH)
    trained = []
    for callbacks in ([], [tb_layergrad.GradientLogger(logdir, weights=True, per_example=True, update_freq=2)]):
        model = _mlp()
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        trained.append(([np.asarray(w) for w in model.get_weights()], history.history["loss"]))
    for a, b in zip(trained[0][0], trained[1][0]):
        np.testing.assert_array_equal(a, b)
    assert trained[0][1] == trained[1][1]
    assert sorted(tb_reading.examples(logdir)["train"][("loss", "weight")]) == [2, 4, 6, 8]
