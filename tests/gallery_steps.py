"""A gallery of custom `train_step`s as users write them, each with an independent reproduction of its tapes.

Each model follows the pattern of a Keras guide or keras.io example, shrunk to a few units:
the guide's GAN ("Customizing what happens in fit()": its own d/g optimizers, compile()
without one), WGAN-GP (n critic updates, each with an inner gradient-penalty tape, then
the generator), a VAE with its own loss trackers, a Distiller (teacher frozen, student
trained), a two-view contrastive step (SimSiam's symmetric loss), gradient accumulation
over k batches, `add_loss` regularization, `sample_weight` / `class_weight` through
`compute_loss`, and Keras 3's `compute_loss` + `optimizer.apply`.

What differs from the examples, and why: every random draw (latent vectors, the
gradient penalty's interpolation, the VAE's epsilon, the second view) comes with the
data instead of being drawn inside the step, so that a test can replay the step; no
dropout; SGD where the reproduction must replay an update made inside the step.

`Case.reproduce(model, before, after, batch)` recomputes, in eager mode with its own
`tf.GradientTape`s, every tape the step differentiates a loss with, from the weights
saved before the batch (`before`) and, where the step updates some weights before a
later tape reads them, the weights after the batch (`after`, e.g. the GAN's
discriminator as the generator's tape sees it). Each tape's layer outputs are watched
by hand, layer by layer (`Forward`), under the paths GradientLogger writes:
`root/sub_model/layer`, `#2` for a layer's second call in the same tape.
Everything goes through `tf.keras`: Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tolerances import reduction_path_length

keras = tf.keras
layers = keras.layers

BATCH = 8
BATCHES = 4
N = BATCH * BATCHES
FEATURES = 4
LATENT = 3
CRITIC_STEPS = 2  # WGAN-GP: critic updates per batch (the example's "discriminator_extra_steps")
GP_WEIGHT = 10.0
ACCUMULATE = 2  # gradient accumulation: the optimizer applies every 2nd batch
TEMPERATURE = 3.0
ALPHA = 0.3  # Distiller: weight of the student's own loss
ACTIVITY = 0.05  # add_loss: the activity penalty's factor
L2 = 0.01  # add_loss: the kernel regularizer's factor
CLASS_WEIGHT = {0: 0.5, 1: 2.0, 2: 1.0}


@dataclasses.dataclass
class Tape:
    """What one tape of the step differentiated, reproduced: d(loss)/d(layer outputs) and d(loss)/d(weights)."""

    loss: float
    outputs: Dict[str, Optional[np.ndarray]]  # by layer path ("root/sub/layer", "#2" for a second call)
    weights: Dict[str, np.ndarray]  # by "layer path/weight name", the weights this tape was asked for


@dataclasses.dataclass
class Case:
    name: str
    build: Callable[[], keras.Model]  # a compiled model, from a fixed seed
    data: Callable[[], Tuple[np.ndarray, ...]]  # N examples each; the batches are consecutive slices
    fit_kwargs: Callable[[Tuple[np.ndarray, ...]], dict]  # what fit() gets besides batch_size/epochs
    # (label, Tape) of each tape in the order the step runs them; label: the sub-model that owns the weights the
    # tape asks for, "loss" where it asks for all of the model's trainable weights
    reproduce: Callable[..., List[Tuple[str, Tape]]]
    keras3_only: Optional[str] = None  # why the pattern needs Keras 3 (skipped under tf_keras)
    outside: Optional[str] = None  # the sub-model whose outputs the step computes before any of its tapes
    logger_kwargs: dict = dataclasses.field(default_factory=dict)  # GradientLogger's arguments beyond the gallery's


# -- small building blocks ---------------------------------------------------------------------------------


def mlp(name: str, inputs: int, sizes: Sequence[int], activation: str = "tanh", last=None) -> keras.Sequential:
    stack = [keras.Input((inputs,))]
    for i, size in enumerate(sizes):
        act = last if i == len(sizes) - 1 else activation
        stack.append(layers.Dense(size, activation=act, name=f"{name[0]}{i}"))
    return keras.Sequential(stack, name=name)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def batches(arrays: Tuple[np.ndarray, ...]) -> List[Tuple[np.ndarray, ...]]:
    return [tuple(a[i * BATCH : (i + 1) * BATCH] for a in arrays) for i in range(len(arrays[0]) // BATCH)]


def dataset(arrays) -> dict:
    return {"x": tf.data.Dataset.from_tensor_slices(tuple(arrays)).batch(BATCH)}


def _short(v) -> str:
    return v.name.split("/")[-1].split(":")[0]


class Forward:
    """A forward pass by hand: each layer called in turn, its output watched on the tape, kept under its path."""

    def __init__(self, tape: tf.GradientTape) -> None:
        self.tape = tape
        self.outputs: Dict[str, tf.Tensor] = {}
        self.variables: Dict[str, tf.Variable] = {}
        self._calls: Dict[str, int] = {}

    def keep(self, path: str, tensor: tf.Tensor) -> tf.Tensor:
        n = self._calls[path] = self._calls.get(path, 0) + 1
        self.tape.watch(tensor)
        self.outputs[path if n == 1 else f"{path}#{n}"] = tensor
        return tensor

    def layer(self, layer, path: str, *args, **kwargs) -> tf.Tensor:
        for v in layer.trainable_weights:
            self.variables[f"{path}/{_short(v)}"] = v
        return self.keep(path, layer(*args, **kwargs))

    def sequential(self, model: keras.Sequential, x, prefix: str) -> tf.Tensor:
        h = x
        for layer in model.layers:
            h = self.layer(layer, f"{prefix}/{layer.name}", h)
        return self.keep(prefix, h)


def differentiate(tape, fwd: Forward, loss, variables, prefix_of: Dict[int, str]) -> Tape:
    """One tape.gradient for (the variables the step asks for, the watched outputs), as the step's own call."""
    g_vars, g_out = tape.gradient(loss, (list(variables), fwd.outputs))
    weights = {prefix_of[id(v)]: g.numpy() for v, g in zip(variables, g_vars)}
    outputs = {k: (None if g is None else g.numpy()) for k, g in g_out.items()}
    return Tape(float(loss), outputs, weights)


def weight_paths(model: keras.Model, subs: Dict[str, keras.Model]) -> Dict[int, str]:
    """{id(variable): "root/sub/layer/name"} for the layers of the given sub-models (Sequential stacks)."""
    out = {}
    for sub_path, sub in subs.items():
        for layer in sub.layers:
            for v in layer.trainable_weights:
                out[id(v)] = f"{model.name}/{sub_path}/{layer.name}/{_short(v)}"
    return out


def path_length(model: keras.Model, batch, passes: int = 4) -> int:
    """The reduction path of any tape of the gallery (`tolerances.reduction_path_length`): through every weight
    of the model `passes` times (the longest path here: WGAN-GP's critic tape, through the generator, then the
    critic's interpolated pass and the penalty's backward pass through it), the loss summing over the largest
    array of the batch twice (the GAN's two concatenated halves)."""
    x = np.asarray(batch[0], np.float32).reshape(len(batch[0]), -1)
    terms = 2 * max(int(np.asarray(a).size) for a in batch)
    return passes * reduction_path_length(model, x, target_terms=terms)


@contextlib.contextmanager
def with_weights(model: keras.Model, values: List[np.ndarray]) -> Iterator[keras.Model]:
    """The model holds `values` (model.get_weights() order) inside the block, its own ones after."""
    saved = model.get_weights()
    model.set_weights(values)
    try:
        yield model
    finally:
        model.set_weights(saved)


def mixed(model: keras.Model, before: List[np.ndarray], after: List[np.ndarray], updated) -> List[np.ndarray]:
    """The weights as a tape late in the step sees them: `updated`'s (a sub-model the step updated earlier in the
    batch) after the batch, every other weight before it."""
    late = {id(v) for v in updated.weights}
    return [a if id(v) in late else b for v, b, a in zip(model.weights, before, after)]


class Snapshots(keras.callbacks.Callback):
    """The model's weights before and after each batch, keyed by the count of batches trained (from 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.before: Dict[int, List[np.ndarray]] = {}
        self.after: Dict[int, List[np.ndarray]] = {}
        self.count = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.count += 1
        try:
            self.before[self.count] = self.model.get_weights()
        except ValueError:  # tf_keras: a sub-model that the first step builds has no weights to read yet
            self.before[self.count] = []

    def on_train_batch_end(self, batch, logs=None):
        self.after[self.count] = self.model.get_weights()
