"""The gallery's one-loss steps on several sub-models: VAE, Distiller, two-view contrastive (see gallery_steps.py)."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import tensorflow as tf
from gallery_steps import (
    ALPHA,
    FEATURES,
    LATENT,
    TEMPERATURE,
    Case,
    Forward,
    N,
    Tape,
    dataset,
    differentiate,
    keras,
    layers,
    mlp,
    rng,
    weight_paths,
    with_weights,
)

CLASSES = 3


def labelled_data(seed: int):
    r = rng(seed)
    x = r.normal(size=(N, FEATURES)).astype(np.float32)
    return x, (np.argmax(x[:, :CLASSES], axis=1)).astype(np.int32)


def numpy_fit(arrays) -> dict:
    return {"x": arrays[0], "y": arrays[1]}


# -- VAE ----------------------------------------------------------------------------------------------------


class Sampling(layers.Layer):
    """z = mean + exp(log_var / 2) * eps; eps comes with the data (the example draws it here)."""

    def call(self, inputs):
        z_mean, z_log_var, eps = inputs
        return z_mean + tf.exp(0.5 * z_log_var) * eps


def vae_losses(x, z_mean, z_log_var, reconstruction):
    reconstruction_loss = tf.reduce_mean(tf.reduce_sum(tf.square(x - reconstruction), axis=1))
    kl = -0.5 * (1.0 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
    kl_loss = tf.reduce_mean(tf.reduce_sum(kl, axis=1))
    return reconstruction_loss + kl_loss, reconstruction_loss, kl_loss


class VAE(keras.Model):
    """keras.io's VAE: an encoder to (mean, log variance), a sampling layer, a decoder, and its own loss trackers."""

    def __init__(self, **kwargs):
        super().__init__(name="vae", **kwargs)
        self.encoder = mlp("encoder", FEATURES, [6, 2 * LATENT])
        self.sampling = Sampling(name="sampling")
        self.decoder = mlp("decoder", LATENT, [6, FEATURES])
        self.trackers = [keras.metrics.Mean(name=n) for n in ("total_loss", "reconstruction_loss", "kl_loss")]

    @property
    def metrics(self):
        return list(self.trackers)

    def train_step(self, data):
        x, eps = data
        with tf.GradientTape() as tape:
            z_mean, z_log_var = tf.split(self.encoder(x, training=True), 2, axis=-1)
            z = self.sampling([z_mean, z_log_var, eps])
            losses = vae_losses(x, z_mean, z_log_var, self.decoder(z, training=True))
        grads = tape.gradient(losses[0], self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        for tracker, value in zip(self.trackers, losses):
            tracker.update_state(value)
        return {t.name: t.result() for t in self.trackers}


def _build_vae():
    keras.utils.set_random_seed(31)
    model = VAE()
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


def _vae_data():
    r = rng(31)
    return r.normal(size=(N, FEATURES)).astype(np.float32), r.normal(size=(N, LATENT)).astype(np.float32)


def _reproduce_vae(model, before, after, batch) -> List[Tuple[str, Tape]]:
    x, eps = (tf.constant(a) for a in batch)
    paths = weight_paths(model, {"encoder": model.encoder, "decoder": model.decoder})
    with with_weights(model, before), tf.GradientTape() as tape:
        fwd = Forward(tape)
        z_mean, z_log_var = tf.split(fwd.sequential(model.encoder, x, "vae/encoder"), 2, axis=-1)
        z = fwd.layer(model.sampling, "vae/sampling", [z_mean, z_log_var, eps])
        total = vae_losses(x, z_mean, z_log_var, fwd.sequential(model.decoder, z, "vae/decoder"))[0]
    return [("loss", differentiate(tape, fwd, total, model.trainable_weights, paths))]


VAE_CASE = Case("vae", _build_vae, _vae_data, dataset, _reproduce_vae)


# -- Distiller ------------------------------------------------------------------------------------------------


class Distiller(keras.Model):
    """keras.io's knowledge distillation: the teacher (frozen) predicts before the tape, the student learns from
    the labels and from the teacher's softened predictions."""

    def __init__(self, student, teacher, **kwargs):
        super().__init__(name="distiller", **kwargs)
        self.student, self.teacher = student, teacher

    def compile(self, optimizer, student_loss_fn, distillation_loss_fn):
        super().compile(optimizer=optimizer)
        self.student_loss_fn, self.distillation_loss_fn = student_loss_fn, distillation_loss_fn

    def distill_loss(self, y, teacher_pred, student_pred):
        student_loss = self.student_loss_fn(y, student_pred)
        soft = self.distillation_loss_fn(
            tf.nn.softmax(teacher_pred / TEMPERATURE, axis=1), tf.nn.softmax(student_pred / TEMPERATURE, axis=1)
        )
        return ALPHA * student_loss + (1.0 - ALPHA) * soft * TEMPERATURE**2

    def train_step(self, data):
        x, y = data
        teacher_pred = self.teacher(x, training=False)
        with tf.GradientTape() as tape:
            loss = self.distill_loss(y, teacher_pred, self.student(x, training=True))
        grads = tape.gradient(loss, self.student.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.student.trainable_variables))
        return {"distillation_loss": loss}


def _build_distiller():
    keras.utils.set_random_seed(32)
    teacher = mlp("teacher", FEATURES, [8, CLASSES])
    teacher.trainable = False
    model = Distiller(mlp("student", FEATURES, [4, CLASSES]), teacher)
    model.compile(
        keras.optimizers.SGD(0.1),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        keras.losses.KLDivergence(),
    )
    return model


def _reproduce_distiller(model, before, after, batch) -> List[Tuple[str, Tape]]:
    x, y = (tf.constant(a) for a in batch)
    paths = weight_paths(model, {"student": model.student})
    with with_weights(model, before):
        teacher_pred = model.teacher(x, training=False)  # before the tape: on no tape
        with tf.GradientTape() as tape:
            fwd = Forward(tape)
            loss = model.distill_loss(y, teacher_pred, fwd.sequential(model.student, x, "distiller/student"))
        return [("loss", differentiate(tape, fwd, loss, model.student.trainable_variables, paths))]


DISTILLER_CASE = Case("distiller", _build_distiller, lambda: labelled_data(32), numpy_fit, _reproduce_distiller)


# -- two views ------------------------------------------------------------------------------------------------


def negative_cosine(p, z):
    """SimSiam's D(p, z): the target branch is a constant (stop-gradient)."""
    p = tf.math.l2_normalize(p, axis=1)
    z = tf.math.l2_normalize(tf.stop_gradient(z), axis=1)
    return -tf.reduce_mean(tf.reduce_sum(p * z, axis=1))


class SimSiam(keras.Model):
    """A two-view contrastive step (keras.io's SimSiam): one encoder and predictor on both views, symmetric loss."""

    def __init__(self, **kwargs):
        super().__init__(name="simsiam", **kwargs)
        self.encoder = mlp("encoder", FEATURES, [6, 5])
        self.predictor = mlp("predictor", 5, [4, 5])

    def views_loss(self, v1, v2, encode, predict):
        z1, z2 = encode(v1), encode(v2)
        return 0.5 * negative_cosine(predict(z1), z2) + 0.5 * negative_cosine(predict(z2), z1)

    def train_step(self, data):
        v1, v2 = data
        with tf.GradientTape() as tape:
            loss = self.views_loss(v1, v2, lambda v: self.encoder(v, training=True), self.predictor)
        variables = self.encoder.trainable_variables + self.predictor.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return {"loss": loss}


def _build_simsiam():
    keras.utils.set_random_seed(33)
    model = SimSiam()
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    return model


def _views():
    r = rng(33)
    v1 = r.normal(size=(N, FEATURES)).astype(np.float32)
    return v1, (v1 + 0.1 * r.normal(size=v1.shape)).astype(np.float32)


def _reproduce_simsiam(model, before, after, batch) -> List[Tuple[str, Tape]]:
    v1, v2 = (tf.constant(a) for a in batch)
    paths = weight_paths(model, {"encoder": model.encoder, "predictor": model.predictor})
    with with_weights(model, before), tf.GradientTape() as tape:
        fwd = Forward(tape)
        loss = model.views_loss(
            v1,
            v2,
            lambda v: fwd.sequential(model.encoder, v, "simsiam/encoder"),
            lambda z: fwd.sequential(model.predictor, z, "simsiam/predictor"),
        )
    variables = model.encoder.trainable_variables + model.predictor.trainable_variables
    return [("loss", differentiate(tape, fwd, loss, variables, paths))]


CONTRASTIVE_CASE = Case("contrastive", _build_simsiam, _views, dataset, _reproduce_simsiam)


SINGLE_CASES = [VAE_CASE, DISTILLER_CASE, CONTRASTIVE_CASE]
