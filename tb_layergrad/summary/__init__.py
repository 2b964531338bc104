"""Summary ops: write gradients as records this plugin's tab can find (docs/FORMAT.md).

- `gradients(grads)`: a whole `Capture.gradients(...)` result (or a dict path -> gradient), with
  the target's value and, when captured, the layer outputs and per-example norms beside them;
- `histogram_and_stats(name, data)`: the histogram and statistics of ONE tensor, the analogue of
  `tf.summary.histogram`;
- `activations(values)`: layer outputs (forward values);
- `timesteps(name, norms)`: an RNN layer's per-timestep gradient norms.

They write to the default `tf.summary` writer, at `step` or at the default step, and respect
`tf.summary.record_if`: nothing is computed when nothing is recorded. Under a multi-replica
`tf.distribute` strategy they write the GLOBAL batch, once (docs/DISTRIBUTED.md): inside
`strategy.run` the replicas' tensors are all-gathered first, at every step (collectives cannot run
inside the recording condition); in cross-replica context, on what `strategy.run` returned, they
are gathered on recorded steps only.

With a `tf.function` train step, enter the writer around the Python loop (or call
`writer.set_as_default(step=...)` once), not inside the step: leaving a `with writer.as_default():`
block inside a `tf.function` flushes the event file at every call, logged or not.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.summary import ops
from tb_layergrad.summary import plan as plans
from tb_layergrad.summary.write import resolve_step

__all__ = ["activations", "gradients", "histogram_and_stats", "timesteps"]


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def gradients(
    grads: Mapping[str, Any],
    step: Any = None,
    buckets: int = 30,
    *,
    max_elements: int = 0,
    target: Optional[str] = None,
    strategy: Any = None,
    histograms: Any = True,
    per_example: Any = None,
) -> tf.Tensor:
    """Write every entry of a `Capture.gradients(...)` result: histogram and statistics of each.

    One recording condition guards the whole step: when nothing is recorded
    (`record_if` false, no writer), no reduction runs. From the first logged
    step at which an entry holds a NaN/Inf on, that step is also written (kind
    `first_nonfinite`, kept per default writer and tag), so that TensorBoard's
    sampling cannot hide it. Inside `strategy.run` call it at every step,
    unconditionally, and choose the logged steps with `tf.summary.record_if`.

    Args:
      grads: a `GradientMap` (`cap.gradients(tape, loss)`), or a dict layer
        path -> gradient (every entry taken as a layer output, in dict order);
        also what `strategy.run` returned (PerReplica values).
      step: the training step (an integer); defaults to the default summary step.
      buckets: number of histogram buckets.
      max_elements: when > 0, also write each raw gradient, bounded to this many
        elements (docs/FORMAT.md, kind `tensor`).
      target: the name of the differentiated scalar, in place of the one
        `grads` carries ("loss" for a plain dict).
      strategy: for what `strategy.run` returned outside `strategy.scope()`:
        the strategy that ran it (in scope: that one).
      histograms: a bool or a bool tensor: False writes the statistics alone
        (e.g. `histograms=step % 100 == 0`), except at a step where an entry
        holds a NaN/Inf, written in full.
      per_example: each example's own gradient norms (docs/PER_EXAMPLE.md),
        written beside the statistics, and for the target "loss" with weight
        gradients the gradient noise scale as TensorBoard scalars. None: those
        `grads` carries (`capture(..., per_example=True)`); a `PerExampleNorms`
        or a dict path -> [batch] norms: these; False: none.

    Returns:
      A boolean scalar tensor: True if something was written.

    Raises:
      ValueError: no step given and no default step set; `buckets` < 1 or
        `max_elements` < 0; per-example norms of gradients returned from
        `strategy.run` (write them inside it); PerReplica values without a
        strategy in scope or given.
      RuntimeError: called inside a `tf.cond` in replica context (collectives).

    A warning (once) says when an option has no effect: `strategy` for
    gradients that are not PerReplica values; per-example norms of the loss
    without weight gradients (no noise scale can be written).

    Example:

    ```python
    import tensorflow as tf, keras, tb_layergrad

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    writer = tf.summary.create_file_writer("/tmp/layergrad_example")
    x, y = tf.random.normal([16, 4]), tf.random.normal([16, 1])
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = tf.reduce_mean(tf.square(model(x) - y))
    grads = cap.gradients(tape, loss)
    with writer.as_default(step=1):
        tb_layergrad.summary.gradients(grads)
    ```
    """
    step = resolve_step(step)
    plans.check_buckets(buckets)
    grads = ops.gradient_map(grads, per_example)
    with tf.name_scope("layergrad"):
        return ops.write_gradient_map(grads, step, buckets, max_elements, target or grads.target, strategy, histograms)


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def histogram_and_stats(
    name: str,
    data: Optional[tf.Tensor],
    step: Any = None,
    buckets: int = 30,
    *,
    target: str = metadata.DEFAULT_TARGET,
    source: str = metadata.SOURCE_OUTPUT,
    max_elements: int = 0,
    description: str = "",
) -> tf.Tensor:
    """Write the histogram and statistics of one tensor, e.g. one layer's gradient.

    The analogue of `tf.summary.histogram` for the tab: a histogram record and
    a statistics record (docs/FORMAT.md). Unlike `gradients()`, it keeps no
    state across steps: no `first_nonfinite` records. Inside `strategy.run`,
    the replicas' tensors are merged into the global batch's first.

    Args:
      name: the layer (or tensor) path, e.g. "my_model/dense".
      data: the tensor; None records "no gradient" (the target does not
        depend on this tensor) instead of failing.
      step: the training step (an integer); defaults to the default summary step.
      buckets: number of histogram buckets.
      target: the name of the differentiated scalar.
      source: "output" (a gradient w.r.t. a layer output), "weight" (w.r.t. a
        variable) or "activation" (a forward value: then `target` "forward").
      max_elements: when > 0, also write the raw tensor, bounded to this many
        elements (docs/FORMAT.md, kind `tensor`).
      description: shown with the series (`SummaryMetadata.summary_description`).

    Returns:
      A boolean scalar tensor: True if something was written.

    Raises:
      ValueError: an empty `name`, an unknown `source`, `buckets` < 1,
        `max_elements` < 0, or no step given and no default step set.

    Example:

    ```python
    import tensorflow as tf, tb_layergrad

    writer = tf.summary.create_file_writer("/tmp/layergrad_example")
    with writer.as_default(step=3):
        tb_layergrad.summary.histogram_and_stats("model/dense", tf.random.normal([32, 8]))
    ```
    """
    one = plans.series(name, data, target=target, source=source, max_elements=max_elements)
    return ops.write_series(one, step, buckets, description)


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def activations(
    values: Mapping[str, Any], step: Any = None, buckets: int = 30, *, max_elements: int = 0, description: str = ""
) -> tf.Tensor:
    """Write the histogram and statistics of layer outputs: the forward values (source "activation").

    The records are those of gradients (docs/FORMAT.md) with source
    "activation" and target "forward"; like `gradients()`, one recording
    condition guards the step, and the first step at which an output holds a
    NaN/Inf is kept in `first_nonfinite` records. To write gradients and
    activations of one pass together, capture with `activations=True` and
    call `gradients()` alone. Inside `strategy.run` the global batch's outputs
    are written.

    Args:
      values: `cap.activations()` (layer path -> output; its layers keep their
        model positions), a `GradientMap` from a capture made with
        `activations=True`, or a dict (positions in dict order).
      step: the training step (an integer); defaults to the default summary step.
      buckets: number of histogram buckets.
      max_elements: when > 0, also write each raw output, bounded to this many elements.
      description: shown with the series (`SummaryMetadata.summary_description`).

    Returns:
      A boolean scalar tensor: True if something was written.

    Raises:
      ValueError: `buckets` < 1, `max_elements` < 0, or no step given and no
        default step set.

    Example:

    ```python
    import tensorflow as tf, keras, tb_layergrad

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    writer = tf.summary.create_file_writer("/tmp/layergrad_example")
    with tf.GradientTape() as tape:
        with tb_layergrad.capture(model, tape=tape) as cap:
            loss = tf.reduce_mean(model(tf.random.normal([16, 4])))
    with writer.as_default(step=1):
        tb_layergrad.summary.activations(cap.activations())
    ```
    """
    step = resolve_step(step)
    plans.check_buckets(buckets)
    with tf.name_scope("layergrad"):
        return ops.write_activations(ops.activation_map(values), step, buckets, max_elements, description)


@tf.autograph.experimental.do_not_convert  # library code: autograph only slows tracing
def timesteps(name: str, norms: tf.Tensor, step: Any = None, *, target: str = metadata.DEFAULT_TARGET) -> tf.Tensor:
    """Write an RNN layer's per-timestep gradient norms (kind `timesteps`, docs/FORMAT.md).

    Args:
      name: the RNN layer's path, e.g. "my_model/lstm".
      norms: a [T] tensor, the norm of dL/dh_t at each timestep
        (for a [batch, T, units] gradient g: `tf.norm(tf.cast(g, tf.float64), axis=[0, 2])`).
      step: the training step (an integer); defaults to the default summary step.
      target: the name of the differentiated scalar.

    Returns:
      A boolean scalar tensor: True if something was written.

    Raises:
      ValueError: no step given and no default step set.

    Example:

    ```python
    import tensorflow as tf, tb_layergrad

    writer = tf.summary.create_file_writer("/tmp/layergrad_example")
    with writer.as_default(step=1):
        tb_layergrad.summary.timesteps("model/lstm", tf.constant([0.5, 0.25, 0.125]))
    ```
    """
    return ops.write_timesteps(name, norms, step, target=target)
