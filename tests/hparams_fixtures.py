"""A logdir of small fits whose hyperparameters were logged with TensorBoard's HParams API.

Written as a user would: `hp.KerasCallback(log_dir, ...)` beside `GradientLogger(log_dir)` in fit(), and
`hp.hparams(...)` inside a file writer, at two depths. `EXPECTED` is what was logged, by our run (the folder
GradientLogger wrote): each run gets the nearest session at or above it.

  kc/train          <- kc       (hp.KerasCallback(kc) in fit())
  top/train         <- top      (hp.hparams in `top`)
  top/deep/train    <- top/deep (hp.hparams in `top/deep`: the nearer session, not merged with `top`'s)
  bare/train        <- none
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np

SESSIONS: Dict[str, dict] = {
    "kc": {"learning_rate": 0.05, "activation": "relu", "batch_norm": True, "units": 8, "mixed": 3.5},
    "top": {"learning_rate": 0.2, "activation": "<b>tanh</b>", "batch_norm": False, "mixed": "three"},
    "top/deep": {"learning_rate": 1e-4, "dropout": 0.25},
}
# What each run reads back: numbers as floats (the format stores doubles).
EXPECTED: Dict[str, dict] = {
    "kc/train": {
        k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in SESSIONS["kc"].items()
    },
    "top/train": dict(SESSIONS["top"]),
    "top/deep/train": dict(SESSIONS["top/deep"]),
    "bare/train": {},
}
NAMES = sorted({k for v in SESSIONS.values() for k in v})
STEPS = 3


def fit_with_logger(logdir: str, run: str, callbacks: list, seed: int) -> None:
    import tensorflow as tf

    import tb_layergrad

    keras = tf.keras
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8 * STEPS, 4)).astype("float32")
    y = rng.normal(size=(8 * STEPS, 1)).astype("float32")
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="hidden"), keras.layers.Dense(1, name="out")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    logger = tb_layergrad.GradientLogger(os.path.join(logdir, run))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[*callbacks, logger])


def write_hparams_logdir(logdir: str) -> None:
    """The four runs above, with the real HParams API and GradientLogger."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    fit_with_logger(logdir, "kc", [hp.KerasCallback(os.path.join(logdir, "kc"), SESSIONS["kc"])], seed=1)
    for session in ("top", "top/deep"):
        with tf.summary.create_file_writer(os.path.join(logdir, session)).as_default():
            hp.hparams(SESSIONS[session])
    fit_with_logger(logdir, "top", [], seed=2)
    fit_with_logger(logdir, "top/deep", [], seed=3)
    fit_with_logger(logdir, "bare", [], seed=4)
