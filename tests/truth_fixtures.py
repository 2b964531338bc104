"""Generated series for the "only what is in the data is drawn" browser tests (tests/tab/test_tab_charts_e2e.py).

The `stats` records are framed as the summary ops write them (format version 1: a record per layer and step,
`long_fixtures`' framing), from tables made here, so every case is exact:
- run `gaps`, steps 0-59 without 20-24 (not recorded), layers:
  `net/nan`: all elements +Inf at INF_STEPS (as the writer stores it: no finite element, so the norm 0 and the
  mean of |g|, the std, min and max NaN); `net/zero`: all elements 0 at ZERO_STEPS (0 on a log axis);
  `net/big`: a norm that overflowed to +Inf at BIG_STEP; `net/allinf`: every element +Inf at every step;
- run `one`: one step; run `long`: LONG_STEPS steps (answered binned).
`EXPECTED` holds each table; the tests read the drawn points back to the routes' answers, and those to these.
"""

from __future__ import annotations

import os
from typing import Dict, List

import numpy as np
from long_fixtures import _tensor
from tensorboard.compat.proto import event_pb2, summary_pb2

from tb_layergrad import metadata

S = metadata.STAT_INDEX
GAPS, ONE, LONG = "gaps", "one", "long"
GAP_STEPS = [s for s in range(60) if not 20 <= s <= 24]
INF_STEPS = range(40, 60)
ZERO_STEPS = range(30, 35)
BIG_STEP = 12
LONG_STEPS = 100_000
ELEMENTS = 64
LAYERS = {GAPS: ["net/nan", "net/zero", "net/big", "net/allinf"], ONE: ["net/nan"], LONG: ["net/nan"]}


def table(steps: List[int], layer: str, seed: int) -> np.ndarray:
    """[len(steps), fields]: a gradient of ELEMENTS values whose size wanders over 2 decades, and the layer's case."""
    rng = np.random.default_rng(seed)
    t = np.asarray(steps, dtype=np.float64)
    scale = 1e-3 * 10 ** (np.sin(t / 7.0) + 0.2 * rng.normal(size=t.size))
    out = np.zeros((t.size, len(metadata.STAT_FIELDS)))
    out[:, S["elements"]] = ELEMENTS
    out[:, S["std"]] = scale
    out[:, S["min"]], out[:, S["max"]] = -3 * scale, 3 * scale
    out[:, S["mean"]] = 0.01 * scale
    out[:, S["mean_abs"]] = 0.8 * scale
    out[:, S["norm"]] = scale * np.sqrt(ELEMENTS)
    rows = {s: k for k, s in enumerate(steps)}

    def all_inf(k: int) -> None:
        out[k, S["pos_inf"]] = ELEMENTS
        out[k, S["norm"]] = 0.0  # a sum over no finite element
        out[k, [S["min"], S["max"], S["mean"], S["std"], S["mean_abs"]]] = np.nan

    if layer == "net/nan":
        for s in INF_STEPS:
            if s in rows:
                all_inf(rows[s])
    elif layer == "net/zero":
        for s in ZERO_STEPS:
            k = rows[s]
            out[k, [S["std"], S["min"], S["max"], S["mean"], S["mean_abs"], S["norm"]]] = 0.0
            out[k, S["zeros"]] = ELEMENTS
    elif layer == "net/big":
        out[rows[BIG_STEP], S["norm"]] = np.inf  # the sum of squares overflowed float32
    elif layer == "net/allinf":
        for k in range(t.size):
            all_inf(k)
    return out


def _write(path: str, steps: List[int], layers: List[str], seed: int) -> Dict[str, np.ndarray]:
    import tensorflow as tf  # its C++ TFRecord writer: event files are TFRecords

    os.makedirs(path, exist_ok=True)
    tables = {layer: table(steps, layer, seed + i) for i, layer in enumerate(layers)}
    with tf.io.TFRecordWriter(os.path.join(path, "events.out.tfevents.1.truth.v2")) as writer:
        writer.write(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())
        for i, layer in enumerate(layers):
            info = metadata.SeriesInfo(layer=layer, kind=metadata.KIND_STATS, index=i + 1, dtype="float32")
            meta = metadata.create_summary_metadata(info)
            for k, step in enumerate(steps):
                value = summary_pb2.Summary.Value(tag=info.tag, tensor=_tensor(tables[layer][k]))
                value.metadata.CopyFrom(meta)
                event = event_pb2.Event(wall_time=1.7e9 + step, step=step, summary=summary_pb2.Summary(value=[value]))
                writer.write(event.SerializeToString())
    return tables


def write_truth_runs(logdir: str) -> Dict[str, Dict[str, np.ndarray]]:
    """The runs above; {run: {layer: table}} (rows in the order of `steps_of(run)`)."""
    return {run: _write(os.path.join(logdir, run), steps_of(run), LAYERS[run], seed) for seed, run in enumerate(LAYERS)}


def steps_of(run: str) -> List[int]:
    return {GAPS: GAP_STEPS, ONE: [7], LONG: list(range(LONG_STEPS))}[run]


LAST_STEPS = {run: steps_of(run)[-1] for run in LAYERS}
