"""The gallery's adversarial steps: the guide's GAN and WGAN-GP (see gallery_steps.py for the conventions)."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import tensorflow as tf
from gallery_steps import (
    CRITIC_STEPS,
    FEATURES,
    GP_WEIGHT,
    LATENT,
    Case,
    Forward,
    N,
    Tape,
    dataset,
    differentiate,
    keras,
    mixed,
    mlp,
    path_length,
    rng,
    weight_paths,
    with_weights,
)
from tolerances import assert_same_float32_math

D_LR = 0.05  # SGD: the reproduction replays the critic's updates inside a batch (w - lr g)
G_LR = 0.02
# WGAN-GP: the gradient penalty's tapes (w.r.t. the interpolated inputs) are logged under this name when asked for
# (`targets={PENALTY: "inputs"}`): one target per critic update.
PENALTY = "critic_penalty"


class GAN(keras.Model):
    """The guide's GAN ("Customizing what happens in fit()"): its own optimizers, compile() without one.

    The discriminator learns on generated (label 1) and real (label 0) samples, generated before its tape
    opens; then the generator learns through the discriminator, with the labels flipped.
    """

    def __init__(self, discriminator, generator, **kwargs):
        super().__init__(name="gan", **kwargs)
        self.discriminator = discriminator
        self.generator = generator

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def train_step(self, data):
        real, z_d, z_g = data
        n = tf.shape(real)[0]
        generated = self.generator(z_d)
        combined = tf.concat([generated, real], axis=0)
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(tf.zeros((n, 1)), self.discriminator(self.generator(z_g)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


def _gan_data():
    r = rng(21)
    real = (r.normal(size=(N, FEATURES)) * 0.5 + 1.0).astype(np.float32)
    return real, r.normal(size=(N, LATENT)).astype(np.float32), r.normal(size=(N, LATENT)).astype(np.float32)


def _build_gan() -> GAN:
    keras.utils.set_random_seed(21)
    model = GAN(mlp("discriminator", FEATURES, [6, 1]), mlp("generator", LATENT, [6, FEATURES]))
    model.compile(
        d_optimizer=keras.optimizers.Adam(0.01),
        g_optimizer=keras.optimizers.Adam(0.01),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model


def _reproduce_gan(model: GAN, before, after, batch) -> List[Tuple[str, Tape]]:
    real, z_d, z_g = (tf.constant(a) for a in batch)
    n = real.shape[0]
    paths = weight_paths(model, {"discriminator": model.discriminator, "generator": model.generator})
    with with_weights(model, before):
        generated = model.generator(z_d)  # before the tape: on no tape
        labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], axis=0)
        with tf.GradientTape() as tape:
            fwd = Forward(tape)
            pred = fwd.sequential(model.discriminator, tf.concat([generated, real], axis=0), "gan/discriminator")
            loss = model.loss_fn(labels, pred)
        d = differentiate(tape, fwd, loss, model.discriminator.trainable_weights, paths)
    # The generator's tape reads the discriminator as its update left it, the generator before its own.
    with with_weights(model, mixed(model, before, after, model.discriminator)):
        with tf.GradientTape() as tape:
            fwd = Forward(tape)
            fake = fwd.sequential(model.generator, z_g, "gan/generator")
            loss = model.loss_fn(tf.zeros((n, 1)), fwd.sequential(model.discriminator, fake, "gan/discriminator"))
        g = differentiate(tape, fwd, loss, model.generator.trainable_weights, paths)
    return [("discriminator", d), ("generator", g)]


GAN_CASE = Case("gan", _build_gan, _gan_data, dataset, _reproduce_gan, outside="gan/generator")


class WGANGP(keras.Model):
    """keras.io's WGAN-GP: CRITIC_STEPS critic updates per batch, each loss with a gradient penalty computed by an
    inner tape on interpolated samples (a gradient w.r.t. inputs), then one generator update."""

    def __init__(self, critic, generator, **kwargs):
        super().__init__(name="wgan", **kwargs)
        self.critic = critic
        self.generator = generator

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

    def gradient_penalty(self, real, fake, alpha):
        interpolated = real + alpha * (fake - real)
        with tf.GradientTape() as gp_tape:
            gp_tape.watch(interpolated)
            pred = self.critic(interpolated, training=True)
        grads = gp_tape.gradient(pred, [interpolated])[0]
        norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=1))
        return tf.reduce_mean((norm - 1.0) ** 2)

    def critic_loss(self, real, z, alpha):
        fake = self.generator(z, training=True)
        cost = tf.reduce_mean(self.critic(fake, training=True)) - tf.reduce_mean(self.critic(real, training=True))
        return cost + GP_WEIGHT * self.gradient_penalty(real, fake, alpha)

    def train_step(self, data):
        real, z, alpha = data  # z: a latent batch per critic update and one for the generator
        for i in range(CRITIC_STEPS):
            with tf.GradientTape() as tape:
                d_loss = self.critic_loss(real, z[:, i], alpha[:, i : i + 1])
            grads = tape.gradient(d_loss, self.critic.trainable_variables)
            self.d_optimizer.apply_gradients(zip(grads, self.critic.trainable_variables))
        with tf.GradientTape() as tape:
            g_loss = -tf.reduce_mean(self.critic(self.generator(z[:, -1], training=True), training=True))
        grads = tape.gradient(g_loss, self.generator.trainable_variables)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_variables))
        return {"d_loss": d_loss, "g_loss": g_loss}


def _wgan_data():
    r = rng(22)
    real = (r.normal(size=(N, FEATURES)) * 0.5 - 1.0).astype(np.float32)
    z = r.normal(size=(N, CRITIC_STEPS + 1, LATENT)).astype(np.float32)
    return real, z, r.uniform(size=(N, CRITIC_STEPS)).astype(np.float32)


def _build_wgan() -> WGANGP:
    keras.utils.set_random_seed(22)
    model = WGANGP(mlp("critic", FEATURES, [6, 1]), mlp("generator", LATENT, [6, FEATURES]))
    model.compile(d_optimizer=keras.optimizers.SGD(D_LR), g_optimizer=keras.optimizers.SGD(G_LR))
    return model


def _critic_tape(model: WGANGP, real, z, alpha, paths) -> Tuple[Tape, Tape]:
    """(the critic's tape, its gradient penalty's tape): the penalty's target is the critic's output on the
    interpolated samples, summed (what `gp_tape.gradient(pred, ...)` differentiates), its layers numbered by their
    calls under that tape."""
    with tf.GradientTape() as tape:
        fwd = Forward(tape)
        fake = fwd.sequential(model.generator, z, "wgan/generator")
        cost = tf.reduce_mean(fwd.sequential(model.critic, fake, "wgan/critic")) - tf.reduce_mean(
            fwd.sequential(model.critic, real, "wgan/critic")
        )
        interpolated = real + alpha * (fake - real)
        earlier = set(fwd.outputs)
        with tf.GradientTape() as gp_tape:
            gp_tape.watch(interpolated)
            pred = fwd.sequential(model.critic, interpolated, "wgan/critic")
        under_gp = {key.split("#")[0]: t for key, t in fwd.outputs.items() if key not in earlier}
        grads, gp_outputs = gp_tape.gradient(pred, (interpolated, under_gp))
        penalty = tf.reduce_mean((tf.sqrt(tf.reduce_sum(tf.square(grads), axis=1)) - 1.0) ** 2)
        loss = cost + GP_WEIGHT * penalty
    gp = Tape(float(tf.reduce_sum(pred)), {k: g.numpy() for k, g in gp_outputs.items()}, {})
    return differentiate(tape, fwd, loss, model.critic.trainable_variables, paths), gp


def _reproduce_wgan(model: WGANGP, before, after, batch) -> List[Tuple[str, Tape]]:
    real, z, alpha = (tf.constant(a) for a in batch)
    paths = weight_paths(model, {"critic": model.critic, "generator": model.generator})
    out = []
    with with_weights(model, before):
        for i in range(CRITIC_STEPS):
            t, gp = _critic_tape(model, real, z[:, i], alpha[:, i : i + 1], paths)
            out += [("critic", t), (PENALTY, gp)]
            for v in model.critic.trainable_variables:  # the critic's SGD update, replayed
                v.assign(v.numpy() - np.float32(D_LR) * t.weights[paths[id(v)]])
        replayed = model.critic.get_weights()
    late = mixed(model, before, after, model.critic)
    in_critic = [i for i, v in enumerate(model.weights) if any(v is w for w in model.critic.weights)]
    for got, i in zip(replayed, in_critic):  # the replay reaches the critic fit() left: the reproduction holds
        assert_same_float32_math(got, late[i], path_length(model, batch), "the critic's updates, replayed")
    with with_weights(model, mixed(model, before, after, model.critic)):
        with tf.GradientTape() as tape:
            fwd = Forward(tape)
            fake = fwd.sequential(model.generator, z[:, -1], "wgan/generator")
            loss = -tf.reduce_mean(fwd.sequential(model.critic, fake, "wgan/critic"))
        out.append(("generator", differentiate(tape, fwd, loss, model.generator.trainable_variables, paths)))
    return out


WGAN_CASE = Case(
    "wgan_gp", _build_wgan, _wgan_data, dataset, _reproduce_wgan, logger_kwargs={"targets": {PENALTY: "inputs"}}
)
