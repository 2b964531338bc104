"""Write a synthetic layergrad logdir (no training) for tab benchmarks.

Each run gets `layers` layers x `steps` steps of `histogram` and `stats`
records, written exactly as the summary ops write them in the chosen format
version (docs/FORMAT.md): version 1, one Event per layer and kind, metadata on
every record (as TensorFlow's writer does); version 2, one Event per kind for
all layers, metadata on each tag's first record. Plausible numbers: per-layer
norms that shrink with depth and drift over steps, and a NaN at one step of
one layer.

    python bench/synthetic_logdir.py OUT --runs 3 --layers 200 --steps 5000 --format-version 2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from tb_layergrad import metadata

BUCKETS = 30


_PROTO_DTYPES = {np.dtype(np.float64): types_pb2.DT_DOUBLE, np.dtype(np.uint16): types_pb2.DT_UINT16}


def _tensor_proto(values: np.ndarray) -> tensor_pb2.TensorProto:
    if values.dtype not in _PROTO_DTYPES:
        values = values.astype(np.float64)
    values = np.ascontiguousarray(values)
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in values.shape])
    return tensor_pb2.TensorProto(
        dtype=_PROTO_DTYPES[values.dtype], tensor_shape=shape, tensor_content=values.tobytes()
    )


_BELL = np.exp(-0.5 * np.linspace(-3.5, 3.5, BUCKETS) ** 2)
_COUNTS = np.round(4096 * _BELL / _BELL.sum())


def _stats_and_histogram(scale: float, elements: int, nan: bool):
    """Records of a Gaussian-looking gradient of standard deviation `scale`."""
    lo, hi = -3.5 * scale, 3.5 * scale
    edges = np.linspace(lo, hi, BUCKETS + 1)
    hist = np.stack([edges[:-1], edges[1:], _COUNTS * (0 if nan else 1)], axis=1)
    S = metadata.STAT_INDEX
    stats = np.zeros(len(metadata.STAT_FIELDS))
    stats[S["elements"]] = elements
    stats[S["nan"]] = 3 if nan else 0
    stats[S["min"]], stats[S["max"]] = lo, hi
    stats[S["std"]] = scale
    stats[S["norm"]] = scale * np.sqrt(elements)
    stats[S["mean_abs"]] = scale * 0.8
    return hist, stats


def _layer_records(layers: int, step: int, seed: int, nan_at: tuple):
    """(histograms [L, k, 3], stats [L, 12]) of one step."""
    hists, stats = [], []
    for i in range(layers):
        scale = 1e-2 * (0.97 ** (layers - i) + 1e-6) * (1 + 0.5 * np.sin(step / 200 + seed))
        hist, stat = _stats_and_histogram(scale, 4096, nan=(i, step) == nan_at)
        hists.append(hist)
        stats.append(stat)
    return np.stack(hists), np.stack(stats)


def write_run(path: str, layers: int, steps: int, seed: int, format_version: int = 1) -> int:
    """Writes one run; returns the number of bytes written."""
    os.makedirs(path, exist_ok=True)
    name = os.path.join(path, f"events.out.tfevents.{int(time.time())}.synthetic.{seed}.v2")
    infos = [
        metadata.SeriesInfo(
            layer=f"model/block_{i // 10}/dense_{i}", kind=metadata.KIND_STATS, index=i + 1, dtype="float32"
        )
        for i in range(layers)
    ]
    nan_at = (layers // 2, steps // 3)
    import tensorflow as tf  # only for its C++ TFRecord writer (event files are TFRecords)

    def event(step: int, wall: float, tag: str, meta, values: np.ndarray) -> bytes:
        value = summary_pb2.Summary.Value(tag=tag, tensor=_tensor_proto(values))
        if meta is not None:
            value.metadata.CopyFrom(meta)
        return event_pb2.Event(
            wall_time=wall + step * 0.1, step=step, summary=summary_pb2.Summary(value=[value])
        ).SerializeToString()

    with tf.io.TFRecordWriter(name) as writer:
        writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        wall = time.time()
        if format_version == 1:
            kinds = (metadata.KIND_HISTOGRAM, metadata.KIND_STATS)
            metas = {
                (i, k): (
                    dataclasses.replace(info, kind=k).tag,
                    metadata.create_summary_metadata(dataclasses.replace(info, kind=k)),
                )
                for i, info in enumerate(infos)
                for k in kinds
            }
            for step in range(steps):
                hists, stats = _layer_records(layers, step, seed, nan_at)
                for i in range(layers):
                    for kind, values in ((metadata.KIND_HISTOGRAM, hists[i]), (metadata.KIND_STATS, stats[i])):
                        tag, meta = metas[(i, kind)]
                        writer.write(event(step, wall, tag, meta, values))
        else:
            group = metadata.GroupInfo.of(metadata.KIND_STATS, infos)
            groups = {k: group.with_kind(k) for k in (metadata.KIND_HISTOGRAM, metadata.KIND_STATS)}
            for step in range(steps):
                hists, stats = _layer_records(layers, step, seed, nan_at)
                counts = hists[:, :, 2].astype(np.uint16)  # 4,096 elements per layer: the narrowest type
                for kind, values in ((metadata.KIND_HISTOGRAM, counts), (metadata.KIND_STATS, stats)):
                    g = groups[kind]
                    tag = g.tag_at(step)  # a tag per block of steps; its first record carries the metadata
                    first = step == 0 or metadata.block_start(step, g.block_steps) == step
                    writer.write(event(step, wall, tag, metadata.create_group_metadata(g) if first else None, values))
    return os.path.getsize(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument(
        "--format-version",
        type=int,
        default=metadata.FORMAT_VERSION,
        choices=(1, 2),  # laid out here: a reader's load
    )
    args = parser.parse_args()
    for r in range(args.runs):
        t = time.time()
        size = write_run(
            os.path.join(args.out, f"run_{r}"), args.layers, args.steps, seed=r, format_version=args.format_version
        )
        print(f"run_{r}: {size / 1e6:.1f} MB in {time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main()
