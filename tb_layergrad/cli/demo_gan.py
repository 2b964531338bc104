"""The demo's `gan` run: the discriminator wins, and the generator's gradients vanish.

The model is the GAN of Keras' guide "Customizing what happens in fit()": its `train_step`
applies two optimizers of its own (`compile()` gets none), the discriminator's tape first
(generated samples labelled 1, real ones 0), then the generator's. GradientLogger logs
each tape as its own target, so both halves of the training show in the tab.

Planted: the discriminator has more capacity and a 100x larger learning rate than the
generator, and the generator minimizes the *saturating* (minimax) loss, minus the
discriminator's loss on the generated samples. Once the discriminator rejects them
confidently (logit l >> 0), that loss is -log(1 + e^-l) and its gradient e^-l / (1 + e^-l)
vanishes: the generator's gradients fall by orders of magnitude within a few dozen steps
(`GAN_VANISH`), while its loss, going to 0, reads like convergence.
"""

from __future__ import annotations

import os
import warnings
from typing import Mapping, Tuple

import keras
import numpy as np
import tensorflow as tf
from keras import layers

import tb_layergrad
from tb_layergrad.cli.demo_fit import Progress, lift_train_run, progress_callback

GAN_LATENT = 4
GAN_D_LR = 0.01  # the discriminator's Adam: 100x the generator's
GAN_G_LR = 1e-4
GAN_BATCH = 64
GAN_VANISH = 100  # the generator's gradients at the last step: < 1/100 of their largest over the first 10 steps
# The run's targets and the generator's output, as GradientLogger names them (docs/FIT.md, "Custom `train_step`").
D_TARGET, G_TARGET, G_OUTPUT = "discriminator", "generator", "gan/generator"


class SaturatingGAN(keras.Model):
    """The guide's GAN, with the generator on the saturating loss (see the module docstring)."""

    def __init__(self, discriminator: keras.Model, generator: keras.Model, **kwargs):
        super().__init__(**kwargs)
        self.discriminator = discriminator
        self.generator = generator

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def train_step(self, real):
        n = tf.shape(real)[0]
        generated = self.generator(tf.random.normal((n, GAN_LATENT)))
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], axis=0)  # generated: 1, real: 0
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(tf.concat([generated, real], axis=0)))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            fake = self.generator(tf.random.normal((n, GAN_LATENT)))
            g_loss = -self.loss_fn(tf.ones((n, 1)), self.discriminator(fake))  # saturates as D wins
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


def _stack(name: str, inputs: int, widths: Tuple[int, ...], prefix: str) -> keras.Sequential:
    """ReLU Dense layers `{prefix}_hidden_i`, then a linear `{prefix}_out`."""
    hidden = [layers.Dense(w, activation="relu", name=f"{prefix}_hidden_{i}") for i, w in enumerate(widths[:-1])]
    return keras.Sequential(
        [keras.Input((inputs,)), *hidden, layers.Dense(widths[-1], name=f"{prefix}_out")], name=name
    )


def gan_model() -> SaturatingGAN:
    """The generator (latent -> 16 -> 2-D sample) and a larger discriminator (2-D sample -> 64 -> 64 -> logit)."""
    generator = _stack("generator", GAN_LATENT, (16, 2), "g")
    return SaturatingGAN(_stack("discriminator", 2, (64, 64, 1), "d"), generator, name="gan")


def gan_run(logdir: str, steps: int, shows: Mapping[str, str]) -> None:
    """Train the GAN in fit() with GradientLogger on 2-D samples around (2, 2) into `logdir/gan`."""
    rng = np.random.default_rng(9)
    real = (rng.normal(size=(steps * GAN_BATCH, 2)) * 0.5 + 2.0).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = gan_model()
    model.compile(
        d_optimizer=keras.optimizers.Adam(GAN_D_LR),
        g_optimizer=keras.optimizers.Adam(GAN_G_LR),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    progress = Progress("gan", steps, shows["gan"])
    run_dir = os.path.join(logdir, "gan")
    with warnings.catch_warnings():
        # The guide generates the discriminator's fake samples before its tape: GradientLogger says that those
        # generator outputs are in no target. True, and known here: the generator's own tape logs them.
        warnings.filterwarnings("ignore", message="GradientLogger: .* outside its GradientTapes")
        model.fit(
            real,
            batch_size=GAN_BATCH,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[tb_layergrad.GradientLogger(run_dir, update_freq=1), progress_callback(progress)],
        )
    progress.finish()
    lift_train_run(run_dir)
