"""Runs with per-example records (kind `examples`, docs/FORMAT.md) and noise-scale scalars, written by hand.

The reader side is built against the contract while the writer is built elsewhere, so the records are
made here from made-up per-example norms (`Written.norms`): each row as docs/FORMAT.md defines it.
The tests compute what the routes should answer from `norms` with numpy, not from the rows written.
Runs:
- `ex`: stats and examples groups for three layers, B examples per step; at DOMINATED_STEP one example
  of DOMINATED_LAYER carries most of that layer's gradient; DOMINATED_LAYER... the last layer has no exact
  rule (status 1). Noise-scale scalars written with `tf.summary.scalar`, none at NO_SIGNAL_STEP.
- `ex_renamed`: the same examples records with their columns in another order, an unknown column and
  `sum_sq` absent (readers map by name).
- `plain`: stats only (no examples, no scalars): must read as before; `plain_v1` the same stats in format
  version 1 (a record per layer).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Tuple

import long_fixtures as lf
import numpy as np

from tb_layergrad import metadata

RUN, RENAMED, PLAIN, PLAIN_V1 = "ex", "ex_renamed", "plain", "plain_v1"
LAYERS = ("net/in", "net/mid", "net/out")
STEPS = 40
BATCH = 16
DOMINATED_LAYER, DOMINATED_STEP, DOMINATED_POSITION = "net/mid", 17, 11
UNSUPPORTED_LAYER = "net/out"
NO_SIGNAL_STEP = 9  # the signal estimate is <= 0 here: no noise_scale value
E = metadata.EXAMPLE_INDEX


@dataclasses.dataclass
class Written:
    logdir: str
    norms: Dict[str, np.ndarray]  # layer -> float64 [STEPS, BATCH]: each example's gradient norm
    trace: np.ndarray  # [STEPS]
    signal: np.ndarray  # [STEPS]
    coverage: float


def make_norms() -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(28)
    out = {}
    for i, layer in enumerate(LAYERS):
        norms = np.exp(rng.normal(size=(STEPS, BATCH)) * 0.3) * (0.1 * (i + 1))
        if layer == DOMINATED_LAYER:
            norms[DOMINATED_STEP, DOMINATED_POSITION] = 50.0 * norms[DOMINATED_STEP].max()
        out[layer] = norms
    return out


def examples_row(norms: np.ndarray, status: int = metadata.EXAMPLE_EXACT) -> np.ndarray:
    """One layer's row at one step, as docs/FORMAT.md defines it."""
    row = np.full(len(metadata.EXAMPLE_FIELDS), np.nan)
    row[E["examples"]] = norms.size
    row[E["status"]] = status
    k = metadata.EXAMPLE_TOP_K
    for j in range(1, k + 1):
        row[E[f"top_index_{j}"]] = -1
    if status != metadata.EXAMPLE_EXACT:
        return row
    order = sorted(range(norms.size), key=lambda p: (-norms[p], p))
    sum_sq = float(np.sum(norms**2))
    row[E["min"]], row[E["median"]], row[E["max"]] = norms.min(), np.median(norms), norms.max()
    row[E["sum_sq"]] = sum_sq
    row[E["top_share"]] = norms.max() ** 2 / sum_sq if sum_sq > 0 else np.nan
    for j, p in enumerate(order[:k], start=1):
        row[E[f"top_index_{j}"]], row[E[f"top_norm_{j}"]] = p, norms[p]
    return row


def _infos() -> List[metadata.SeriesInfo]:
    return [
        metadata.SeriesInfo(layer=layer, kind=metadata.KIND_STATS, index=i + 1, dtype="float32")
        for i, layer in enumerate(LAYERS)
    ]


def write_run(
    path: str, norms: Dict[str, np.ndarray], with_examples: bool, fields=metadata.EXAMPLE_FIELDS, steps: int = STEPS
) -> None:
    """Stats (long_fixtures' made-up tables) and, if asked, examples groups, in one event file."""
    import tensorflow as tf

    os.makedirs(path, exist_ok=True)
    infos = _infos()
    stats = metadata.GroupInfo.of(metadata.KIND_STATS, infos)
    ex = stats.with_kind(metadata.KIND_EXAMPLES)
    ex = dataclasses.replace(ex, fields=tuple(fields))
    tables = np.stack(
        [lf.stats_table(i, steps, len(LAYERS), nan=False, spike=False) for i in range(len(LAYERS))], axis=1
    )

    def event(step: int, tag: str, meta, values: np.ndarray) -> bytes:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        value = summary_pb2.Summary.Value(tag=tag, tensor=lf._tensor(values))  # noqa: SLF001 - the same framing
        if meta is not None:
            value.metadata.CopyFrom(meta)
        return event_pb2.Event(
            wall_time=1.7e9 + step, step=step, summary=summary_pb2.Summary(value=[value])
        ).SerializeToString()

    from tensorboard.compat.proto import event_pb2

    with tf.io.TFRecordWriter(os.path.join(path, "events.out.tfevents.1.ex.v2")) as writer:
        writer.write(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())
        for step in range(steps):
            first = step == 0
            writer.write(
                event(
                    step,
                    stats.tag_at(step),
                    metadata.create_group_metadata(stats) if first else None,
                    np.ascontiguousarray(tables[step]),
                )
            )
            if not with_examples:
                continue
            rows = np.stack(
                [
                    examples_row(norms[layer][step], metadata.EXAMPLE_UNSUPPORTED if layer == UNSUPPORTED_LAYER else 0)
                    for layer in LAYERS
                ]
            )
            cols = [rows[:, E[f]] if f in E else np.full(len(LAYERS), 7.0) for f in fields]
            writer.write(
                event(
                    step,
                    ex.tag_at(step),
                    metadata.create_group_metadata(ex) if first else None,
                    np.ascontiguousarray(np.stack(cols, axis=1)),
                )
            )


def noise_numbers(norms: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Made-up trace and signal per step (the formula's inputs are the writer's business): positive, but the
    signal negative at NO_SIGNAL_STEP."""
    t = np.arange(STEPS)
    trace = 4.0 + np.sin(t / 5.0)
    signal = 0.5 + 0.1 * np.cos(t / 3.0)
    signal[NO_SIGNAL_STEP] = -0.2
    return trace, signal


def write_scalars(path: str, trace: np.ndarray, signal: np.ndarray, coverage: float) -> None:
    import tensorflow as tf

    writer = tf.summary.create_file_writer(path)
    with writer.as_default():
        for step in range(STEPS):
            tf.summary.scalar("layergrad/gradient_noise_scale/trace", trace[step], step=step)
            tf.summary.scalar("layergrad/gradient_noise_scale/signal", signal[step], step=step)
            tf.summary.scalar("layergrad/gradient_noise_scale/coverage", coverage, step=step)
            if signal[step] > 0:
                tf.summary.scalar("layergrad/gradient_noise_scale", trace[step] / signal[step], step=step)
    writer.close()


RENAMED_FIELDS = tuple(reversed([f for f in metadata.EXAMPLE_FIELDS if f != "sum_sq"])) + ("unknown_column",)


def write_examples_logdir(logdir: str) -> Written:
    norms = make_norms()
    write_run(os.path.join(logdir, RUN), norms, True)
    write_run(os.path.join(logdir, RENAMED), norms, True, fields=RENAMED_FIELDS)
    write_run(os.path.join(logdir, PLAIN), norms, False)
    lf.write_run(os.path.join(logdir, PLAIN_V1), list(LAYERS), STEPS, keep=False, format_version=1)
    trace, signal = noise_numbers(norms)
    write_scalars(os.path.join(logdir, RUN), trace, signal, 0.75)
    return Written(logdir, norms, trace, signal, 0.75)
