"""Write a synthetic layergrad logdir (no training) for tab benchmarks.

Each run gets `layers` layers x `steps` steps of `histogram` and `stats`
records, written exactly as the summary ops write them in the chosen format
version (docs/FORMAT.md): version 1, one Event per layer and kind, metadata on
every record (as TensorFlow's writer does); version 2, one Event per kind for
all layers, metadata on each tag's first record. Plausible numbers: per-layer
norms that shrink with depth and drift over steps, and a NaN at one step of
one layer.

    python bench/synthetic_logdir.py OUT --runs 3 --layers 200 --steps 5000 --format-version 2
    python bench/synthetic_logdir.py OUT --sweep --runs 200 --layers 50 --steps 1000

`--sweep`: runs of a learning rate x activation x seed grid whose hyperparameters are written as TensorBoard's
HParams API writes them (`hp.hparams`: a session in each run's folder), with the noise-scale scalars, and whose
gradients go wrong as such runs do: vanishing with depth, a NaN from some step on, dead or exploding layers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Dict, List, Tuple

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


def _records(scale: np.ndarray, elements: int, nan: np.ndarray):
    """Records of Gaussian-looking gradients of standard deviation `scale` [steps, layers], every step at once:
    (histograms [steps, layers, BUCKETS, 3], stats [steps, layers, 12]); `nan` (bool, same shape) marks
    records holding NaNs (no finite element counted in their histogram)."""
    S = metadata.STAT_INDEX
    lo, hi = -3.5 * scale, 3.5 * scale
    edges = lo[..., None] + (hi - lo)[..., None] * np.linspace(0, 1, BUCKETS + 1)
    counts = np.where(nan[..., None], 0.0, _COUNTS)
    hist = np.stack([edges[..., :-1], edges[..., 1:], counts], axis=-1)
    stats = np.zeros(scale.shape + (len(metadata.STAT_FIELDS),))
    stats[..., S["elements"]] = elements
    stats[..., S["nan"]] = np.where(nan, 3, 0)
    stats[..., S["min"]], stats[..., S["max"]] = lo, hi
    stats[..., S["std"]] = scale
    stats[..., S["norm"]] = scale * np.sqrt(elements)
    stats[..., S["mean_abs"]] = scale * 0.8
    return hist, stats


def _scales(layers: int, steps: int, seed: int, decay: float = 0.97) -> np.ndarray:
    """[steps, layers]: per-layer norms that shrink with depth (`decay` per layer) and drift over steps."""
    step = np.arange(steps, dtype=np.float64)[:, None]
    depth = decay ** (layers - np.arange(layers, dtype=np.float64))[None, :]
    return 1e-2 * (depth + 1e-6) * (1 + 0.5 * np.sin(step / 200 + seed))


def _layer_records(layers: int, steps: int, seed: int, nan_at: tuple):
    """(histograms [steps, L, k, 3], stats [steps, L, 12]) of every step, a NaN at `nan_at` = (layer, step)."""
    nan = np.zeros((steps, layers), bool)
    if nan_at[1] < steps:
        nan[nan_at[1], nan_at[0]] = True
    return _records(_scales(layers, steps, seed), 4096, nan)


def _event(step: int, wall: float, value: summary_pb2.Summary.Value) -> bytes:
    return event_pb2.Event(
        wall_time=wall + step * 0.1, step=step, summary=summary_pb2.Summary(value=[value])
    ).SerializeToString()


def _value(tag: str, meta, values: np.ndarray) -> summary_pb2.Summary.Value:
    value = summary_pb2.Summary.Value(tag=tag, tensor=_tensor_proto(values))
    if meta is not None:
        value.metadata.CopyFrom(meta)
    return value


def _infos(layers: int) -> list:
    return [
        metadata.SeriesInfo(
            layer=f"model/block_{i // 10}/dense_{i}", kind=metadata.KIND_STATS, index=i + 1, dtype="float32"
        )
        for i in range(layers)
    ]


def _write_groups(writer, infos: list, hists: np.ndarray, stats: np.ndarray, wall: float) -> None:
    """Version 2: one event per kind and step for all layers, metadata on each block's first record."""
    group = metadata.GroupInfo.of(metadata.KIND_STATS, infos)
    groups = {k: group.with_kind(k) for k in (metadata.KIND_HISTOGRAM, metadata.KIND_STATS)}
    counts = hists[..., 2].astype(np.uint16)  # 4,096 elements per layer: the narrowest type
    for step in range(stats.shape[0]):
        for kind, values in ((metadata.KIND_HISTOGRAM, counts[step]), (metadata.KIND_STATS, stats[step])):
            g = groups[kind]
            first = step == 0 or metadata.block_start(step, g.block_steps) == step
            meta = metadata.create_group_metadata(g) if first else None
            writer.write(_event(step, wall, _value(g.tag_at(step), meta, values)))


def write_run(path: str, layers: int, steps: int, seed: int, format_version: int = 1) -> int:
    """Writes one run; returns the number of bytes written."""
    os.makedirs(path, exist_ok=True)
    name = os.path.join(path, f"events.out.tfevents.{int(time.time())}.synthetic.{seed}.v2")
    infos = _infos(layers)
    hists, stats = _layer_records(layers, steps, seed, (layers // 2, steps // 3))
    import tensorflow as tf  # only for its C++ TFRecord writer (event files are TFRecords)

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
                for i in range(layers):
                    for kind, values in (
                        (metadata.KIND_HISTOGRAM, hists[step, i]),
                        (metadata.KIND_STATS, stats[step, i]),
                    ):
                        tag, meta = metas[(i, kind)]
                        writer.write(_event(step, wall, _value(tag, meta, values)))
        else:
            _write_groups(writer, infos, hists, stats, wall)
    return os.path.getsize(name)


# A sweep (`write_sweep`): learning rate x activation x seed. An activation sets how fast the gradient shrinks
# with depth (a sigmoid's vanishes); the largest learning rates diverge (a NaN from some step on), and the next
# one kills a ReLU's last layers and makes a tanh's first layers explode.
SWEEP_RATES = tuple(float(x) for x in np.logspace(-4, 0, 10))
SWEEP_ACTIVATIONS = {"relu": 0.97, "tanh": 0.9, "sigmoid": 0.75, "gelu": 0.95}
DIVERGES_ABOVE = 0.3
HARMS_ABOVE = 0.1


def sweep_grid(runs: int) -> List[Tuple[str, Dict[str, object]]]:
    """(run name, hyperparameters) of the first `runs` runs of the grid: learning rate fastest, then activation, seed."""
    acts = list(SWEEP_ACTIVATIONS)
    out = []
    for r in range(runs):
        lr, act, seed = SWEEP_RATES[r % 10], acts[(r // 10) % len(acts)], r // (10 * len(acts))
        hp = {"learning_rate": lr, "activation": act, "seed": seed, "optimizer": "adam" if seed % 2 else "sgd"}
        out.append((f"sweep/lr={lr:.1e},act={act},seed={seed}", hp))
    return out


def _sweep_records(layers: int, steps: int, hp: Dict[str, object]):
    """(histograms, stats) of one run of the sweep: its activation's decay, its learning rate's harm."""
    lr, act = float(hp["learning_rate"]), str(hp["activation"])
    scale = _scales(layers, steps, int(hp["seed"]), SWEEP_ACTIVATIONS[act])
    nan = np.zeros((steps, layers), bool)
    if lr > DIVERGES_ABOVE:  # from this step on, the gradient of the middle layer and all below it is NaN
        nan[min(steps - 1, int(steps * 0.05 / lr)) :, : layers // 2 + 1] = True
    dead = np.zeros((steps, layers), bool)
    if HARMS_ABOVE < lr <= DIVERGES_ABOVE and act == "relu":
        dead[steps // 2 :, -3:] = True
    if HARMS_ABOVE < lr <= DIVERGES_ABOVE and act == "tanh":
        scale[steps - steps // 10 :, :5] *= 1e4
    scale = np.where(dead, 0.0, scale)
    hists, stats = _records(scale, 4096, nan)
    stats[..., metadata.STAT_INDEX["zeros"]] = np.where(dead, 4096, 0)
    return hists, stats


def write_sweep_run(path: str, layers: int, steps: int, hp: Dict[str, object]) -> int:
    """One run of the sweep in format version 2, its hyperparameters as `hp.hparams` writes them (a session in
    the run's own folder) and the noise-scale scalars; returns the bytes written."""
    from tensorboard.plugins.hparams import summary_v2 as hparams_summary
    from tensorboard.plugins.scalar import summary_v2 as scalar_summary

    os.makedirs(path, exist_ok=True)
    name = os.path.join(path, "events.out.tfevents.1.synthetic.sweep.v2")
    hists, stats = _sweep_records(layers, steps, hp)
    step = np.arange(steps, dtype=np.float64)
    signal = 1.0 / (1 + step / 300) * (1 + 0.1 * np.sin(step / 7))
    trace = signal * 64 * (1 + 10 * float(hp["learning_rate"])) * (1 + step / steps)
    import tensorflow as tf  # only for its C++ TFRecord writer (event files are TFRecords)

    wall = 1.7e9
    with tf.io.TFRecordWriter(name) as writer:
        writer.write(event_pb2.Event(wall_time=wall, file_version="brain.Event:2").SerializeToString())
        session = hparams_summary.hparams_pb(hp, start_time_secs=wall)
        writer.write(event_pb2.Event(wall_time=wall, step=0, summary=session).SerializeToString())
        _write_groups(writer, _infos(layers), hists, stats, wall)
        for tag, values in ((metadata.NOISE_SCALE_TAGS["trace"], trace), (metadata.NOISE_SCALE_TAGS["signal"], signal)):
            for k in range(steps):
                writer.write(_event(k, wall, scalar_summary.scalar_pb(tag, float(values[k])).value[0]))
    return os.path.getsize(name)


def write_sweep(out: str, runs: int, layers: int, steps: int) -> List[Tuple[str, Dict[str, object]]]:
    """`runs` runs of the sweep grid under `out`; returns their (run name, hyperparameters)."""
    grid = sweep_grid(runs)
    for run, hp in grid:
        write_sweep_run(os.path.join(out, run), layers, steps, hp)
    return grid


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
    parser.add_argument("--sweep", action="store_true", help="a hyperparameter sweep (write_sweep), format version 2")
    args = parser.parse_args()
    if args.sweep:
        t = time.time()
        write_sweep(args.out, args.runs, args.layers, args.steps)
        print(f"{args.runs} runs in {time.time() - t:.1f}s", flush=True)
        return
    for r in range(args.runs):
        t = time.time()
        size = write_run(
            os.path.join(args.out, f"run_{r}"), args.layers, args.steps, seed=r, format_version=args.format_version
        )
        print(f"run_{r}: {size / 1e6:.1f} MB in {time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main()
