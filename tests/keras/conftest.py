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
