"""A run written by the real capture and summary ops with per-example records of the outputs AND the weights, one
example planted to dominate one step (docs/ANOMALIES.md, "One example dominates"), and what the routes must say
about it, computed independently (tests/per_example_reference.py: one tape per example, its own loss on a batch
of one) and reduced with numpy.

The model does not train (no optimizer): every step holds a fresh batch through the same weights, so each step's
per-example norms are those of that batch alone. At DOMINATED_STEP the example at DOMINATED_POSITION has a target
far from the others': its gradient carries most of every layer's per-example gradient energy there.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

RUN = "mlp_ex"
STEPS, BATCH = 6, 16
DOMINATED_STEP, DOMINATED_POSITION = 3, 5
OUT, KERNEL, BIAS, HIDDEN_KERNEL = "mlp/out", "mlp/out/kernel", "mlp/out/bias", "mlp/h/kernel"
RTOL = 1e-4  # per-example norms, as tests/summary/test_per_example_write.py; a share of squares within 4x that


@dataclasses.dataclass
class Written:
    run_dir: str
    outputs: List[Dict[str, np.ndarray]]  # per step: layer path -> [BATCH] per-example norms of its output gradient
    weights: List[Dict[str, np.ndarray]]  # per step: variable path -> [BATCH] per-example norms of its gradient

    def norms(self, source: str, path: str) -> np.ndarray:
        """[STEPS, BATCH] of one series."""
        by_step = self.outputs if source == "output" else self.weights
        return np.stack([s[path] for s in by_step])


def _loss(y, pred):
    import tensorflow as tf

    return tf.reduce_mean(tf.square(pred - y))


def _model():
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(3)  # the same weights in every run of the tests
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(7, activation="tanh", name="h"), keras.layers.Dense(3, name="out")],
        name="mlp",
    )


def batch(step: int) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(100 + step)
    x, y = rng.normal(size=(BATCH, 5)), rng.normal(size=(BATCH, 3))
    if step == DOMINATED_STEP:
        y[DOMINATED_POSITION] += 40.0
    return x.astype(np.float32), y.astype(np.float32)


def write_run(run_dir: str) -> Written:
    """`summary.gradients` of `capture(weights=True, per_example=True)` at every step, and the reference norms."""
    import per_example_reference as ref
    import tensorflow as tf

    import tb_layergrad

    model = _model()
    writer = tf.summary.create_file_writer(run_dir)
    outputs, weights = [], []
    with writer.as_default():
        for step in range(STEPS):
            x, y = (tf.constant(a) for a in batch(step))
            with tf.GradientTape() as tape:
                with tb_layergrad.capture(model, tape=tape, weights=True, per_example=True) as cap:
                    loss = _loss(y, model(x, training=True))
            tb_layergrad.summary.gradients(cap.gradients(tape, loss), step=step)
            outputs.append(ref.output_norms(model, _loss, x, y))
            weights.append(ref.norms(ref.per_example_gradients(model, _loss, x, y)))
    writer.close()
    return Written(run_dir, outputs, weights)


def write_logdir(logdir: str) -> Written:
    return write_run(os.path.join(logdir, RUN))


def expected_dominance(layer: str, norms: np.ndarray) -> Optional[dict]:
    """numpy on [steps, batch] norms: the steps where the largest example carries more than half of the squares
    and is over 4 times the median, over the steps, of the batch's largest norm."""
    sq = norms.astype(np.float64) ** 2
    share = sq.max(1) / sq.sum(1)
    top = norms.astype(np.float64).max(1)
    hit = np.flatnonzero((share > 0.5) & (top > 4.0 * np.median(top)))
    if not hit.size:
        return None
    worst = int(hit[np.argmax(share[hit])])
    return {
        "layer": layer,
        "steps": int(hit.size),
        "first_step": int(hit[0]),
        "worst_step": worst,
        "worst_share": float(share[worst]),
        "worst_position": int(np.argmax(norms[worst])),
        "examples": norms.shape[1],
    }
