"""The demo's three NaN runs: where a NaN is born (the loss, a layer's forward pass, a layer's backward pass).

`nan_log0` saturates a sigmoid until a hand-written cross-entropy takes log(0); `nan_forward` and
`nan_backward` plant one bad batch at a known step that is not a logged one, so the runs also show that the
first non-finite step is written off the schedule.
"""

from __future__ import annotations

from typing import Mapping

from tb_layergrad.cli.demo_fit import fit

NAN_LR = 1.0  # nan_log0: the sigmoid saturates (p == 1.0 in float32) within ~30 steps
NAN_FORWARD_STEP = 23  # nan_forward: the batch whose inputs drive a feature below 0 (not a logged step)
NAN_BACKWARD_STEP = 17  # nan_backward: the batch whose inputs drive a ReLU feature to exactly 0 (not a logged step)
NAN_EVERY = 5  # nan_forward, nan_backward: logged every 5 steps


def naive_binary_crossentropy(y_true, p):
    """The textbook formula, without Keras' clipping: log(1 - p) is log(0) once p rounds to 1.0."""
    from keras import ops

    y_true = ops.reshape(ops.cast(y_true, p.dtype), ops.shape(p))
    return -ops.mean(y_true * ops.log(p) + (1.0 - y_true) * ops.log(1.0 - p))


def nan_log0_run(logdir: str, steps: int, shows: Mapping[str, str]) -> None:
    """A hand-written cross-entropy takes log(0) once the sigmoid saturates: the NaN is born in the loss."""
    import keras
    import numpy as np
    from keras import layers

    rng = np.random.default_rng(3)
    x = rng.normal(size=(steps * 64, 16)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            layers.Dense(32, activation="relu", name="dense_0"),
            layers.Dense(32, activation="relu", name="dense_1"),
            layers.Dense(1, activation="sigmoid", name="prob"),
        ],
        name="nan_log0",
    )
    optimizer = keras.optimizers.SGD(NAN_LR)
    fit(
        "nan_log0",
        shows["nan_log0"],
        logdir,
        model,
        (x, y),
        steps,
        optimizer=optimizer,
        loss=naive_binary_crossentropy,
        activations=True,
    )


def inputs_with_one_bad_batch(steps: int, bad_step: int, scale: float, seed: int):
    """Small inputs, except batch `bad_step` (1-based, as the optimizer counts): its first example is large."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = (0.1 * rng.normal(size=(steps * 64, 16))).astype(np.float32)
    x[(bad_step - 1) * 64] = scale
    y = rng.normal(size=(steps * 64, 1)).astype(np.float32)
    return x, y


def nan_pass_runs(logdir: str, steps: int, shows: Mapping[str, str]) -> None:
    """Two NaNs the loss does not explain: one born in a layer's forward pass, one in a layer's backward pass.

    Why data-driven: the step is then known in advance (one batch holds a large
    input), and it is not a logged step, so the runs also show that the first
    non-finite step is written off the schedule.
    """
    import keras
    from keras import layers, ops

    forward = [
        layers.Dense(16, name="dense_0"),
        # Positive for small inputs (bias 2); a large input drives some below 0, and log is NaN there.
        layers.Dense(8, bias_initializer=keras.initializers.Constant(2.0), name="shift"),
        layers.Lambda(ops.log, name="log_features"),
    ]
    backward = [
        # Positive for small inputs (bias 1): the large input drives some to exactly 0 after the ReLU.
        layers.Dense(
            16,
            activation="relu",
            bias_initializer=keras.initializers.Constant(1.0),
            kernel_initializer=keras.initializers.Constant(0.1),
            name="dense_0",
        ),
        layers.Lambda(ops.sqrt, name="sqrt_features"),  # sqrt(0) = 0, but its gradient there is infinite
    ]
    for name, stack, bad_step, scale, seed in (
        ("nan_forward", forward, NAN_FORWARD_STEP, 50.0, 5),
        ("nan_backward", backward, NAN_BACKWARD_STEP, -50.0, 6),
    ):
        x, y = inputs_with_one_bad_batch(steps, bad_step, scale, seed=seed)
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((16,)), *stack, layers.Dense(1, name="head")], name=name)
        optimizer, loss = keras.optimizers.SGD(0.01), keras.losses.MeanSquaredError()
        fit(
            name,
            shows[name],
            logdir,
            model,
            (x, y),
            steps,
            optimizer=optimizer,
            loss=loss,
            activations=True,
            update_freq=NAN_EVERY,
        )
