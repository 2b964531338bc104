"""The gallery's steps with several `gradient()` calls that the other cases do not hold (see gallery_steps.py).

Ported tiny from published train steps, as their authors wrote them:
- keras.io's CycleGAN: two generators, two discriminators, ONE persistent tape asked four times (one loss
  each), four optimizers: four targets, named after the sub-model each call asks for.
- keras.io's SimCLR: a contrastive tape over an encoder (a `Sequential` without `Input`: built by the first
  step) and a projection head, then a linear probe's tape on the encoder's features: the first call asks for
  two top-level sub-models ("encoder+projection_head"), the second for a sub-model of one layer
  ("linear_probe", not its Dense).
- keras.io's image captioning: a frozen CNN outside the tapes, then one tape per caption in a Python loop over
  an encoder and a decoder (custom layers whose weights the first step creates), each applied at once:
  "loss", "loss#2".

Weights the first step builds have no value before it: their initializers are seeded, and the reproduction
of that step builds the model again (`initial_weights`).
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import tensorflow as tf
from gallery_steps import (
    FEATURES,
    Case,
    Forward,
    N,
    Tape,
    dataset,
    differentiate,
    keras,
    layers,
    mixed,
    mlp,
    rng,
    weight_paths,
    with_weights,
)

CLASSES = 3

# -- CycleGAN -------------------------------------------------------------------------------------------------

LAMBDA_CYCLE, LAMBDA_IDENTITY = 10.0, 0.5


def _mse(a, b):
    return tf.reduce_mean(tf.square(a - b))


def _mae(a, b):
    return tf.reduce_mean(tf.abs(a - b))


def generator_loss(fake):
    return _mse(tf.ones_like(fake), fake)


def discriminator_loss(real, fake):
    return (_mse(tf.ones_like(real), real) + _mse(tf.zeros_like(fake), fake)) * 0.5


class CycleGan(keras.Model):
    """keras.io's CycleGAN (`CycleGan.train_step`): one persistent tape, four losses, four gradient calls."""

    def __init__(self, generator_G, generator_F, discriminator_X, discriminator_Y, **kwargs):
        super().__init__(name="cyclegan", **kwargs)
        self.gen_G, self.gen_F = generator_G, generator_F
        self.disc_X, self.disc_Y = discriminator_X, discriminator_Y

    def compile(self, gen_G_optimizer, gen_F_optimizer, disc_X_optimizer, disc_Y_optimizer):
        super().compile()
        self.gen_G_optimizer, self.gen_F_optimizer = gen_G_optimizer, gen_F_optimizer
        self.disc_X_optimizer, self.disc_Y_optimizer = disc_X_optimizer, disc_Y_optimizer

    def losses_of(self, real_x, real_y, run):
        """The example's forward and its four losses; `run(sub_model, x)` calls a sub-model."""
        fake_y = run(self.gen_G, real_x)
        fake_x = run(self.gen_F, real_y)
        cycled_x = run(self.gen_F, fake_y)
        cycled_y = run(self.gen_G, fake_x)
        same_x = run(self.gen_F, real_x)
        same_y = run(self.gen_G, real_y)
        disc_real_x = run(self.disc_X, real_x)
        disc_fake_x = run(self.disc_X, fake_x)
        disc_real_y = run(self.disc_Y, real_y)
        disc_fake_y = run(self.disc_Y, fake_y)
        cycle_loss_G = _mae(real_y, cycled_y) * LAMBDA_CYCLE
        cycle_loss_F = _mae(real_x, cycled_x) * LAMBDA_CYCLE
        id_loss_G = _mae(real_y, same_y) * LAMBDA_CYCLE * LAMBDA_IDENTITY
        id_loss_F = _mae(real_x, same_x) * LAMBDA_CYCLE * LAMBDA_IDENTITY
        total_loss_G = generator_loss(disc_fake_y) + cycle_loss_G + id_loss_G
        total_loss_F = generator_loss(disc_fake_x) + cycle_loss_F + id_loss_F
        disc_X_loss = discriminator_loss(disc_real_x, disc_fake_x)
        disc_Y_loss = discriminator_loss(disc_real_y, disc_fake_y)
        return total_loss_G, total_loss_F, disc_X_loss, disc_Y_loss

    def train_step(self, batch_data):
        real_x, real_y = batch_data
        with tf.GradientTape(persistent=True) as tape:
            total_loss_G, total_loss_F, disc_X_loss, disc_Y_loss = self.losses_of(
                real_x, real_y, lambda model, x: model(x, training=True)
            )
        grads_G = tape.gradient(total_loss_G, self.gen_G.trainable_variables)
        grads_F = tape.gradient(total_loss_F, self.gen_F.trainable_variables)
        disc_X_grads = tape.gradient(disc_X_loss, self.disc_X.trainable_variables)
        disc_Y_grads = tape.gradient(disc_Y_loss, self.disc_Y.trainable_variables)
        self.gen_G_optimizer.apply_gradients(zip(grads_G, self.gen_G.trainable_variables))
        self.gen_F_optimizer.apply_gradients(zip(grads_F, self.gen_F.trainable_variables))
        self.disc_X_optimizer.apply_gradients(zip(disc_X_grads, self.disc_X.trainable_variables))
        self.disc_Y_optimizer.apply_gradients(zip(disc_Y_grads, self.disc_Y.trainable_variables))
        return {"G_loss": total_loss_G, "F_loss": total_loss_F, "D_X_loss": disc_X_loss, "D_Y_loss": disc_Y_loss}


def _build_cyclegan():
    keras.utils.set_random_seed(41)
    model = CycleGan(
        mlp("generator_G", FEATURES, [5, FEATURES]),
        mlp("generator_F", FEATURES, [5, FEATURES]),
        mlp("discriminator_X", FEATURES, [4, 1]),
        mlp("discriminator_Y", FEATURES, [4, 1]),
    )
    model.compile(*(keras.optimizers.Adam(0.01, beta_1=0.5) for _ in range(4)))
    return model


def _cyclegan_data():
    r = rng(41)
    return r.normal(size=(N, FEATURES)).astype(np.float32), (r.normal(size=(N, FEATURES)) + 1.0).astype(np.float32)


def _reproduce_cyclegan(model, before, after, batch) -> List[Tuple[str, Tape]]:
    """All four gradients are taken before any update: every call on the weights before the batch."""
    real_x, real_y = (tf.constant(a) for a in batch)
    subs = {s.name: s for s in (model.gen_G, model.gen_F, model.disc_X, model.disc_Y)}
    paths = weight_paths(model, subs)
    with with_weights(model, before), tf.GradientTape(persistent=True) as tape:
        fwd = Forward(tape)
        losses = model.losses_of(real_x, real_y, lambda sub, x: fwd.sequential(sub, x, f"cyclegan/{sub.name}"))
    out = []
    for loss, sub in zip(losses, subs.values()):
        out.append((sub.name, differentiate(tape, fwd, loss, sub.trainable_variables, paths)))
    del tape
    return out


CYCLEGAN_CASE = Case("cyclegan", _build_cyclegan, _cyclegan_data, dataset, _reproduce_cyclegan)


# -- SimCLR ---------------------------------------------------------------------------------------------------

SIMCLR_TEMPERATURE = 0.5


def seeded(seed: int):
    """A seeded initializer: the same values at every build (the reproduction builds the model again)."""
    return keras.initializers.GlorotUniform(seed=seed)


class ContrastiveModel(keras.Model):
    """keras.io's SimCLR (`ContrastiveModel.train_step`): contrastive tape, then a linear probe's tape."""

    def __init__(self, **kwargs):
        super().__init__(name="simclr", **kwargs)
        # no Input: built by its first call, inside the first step
        self.encoder = keras.Sequential(
            [
                layers.Dense(6, activation="relu", kernel_initializer=seeded(1), name="e0"),
                layers.Dense(5, kernel_initializer=seeded(2), name="e1"),
            ],
            name="encoder",
        )
        self.projection_head = mlp("projection_head", 5, [5, 5], activation="relu")
        self.linear_probe = keras.Sequential(
            [keras.Input((5,)), layers.Dense(CLASSES, name="dense")], name="linear_probe"
        )

    def compile(self, contrastive_optimizer, probe_optimizer):
        super().compile()
        self.contrastive_optimizer, self.probe_optimizer = contrastive_optimizer, probe_optimizer
        self.probe_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def contrastive_loss(self, projections_1, projections_2):
        """The example's NT-Xent: a loss per example (the tape differentiates their sum)."""
        projections_1 = tf.math.l2_normalize(projections_1, axis=1)
        projections_2 = tf.math.l2_normalize(projections_2, axis=1)
        similarities = tf.matmul(projections_1, projections_2, transpose_b=True) / SIMCLR_TEMPERATURE
        contrastive_labels = tf.range(tf.shape(projections_1)[0])
        loss_1_2 = keras.losses.sparse_categorical_crossentropy(contrastive_labels, similarities, from_logits=True)
        loss_2_1 = keras.losses.sparse_categorical_crossentropy(
            contrastive_labels, tf.transpose(similarities), from_logits=True
        )
        return (loss_1_2 + loss_2_1) / 2

    def train_step(self, data):
        view_1, view_2, labeled_images, labels = data
        with tf.GradientTape() as tape:
            features_1 = self.encoder(view_1, training=True)
            features_2 = self.encoder(view_2, training=True)
            projections_1 = self.projection_head(features_1, training=True)
            projections_2 = self.projection_head(features_2, training=True)
            contrastive_loss = self.contrastive_loss(projections_1, projections_2)
        gradients = tape.gradient(
            contrastive_loss, self.encoder.trainable_weights + self.projection_head.trainable_weights
        )
        self.contrastive_optimizer.apply_gradients(
            zip(gradients, self.encoder.trainable_weights + self.projection_head.trainable_weights)
        )
        with tf.GradientTape() as tape:
            features = self.encoder(labeled_images, training=False)
            class_logits = self.linear_probe(features, training=True)
            probe_loss = self.probe_loss(labels, class_logits)
        gradients = tape.gradient(probe_loss, self.linear_probe.trainable_weights)
        self.probe_optimizer.apply_gradients(zip(gradients, self.linear_probe.trainable_weights))
        return {"c_loss": tf.reduce_mean(contrastive_loss), "p_loss": probe_loss}


def _build_simclr():
    keras.utils.set_random_seed(42)
    model = ContrastiveModel()
    model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01))
    return model


def _simclr_data():
    r = rng(42)
    base = r.normal(size=(N, FEATURES)).astype(np.float32)
    views = [(base + 0.2 * r.normal(size=base.shape)).astype(np.float32) for _ in range(2)]
    labeled = r.normal(size=(N, FEATURES)).astype(np.float32)
    return views[0], views[1], labeled, np.argmax(labeled[:, :CLASSES], axis=1).astype(np.int32)


def initial_weights(model, build, run) -> List[np.ndarray]:
    """The weights `model` started with where its first step built some: a new model from `build`, built by
    `run(new_model)` (each initializer seeded, or drawn at construction from `build`'s seed)."""
    fresh = build()
    run(fresh)
    assert len(fresh.weights) == len(model.weights)
    return fresh.get_weights()


def _reproduce_simclr(model, before, after, batch) -> List[Tuple[str, Tape]]:
    v1, v2, xl, y = (tf.constant(a) for a in batch)
    if len(before) != len(model.weights):  # the first batch built the encoder
        before = initial_weights(model, _build_simclr, lambda m: m.encoder(v1))
    subs = {"encoder": model.encoder, "projection_head": model.projection_head, "linear_probe": model.linear_probe}
    paths = weight_paths(model, subs)
    with with_weights(model, before), tf.GradientTape() as tape:
        fwd = Forward(tape)
        p1 = fwd.sequential(
            model.projection_head, fwd.sequential(model.encoder, v1, "simclr/encoder"), "simclr/projection_head"
        )
        p2 = fwd.sequential(
            model.projection_head, fwd.sequential(model.encoder, v2, "simclr/encoder"), "simclr/projection_head"
        )
        loss = tf.reduce_sum(model.contrastive_loss(p1, p2))  # what the step's call differentiates: the sum
    variables = model.encoder.trainable_weights + model.projection_head.trainable_weights
    contrastive = differentiate(tape, fwd, loss, variables, paths)
    late = mixed(model, mixed(model, before, after, model.encoder), after, model.projection_head)
    with with_weights(model, late), tf.GradientTape() as tape:
        fwd = Forward(tape)
        logits = fwd.sequential(
            model.linear_probe, fwd.sequential(model.encoder, xl, "simclr/encoder"), "simclr/linear_probe"
        )
        probe_loss = model.probe_loss(y, logits)
    probe = differentiate(tape, fwd, probe_loss, model.linear_probe.trainable_weights, paths)
    return [("encoder+projection_head", contrastive), ("linear_probe", probe)]


SIMCLR_CASE = Case("simclr", _build_simclr, _simclr_data, dataset, _reproduce_simclr)


# -- image captioning -----------------------------------------------------------------------------------------

VOCAB, SEQ, CAPTIONS, EMBED = 7, 5, 2, 6
CAPTION_LR = 0.1  # SGD: the reproduction replays the update after each caption (w - lr g)


class TransformerEncoderBlock(layers.Layer):
    """The example's encoder block, shrunk: its sub-layers made in __init__, their weights at the first call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.layernorm_1 = layers.LayerNormalization(name="layernorm_1")
        self.dense_1 = layers.Dense(EMBED, activation="relu", kernel_initializer=seeded(3), name="dense_1")

    def call(self, inputs, training=False):
        return self.dense_1(self.layernorm_1(inputs))


class TransformerDecoderBlock(layers.Layer):
    """The example's decoder block, shrunk: token embedding plus the encoder's output, then the vocabulary."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = layers.Embedding(VOCAB, EMBED, embeddings_initializer=seeded(4), name="embedding")
        self.out = layers.Dense(VOCAB, kernel_initializer=seeded(5), name="out")

    def call(self, inputs, encoder_outputs, training=False):
        return self.out(tf.tanh(self.embedding(inputs) + encoder_outputs[:, None, :]))


class ImageCaptioningModel(keras.Model):
    """keras.io's image captioning (`ImageCaptioningModel.train_step`): a tape per caption, in a Python loop."""

    def __init__(self, cnn_model, encoder, decoder, **kwargs):
        super().__init__(name="captioner", **kwargs)
        self.cnn_model, self.encoder, self.decoder = cnn_model, encoder, decoder
        self.loss_tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.loss_tracker]

    def calculate_loss(self, y_true, y_pred, mask):
        loss = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        mask = tf.cast(mask, dtype=loss.dtype)
        return tf.reduce_sum(loss * mask) / tf.reduce_sum(mask)

    def caption_loss(self, img_embed, batch_seq, encode, decode):
        encoder_out = encode(img_embed)
        batch_seq_inp, batch_seq_true = batch_seq[:, :-1], batch_seq[:, 1:]
        batch_seq_pred = decode(batch_seq_inp, encoder_out)
        return self.calculate_loss(batch_seq_true, batch_seq_pred, tf.math.not_equal(batch_seq_true, 0))

    def train_step(self, batch_data):
        batch_img, batch_seq = batch_data
        batch_loss = 0.0
        img_embed = self.cnn_model(batch_img)  # the frozen image model, outside the tapes
        for i in range(CAPTIONS):
            with tf.GradientTape() as tape:
                loss = self.caption_loss(
                    img_embed,
                    batch_seq[:, i, :],
                    lambda x: self.encoder(x, training=True),
                    lambda s, e: self.decoder(s, e, training=True),
                )
                batch_loss += loss
            train_vars = self.encoder.trainable_variables + self.decoder.trainable_variables
            grads = tape.gradient(loss, train_vars)
            self.optimizer.apply_gradients(zip(grads, train_vars))
        self.loss_tracker.update_state(batch_loss)
        return {"loss": self.loss_tracker.result()}


def _build_captioner():
    keras.utils.set_random_seed(43)
    cnn = mlp("cnn", FEATURES, [EMBED], activation="relu")
    cnn.trainable = False
    model = ImageCaptioningModel(cnn, TransformerEncoderBlock(name="encoder"), TransformerDecoderBlock(name="decoder"))
    model.compile(optimizer=keras.optimizers.SGD(CAPTION_LR))
    return model


def _captioner_data():
    r = rng(43)
    images = r.normal(size=(N, FEATURES)).astype(np.float32)
    captions = r.integers(0, VOCAB, size=(N, CAPTIONS, SEQ)).astype(np.int32)
    captions[:, :, 0] = 1  # the start token
    return images, captions


def _reproduce_captioner(model, before, after, batch) -> List[Tuple[str, Tape]]:
    """Each caption's tape on the weights after the updates of the captions before it (SGD replayed)."""
    images, captions = (tf.constant(a) for a in batch)
    if len(before) != len(model.weights):  # the first batch built the encoder and the decoder
        before = initial_weights(
            model, _build_captioner, lambda m: m.decoder(captions[:, 0, :-1], m.encoder(m.cnn_model(images)))
        )
    block_paths = {}
    for block in (model.encoder, model.decoder):
        for layer in (block.layernorm_1, block.dense_1) if block is model.encoder else (block.embedding, block.out):
            for v in layer.trainable_weights:
                block_paths[id(v)] = f"captioner/{block.name}/{layer.name}/{v.name.split('/')[-1].split(':')[0]}"
    out = []
    with with_weights(model, before):
        img_embed = model.cnn_model(images)
        variables = model.encoder.trainable_variables + model.decoder.trainable_variables
        for i in range(CAPTIONS):
            with tf.GradientTape() as tape:
                fwd = Forward(tape)

                def encode(x):
                    enc = model.encoder
                    h = fwd.layer(enc.layernorm_1, "captioner/encoder/layernorm_1", x)
                    return fwd.keep("captioner/encoder", fwd.layer(enc.dense_1, "captioner/encoder/dense_1", h))

                def decode(s, e):
                    dec = model.decoder
                    emb = fwd.layer(dec.embedding, "captioner/decoder/embedding", s)
                    o = fwd.layer(dec.out, "captioner/decoder/out", tf.tanh(emb + e[:, None, :]))
                    return fwd.keep("captioner/decoder", o)

                loss = model.caption_loss(img_embed, captions[:, i, :], encode, decode)
            grads = tape.gradient(loss, variables + [fwd.outputs])
            var_grads, out_grads = [tf.convert_to_tensor(g) for g in grads[:-1]], grads[-1]
            out.append(
                (
                    "loss",
                    Tape(
                        float(loss),
                        {k: (None if g is None else g.numpy()) for k, g in out_grads.items()},
                        {block_paths[id(v)]: g.numpy() for v, g in zip(variables, var_grads)},
                    ),
                )
            )
            for v, g in zip(variables, var_grads):
                v.assign_sub(CAPTION_LR * g)  # SGD's update, as the step's optimizer made it
    return out


CAPTION_CASE = Case("captions", _build_captioner, _captioner_data, dataset, _reproduce_captioner)


CALL_CASES = [CYCLEGAN_CASE, SIMCLR_CASE, CAPTION_CASE]
