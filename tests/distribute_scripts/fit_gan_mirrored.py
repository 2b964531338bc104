"""The guide's GAN (tests/custom_steps.py) trained by fit() under MirroredStrategy (2 logical CPUs) with GradientLogger.

Usage: fit_gan_mirrored.py LOGDIR MODES. For each mode (graph, eager): LOGDIR/<mode>/train holds the logger's
records (weights=True, whole tensors); LOGDIR/expected_<mode>.npz the independent reproduction of both tapes of
every batch: each replica's own tapes on its half of the global batch (`strategy.run` of a hand-written forward
pass, with `tape.watch` on every layer output), on the weights saved around the batch, merged by
`tb_layergrad.distribute.merge` (the package's one rule for several replicas). LOGDIR/weights_<mode>.npz: the
final weights with the logger and without (must be bitwise equal).
"""

import json
import os
import sys

from common import logical_cpus  # noqa: E402

logdir = sys.argv[1]
modes = sys.argv[2].split(",")
devices = logical_cpus(2)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the gallery's GAN

import custom_steps as cs  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from gallery_steps import Snapshots, mixed, with_weights  # noqa: E402

import tb_layergrad  # noqa: E402
from tb_layergrad import metadata  # noqa: E402
from tb_layergrad.capturing.gradient_map import Entry  # noqa: E402

LR, GLOBAL_BATCH, STEPS = 0.05, 8, 2
x = cs.data(GLOBAL_BATCH * STEPS)
strategy = tf.distribute.MirroredStrategy(devices)


class GAN(cs.GAN):
    """The guide's GAN; its `call` takes a batch of the data, as fit() under a strategy calls it with one."""

    def call(self, real):
        return self.discriminator(real)


def fit(mode, logged):
    with strategy.scope():
        model = cs.gan(GAN, LR, run_eagerly=mode == "eager")
    snaps = Snapshots()
    callbacks = [snaps]
    if logged:
        run = os.path.join(logdir, mode)
        callbacks.append(tb_layergrad.GradientLogger(run, weights=True, max_elements=10_000))
    model.fit(x, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return model, snaps


def _short(v):
    return v.name.split("/")[-1].split(":")[0]


def _watched(tape, outputs, path, tensor):
    tape.watch(tensor)
    outputs[path] = tensor
    return tensor


def _run(tape, outputs, prefix, sub, h):
    """`sub` (a Sequential) layer by layer, each output watched under its path; the sub-model's output too."""
    for layer in sub.layers:
        h = _watched(tape, outputs, f"{prefix}/{layer.name}", layer(h))
    outputs[prefix] = h
    return h


def _gradient_map(model, tape, loss, outputs, variables, target):
    """A GradientMap of one replica's tape: its output and weight gradients, the loss as its target value."""
    grads, g_vars = tape.gradient(loss, (outputs, variables))
    entries = {p: Entry(g, metadata.SOURCE_OUTPUT, i) for i, (p, g) in enumerate(grads.items())}
    owner = {
        id(v): f"{model.name}/{sub.name}/{layer.name}"
        for sub in model.layers
        for layer in sub.layers
        for v in layer.trainable_weights
    }
    for v, g in zip(variables, g_vars):
        entries[f"{owner[id(v)]}/{_short(v)}"] = Entry(g, metadata.SOURCE_WEIGHT, len(entries))
    return tb_layergrad.GradientMap(entries, target, target_value=loss)


def _tapes(model, batch, weights_d, weights_g):
    """Both tapes of one batch, each replica on its half, merged."""
    halves = np.split(batch, strategy.num_replicas_in_sync)
    shard = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(halves[ctx.replica_id_in_sync_group])
    )
    d, g, name = model.discriminator, model.generator, model.name

    def discriminator_tape(real):
        z = cs.latent(real)
        combined = tf.concat([g(z), real], axis=0)  # the generator runs before the tape, as in the step
        labels = tf.concat([tf.ones((tf.shape(real)[0], 1)), tf.zeros((tf.shape(real)[0], 1))], axis=0)
        outputs = {}
        with tf.GradientTape() as tape:
            loss = model.loss_fn(labels, _run(tape, outputs, f"{name}/discriminator", d, combined))
        return _gradient_map(model, tape, loss, outputs, d.trainable_weights, "discriminator")

    def generator_tape(real):
        z = cs.latent(real)
        outputs = {}
        with tf.GradientTape() as tape:
            fake = _run(tape, outputs, f"{name}/generator", g, z)
            pred = _run(tape, outputs, f"{name}/discriminator", d, fake)
            loss = model.loss_fn(tf.zeros((tf.shape(real)[0], 1)), pred)
        return _gradient_map(model, tape, loss, outputs, g.trainable_weights, "generator")

    merged = {}
    for fn, weights in ((discriminator_tape, weights_d), (generator_tape, weights_g)):
        with with_weights(model, weights):
            gmap = tb_layergrad.distribute.merge(strategy.run(fn, args=(shard,)), strategy)
        merged[gmap.target] = gmap
    return merged


def replicas_agree(model) -> bool:
    """Do the replicas hold the same weights (MirroredVariables kept in sync by the optimizer's all-reduce)?"""
    for v in model.weights:
        values = [np.asarray(r) for r in strategy.experimental_local_results(getattr(v, "value", v))]
        if any(not np.array_equal(values[0], r) for r in values[1:]):
            return False
    return True


for mode in modes:
    model, snaps = fit(mode, logged=True)
    with open(os.path.join(logdir, f"replicas_agree_{mode}.json"), "w") as f:
        json.dump(replicas_agree(model), f)
    expected = {}
    for step in range(1, STEPS + 1):
        batch = x[(step - 1) * GLOBAL_BATCH : step * GLOBAL_BATCH]
        # the generator's tape sees the discriminator after its update, the generator before its own
        late = mixed(model, snaps.before[step], snaps.after[step], model.discriminator)
        for target, gmap in _tapes(model, batch, snaps.before[step], late).items():
            expected[f"{step}|{target}|target|loss"] = np.asarray(gmap.target_value)
            for path in gmap:
                expected[f"{step}|{target}|{gmap.entry(path).source}|{path}"] = np.asarray(gmap[path])
    np.savez(os.path.join(logdir, f"expected_{mode}.npz"), **expected)
    plain, _ = fit(mode, logged=False)
    np.savez(os.path.join(logdir, f"weights_{mode}.npz"), *(model.get_weights() + plain.get_weights()))
print("OK")
