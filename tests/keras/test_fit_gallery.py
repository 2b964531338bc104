"""GradientLogger on a gallery of real custom train_steps (tests/gallery_*.py), in graph and eager mode (not under
XLA: tests/keras/conftest.py says where what XLA compiles in these steps is crossed).

For every case, two fit()s of 4 batches from the same seed, one with GradientLogger:
(a) training is bitwise what it is without GradientLogger, batch by batch;
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

import tb_layergrad

# The cases and the modes each runs in (`gallery_case`, `gallery_mode`) are parametrized by tests/keras/conftest.py.
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


def _fit(gallery_steps, case, mode: str, log_dir: str, logged: bool, max_elements: int):
    model = case.build()
    model.run_eagerly = mode == "eager"
    snapshots = gallery_steps.Snapshots()
    callbacks = [snapshots, gallery_steps.keras.callbacks.TensorBoard(log_dir, update_freq=1)]
    if logged:
        callbacks.append(
            tb_layergrad.GradientLogger(
                log_dir, update_freq=1, weights=True, max_elements=max_elements, **case.logger_kwargs
            )
        )
    arrays = case.data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            **case.fit_kwargs(arrays),
            batch_size=len(gallery_steps.batches(arrays)[0][0]),
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
    outside = [str(w.message) for w in caught if "outside its GradientTape" in str(w.message)]
    return model, snapshots, arrays, outside


def _check_tape(fit_helpers, series, target: str, step: int, tape, length: int) -> None:
    """The records of `target` at `step` are the reproduced tape's numbers."""
    one, stat, assert_close, bounded = fit_helpers.one, fit_helpers.stat, fit_helpers.assert_close, fit_helpers.bounded
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
        assert_close(got, bounded(tape.outputs[path], fit_helpers.MAX), f"{target} {path} at step {step}", length)
    weights = {layer for source, layer in infos if source == "weight"}
    assert weights == set(tape.weights), f"{target}: weights {sorted(weights)}, asked {sorted(tape.weights)}"
    for path in sorted(weights):
        got = one(series, f"{target}/weight/{path}/tensor", step)
        assert_close(
            got, bounded(tape.weights[path], fit_helpers.MAX), f"{target} weight {path} at step {step}", length
        )


@pytest.mark.slow
def test_gallery_step(tmp_path, gallery_case, gallery_mode, gallery_steps, fit_helpers, tb_reading):
    case, mode = gallery_case, gallery_mode
    if fit_helpers.TF_KERAS and case.keras3_only:
        pytest.skip(case.keras3_only)
    batches, path_length = gallery_steps.batches, gallery_steps.path_length
    plain, plain_snaps, _, _ = _fit(gallery_steps, case, mode, str(tmp_path / "plain"), False, fit_helpers.MAX)
    model, snaps, arrays, outside = _fit(gallery_steps, case, mode, str(tmp_path / "logged"), True, fit_helpers.MAX)

    # (a) bitwise the same training, batch by batch
    assert sorted(snaps.after) == list(range(1, gallery_steps.BATCHES + 1))
    for step in snaps.after:
        for a, b in zip(plain_snaps.after[step], snaps.after[step]):
            np.testing.assert_array_equal(a, b, err_msg=f"{case.name}: weights after batch {step}")

    # (b) at Keras' TensorBoard steps: the count of batches trained
    steps = list(range(1, gallery_steps.BATCHES + 1))
    scalars = tb_reading.scalars(str(tmp_path / "logged"))["train"]
    keras_steps = sorted({s for tag, points in scalars.items() if tag.startswith("batch_") for s in points})
    if keras_steps != [0]:  # Keras 3.3's TensorBoard writes every batch_* scalar at step 0 (its count never moves)
        assert keras_steps == steps, scalars.keys()
    series = fit_helpers.read_series(str(tmp_path / "logged"))
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
                _check_tape(fit_helpers, series, target, step, tape, length)
