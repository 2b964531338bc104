"""Who writes under multi-worker training: the chief only, and the other workers leave no file behind."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import tensorflow as tf


def is_chief(strategy: Any = None) -> bool:
    """True on the one process that should write: always, except on non-chief multi-worker tasks.

    The chief is task "chief" (index 0), or "worker" 0 when the cluster has no
    chief task, as in `tf.distribute.MultiWorkerMirroredStrategy`. Without a
    strategy (none given, none in scope) the cluster is read from `TF_CONFIG`,
    so a writer made outside `strategy.scope()` is still only the chief's.

    Args:
      strategy: the strategy to ask (default: the one in scope, else `TF_CONFIG`).

    Returns:
      Whether this process writes.

    Raises:
      ValueError: a `TF_CONFIG` that TensorFlow's cluster resolver cannot read.

    Example:

    ```python
    import tb_layergrad

    print(tb_layergrad.distribute.is_chief())  # True in a single process
    ```
    """
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    if strategy is not None:
        resolver = getattr(strategy, "cluster_resolver", None)
        extended = getattr(strategy, "extended", None)
        if resolver is None or not getattr(extended, "_in_multi_worker_mode", lambda: False)():
            return True
    else:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return _is_chief_task(resolver)


def _is_chief_task(resolver: Any) -> bool:
    spec = resolver.cluster_spec().as_dict()
    task_type, task_id = resolver.task_type, resolver.task_id
    if not spec or task_type is None:
        return True
    if "chief" in spec:
        return task_type == "chief"
    return task_type == "worker" and int(task_id or 0) == 0


class NonChiefWriter:
    """The writer of a non-chief worker: writes nothing, creates no file, but sets the step.

    Why not `tf.summary.create_noop_writer()`: its `as_default(step=...)` drops the
    step, so `summary.gradients` (which must still run on every worker: its
    collectives pair with the chief's) would find no step.
    """

    @contextlib.contextmanager
    def as_default(self, step: Any = None) -> Iterator["NonChiefWriter"]:
        if step is None:
            yield self
            return
        previous = tf.summary.experimental.get_step()
        tf.summary.experimental.set_step(step)
        try:
            yield self
        finally:
            tf.summary.experimental.set_step(previous)

    def set_as_default(self, step: Any = None) -> None:
        if step is not None:
            tf.summary.experimental.set_step(step)

    def init(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def create_file_writer(logdir: Any, strategy: Any = None, **kwargs: Any) -> Any:
    """`tf.summary.create_file_writer(logdir)` on the chief, a `NonChiefWriter` elsewhere.

    Under MultiWorkerMirroredStrategy every worker runs the same program; a file
    writer on each would leave one event file per worker in `logdir`.

    Args:
      logdir: the run's directory.
      strategy: the strategy whose chief writes (default: the one in scope, else `TF_CONFIG`'s cluster).
      **kwargs: passed to `tf.summary.create_file_writer` on the chief.

    Returns:
      A summary writer: TensorFlow's on the chief, a `NonChiefWriter` (writes nothing, keeps the step) elsewhere.

    Raises:
      Whatever `tf.summary.create_file_writer` raises for `logdir`.

    Example:

    ```python
    import tensorflow as tf, tb_layergrad

    writer = tb_layergrad.distribute.create_file_writer("/tmp/layergrad_example/run1")
    with writer.as_default(step=1):
        tb_layergrad.summary.gradients({"model/dense": tf.ones([4, 2])})
    ```
    """
    if not is_chief(strategy):
        return NonChiefWriter()
    return tf.summary.create_file_writer(os.fspath(logdir), **kwargs)
