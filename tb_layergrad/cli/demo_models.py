"""Small models used by the demo (and the tests): the seed question's RNN, deep MLPs.

The seed model is the one from the classic question "how do I get the gradient
of the loss w.r.t. an inner layer's output in TF2?", updated for Keras 3
(`AbstractRNNCell` and `K.dot` are gone: a cell is a plain Layer with
`state_size`).
"""

from __future__ import annotations

import keras
from keras import layers


class MinimalRNNCell(layers.Layer):
    """output_t = x_t @ kernel + output_{t-1} @ recurrent_kernel."""

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.state_size = units

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="uniform", name="kernel")
        self.recurrent_kernel = self.add_weight(
            shape=(self.units, self.units), initializer="uniform", name="recurrent_kernel"
        )

    def call(self, inputs, states):
        output = inputs @ self.kernel + states[0] @ self.recurrent_kernel
        return output, [output]


class MyModel(keras.Model):
    """The seed question's subclassed model: RNN(MinimalRNNCell) -> Dense(4)."""

    def __init__(self, size: int, **kwargs):
        kwargs.setdefault("name", "my_model")
        super().__init__(**kwargs)
        self.minimalrnn = layers.RNN(MinimalRNNCell(size), name="minimalrnn")
        self.out = layers.Dense(4, name="out")

    def call(self, inputs):
        return self.out(self.minimalrnn(inputs))


def deep_mlp(
    depth: int, width: int, activation: str, initializer: str, inputs: int, classes: int, name: str
) -> keras.Model:
    """A plain MLP; sigmoid + Glorot shows vanishing gradients, ReLU + He does not."""
    stack = [keras.Input((inputs,))]
    stack += [
        layers.Dense(width, activation=activation, kernel_initializer=initializer, name=f"dense_{i}")
        for i in range(depth)
    ]
    stack.append(layers.Dense(classes, name="logits"))
    return keras.Sequential(stack, name=name)
