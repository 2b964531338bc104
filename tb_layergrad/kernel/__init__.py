"""The fused C++ kernel: one op computes (and can write) the records of all of a step's tensors.

Modules:
  loader -- build on first use, load, the op functions (`op()`, `write_op()`, `disabled()`)
  ops    -- the two ops called from Python (`histograms_and_stats`, `write_histograms_and_stats`)
  cache  -- where builds live and which may be loaded (no TensorFlow: cheap to ask)
  src/   -- the C++ sources (records.h holds the statistics' positions)

`tb_layergrad.kernel.<name>` reads `ops`' and `loader`'s names, so that importing this
package (or `cache`) does not import TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    ops = importlib.import_module("tb_layergrad.kernel.ops")
    return (
        getattr(ops, name)
        if name in vars(ops)
        else getattr(importlib.import_module("tb_layergrad.kernel.loader"), name)
    )
