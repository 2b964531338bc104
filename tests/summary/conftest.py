"""The summary room's fixtures."""

import contextlib

import pytest


@pytest.fixture(params=[pytest.param("fused op", marks=pytest.mark.kernel), "TensorFlow ops"])
def write_path(request, fused_kernel):
    """Both ways a step's records are written: by the fused write op (which also keeps the first non-finite steps
    and the stats ‖G_B‖² is had from), and by TensorFlow's ops (nonfinite.py's variable, the gradients)."""
    with fused_kernel.off() if request.param == "TensorFlow ops" else contextlib.nullcontext():
        yield request.param
