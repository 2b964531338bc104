"""The keras room's helpers: the gallery of custom train steps and the guide's steps, as fixtures; the ways fit()
runs a step, one test each."""

import importlib

import fit_helpers
import pytest


@pytest.fixture(params=fit_helpers.MODES)
def fit_mode(request) -> str:
    """Each way fit() runs a train step (`fit_helpers.MODES`: eager, graph, XLA; `fit_helpers.compile_kwargs`),
    one test per mode."""
    return request.param


def pytest_generate_tests(metafunc):
    """A test naming `gallery_case` and `gallery_mode` runs once per case of the gallery and mode fit() runs it in:
    graph and eager. Not under XLA (its compile time is most of a case's): what XLA compiles unlike graph mode in a
    gallery step (several tapes, a nested penalty tape, a persistent tape asked four times and applied by several
    optimizers, sub-models built by the first step) is crossed under XLA on the newest and the oldest releases
    (Keras 3 and tf_keras) by the generated steps (test_fit_generated_steps: its pairwise covering puts a
    persistent tape asked four times and a nested penalty tape under XLA, each in some example) and by
    test_fit_calls' persistent tape asked four ways; a one-tape step by the standard step's case (test_fit_neutral). Ids `<case>-<mode>`."""
    if "gallery_case" not in metafunc.fixturenames:
        return
    gan, single, body, calls = (
        importlib.import_module(name) for name in ("gallery_gan", "gallery_single", "gallery_body", "gallery_calls")
    )
    cases = [gan.GAN_CASE, gan.WGAN_CASE, *single.SINGLE_CASES, *body.BODY_CASES, *calls.CALL_CASES]
    params = [(c, m) for c in cases for m in ("graph", "eager")]
    metafunc.parametrize("gallery_case, gallery_mode", [pytest.param(c, m, id=f"{c.name}-{m}") for c, m in params])


@pytest.fixture(scope="session")
def custom_steps():
    """tests/custom_steps.py, as a namespace: custom `train_step`s as Keras' guide and keras-io write them, small
    and deterministic (no random latent)."""
    return importlib.import_module("custom_steps")


@pytest.fixture(scope="session")
def gallery_body():
    """tests/gallery_body.py, as a namespace: the gallery's one-loss steps on one body: gradient accumulation over k
    batches, `add_loss`, `sample_weight` / `class_weight` through `compute_loss`, and Keras 3's `compute_loss` +
    `optimizer.apply` (see gallery_steps.py)."""
    return importlib.import_module("gallery_body")


@pytest.fixture(scope="session")
def gallery_calls():
    """tests/gallery_calls.py, as a namespace: the gallery's steps with several `gradient()` calls that the other
    cases do not hold (see gallery_steps.py)."""
    return importlib.import_module("gallery_calls")


@pytest.fixture(scope="session")
def gallery_gan():
    """tests/gallery_gan.py, as a namespace: the gallery's adversarial steps: the guide's GAN and WGAN-GP (see
    gallery_steps.py for the conventions)."""
    return importlib.import_module("gallery_gan")


@pytest.fixture(scope="session")
def gallery_single():
    """tests/gallery_single.py, as a namespace: the gallery's one-loss steps on several sub-models: VAE, Distiller,
    two-view contrastive (see gallery_steps.py)."""
    return importlib.import_module("gallery_single")


@pytest.fixture(scope="session")
def gallery_steps():
    """tests/gallery_steps.py, as a namespace: a gallery of custom `train_step`s as users write them, each with an
    independent reproduction of its tapes."""
    return importlib.import_module("gallery_steps")
