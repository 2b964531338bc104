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
the casts of the input and of each variable to float16 (those of δ to float32 where the norm is taken are
exact), and one per elementwise op (tanh, its derivative, the loss's difference; the scaling by S, a power of
two, is exact). The norm itself (a float32 sum of at most `terms` squares or products) and the float32
reference add gamma over those lengths at u = 2**-24. A norm of a vector whose every element errs by at
most r (relative) errs by at most r, so

    rtol = gamma(L + elementwise, float16) + gamma(L + terms, float32)

(`_rtol`; each model's counts beside it in `SPECS`: an MLP, and Embedding -> LayerNormalization -> Dense per
token).

"Relative to the magnitudes combined" equals relative to the value where the terms do not cancel: the data
have targets above the predictions, so every δ of the loss has one sign (asserted); what can still cancel is a
sum through weights of both signs, of a few terms each here: the assumption this bound rests on. The noise
scale's tolerances follow from that rtol (`per_example_reference.noise_scale_tolerance`).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, NamedTuple, Tuple

import numpy as np
import pytest
import tensorflow as tf

import tb_layergrad
from tb_layergrad import metadata

keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1, Keras 3 otherwise: the tests run on both
layers = keras.layers

NOISE = metadata.NOISE_SCALE_TAGS  # the noise scale's scalar tags (docs/FORMAT.md)


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
        [
            keras.Input((6,)),
            layers.Dense(8, activation="tanh", name="h"),
            layers.Dense(3, name="out"),
            layers.Activation("linear", dtype="float32", name="f32"),
        ],
        name="mpmlp",
    )


def _tokens() -> keras.Model:
    """Embedding -> LayerNormalization -> Dense per token -> mean over the tokens -> Dense, float32 output."""
    inp = keras.Input((T,), dtype="int32")
    h = layers.LayerNormalization(name="ln")(layers.Embedding(9, 5, name="emb")(inp))
    h = layers.GlobalAveragePooling1D(name="pool")(layers.Dense(4, activation="tanh", name="tok")(h))
    out = layers.Activation("linear", dtype="float32", name="f32")(layers.Dense(3, name="out")(h))
    return keras.Model(inp, out, name="mptok")


T = 6  # tokens per example (`_tokens`)
B = 10  # examples: one batch, one step


class Spec(NamedTuple):
    """A model, its inputs, and what its float16 path adds to `fit_helpers.path_length` (module docstring)."""

    build: Callable[[], keras.Model]
    inputs: Callable[[np.random.RandomState], np.ndarray]
    other: int  # reductions path_length does not count
    elementwise: int  # roundings outside sums
    norm_terms: int  # terms of the widest float32 sum forming a norm (beyond the variables' sizes)


SPECS = {
    # elementwise: the casts to float16 of x and of the 4 variables (5); the forward's 2 bias additions and
    # tanh (3); the float32 output's gradient cast back to float16 (1); the loss's y_pred - y and its factor
    # 2 / (B·3) (2); tanh' = 1 - h² and its product with δ (3).
    "mlp": Spec(
        _mlp,
        lambda rng: rng.normal(size=(B, 6)).astype("float32"),
        other=0,
        elementwise=5 + 3 + 1 + 2 + 3,
        norm_terms=0,
    ),
    # other: the weight gradients sum over B·T positions (path_length counts B: the ids have no feature axis);
    # the mean over T tokens, forward and backward (2T); LayerNormalization's mean and variance over 5
    # features, forward and backward (4·5). elementwise: the casts to float16 of the looked-up rows and of the
    # 6 other variables (7); LayerNormalization's x - μ, its square, + ε, rsqrt, the product, ·γ, +β, forward
    # and backward (14); the Dense layers' 2 bias additions and tanh, tanh' = 1 - h² and its product (6); the
    # mean's 1/T, forward and backward (2); the output's gradient cast (1); the loss's 2 (2). norm_terms: the
    # embedding's per-example norm sums T² products ("same id" Gram, tests/capturing/test_per_example.py).
    "tokens": Spec(
        _tokens,
        lambda rng: rng.randint(0, 9, size=(B, T)).astype("int32"),
        other=B * T + 2 * T + 4 * 5,
        elementwise=7 + 14 + 6 + 2 + 1 + 2,
        norm_terms=T * T,
    ),
}


def _float32_twin(spec: Spec, model: keras.Model) -> keras.Model:
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        twin = spec.build()
    finally:
        keras.mixed_precision.set_global_policy(policy)
    twin.set_weights(model.get_weights())
    return twin


def _data(spec: Spec, twin: keras.Model, above: float) -> Tuple[np.ndarray, np.ndarray]:
    """Targets above the predictions (the loss's δ has one sign) by `above` plus up to about 1.5. The step's
    scaled gradients are about S · (2/3) · that: below float16's largest value (65504) for `above` = 0.2, past
    it (in the output bias's batch sum) for `above` = 4, where Keras skips the update."""
    rng = np.random.RandomState(5)
    x = spec.inputs(rng)
    return x, (twin(x).numpy() + above + np.abs(rng.normal(scale=0.5, size=(B, 3)))).astype("float32")


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


def _logged_step(
    fit_helpers, per_example_reference, tb_reading, tolerances, logdir: str, spec: Spec, mode: str, above: float
) -> Step:
    keras.utils.set_random_seed(7)
    model = spec.build()
    twin = _float32_twin(spec, model)  # the weights the first (and only) step sees
    x, y = _data(spec, twin, above)
    assert np.all(twin(x).numpy() < y), "the loss's δ must have one sign (see the module docstring)"
    weights = per_example_reference.per_example_gradients(twin, _loss, x, y)
    noise = per_example_reference.noise_scale(weights, per_example_reference.batch_gradients(twin, _loss, x, y))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", **fit_helpers.compile_kwargs(mode))
    assert "LossScaleOptimizer" in type(model.optimizer).__name__
    before = model.get_weights()
    model.fit(
        x,
        y,
        batch_size=len(x),
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[tb_layergrad.GradientLogger(logdir, weights=True, per_example=True)],
    )
    return Step(
        tb_reading.examples(logdir)["train"],
        tb_reading.scalars(logdir)["train"],
        per_example_reference.output_norms(twin, _loss, x, y),
        weights,
        noise,
        _rtol(fit_helpers, tolerances, spec, twin, x),
        before,
        model.get_weights(),
    )


def _assert_rows(per_example_reference, step: Step, label: str) -> None:
    assert set(step.found) == {("loss", "output"), ("loss", "weight")}
    for (_, source), by_step in step.found.items():
        assert sorted(by_step) == [1]
        want = step.outputs if source == "output" else per_example_reference.norms(step.weights)
        assert set(by_step[1]) == set(want)
        for layer, row in by_step[1].items():
            per_example_reference.assert_row(row, want[layer], step.rtol, f"{label} {layer}")


def _rtol(fit_helpers, tolerances, spec: Spec, twin: keras.Model, x: np.ndarray) -> float:
    length = fit_helpers.path_length(twin, x, target_terms=B * 3) + spec.other
    terms = max(int(np.prod(v.shape)) for v in twin.trainable_variables) + spec.norm_terms
    return tolerances.chain_rtol(np.float16, [length + spec.elementwise]) + tolerances.chain_rtol(
        np.float32, [length + terms]
    )


@pytest.mark.parametrize("mode", ["graph", "xla", "eager"])
@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.slow
def test_norms_and_noise_scale_are_unscaled_and_equal_float32_tapes(
    tmp_path, mixed_float16, kind, mode, fit_helpers, per_example_reference, tb_reading, tolerances
):
    step = _logged_step(
        fit_helpers, per_example_reference, tb_reading, tolerances, str(tmp_path), SPECS[kind], mode, above=0.2
    )
    assert step.rtol < 0.2, step.rtol  # float16's bound on these short paths; 2**15 (a forgotten scale) is far beyond
    assert not all(np.array_equal(a, b) for a, b in zip(step.before, step.after))  # Keras applied the step
    _assert_rows(per_example_reference, step, mode)
    tol = per_example_reference.noise_scale_tolerance(step.noise, step.rtol)
    # B_simple's relative tolerance sums trace's and signal's: about 0.3 (MLP) and 0.8 (tokens); below 1 the check
    # still tells its order of magnitude (a loss scale left in the norms but not in G_B would be 2**30 off).
    assert step.noise["signal"] > 0 and tol["b_simple"] < 1, tol
    scalars = step.scalars
    np.testing.assert_allclose(scalars[NOISE["trace"]][1], step.noise["trace"], rtol=0, atol=tol["trace"])
    np.testing.assert_allclose(scalars[NOISE["signal"]][1], step.noise["signal"], rtol=0, atol=tol["signal"])
    np.testing.assert_allclose(scalars[NOISE["noise_scale"]][1], step.noise["b_simple"], rtol=tol["b_simple"])
    assert scalars[NOISE["coverage"]][1] == 1.0


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.slow
def test_an_overflowing_step_keeps_its_rows_and_writes_no_noise_scale(
    tmp_path, mixed_float16, mode, fit_helpers, per_example_reference, tb_reading, tolerances
):
    """The batch sum of a scaled gradient overflows float16 where no example's part does: Keras skips the update;
    each example's norm (taken in float32 from its own float16 δ) is finite and right; |G_B|² is not finite, so
    no trace, signal or B_simple is written, only the coverage."""
    step = _logged_step(
        fit_helpers, per_example_reference, tb_reading, tolerances, str(tmp_path), SPECS["mlp"], mode, above=4.0
    )
    for a, b in zip(step.before, step.after):
        np.testing.assert_array_equal(a, b)  # the step overflowed: Keras did not apply it
    _assert_rows(per_example_reference, step, mode)
    assert set(step.scalars) == {NOISE["coverage"]} and step.scalars[NOISE["coverage"]][1] == 1.0
