"""A logdir where a NaN is born in each pass, written with the real summary ops (docs/ANOMALIES.md, "Where it broke").

Each run is a small model, four layers in model order (+ two weights), logged at steps 0..5, that goes
non-finite at NAN_STEP and stays so. Forward values are written as source `activation` (target `forward`)
and the loss as source `target` (layer and target `loss`, index -1), as docs/FORMAT.md says:

| run | activations | target (loss) | gradients | expected pass, origin |
|---|---|---|---|---|
| forward_nan | from layer K on non-finite | NaN | all non-finite | forward, K |
| loss_nan | finite | NaN (written without a histogram, as the real writer does) | all non-finite | loss, "loss" |
| backward_nan | finite | finite | output gradients of layers before K (and a weight of the first) non-finite | backward, K |
| backward_grads_only | not written | not written | as backward_nan | unknown, none |
| loss_nan_no_activations | not written | NaN | all non-finite | forward_or_loss, none |
| html_layer | from `net/<b>x</b>` on non-finite | NaN | all non-finite | forward, `net/<b>x</b>` |

`expected(run)` is the origin each run must get, stated here from the table (not computed by
tb_layergrad); `Written.arrays` holds every array written, for numpy to recompute any number shown.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Dict, Tuple

import numpy as np
import pytest

from tb_layergrad import metadata

LAYERS = [("net/in", 1), ("net/mid", 2), ("net/log", 3), ("net/out", 4)]
K = "net/log"  # where the NaN is born (forward: log of a negative; backward: sqrt at 0 inside it)
WEIGHTS = [("net/in/kernel", 1), ("net/out/kernel", 4)]
HTML_LAYER = "net/<b>x</b>"
HTML_LAYERS = [("net/first", 1), (HTML_LAYER, 2), ("net/last", 3)]
STEPS = list(range(6))
NAN_STEP = 3
BUCKETS = 8

FORWARD, LOSS, BACKWARD, GRADS_ONLY, LOSS_NO_ACTS, HTML = (
    "forward_nan",
    "loss_nan",
    "backward_nan",
    "backward_grads_only",
    "loss_nan_no_activations",
    "html_layer",
)
RUNS = (FORWARD, LOSS, BACKWARD, GRADS_ONLY, LOSS_NO_ACTS, HTML)
WITH_ACTIVATIONS = (FORWARD, LOSS, BACKWARD, HTML)
WITH_TARGET = (FORWARD, LOSS, BACKWARD, LOSS_NO_ACTS, HTML)
RAW_TARGET = (LOSS,)  # its loss series is written without a histogram (tf.summary.write)

Key = Tuple[str, str, str, str]  # (run, target, source, layer)


def expected(run: str) -> dict:
    """The origin JSON (without `line`) each run must get."""
    if run == FORWARD:
        return {"step": NAN_STEP, "pass": "forward", "origin": K, "target": "loss", "layers": [K, "net/out"]}
    if run == HTML:
        return {
            "step": NAN_STEP,
            "pass": "forward",
            "origin": HTML_LAYER,
            "target": "loss",
            "layers": [HTML_LAYER, "net/last"],
        }
    if run == LOSS:
        return {"step": NAN_STEP, "pass": "loss", "origin": "loss", "target": "loss", "layers": []}
    if run == BACKWARD:
        return {
            "step": NAN_STEP,
            "pass": "backward",
            "origin": K,
            "target": "loss",
            "layers": ["net/in", "net/mid", "net/in/kernel"],
        }
    if run == GRADS_ONLY:
        return {
            "step": NAN_STEP,
            "pass": "unknown",
            "origin": None,
            "target": "loss",
            "layers": ["net/in", "net/mid", "net/in/kernel"],
        }
    if run == LOSS_NO_ACTS:
        return {"step": NAN_STEP, "pass": "forward_or_loss", "origin": None, "target": "loss", "layers": []}
    raise KeyError(run)


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("|".join(map(str, parts)).encode()))


def _layers(run: str):
    return HTML_LAYERS if run == HTML else LAYERS


def _born(run: str) -> str:
    return HTML_LAYER if run == HTML else K


def activation(run: str, layer: str, index: int, step: int) -> np.ndarray:
    x = _rng(run, "act", layer, step).uniform(0.5, 2.0, size=(4, 5)).astype(np.float32)
    x.reshape(-1)[2] = 0.0
    born = dict(_layers(run))[_born(run)]
    if run in (FORWARD, HTML) and step >= NAN_STEP and index >= born:
        x.reshape(-1)[0] = np.nan  # log of a negative inside the layer; every later layer inherits it
        if index > born:
            x[:] = np.nan
    return x


def output_gradient(run: str, layer: str, index: int, step: int) -> np.ndarray:
    x = _rng(run, "out", layer, step).normal(scale=0.1 * index, size=(4, 5)).astype(np.float32)
    if step >= NAN_STEP:
        if run in (FORWARD, LOSS, LOSS_NO_ACTS, HTML):
            x[:] = np.nan  # a NaN loss: every gradient NaN
        elif run in (BACKWARD, GRADS_ONLY) and index < dict(LAYERS)[K]:
            x.reshape(-1)[1] = np.inf  # sqrt at 0 inside K: infinite gradient w.r.t. what feeds it
            x.reshape(-1)[4] = np.nan
    return x


def weight_gradient(run: str, layer: str, index: int, step: int) -> np.ndarray:
    x = _rng(run, "w", layer, step).normal(scale=0.05, size=(3, 4)).astype(np.float32)
    if step >= NAN_STEP:
        if run in (FORWARD, LOSS, LOSS_NO_ACTS, HTML):
            x[:] = np.nan
        elif run in (BACKWARD, GRADS_ONLY) and index < dict(LAYERS)[K]:
            x.reshape(-1)[0] = np.nan
    return x


def loss_value(run: str, step: int) -> np.ndarray:
    v = 2.0 / (1 + step)
    if run in (FORWARD, LOSS, LOSS_NO_ACTS, HTML) and step >= NAN_STEP:
        v = np.nan  # log(0) in the loss (the demo's nan_log0 run), or the forward NaN reaching it
    return np.asarray([v], np.float32)


def numpy_stats_record(x: np.ndarray) -> np.ndarray:
    """A `stats` record of docs/FORMAT.md for a small float32 array, computed with numpy."""
    flat = np.asarray(x, np.float64).reshape(-1)
    fin = flat[np.isfinite(flat)]
    nan = float(np.isnan(flat).sum())
    pos, neg = float((flat == np.inf).sum()), float((flat == -np.inf).sum())
    if fin.size:
        moments = [fin.min(), fin.max(), fin.mean(), fin.std(), np.sqrt((fin * fin).sum()), np.abs(fin).mean()]
    else:
        moments = [np.nan, np.nan, np.nan, np.nan, 0.0, np.nan]
    return np.asarray([flat.size, nan, pos, neg, float((flat == 0).sum()), *moments, 0.0], np.float64)


@dataclasses.dataclass
class Written:
    logdir: str
    arrays: Dict[Key, Dict[int, np.ndarray]]


def write_origin_logdir(logdir: str, runs=RUNS) -> Written:
    import tensorflow as tf

    from tb_layergrad import summary

    w = Written(logdir, {})

    def put(run, target, source, layer, step, x):
        w.arrays.setdefault((run, target, source, layer), {})[step] = x

    for run in runs:
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        with writer.as_default():
            for step in STEPS:
                for layer, index in _layers(run):
                    if run in WITH_ACTIVATIONS:
                        a = activation(run, layer, index, step)
                        summary.ops.write_tensor(
                            layer,
                            tf.constant(a),
                            step=step,
                            buckets=BUCKETS,
                            source="activation",
                            target="forward",
                            index=index,
                        )
                        put(run, "forward", "activation", layer, step, a)
                    g = output_gradient(run, layer, index, step)
                    summary.ops.write_tensor(layer, tf.constant(g), step=step, buckets=BUCKETS, index=index)
                    put(run, "loss", "output", layer, step, g)
                if run != HTML:
                    for layer, index in WEIGHTS:
                        g = weight_gradient(run, layer, index, step)
                        summary.ops.write_tensor(
                            layer,
                            tf.constant(g),
                            step=step,
                            buckets=BUCKETS,
                            source="weight",
                            index=index,
                        )
                        put(run, "loss", "weight", layer, step, g)
                if run in WITH_TARGET:
                    v = loss_value(run, step)
                    put(run, "loss", "target", "loss", step, v)
                    if run in RAW_TARGET:  # as the real writer: stats only, no histogram
                        info = metadata.SeriesInfo(
                            layer="loss",
                            kind=metadata.KIND_STATS,
                            target="loss",
                            source=metadata.SOURCE_TARGET,
                            index=-1,
                            dtype="float32",
                        )
                        tf.summary.write(
                            info.tag,
                            tf.constant(numpy_stats_record(v)),
                            step=step,
                            metadata=metadata.create_summary_metadata(info),
                        )
                    else:
                        summary.histogram_and_stats(
                            "loss",
                            tf.constant(v),
                            step=step,
                            buckets=BUCKETS,
                            source="target",
                            target="loss",
                        )
        writer.close()
    return w


@pytest.fixture(scope="session")
def origin_logdir(tmp_path_factory) -> Written:
    return write_origin_logdir(str(tmp_path_factory.mktemp("layergrad_origin")))


@pytest.fixture(params=RUNS)
def origin_run(request) -> str:
    """Each run of the origin logdir (`RUNS`: how its first NaN was born), one test per run."""
    return request.param
