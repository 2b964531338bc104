"""Custom `train_step`s as Keras' guide and keras-io write them, small and deterministic (no random latent).

The GAN follows Keras' guide "Customizing what happens in fit()": `compile()` without an
optimizer, its own `d_optimizer` / `g_optimizer`, the generator run BEFORE the
discriminator's tape. The WGAN follows keras-io's WGAN-GP: `d_steps` critic updates (a
Python loop), each with an inner gradient-penalty tape w.r.t. the interpolated inputs,
then one generator update. The latent vectors are a fixed function of the batch, so
that an independent reproduction sees the same inputs.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import tensorflow as tf
from fit_helpers import keras, layers

FEATURES, LATENT = 4, 3


def generator() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((LATENT,)),
            layers.Dense(5, activation="tanh", name="g_hidden"),
            layers.Dense(FEATURES, name="g_out"),
        ],
        name="generator",
    )


def discriminator() -> keras.Model:
    return keras.Sequential(
        [keras.Input((FEATURES,)), layers.Dense(6, activation="tanh", name="d_hidden"), layers.Dense(1, name="d_out")],
        name="discriminator",
    )


def latent(real: tf.Tensor) -> tf.Tensor:
    return tf.tanh(real[:, :LATENT] * 0.7 + 0.1)


class GAN(keras.Model):
    """Keras' guide's GAN, its `train_step` as written there (labels without noise)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.discriminator, self.generator = discriminator(), generator()
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def compile(self, d_optimizer, g_optimizer, **kwargs):
        super().compile(**kwargs)
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

    def call(self, z):
        return self.generator(z)

    def train_step(self, real):
        z = latent(real)
        generated = self.generator(z)  # outside any tape, as the guide does
        combined = tf.concat([generated, real], axis=0)
        labels = tf.concat([tf.ones((tf.shape(real)[0], 1)), tf.zeros((tf.shape(real)[0], 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        misleading = tf.zeros((tf.shape(real)[0], 1))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(misleading, self.discriminator(self.generator(z)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


class WGAN(GAN):
    """keras-io's WGAN-GP step: `d_steps` critic updates with a gradient penalty, then the generator."""

    d_steps, gp_weight = 2, 10.0

    def train_step(self, real):
        z = latent(real)
        for _ in range(self.d_steps):
            with tf.GradientTape() as tape:
                fake = self.generator(z)
                fake_logits, real_logits = self.discriminator(fake), self.discriminator(real)
                d_cost = tf.reduce_mean(fake_logits) - tf.reduce_mean(real_logits)
                alpha = tf.fill([tf.shape(real)[0], 1], 0.3)
                interpolated = real + alpha * (fake - real)
                with tf.GradientTape() as gp_tape:
                    gp_tape.watch(interpolated)
                    pred = self.discriminator(interpolated)
                grads = gp_tape.gradient(pred, [interpolated])[0]
                gp = tf.reduce_mean((tf.sqrt(tf.reduce_sum(tf.square(grads), axis=1)) - 1.0) ** 2)
                d_loss = d_cost + gp * self.gp_weight
            d_grads = tape.gradient(d_loss, self.discriminator.trainable_variables)
            self.d_optimizer.apply_gradients(zip(d_grads, self.discriminator.trainable_variables))
        with tf.GradientTape() as tape:
            g_loss = -tf.reduce_mean(self.discriminator(self.generator(z)))
        g_grads = tape.gradient(g_loss, self.generator.trainable_variables)
        self.g_optimizer.apply_gradients(zip(g_grads, self.generator.trainable_variables))
        return {"d_loss": d_loss, "g_loss": g_loss}


class TwiceStep(keras.Model):
    """A step that applies its one optimizer twice per batch: its update count is not the batch count."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.net = discriminator()

    def call(self, x):
        return self.net(x)

    def train_step(self, data):
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(self.net(data) ** 2)
            grads = tape.gradient(loss, self.net.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.net.trainable_weights))
        return {"loss": loss}


def gan(cls=GAN, lr: float = 0.05, **compile_kwargs) -> GAN:
    keras.utils.set_random_seed(0)
    model = cls()
    model.compile(keras.optimizers.SGD(lr), keras.optimizers.SGD(lr), **compile_kwargs)
    return model


def data(n: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, FEATURES)).astype(np.float32)


class Snapshots(keras.callbacks.Callback):
    """The model's weights before every batch, keyed by the batch's position in this run (1, 2, ...)."""

    def __init__(self):
        super().__init__()
        self.before: Dict[int, List[np.ndarray]] = {}

    def on_train_batch_begin(self, batch, logs=None):
        self.before[len(self.before) + 1] = [w.copy() for w in self.model.get_weights()]


class Distiller(keras.Model):
    """keras-io's knowledge distillation step: the frozen teacher runs outside the tape, the student inside."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.teacher = keras.Sequential([keras.Input((FEATURES,)), layers.Dense(2, name="t_out")], name="teacher")
        self.student = keras.Sequential([keras.Input((FEATURES,)), layers.Dense(2, name="s_out")], name="student")
        self.teacher.trainable = False

    def call(self, x):
        return self.student(x)

    def train_step(self, data):
        x, y = data
        teacher_predictions = self.teacher(x, training=False)
        with tf.GradientTape() as tape:
            student_predictions = self.student(x, training=True)
            loss = tf.reduce_mean((student_predictions - y) ** 2) + tf.reduce_mean(
                (student_predictions - teacher_predictions) ** 2
            )
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}
