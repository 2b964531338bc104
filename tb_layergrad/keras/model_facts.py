"""What GradientLogger reads off a model and its optimizer, by their behaviour, never by a version."""

from __future__ import annotations

from typing import Any, Callable, Optional

import tensorflow as tf


def flavor(model: Any) -> str:
    """'keras' (Keras 3) or 'tf_keras' (Keras 2), from the model's class hierarchy."""
    for cls in type(model).__mro__:
        root = cls.__module__.split(".")[0]
        if root == "tf_keras":
            return "tf_keras"
        if root == "keras" and cls.__name__ in ("Model", "Trainer", "TensorFlowTrainer"):
            return "keras"
    raise TypeError(f"GradientLogger needs a Keras model (Keras 3 or tf_keras), got {type(model).__name__}")


def check_supported(model: Any) -> str:
    """Raise before training where the step cannot be observed. Returns the flavor.

    What is checked is behaviour, not a version: the model's Keras, and that it
    runs on TensorFlow (the observation watches `tf.GradientTape`).
    """
    kind = flavor(model)
    if kind == "keras":
        import keras

        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                f"GradientLogger observes TensorFlow's GradientTape; Keras runs on {keras.backend.backend()!r}. "
                "Set KERAS_BACKEND=tensorflow."
            )
    return kind


def model_train_step(model: Any) -> Callable:
    """The train step fit() would run without the callback: an instance attribute, else the class's."""
    own = model.__dict__.get("train_step")
    return own if own is not None else type(model).train_step.__get__(model, type(model))


# -- the optimizer: its update count and its loss scale ---------------------------
def update_count(optimizer: Any) -> Any:
    """The variable that counts the optimizer's applied updates (`optimizer.iterations`).

    A loss-scaling wrapper counts on its inner optimizer, the one that applies the
    updates: newer Keras forwards `iterations` to it, Keras 3.3 leaves the wrapper's
    own counter at 0, so the inner optimizer's is the one that counts everywhere.
    """
    inner = getattr(optimizer, "inner_optimizer", None)
    return (inner if inner is not None else optimizer).iterations


def loss_scale(kind: str, optimizer: Any) -> Optional[tf.Tensor]:
    """The factor the step multiplies its loss by before differentiating (None: 1), read now.

    Asked of the optimizer's own public scaling method with a loss of 1 (Keras 3:
    `scale_loss`, which its train step calls; tf_keras: `get_scaled_loss`), so the
    answer is whatever the optimizer applies at this point of the step: a dynamic
    scale, its initial value before the optimizer is built, a fixed factor, or none.
    """
    if optimizer is None:
        return None
    scale = getattr(optimizer, "scale_loss" if kind == "keras" else "get_scaled_loss", None)
    if scale is None:
        return None
    one = tf.constant(1.0, tf.float32)
    scaled = scale(one)
    if scaled is one:  # the optimizer does not scale
        return None
    return tf.cast(tf.convert_to_tensor(scaled), tf.float32)
