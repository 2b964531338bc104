"""Shared set-up of the distribute test scripts: logical CPU devices BEFORE TensorFlow initialises.

Run as scripts (a fresh process each), never imported by pytest: the device
configuration must come before anything creates a TensorFlow context.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def logical_cpus(n: int = 2):
    """Split the one physical CPU into `n` logical devices; returns their names."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def tiny_model(keras, seed: int = 7):
    """Dense(16, relu) -> Dense(4): small, and every layer has a gradient."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((5,))
    h = keras.layers.Dense(16, activation="relu", name="hidden")(inp)
    out = keras.layers.Dense(4, name="out")(h)
    return keras.Model(inp, out, name="tiny")


def data(np, n: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 5)).astype("float32"), rng.normal(size=(n, 4)).astype("float32")
