"""Shared pytest set-up: quiet TensorFlow, deterministic seeds."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state (Keras initializers, tf.random)."""
    try:
        import keras
    except ImportError:  # plugin-only environments
        return
    keras.utils.set_random_seed(1234)
