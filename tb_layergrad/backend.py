"""Which Keras backend the callback observes, decided in one place: TensorFlow's room or JAX's.

Why here and not in each room: `import tb_layergrad` must work wherever the reader, the plugin and
`report` do (no TensorFlow, no JAX), and a user on JAX must never import TensorFlow to get
`GradientLogger`. So the choice is made when the name is first read, from what Keras itself reports.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# The Keras backends whose fit() step GradientLogger observes, and the room that observes each.
LOGGER_OF_BACKEND = {
    "tensorflow": "tb_layergrad.keras.gradient_logger",
    "jax": "tb_layergrad.jax.gradient_logger",
}


def legacy_keras() -> bool:
    """Is `tf.keras` tf_keras (Keras 2)? It runs on TensorFlow only, whatever KERAS_BACKEND says."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


def keras_backend() -> str:
    """The backend Keras 3 runs on (`keras.config.backend()`), or "tensorflow" for tf_keras or no Keras 3."""
    if legacy_keras():
        return "tensorflow"
    try:
        import keras
    except ImportError:  # tf_keras alone, or nothing: TensorFlow's room explains what is missing
        return "tensorflow"
    backend = getattr(getattr(keras, "config", None), "backend", None)
    return backend() if callable(backend) else keras.backend.backend()


def unsupported_message(backend: str) -> str:
    return (
        f"tb_layergrad's GradientLogger observes Keras' fit() on TensorFlow (KERAS_BACKEND=tensorflow, or tf_keras) "
        f"and on JAX (KERAS_BACKEND=jax); this Keras runs on {backend!r}. The reader, the TensorBoard tab, "
        "`tb-layergrad report` and `tb_layergrad.load()` work with any backend."
    )


def logger_class() -> Any:
    """The `GradientLogger` of the backend Keras runs on; RuntimeError before training on any other backend."""
    backend = keras_backend()
    module = LOGGER_OF_BACKEND.get(backend)
    if module is None:
        raise RuntimeError(unsupported_message(backend))
    return importlib.import_module(module).GradientLogger
