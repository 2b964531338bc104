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

from tb_layergrad.metadata import FORMAT_VERSION, PLUGIN_NAME

__version__ = "1.0.0"

_LAZY = {
    "capture": ("tb_layergrad.capturing.layer_capture", "capture"),
    "Capture": ("tb_layergrad.capturing.layer_capture", "Capture"),
    "GradientMap": ("tb_layergrad.capturing.gradient_map", "GradientMap"),
    "GradientLogger": ("tb_layergrad.keras.gradient_logger", "GradientLogger"),
    "timestep_probe": ("tb_layergrad.capturing.rnn_probe", "timestep_probe"),
    "load": ("tb_layergrad.reader.dataframe", "load"),
    "NonFiniteError": ("tb_layergrad.keras.nonfinite_check", "NonFiniteError"),
}
# Public submodules, by the name users import them under -> where they live (the rooms).
_SUBMODULES = {
    "summary": "tb_layergrad.summary",
    "reductions": "tb_layergrad.statistics.reductions",
    "metadata": "tb_layergrad.metadata",
    "anomalies": "tb_layergrad.reader.anomalies",
    "report": "tb_layergrad.cli.report",
    "targets": "tb_layergrad.capturing.targets",
    "rnn_probe": "tb_layergrad.capturing.rnn_probe",
    "distribute": "tb_layergrad.distribute",
    "fused_kernel": "tb_layergrad.kernel",
    "nonfinite_origin": "tb_layergrad.nonfinite_origin",
}

__all__ = ["PLUGIN_NAME", "FORMAT_VERSION", "__version__", *_LAZY, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'tb_layergrad' has no attribute {name!r}")
