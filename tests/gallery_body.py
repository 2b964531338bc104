"""The gallery's one-loss steps on one body: gradient accumulation over k batches, `add_loss`, `sample_weight` /
`class_weight` through `compute_loss`, and Keras 3's `compute_loss` + `optimizer.apply` (see gallery_steps.py)."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import tensorflow as tf
from gallery_single import CLASSES, labelled_data, numpy_fit
from gallery_steps import (
    ACCUMULATE,
    ACTIVITY,
    CLASS_WEIGHT,
    FEATURES,
    L2,
    Case,
    Forward,
    N,
    Tape,
    differentiate,
    keras,
    layers,
    mlp,
    rng,
    weight_paths,
    with_weights,
)

# -- one body, one loss: accumulation, add_loss, weights, Keras 3's step ---------------------------------------


class Body(keras.Model):
    """A subclassed model around one Sequential stack (the steps below differ only in train_step)."""

    def __init__(self, name: str, body=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.body = body if body is not None else mlp("body", FEATURES, [6, CLASSES])

    def call(self, x, training=False):
        return self.body(x, training=training)


class Accumulating(Body):
    """Gradient accumulation: each batch's gradient is added up; the optimizer applies the mean every
    ACCUMULATE-th batch (in a tf.cond), so most batches train nothing."""

    def __init__(self, **kwargs):
        super().__init__("accum", **kwargs)
        self.count = self.add_weight(name="count", shape=(), dtype="int32", initializer="zeros", trainable=False)
        self.sums = [
            self.add_weight(name=f"sum_{i}", shape=v.shape, initializer="zeros", trainable=False)
            for i, v in enumerate(self.body.trainable_variables)
        ]

    def compile(self, optimizer, loss):
        super().compile(optimizer=optimizer, loss=loss)
        self.optimizer.build(self.body.trainable_variables)  # its variables exist before the tf.cond branch

    def _apply(self):
        variables = self.body.trainable_variables
        self.optimizer.apply_gradients(zip([tf.convert_to_tensor(s) for s in self.sums], variables))
        self.count.assign(0)
        for s in self.sums:
            s.assign(tf.zeros_like(s))
        return tf.constant(True)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(self.loss(y, self(x, training=True)))
        grads = tape.gradient(loss, self.body.trainable_variables)
        for s, g in zip(self.sums, grads):
            s.assign_add(g / ACCUMULATE)
        self.count.assign_add(1)
        tf.cond(tf.equal(self.count, ACCUMULATE), self._apply, lambda: tf.constant(False))
        return {"loss": loss}


def _build_accumulating():
    keras.utils.set_random_seed(34)
    model = Accumulating()
    model.compile(keras.optimizers.SGD(0.2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class ActivityPenalty(layers.Layer):
    """Passes its input through and `add_loss`es ACTIVITY * mean(x^2)."""

    def call(self, x):
        self.add_loss(ACTIVITY * tf.reduce_mean(tf.square(x)))
        return x


class Regularized(Body):
    """A hand-written loss plus `self.losses`: an activity penalty (add_loss) and a kernel regularizer."""

    def __init__(self, **kwargs):
        body = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                layers.Dense(6, activation="tanh", kernel_regularizer=keras.regularizers.L2(L2), name="b0"),
                ActivityPenalty(name="penalty"),
                layers.Dense(CLASSES, name="b1"),
            ],
            name="body",
        )
        super().__init__("addloss", body=body, **kwargs)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.loss(y, self(x, training=True)) + tf.add_n(self.losses)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def _build_regularized():
    keras.utils.set_random_seed(35)
    model = Regularized()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(True))
    return model


def _regularization(model):
    """The penalties by hand (not `model.losses`): L2 * sum(kernel^2) and the activity term of `penalty`'s input."""
    return lambda h: (
        ACTIVITY * tf.reduce_mean(tf.square(h)) + L2 * tf.reduce_sum(tf.square(model.body.get_layer("b0").kernel))
    )


class Weighted(Body):
    """The guide's step that supports `sample_weight` and `class_weight`: unpack, `compute_loss`, apply_gradients."""

    def __init__(self, **kwargs):
        super().__init__("weighted", **kwargs)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True), sample_weight=sample_weight)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


class Keras3Step(Body):
    """Keras 3's guide step: `self.compute_loss`, `self.optimizer.apply`, the compiled metrics updated by hand."""

    def __init__(self, **kwargs):
        super().__init__("k3step", **kwargs)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def _built(cls, seed: int, **compile_kwargs):
    def build():
        keras.utils.set_random_seed(seed)
        model = cls()
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            **compile_kwargs,
        )
        return model

    return build


def _reproducer(weight_of=None, extra=None):
    """A one-tape step on model.body: loss = the compiled loss (weighted per example) [+ extra(penalty input)]."""

    def reproduce(model, before, after, batch) -> List[Tuple[str, Tape]]:
        x, y = tf.constant(batch[0]), tf.constant(batch[1])
        weights = None if weight_of is None else tf.constant(weight_of(batch))
        paths = weight_paths(model, {"body": model.body})
        with with_weights(model, before), tf.GradientTape() as tape:
            fwd = Forward(tape)
            pred = fwd.sequential(model.body, x, f"{model.name}/body")
            loss = tf.reduce_mean(model.loss(y, pred, sample_weight=weights))
            if extra is not None:
                loss = loss + extra(model)(fwd.outputs[f"{model.name}/body/b0"])  # the penalty layer's input
        return [("loss", differentiate(tape, fwd, loss, model.body.trainable_variables, paths))]

    return reproduce


def _sample_weights():
    x, y = labelled_data(36)
    return x, y, rng(36).uniform(0.1, 2.0, size=N).astype(np.float32)


def _class_weights(batch):
    return np.array([CLASS_WEIGHT[int(c)] for c in batch[1]], np.float32)


def _no_apply_method() -> str:
    """Why `optimizer.apply(grads, variables)` is missing where it is (an observed fact, not a version check)."""
    if hasattr(keras.optimizers.SGD(), "apply"):
        return None
    return "this Keras' optimizers have no apply(gradients, variables): the step is Keras 3's guide pattern"


BODY_CASES = [
    Case("accumulation", _build_accumulating, lambda: labelled_data(34), numpy_fit, _reproducer()),
    Case("add_loss", _build_regularized, lambda: labelled_data(35), numpy_fit, _reproducer(extra=_regularization)),
    Case(
        "sample_weight",
        _built(Weighted, 36),
        _sample_weights,
        lambda a: {"x": a[0], "y": a[1], "sample_weight": a[2]},
        _reproducer(weight_of=lambda b: b[2]),
    ),
    Case(
        "class_weight",
        _built(Weighted, 37),
        lambda: labelled_data(37),
        lambda a: {"x": a[0], "y": a[1], "class_weight": CLASS_WEIGHT},
        _reproducer(weight_of=_class_weights),
    ),
    Case("compute_loss_apply", _built(Keras3Step, 38), lambda: labelled_data(38), numpy_fit, _reproducer()),
]
BODY_CASES[-1].keras3_only = _no_apply_method()
