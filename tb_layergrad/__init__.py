"""tb_layergrad: the gradient of the loss w.r.t. each layer's output, in TensorBoard.

Quick use inside a training loop:

    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = loss_fn(y, model(x))
    grads = cap.gradients(tape, loss)          # {"my_model/dense": dL/d(output), ...}
    optimizer.apply_gradients(zip(grads.variable_gradients, model.trainable_variables))
    with writer.as_default(step=optimizer.iterations):
        tb_layergrad.summary.gradients(grads)

The heavy submodules (TensorFlow, Keras) load on first use, so that the
TensorBoard plugin, which imports this package, starts without TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "1.0.0"

# The public API (README, "What it writes, the API, the docs"; pinned by tests/test_public_api.py): every
# other module is private and may change in any release.
_LAZY = {
    "capture": ("tb_layergrad.capturing.layer_capture", "capture"),
    "Capture": ("tb_layergrad.capturing.layer_capture", "Capture"),
    "GradientMap": ("tb_layergrad.capturing.gradient_map", "GradientMap"),
    "timestep_probe": ("tb_layergrad.capturing.rnn_probe", "timestep_probe"),
    "NonFiniteError": ("tb_layergrad.nonfinite_origin", "NonFiniteError"),
    "load": ("tb_layergrad.reader.dataframe", "load"),
}
# Public submodules: the summary ops, and the writer helpers for distributed custom loops.
_SUBMODULES = {"summary": "tb_layergrad.summary", "distribute": "tb_layergrad.distribute"}

# Resolved by the backend Keras runs on (`tb_layergrad.backend`): TensorFlow's room or JAX's.
_BY_BACKEND = ("GradientLogger",)

__all__ = ["__version__", *_LAZY, *_BY_BACKEND, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in _BY_BACKEND:
        from tb_layergrad import backend

        value = backend.logger_class()
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'tb_layergrad' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(__all__)
