"""`GradientLogger(per_example=True)` under `mixed_float16`: the written per-example norms and the noise scale are
those of the unscaled loss, equal to an independent float32 computation within float16's bound.

The step under test runs Keras' own `fit()` with the optimizer Keras wraps in a loss-scaling optimizer (Keras 3
and tf_keras alike): its loss is multiplied by the loss scale S (2**15 at the first step) before the backward
pass, so every δ and every norm the capture forms carries S, and the records must divide it out. A forgotten S
is off by 2**15; a norm squared in float16 would overflow (a scaled δ of 2**8 squares past 65504), one taken
from an underflowed δ would be 0: each is far outside the tolerance below.

The reference: a float32 twin of the model with the same weights, one tape per example on its own loss (a batch
of one) and one tape on the batch for G_B (tests/per_example_reference.py).

Tolerance (derived, not tuned). tests/tolerances.py: a chain of reductions of total length L, in any order,
errs by at most gamma(L) = L u / (1 - L u) relative to its terms' magnitudes combined, u the unit roundoff of
the dtype the sums are carried in. The logged step carries its forward and backward pass in float16
(u = 2**-11): L = the path's reduction length (`fit_helpers.path_length`: the input positions, the loss's
B x 3 terms, each kernel's forward and backward contraction), plus the roundings outside sums on the path:
the casts of the input and of each kernel to float16 and of each δ to float32 where the norm is taken (exact),
and one per elementwise op (tanh, its derivative, the loss's difference and square, the scaling by S, which is
a power of two: exact). The norm itself (squares summed in float32 over the features) and the float32
reference add gamma over the same lengths at u = 2**-24. A norm of a vector whose every element errs by at
most r (relative) errs by at most r, so

    rtol = gamma(L + elementwise, float16) + gamma(L + features, float32).

"Relative to the magnitudes combined" equals relative to the value where the terms do not cancel: the data
have targets offset from the predictions (every δ of the loss has one sign) and the test asserts it. The noise
scale's tolerances follow from that rtol (`per_example_reference.noise_scale_tolerance`).
"""
from __future__ import annotations

from typing import Dict, Iterator, List, NamedTuple, Tuple

import numpy as np
import pytest

import per_example_reference as ref
import tb_layergrad
import tb_reading
from fit_helpers import compile_kwargs, keras, layers, path_length
from tb_layergrad.summary import per_example_write as pw
from tolerances import chain_rtol

NAME = "mpmlp"
# Roundings outside sums on a path of this model (a float16 -> float32 cast and a product by S, a power of two,
# are exact): the casts to float16 of x and of the 4 variables (5); the forward's 2 bias additions and tanh (3);
# the float32 output's gradient cast back to float16 (1); the loss's y_pred - y and its factor 2 / (B·3) (2);
# tanh' = 1 - h² and its product with δ (3).
ELEMENTWISE = 5 + 3 + 1 + 2 + 3


@pytest.fixture
def mixed_float16() -> Iterator[None]:
    """The global policy mixed_float16 for the test, and back to what it was, whatever happens."""
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(before)


def _loss(y, pred):
    import tensorflow as tf

    return tf.reduce_mean(tf.square(pred - y))  # Keras' "mse" with its batch mean


def _mlp() -> keras.Model:
    """Dense layers in the global policy's dtype, then a float32 output (Keras' mixed-precision guide)."""
    return keras.Sequential(
        [keras.Input((6,)), layers.Dense(8, activation="tanh", name="h"), layers.Dense(3, name="out"),
         layers.Activation("linear", dtype="float32", name="f32")],
        name=NAME,
    )


def _float32_twin(model: keras.Model) -> keras.Model:
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        twin = _mlp()
    finally:
        keras.mixed_precision.set_global_policy(policy)
    twin.set_weights(model.get_weights())
    return twin


def _data(twin: keras.Model, above: float, n: int = 10) -> Tuple[np.ndarray, np.ndarray]:
    """Targets above the predictions (the loss's δ has one sign) by `above` plus up to about 1.5. The step's
    scaled gradients are about S · (2/3) · that: below float16's largest value (65504) for `above` = 0.2, past
    it (in the output bias's batch sum) for `above` = 4, where Keras skips the update."""
    rng = np.random.RandomState(5)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (twin(x).numpy() + above + np.abs(rng.normal(scale=0.5, size=(n, 3)))).astype("float32")


class Step(NamedTuple):
    """One logged fit() step under mixed_float16 and its float32 reference."""

    found: Dict  # (target, source) -> {step: {layer: row}}, the `examples` records read back
    scalars: Dict[str, Dict[int, float]]
    outputs: Dict[str, np.ndarray]  # layer path -> [B] reference norms
    weights: Dict[str, List[np.ndarray]]  # variable path -> per-example reference gradients
    noise: Dict[str, float]
    rtol: float
    before: List[np.ndarray]  # the weights before the step
    after: List[np.ndarray]


def _logged_step(logdir: str, mode: str, above: float) -> Step:
    keras.utils.set_random_seed(7)
    model = _mlp()
    twin = _float32_twin(model)  # the weights the first (and only) step sees
    x, y = _data(twin, above)
    assert np.all(twin(x).numpy() < y), "the loss's δ must have one sign (see the module docstring)"
    weights = ref.per_example_gradients(twin, _loss, x, y)
    noise = ref.noise_scale(weights, ref.batch_gradients(twin, _loss, x, y))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", **compile_kwargs(mode))
    assert "LossScaleOptimizer" in type(model.optimizer).__name__
    before = model.get_weights()
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0,
              callbacks=[tb_layergrad.GradientLogger(logdir, weights=True, per_example=True)])
    return Step(tb_reading.examples(logdir)["train"], tb_reading.scalars(logdir)["train"],
                ref.output_norms(twin, _loss, x, y), weights, noise, _rtol(twin, x), before, model.get_weights())


def _assert_rows(step: Step, label: str) -> None:
    assert set(step.found) == {("loss", "output"), ("loss", "weight")}
    for (_, source), by_step in step.found.items():
        assert sorted(by_step) == [1]
        want = step.outputs if source == "output" else ref.norms(step.weights)
        assert set(by_step[1]) == set(want)
        for layer, row in by_step[1].items():
            ref.assert_row(row, want[layer], step.rtol, f"{label} {layer}")


def _rtol(twin: keras.Model, x: np.ndarray) -> float:
    length = path_length(twin, x, target_terms=x.shape[0] * 3)
    features = max(int(np.prod(v.shape)) for v in twin.trainable_variables)
    return chain_rtol(np.float16, [length + ELEMENTWISE]) + chain_rtol(np.float32, [length + features])


@pytest.mark.parametrize("mode", ["graph", "xla", "eager"])
def test_norms_and_noise_scale_are_unscaled_and_equal_float32_tapes(tmp_path, mixed_float16, mode):
    step = _logged_step(str(tmp_path), mode, above=0.2)
    assert step.rtol < 0.05, step.rtol  # float16's bound on this short path; 2**15 (a forgotten scale) is far beyond
    assert not all(np.array_equal(a, b) for a, b in zip(step.before, step.after))  # Keras applied the step
    _assert_rows(step, mode)
    tol = ref.noise_scale_tolerance(step.noise, step.rtol)
    assert step.noise["signal"] > 0 and tol["b_simple"] < 0.5, tol  # the check below says something
    scalars = step.scalars
    np.testing.assert_allclose(scalars[pw.TRACE_TAG][1], step.noise["trace"], rtol=0, atol=tol["trace"])
    np.testing.assert_allclose(scalars[pw.SIGNAL_TAG][1], step.noise["signal"], rtol=0, atol=tol["signal"])
    np.testing.assert_allclose(scalars[pw.NOISE_SCALE_TAG][1], step.noise["b_simple"], rtol=tol["b_simple"])
    assert scalars[pw.COVERAGE_TAG][1] == 1.0


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_an_overflowing_step_keeps_its_rows_and_writes_no_noise_scale(tmp_path, mixed_float16, mode):
    """The batch sum of a scaled gradient overflows float16 where no example's part does: Keras skips the update;
    each example's norm (taken in float32 from its own float16 δ) is finite and right; |G_B|² is not finite, so
    no trace, signal or B_simple is written, only the coverage."""
    step = _logged_step(str(tmp_path), mode, above=4.0)
    for a, b in zip(step.before, step.after):
        np.testing.assert_array_equal(a, b)  # the step overflowed: Keras did not apply it
    _assert_rows(step, mode)
    assert set(step.scalars) == {pw.COVERAGE_TAG} and step.scalars[pw.COVERAGE_TAG][1] == 1.0
