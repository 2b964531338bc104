"""Writes `logs/` and `start.npz` here: the TensorFlow run that tests/jax_backend/test_jax_vs_tf.py compares a JAX run to.

Run with TensorFlow and Keras 3 (`KERAS_BACKEND=tensorflow python tests/data/jax_vs_tf/make_tf_run.py`). The
model, data and options are `tests/jax_vs_tf_case.py`'s, the starting weights saved beside the logs so that
the JAX run starts from the same numbers.
"""

from __future__ import annotations

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import numpy as np  # noqa: E402
from jax_vs_tf_case import BATCH, EPOCHS, LOGGER_OPTIONS, data, model  # noqa: E402

import tb_layergrad  # noqa: E402


def main() -> None:
    logs = os.path.join(HERE, "logs")
    shutil.rmtree(logs, ignore_errors=True)
    net = model()
    np.savez(os.path.join(HERE, "start.npz"), *net.get_weights())
    x, y = data()
    logger = tb_layergrad.GradientLogger(logs, **LOGGER_OPTIONS)
    net.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[logger])
    logger.close()


if __name__ == "__main__":
    main()
