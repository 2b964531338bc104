"""Internal: reduce and write the records of one fit() step.

Shared by the two places `GradientLogger` writes from: inside the compiled
train step (graph mode without XLA, see `_fit_step.FitStep._writes_in_step`)
and its compiled record writer outside the step (XLA, eager, several
replicas). Both run it under `writer.as_default()`, so every logged step is
flushed to disk: records of the steps before a crash are there to look at.
"""
from __future__ import annotations

from typing import Dict

import tensorflow as tf

from tb_layergrad import metadata, nonfinite, record_writes
from tb_layergrad import summary as lg_summary


def write_step_records(
    series: Dict[str, metadata.SeriesInfo],
    buckets: int,
    step: tf.Tensor,
    records: Dict[str, tf.Tensor],
    gradients: Dict[str, tf.Tensor],
) -> None:
    """Write one step's records to the default writer.

    `gradients` ({stats tag: unscaled gradient}) are reduced and written here,
    all together (`record_writes`: one op where the fused kernel can);
    `records` ({tag: tensor}) arrive finished. The running first NaN/Inf step
    of each stats series (kind `first_nonfinite`) is kept and written too.
    """
    tags = list(gradients)
    step = tf.cast(step, tf.int64)
    tracked = record_writes.write_histograms_and_stats([series[t] for t in tags], [gradients[t] for t in tags], buckets, step) if tags else []
    for tag, value in records.items():
        info = series[tag]
        if info.kind == metadata.KIND_TIMESTEPS:
            lg_summary.timesteps(info.layer, value, step, target=info.target, layer_index=info.index)
        else:
            tf.summary.write(tag, value, step=step, metadata=metadata.create_summary_metadata(info))
        if info.kind == metadata.KIND_STATS:
            tracked.append((info, value))
    nonfinite.write_first_nonfinite(tracked, step)
