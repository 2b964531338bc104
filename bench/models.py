"""The three benchmark models: an MLP, a small CNN and an LSTM, with batches."""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import keras
import tensorflow as tf
from keras import layers


def mlp() -> Tuple[keras.Model, tf.Tensor, tf.Tensor]:
    model = keras.Sequential(
        [
            keras.Input((784,)),
            layers.Dense(256, activation="relu"),
            layers.Dense(256, activation="relu"),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ],
        name="mlp",
    )
    return model, tf.random.normal([128, 784]), tf.random.uniform([128], 0, 10, tf.int32)


def cnn() -> Tuple[keras.Model, tf.Tensor, tf.Tensor]:
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(10),
        ],
        name="cnn",
    )
    return model, tf.random.normal([64, 32, 32, 3]), tf.random.uniform([64], 0, 10, tf.int32)


def lstm() -> Tuple[keras.Model, tf.Tensor, tf.Tensor]:
    model = keras.Sequential(
        [keras.Input((50, 32)), layers.LSTM(128, return_sequences=True), layers.LSTM(128), layers.Dense(10)],
        name="lstm",
    )
    return model, tf.random.normal([64, 50, 32]), tf.random.uniform([64], 0, 10, tf.int32)


MODELS: Dict[str, Callable] = {"mlp": mlp, "cnn": cnn, "lstm": lstm}
