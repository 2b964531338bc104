"""Summary ops: write gradients as records this plugin's tab can find.

`gradient()` is the low-level op, the analogue of `tf.summary.histogram` for
one tensor; `gradients()` writes a whole `Capture.gradients(...)` result. Both
write to the default `tf.summary` writer, at `step` or at the default step, and
respect `tf.summary.record_if` (nothing is computed when nothing is recorded).

Example:
    writer = tf.summary.create_file_writer("logs/run1")
    with writer.as_default(step=optimizer.iterations):
        tb_layergrad.summary.gradients(grads)
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import tensorflow as tf

from tb_layergrad import metadata, nonfinite, reductions
from tb_layergrad.gradient_map import Entry, GradientMap

__all__ = ["gradient", "gradients", "timesteps"]


def _resolve_step(step: Any) -> Any:
    if step is None:
        step = tf.summary.experimental.get_step()
        if step is None:
            raise ValueError(
                "no step given and no default step set: pass step=..., or use "
                "writer.as_default(step=...) / tf.summary.experimental.set_step(...)"
            )
    return step


def _when_recording(fn) -> Any:
    """Run `fn` only if summaries are being recorded (a default writer, record_if true)."""
    should = tf.summary.should_record_summaries()
    if tf.executing_eagerly() or isinstance(should, bool):
        if bool(should):
            fn()
            return tf.constant(True)
        return tf.constant(False)

    def write():
        fn()
        return tf.constant(True)

    return tf.cond(should, write, lambda: tf.constant(False))


def _info(name: str, kind: str, target: str, source: str, index: int, dtype: str) -> metadata.SeriesInfo:
    return metadata.SeriesInfo(layer=name, kind=kind, target=target, source=source, index=int(index), dtype=dtype)


def _write(info: metadata.SeriesInfo, tensor: tf.Tensor, step: Any, description: str = "") -> None:
    tf.summary.write(info.tag, tensor, step=step, metadata=metadata.create_summary_metadata(info, description))


def gradient(
    name: str,
    data: Optional[tf.Tensor],
    step: Any = None,
    buckets: int = 30,
    *,
    max_elements: int = 0,
    target: str = metadata.DEFAULT_TARGET,
    source: str = metadata.SOURCE_OUTPUT,
    layer_index: int = -1,
    elements: int = -1,
    description: str = "",
) -> tf.Tensor:
    """Write the histogram and statistics of one gradient tensor.

    Args:
      name: the layer (or tensor) path, e.g. "my_model/minimalrnn".
      data: the gradient; None records "no gradient" (the target does not
        depend on this tensor) instead of failing.
      step: the training step; defaults to the default summary step.
      buckets: number of histogram buckets.
      max_elements: when > 0, also write the raw gradient, bounded to this many
        elements (see `reductions.bounded_tensor` for the rule).
      target: name of the scalar differentiated ("loss" unless told otherwise).
      source: "output" for a layer output, "weight" for a variable.
      layer_index: the layer's position in the model, for ordering in the tab.
      elements: element count to report when `data` is None (-1 if unknown).

    Returns:
      A boolean scalar tensor: True if something was written.
    """
    step = _resolve_step(step)
    write = _writer_for(name, data, step, buckets, max_elements, target, source, layer_index, elements, description)
    with tf.name_scope("layergrad"):
        return _when_recording(write)


def _writer_for(name, data, step, buckets, max_elements, target, source, layer_index, elements, description="",
                track_nonfinite=False):
    """Validate now; return the function that computes and writes the records."""
    write_reduced = _reduced_writer_for(name, data, step, buckets, max_elements, target, source, layer_index, elements,
                                        description, track_nonfinite)

    def write() -> None:
        write_reduced(None if data is None else reductions.histogram_and_stats(data, buckets))

    return write


def _reduced_writer_for(name, data, step, buckets, max_elements, target, source, layer_index, elements, description="",
                        track_nonfinite=False):
    """Validate now; return the function that writes the records, given `data`'s (histogram, stats).

    Split from the reductions so that `gradients()` can reduce all its tensors
    in one `reductions.histograms_and_stats` call.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    if max_elements < 0:
        raise ValueError(f"max_elements must be >= 0, got {max_elements}")
    dtype = "" if data is None else tf.as_dtype(getattr(data, "dtype", tf.float32)).name

    def write(reduced) -> None:
        hist, stats = reductions.no_gradient_records(elements, buckets) if data is None else reduced
        _write(_info(name, metadata.KIND_HISTOGRAM, target, source, layer_index, dtype), hist, step, description)
        _write(_info(name, metadata.KIND_STATS, target, source, layer_index, dtype), stats, step, description)
        if track_nonfinite and data is not None:  # the running first NaN/Inf step (docs/FORMAT.md)
            info = _info(name, metadata.KIND_STATS, target, source, layer_index, dtype)
            nonfinite.write_first_nonfinite(info, stats, step, description)
        if max_elements > 0 and data is not None:
            _write(
                _info(name, metadata.KIND_TENSOR, target, source, layer_index, dtype),
                reductions.bounded_tensor(data, max_elements),
                step,
                description,
            )

    return write


def gradients(
    grads: Mapping[str, Any],
    step: Any = None,
    buckets: int = 30,
    *,
    max_elements: int = 0,
    target: Optional[str] = None,
) -> tf.Tensor:
    """Write every entry of a `Capture.gradients(...)` result (or a plain dict).

    For a plain dict, every entry is taken as a layer output, in dict order.
    `target` overrides the target name the result carries. One recording
    condition guards the whole step: when nothing is recorded (record_if
    false, no writer), no reduction runs at all. From the first logged step
    at which an entry holds a NaN/Inf on, it also writes that step (kind
    `first_nonfinite`, kept per default writer and tag), so that sampling by
    TensorBoard cannot hide it.
    """
    step = _resolve_step(step)
    if isinstance(grads, GradientMap):
        target_name = target or grads.target
        items = [(path, grads.entry(path)) for path in grads]
    else:
        target_name = target or metadata.DEFAULT_TARGET
        items = [(path, Entry(g, metadata.SOURCE_OUTPUT, i)) for i, (path, g) in enumerate(grads.items())]
    writers = [
        _reduced_writer_for(path, e.gradient, step, buckets, max_elements, target_name, e.source, e.index, e.elements,
                            track_nonfinite=True)
        for path, e in items
    ]
    present = [e.gradient for _, e in items if e.gradient is not None]

    def write_all() -> None:
        reduced = iter(reductions.histograms_and_stats(present, buckets)) if present else iter(())
        for write, (_, e) in zip(writers, items):
            write(None if e.gradient is None else next(reduced))

    with tf.name_scope("layergrad"):
        return _when_recording(write_all)


def timesteps(name: str, norms: tf.Tensor, step: Any = None, *, target: str = metadata.DEFAULT_TARGET, layer_index: int = -1) -> tf.Tensor:
    """Write a per-timestep gradient norm vector [T] for an RNN layer."""
    step = _resolve_step(step)
    norms = tf.cast(tf.reshape(norms, [-1]), tf.float64)

    def write() -> None:
        _write(_info(name, metadata.KIND_TIMESTEPS, target, metadata.SOURCE_OUTPUT, layer_index, "float64"), norms, step)

    with tf.name_scope("layergrad"):
        return _when_recording(write)
