"""GradientLogger on a gallery of real custom train_steps (tests/gallery_*.py), in graph and eager mode (XLA too
for the steps with several tapes).

For every case, two fit()s of 4 batches from the same seed, one with GradientLogger:
(a) training is bitwise what it is without GradientLogger, batch by batch (XLA: the same math, docs/FIT.md);
(b) every batch's records are at the step at which Keras' own `TensorBoard(update_freq=1)`, in the same
    fit(), writes that batch's `batch_*` scalars (both read back through TensorBoard's readers);
(c) each target's records (its loss, layer-output gradients and, with weights=True, the gradients of the
    weights its tape was asked for, and no other weight) equal the case's independent reproduction of that
    tape (its own `tf.GradientTape` on the weights saved around the batch, on the same batch).
"""

from __future__ import annotations

import warnings
from typing import Dict, List

import numpy as np
import pytest
import tb_reading
from fit_helpers import MAX, TF_KERAS, assert_close, bounded, one, read_series, stat
from gallery_body import BODY_CASES
from gallery_calls import CALL_CASES, CYCLEGAN_CASE, SIMCLR_CASE
from gallery_gan import GAN_CASE, WGAN_CASE
from gallery_single import SINGLE_CASES
from gallery_steps import BATCHES, Case, Snapshots, batches, keras, path_length
from tolerances import assert_same_float32_math

import tb_layergrad

CASES = [GAN_CASE, WGAN_CASE, *SINGLE_CASES, *BODY_CASES, *CALL_CASES]
# Under XLA (its compile time adds ~10 s a case here): the steps with several tapes or gradient calls, the novel
# part; a one-tape step is the standard step's case (tests/keras/test_fit_neutral.py).
XLA_CASES = [GAN_CASE, WGAN_CASE, CYCLEGAN_CASE, SIMCLR_CASE]
PARAMS = [(c, m) for c in CASES for m in ("graph", "eager")] + [(c, "xla") for c in XLA_CASES]
# weights=True in graph mode: the weight records' second backward pass changes how grappler rewrites the update of
# a LayerNormalization + Dense block (its last bits); the step's own gradients, recorded as they are, will not.
KNOWN = {
    ("captions", "graph"): pytest.mark.xfail(
        strict=False,
        raises=AssertionError,
        reason="weights=True's second backward pass changes a LayerNormalization step's update in graph mode",
    )
}
PARAMS = [pytest.param(c, m, marks=KNOWN.get((c.name, m), ()), id=f"{c.name}-{m}") for c, m in PARAMS]
pytestmark = pytest.mark.timeout(600)


def target_names(labels: List[str]) -> List[str]:
    """The target each reproduced tape is logged under (docs/FIT.md, "Custom `train_step`: what is logged"): its
    label (the sub-model whose weights it asks for, or "loss" for all of the model's), "#k" for the k-th tape
    of a label in one step."""
    seen: Dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out


def _fit(case: Case, mode: str, log_dir: str, logged: bool):
    model = case.build()
    model.run_eagerly = mode == "eager"
    model.jit_compile = mode == "xla"
    snapshots = Snapshots()
    callbacks = [snapshots, keras.callbacks.TensorBoard(log_dir, update_freq=1)]
    if logged:
        callbacks.append(
            tb_layergrad.GradientLogger(log_dir, update_freq=1, weights=True, max_elements=MAX, **case.logger_kwargs)
        )
    arrays = case.data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            **case.fit_kwargs(arrays),
            batch_size=len(batches(arrays)[0][0]),
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
    outside = [str(w.message) for w in caught if "outside its GradientTape" in str(w.message)]
    return model, snapshots, arrays, outside


def _check_tape(series, target: str, step: int, tape, length: int) -> None:
    """The records of `target` at `step` are the reproduced tape's numbers."""
    infos = {(info.source, info.layer): info for info, _ in series.values() if info.target == target}
    assert infos, f"no records for target {target!r} (targets: {sorted({i.target for i, _ in series.values()})})"
    loss = [layer for source, layer in infos if source == "target"]
    assert len(loss) == 1, loss
    assert_close(stat(one(series, f"{target}/target/{loss[0]}/stats", step), "mean"), tape.loss, "loss", length)
    logged = {layer for source, layer in infos if source == "output"}
    assert logged == set(tape.outputs), f"{target}: logged {sorted(logged)}, reproduced {sorted(tape.outputs)}"
    for path in sorted(logged):
        no_gradient = stat(one(series, f"{target}/output/{path}/stats", step), "no_gradient")
        assert no_gradient == (tape.outputs[path] is None), f"{target} {path} at step {step}: no_gradient"
        if tape.outputs[path] is None:  # the loss does not depend on it (e.g. the penalty's critic output)
            continue
        got = one(series, f"{target}/output/{path}/tensor", step)
        assert_close(got, bounded(tape.outputs[path], MAX), f"{target} {path} at step {step}", length)
    weights = {layer for source, layer in infos if source == "weight"}
    assert weights == set(tape.weights), f"{target}: weights {sorted(weights)}, asked {sorted(tape.weights)}"
    for path in sorted(weights):
        got = one(series, f"{target}/weight/{path}/tensor", step)
        assert_close(got, bounded(tape.weights[path], MAX), f"{target} weight {path} at step {step}", length)


@pytest.mark.parametrize("case, mode", PARAMS)
@pytest.mark.slow
def test_gallery_step(tmp_path, case: Case, mode: str):
    if TF_KERAS and case.keras3_only:
        pytest.skip(case.keras3_only)
    plain, plain_snaps, _, _ = _fit(case, mode, str(tmp_path / "plain"), logged=False)
    model, snaps, arrays, outside = _fit(case, mode, str(tmp_path / "logged"), logged=True)

    # (a) bitwise the same training, batch by batch; under XLA the same math (docs/FIT.md): the first batch's
    # update within its rounding bound, and every batch bitwise where the first one was
    assert sorted(snaps.after) == list(range(1, BATCHES + 1))
    first = zip(plain_snaps.after[1], snaps.after[1])
    if mode == "xla" and not all(np.array_equal(a, b) for a, b in first):
        length = path_length(model, batches(arrays)[0])
        for a, b in zip(plain_snaps.after[1], snaps.after[1]):
            assert_same_float32_math(b, a, length, f"{case.name}: weights after batch 1 (XLA)")
    else:
        for step in snaps.after:
            for a, b in zip(plain_snaps.after[step], snaps.after[step]):
                np.testing.assert_array_equal(a, b, err_msg=f"{case.name}: weights after batch {step}")

    # (b) at Keras' TensorBoard steps: the count of batches trained
    steps = list(range(1, BATCHES + 1))
    scalars = tb_reading.scalars(str(tmp_path / "logged"))["train"]
    keras_steps = sorted({s for tag, points in scalars.items() if tag.startswith("batch_") for s in points})
    if keras_steps != [0]:  # Keras 3.3's TensorBoard writes every batch_* scalar at step 0 (its count never moves)
        assert keras_steps == steps, scalars.keys()
    series = read_series(str(tmp_path / "logged"))
    for info, by_step in series.values():
        assert sorted(by_step) == steps, f"{info.target}/{info.source}/{info.layer}/{info.kind}"

    # Outputs of trainable layers that the step computed before any of its tapes (the guide's GAN's generated
    # samples) are named in one warning (raised at each trace; Python's default filter shows it once); nothing
    # else is (not the Distiller's frozen teacher: nothing of it trains).
    if case.outside:
        assert outside and set(outside) == {outside[0]} and f"outputs of {case.outside}, " in outside[0], outside
    else:
        assert outside == []

    # (c) each tape's numbers
    for step, batch in zip(steps, batches(arrays)):
        tapes = case.reproduce(model, snaps.before[step], snaps.after[step], batch)
        length = path_length(model, batch)
        for target, (_, tape) in zip(target_names([label for label, _ in tapes]), tapes):
            if target is not None:
                _check_tape(series, target, step, tape, length)
