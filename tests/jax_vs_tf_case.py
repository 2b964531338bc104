"""The case a JAX run is compared to a TensorFlow run on (tests/jax_backend/test_jax_vs_tf.py): one model, data and
logger options for both backends; the TensorFlow run is stored in tests/data/jax_vs_tf (its `make_tf_run.py`)."""

from __future__ import annotations

import keras
import numpy as np

BATCH, EPOCHS, FEATURES, HIDDEN = 8, 1, 6, 12
LOGGER_OPTIONS = {"weights": True, "activations": True, "update_freq": 1}


def data():
    rng = np.random.RandomState(5)
    return rng.randn(3 * BATCH, FEATURES).astype(np.float32), rng.randn(3 * BATCH, 3).astype(np.float32)


def model(weights=None):
    keras.utils.set_random_seed(2)
    net = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(HIDDEN, activation="tanh", name="h1"),
            keras.layers.Dense(HIDDEN, activation="relu", name="h2"),
            keras.layers.Dense(3, name="out"),
        ],
        name="mlp",
    )
    net.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    if weights is not None:
        net.set_weights(weights)
    return net
