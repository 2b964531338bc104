"""keras.io's CycleGAN (tests/gallery_calls.py: one persistent tape, four gradient calls) trained by fit() under
MirroredStrategy (2 logical CPUs) with GradientLogger.

Usage: fit_calls_mirrored.py LOGDIR MODES. For each mode (graph, eager): LOGDIR/<mode>/train holds the logger's
records (weights=True, whole tensors); LOGDIR/expected_<mode>.npz the first batch's four calls reproduced: each
replica's own tapes on its half of the global batch (the gallery's reproduction, on the initial weights: every
call of the step comes before any update), merged as `tb_layergrad.distribute.merge` does (layer outputs
concatenated along the batch in replica order, weights and losses summed). LOGDIR/weights_<mode>.npz: the final
weights with the logger and without (must be bitwise equal).
"""

import os
import sys

from common import logical_cpus  # noqa: E402

logdir = sys.argv[1]
modes = sys.argv[2].split(",")
devices = logical_cpus(2)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the gallery

import gallery_calls as gc  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from gallery_steps import BATCH, BATCHES, Snapshots, mlp  # noqa: E402

import tb_layergrad  # noqa: E402

strategy = tf.distribute.MirroredStrategy(devices)
arrays = gc.CYCLEGAN_CASE.data()


class CycleGan(gc.CycleGan):
    """The gallery's CycleGAN with a `call`, which fit() under a strategy calls with the batch's first part."""

    def call(self, real_x):
        return self.gen_G(real_x)


def fit(mode, logged):
    with strategy.scope():
        tf.keras.utils.set_random_seed(41)  # the gallery's builder, on this class
        model = CycleGan(*(mlp(n, gc.FEATURES, s) for n, s in _SUBS))
        # SGD, not the example's Adam: four Adams building their state inside the first step fail under the
        # strategy without any callback ("You must feed a value for placeholder tensor", Keras 3.15)
        model.compile(*(tf.keras.optimizers.SGD(0.01) for _ in range(4)))
        model.run_eagerly = mode == "eager"
    snaps = Snapshots()
    callbacks = [snaps]
    if logged:
        callbacks.append(tb_layergrad.GradientLogger(os.path.join(logdir, mode), weights=True, max_elements=10_000))
    model.fit(tf.data.Dataset.from_tensor_slices(arrays).batch(BATCH), epochs=1, verbose=0, callbacks=callbacks)
    return model, snaps


_SUBS = [
    ("generator_G", [5, gc.FEATURES]),
    ("generator_F", [5, gc.FEATURES]),
    ("discriminator_X", [4, 1]),
    ("discriminator_Y", [4, 1]),
]

for mode in modes:
    model, snaps = fit(mode, logged=True)
    first = tuple(a[:BATCH] for a in arrays)
    halves = [tuple(a[r * BATCH // 2 : (r + 1) * BATCH // 2] for a in first) for r in range(2)]
    per_replica = [gc._reproduce_cyclegan(model, snaps.before[1], snaps.after[1], half) for half in halves]
    expected = {}
    for k, (label, _) in enumerate(per_replica[0]):
        tapes = [replica[k][1] for replica in per_replica]
        expected[f"{label}|target|loss"] = np.asarray(sum(t.loss for t in tapes))
        for path in tapes[0].outputs:
            parts = [t.outputs[path] for t in tapes]
            expected[f"{label}|output|{path}"] = (
                np.asarray(np.nan) if parts[0] is None else np.concatenate(parts, axis=0)
            )
        for path in tapes[0].weights:
            expected[f"{label}|weight|{path}"] = sum(t.weights[path] for t in tapes)
    np.savez(os.path.join(logdir, f"expected_{mode}.npz"), **expected)
    plain, _ = fit(mode, logged=False)
    assert len(snaps.after) == BATCHES
    np.savez(os.path.join(logdir, f"weights_{mode}.npz"), *(model.get_weights() + plain.get_weights()))
print("OK")
