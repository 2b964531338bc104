"""Write a synthetic layergrad logdir (no training) for tab benchmarks.

Each run gets `layers` layers x `steps` steps of `histogram` and `stats`
records, written exactly as the summary ops write them (one Event per record,
metadata on every record, as TensorFlow's writer does), with plausible
numbers: per-layer norms that shrink with depth and drift over steps, and a
NaN at one step of one layer.

    python bench/synthetic_logdir.py OUT --runs 3 --layers 200 --steps 5000
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from tb_layergrad import metadata

BUCKETS = 30


def _tensor_proto(values: np.ndarray) -> tensor_pb2.TensorProto:
    values = np.ascontiguousarray(values, np.float64)
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in values.shape])
    return tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, tensor_shape=shape, tensor_content=values.tobytes())


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


def write_run(path: str, layers: int, steps: int, seed: int) -> int:
    """Writes one run; returns the number of bytes written."""
    os.makedirs(path, exist_ok=True)
    name = os.path.join(path, f"events.out.tfevents.{int(time.time())}.synthetic.{seed}.v2")
    contents = {}
    for i in range(layers):
        layer = f"model/block_{i // 10}/dense_{i}"
        for kind in (metadata.KIND_HISTOGRAM, metadata.KIND_STATS):
            info = metadata.SeriesInfo(layer=layer, kind=kind, index=i + 1, dtype="float32")
            contents[(i, kind)] = (info.tag, metadata.create_summary_metadata(info))
    nan_layer, nan_step = layers // 2, steps // 3
    import tensorflow as tf  # only for its C++ TFRecord writer (event files are TFRecords)

    with tf.io.TFRecordWriter(name) as writer:
        writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        wall = time.time()
        for step in range(steps):
            for i in range(layers):
                scale = 1e-2 * (0.97 ** (layers - i) + 1e-6) * (1 + 0.5 * np.sin(step / 200 + seed))
                hist, stats = _stats_and_histogram(scale, 4096, nan=(i == nan_layer and step == nan_step))
                for kind, values in ((metadata.KIND_HISTOGRAM, hist), (metadata.KIND_STATS, stats)):
                    tag, meta = contents[(i, kind)]
                    value = summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=_tensor_proto(values))
                    event = event_pb2.Event(wall_time=wall + step * 0.1, step=step, summary=summary_pb2.Summary(value=[value]))
                    writer.write(event.SerializeToString())
    return os.path.getsize(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    for r in range(args.runs):
        t = time.time()
        size = write_run(os.path.join(args.out, f"run_{r}"), args.layers, args.steps, seed=r)
        print(f"run_{r}: {size / 1e6:.1f} MB in {time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main()
