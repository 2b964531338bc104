"""A long run (100,000 steps) for the binned routes and the tab's zoom, written fast.

`tf.summary` writes about 10,000 records a second here, so the records are framed as the summary
ops would write them and written with `tf.io.TFRecordWriter`, as bench/synthetic_logdir.py does: format
version 2 by default (one `stats` record per step for all layers, in blocks of steps, the metadata on
each block's first record, docs/FORMAT.md), version 1 on request (a record per layer, metadata on each). The stats are made up, not reduced from
a tensor: the tests compare the routes with numpy applied to `LongRun.tables`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from tb_layergrad import metadata

RUN = "long"
STEPS = 100_000
LAYERS = ("net/in", "net/mid", "net/out")
NAN_LAYER, NAN_STEP = 1, 61_234  # net/mid holds 3 NaN at this step
SPIKE_LAYER, SPIKE_STEP = 0, 23_456  # net/in's norm jumps a million-fold: exploding
ELEMENTS = 4096
S = metadata.STAT_INDEX


@dataclasses.dataclass
class LongRun:
    logdir: str
    steps: np.ndarray  # int64 [STEPS]
    tables: Dict[str, np.ndarray]  # layer -> float64 [STEPS, len(STAT_FIELDS)], as stored

    def column(self, layer: str, stat: str) -> np.ndarray:
        from tb_layergrad.reader import series

        return series.stat_column(self.tables[layer], stat)


def stats_table(
    i: int, steps: int, n_layers: int, nan: bool, spike: bool, seed: int = 0, gain: float = 1.0
) -> np.ndarray:
    """The stats records of layer i: a norm drifting with the step, noisy, shrinking with depth (`seed`: another
    run's noise; `gain`: another run's size)."""
    rng = np.random.default_rng(100 + i if seed == 0 else [seed, i])
    t = np.arange(steps)
    scale = (
        gain * 1e-2 * (0.5 ** (n_layers - i)) * (1 + 0.5 * np.sin(t / 3000.0)) * np.exp(0.1 * rng.normal(size=steps))
    )
    table = np.zeros((steps, len(metadata.STAT_FIELDS)))
    table[:, S["elements"]] = ELEMENTS
    table[:, S["std"]] = scale
    table[:, S["min"]], table[:, S["max"]] = -3.5 * scale, 3.5 * scale
    table[:, S["mean_abs"]] = 0.8 * scale
    if spike and SPIKE_STEP < steps:  # a shorter run (tests of their own) has neither
        table[SPIKE_STEP, [S["std"], S["max"]]] *= 1e6
    table[:, S["norm"]] = table[:, S["std"]] * np.sqrt(ELEMENTS)
    if nan and NAN_STEP < steps:
        table[NAN_STEP, S["nan"]] = 3
    return table


_DTYPES = {np.dtype(np.float64): types_pb2.DT_DOUBLE, np.dtype(np.uint16): types_pb2.DT_UINT16}
HIST_BUCKETS = 30


def _tensor(values: np.ndarray) -> tensor_pb2.TensorProto:
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in values.shape])
    return tensor_pb2.TensorProto(dtype=_DTYPES[values.dtype], tensor_shape=shape, tensor_content=values.tobytes())


def histogram_counts(n_layers: int, seed: int) -> np.ndarray:
    """uint16 [layers, HIST_BUCKETS]: each layer's counts (of ELEMENTS) at every step, a bump placed by `seed` so
    that each run's histogram has its own shape (docs/FORMAT.md: edges from the same step's stats min and max)."""
    centre = 0.5 + 0.35 * np.sin(1.7 * seed + np.arange(n_layers))[:, None]
    x = (np.arange(HIST_BUCKETS) + 0.5) / HIST_BUCKETS
    bump = np.exp(-(((x[None, :] - centre) / 0.12) ** 2)) + 1e-3
    counts = np.floor(ELEMENTS * bump / bump.sum(axis=1, keepdims=True))
    counts[:, 0] += ELEMENTS - counts.sum(axis=1)  # every element counted
    return counts.astype(np.uint16)


def write_run(
    path: str,
    layers: List[str],
    steps: int,
    keep: bool = True,
    format_version: int = 2,
    block_steps: Optional[int] = None,
    seed: int = 0,
    gain: float = 1.0,
    target: str = metadata.DEFAULT_TARGET,
    histograms: bool = False,
    only: Optional[Sequence[int]] = None,
) -> Dict[str, np.ndarray]:
    """One run of `stats` records; returns the tables (none with `keep=False`). `block_steps`: a version-2
    group's blocks as given (a power of two), not as the layer count sets them, for many blocks in few steps.
    `seed`, `gain`: another run's values (`stats_table`); `target`: the differentiated scalar named; `histograms`: a version-2 `histogram` record beside each `stats`
    one (`histogram_counts`); `only`: the steps written, ascending (default: every step below `steps`; the
    tables hold every step)."""
    import tensorflow as tf  # its C++ TFRecord writer: event files are TFRecords

    os.makedirs(path, exist_ok=True)
    infos = [
        metadata.SeriesInfo(layer=layer, kind=metadata.KIND_STATS, target=target, index=i + 1, dtype="float32")
        for i, layer in enumerate(layers)
    ]
    tables = {
        layer: stats_table(i, steps, len(layers), nan=i == NAN_LAYER, spike=i == SPIKE_LAYER, seed=seed, gain=gain)
        for i, layer in enumerate(layers)
    }

    def event(step: int, tag: str, meta, values: np.ndarray) -> bytes:
        value = summary_pb2.Summary.Value(tag=tag, tensor=_tensor(values))
        if meta is not None:
            value.metadata.CopyFrom(meta)
        return event_pb2.Event(
            wall_time=1.7e9 + step * 0.01, step=step, summary=summary_pb2.Summary(value=[value])
        ).SerializeToString()

    with tf.io.TFRecordWriter(os.path.join(path, "events.out.tfevents.1.long.v2")) as writer:
        writer.write(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())
        if format_version == 1:
            for info in infos:
                meta = metadata.create_summary_metadata(info)
                for step in range(steps) if only is None else only:
                    writer.write(event(step, info.tag, meta, tables[info.layer][step]))
        else:
            group = metadata.GroupInfo.of(metadata.KIND_STATS, infos)
            if block_steps is not None:
                group = dataclasses.replace(group, block_steps=block_steps)
            meta = metadata.create_group_metadata(group)
            hists = [dataclasses.replace(info, kind=metadata.KIND_HISTOGRAM) for info in infos]
            hgroup = dataclasses.replace(
                metadata.GroupInfo.of(metadata.KIND_HISTOGRAM, hists), block_steps=group.block_steps
            )
            hmeta, counts = metadata.create_group_metadata(hgroup), histogram_counts(len(infos), seed)
            rows = np.stack([tables[info.layer] for info in infos], axis=1)  # [steps, layers, fields]
            begun = set()  # the blocks written to: a tag's first record carries its metadata
            for step in range(steps) if only is None else only:
                block = metadata.block_start(step, group.block_steps)
                first = block not in begun
                begun.add(block)
                writer.write(event(step, group.tag_at(step), meta if first else None, rows[step]))
                if histograms:
                    writer.write(event(step, hgroup.tag_at(step), hmeta if first else None, counts))
    return tables if keep else {}


def write_long_logdir(logdir: str, layers=LAYERS, steps: int = STEPS) -> LongRun:
    tables = write_run(os.path.join(logdir, RUN), list(layers), steps)
    return LongRun(logdir, np.arange(steps, dtype=np.int64), tables)
