"""Test logdirs for the plugin tests, written with the real summary ops, and helpers.

`write_small_logdir` returns, next to the logdir, exactly what was written (the
input arrays and the histogram/stats tensors the reductions produced), so the
tests can compare every route's numbers with it and recompute them with numpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import zlib
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata

# (run, target, source, layer) -> {step: input array}
Key = Tuple[str, str, str, str]

# Layers of the small logdir: (layer path, model index, source).
LAYERS = [
    ("model/embedding", 0, metadata.SOURCE_OUTPUT),
    ("model/dense", 1, metadata.SOURCE_OUTPUT),
    ("model/dense/kernel", 1, metadata.SOURCE_WEIGHT),
    ("model/rnn", 2, metadata.SOURCE_OUTPUT),
    ("extra/no_index", -1, metadata.SOURCE_OUTPUT),
]
UNUSED_LAYER = ("model/unused", 3)  # written with data=None (no gradient)
NAN_STEP = 5  # "model/dense" at this step holds NaN, +Inf and -Inf
TENSOR_LAYER = "model/dense"
TENSOR_MAX_ELEMENTS = 64
RNN_LAYER = "model/rnn"
AUX_TARGET = "aux"
TRAIN_STEPS = list(range(10))
EVAL_STEPS = list(range(0, 20, 2))  # overlaps train on even steps, extends past it
BUCKETS = 6

# The statistics the routes serve (docs/HTTP_API.md, `stat`): the stored fields of the on-disk contract, then the
# derived ones; COUNT_STATS are sent as JSON integers; EXAMPLE_STATS read a layer's per-example records.
HTTP_STATS = metadata.STAT_FIELDS + ("nonfinite", "nonfinite_frac", "zero_frac", "rms")
COUNT_STATS = frozenset({"elements", "nan", "pos_inf", "neg_inf", "zeros", "no_gradient", "nonfinite"})
EXAMPLE_STATS = ("example_norm_min", "example_norm_median", "example_norm_max", "example_norm_top_share")


def expected_stat(raw: np.ndarray, name: str) -> float:
    """One statistic the routes serve, from a stored stats vector (`metadata.STAT_FIELDS` order): the derived
    ones recomputed here, by their definitions in docs/HTTP_API.md."""
    s = dict(zip(metadata.STAT_FIELDS, raw.astype(np.float64)))
    nonfinite = s["nan"] + s["pos_inf"] + s["neg_inf"]
    if name in s:
        return s[name]
    if name == "nonfinite":
        return nonfinite
    if name == "nonfinite_frac":
        return nonfinite / s["elements"] if s["elements"] > 0 else np.nan
    if name == "zero_frac":
        return s["zeros"] / s["elements"] if s["elements"] > 0 else np.nan
    if name == "rms":
        finite = s["elements"] - nonfinite
        return s["norm"] / np.sqrt(finite) if finite > 0 and not s["no_gradient"] else np.nan
    raise KeyError(name)


def layer_data(run: str, target: str, layer: str, step: int) -> np.ndarray:
    """The deterministic float32 'gradient' written for one (run, target, layer, step)."""
    seed = zlib.crc32(f"{run}|{target}|{layer}|{step}".encode())
    rng = np.random.default_rng(seed)
    shape = (4, 3, 5) if layer == TENSOR_LAYER else (6, 7)
    x = rng.normal(scale=1.0 + step, size=shape).astype(np.float32)
    x.reshape(-1)[3] = 0.0  # a zero to count
    if layer == TENSOR_LAYER and step == NAN_STEP and target == metadata.DEFAULT_TARGET and run == "train":
        flat = x.reshape(-1)
        flat[0] = np.nan
        flat[7] = np.inf
        flat[8] = -np.inf
        flat[20] = np.nan
    return x


def timestep_norms(run: str, step: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + step + (0 if run == "train" else 500))
    norms = rng.uniform(0.0, 2.0, size=7)
    if step == NAN_STEP:
        norms[2] = np.nan
    return norms


@dataclasses.dataclass
class Written:
    """What the small logdir holds, keyed like the routes ask for it."""

    logdir: str
    inputs: Dict[Key, Dict[int, np.ndarray]]
    hist: Dict[Key, Dict[int, np.ndarray]]
    stats: Dict[Key, Dict[int, np.ndarray]]
    timesteps: Dict[Tuple[str, str], Dict[int, np.ndarray]]  # (run, layer) -> {step: norms}
    indices: Dict[str, int]


def write_small_logdir(logdir: str) -> Written:
    """Two runs, two targets, weight and output sources, raw tensors, timesteps, NaN/Inf."""
    import tensorflow as tf

    from tb_layergrad import summary
    from tb_layergrad.statistics import special_records
    from tb_layergrad.summary import write  # what the writer computes the records with

    w = Written(logdir, {}, {}, {}, {}, {layer: i for layer, i, _ in LAYERS})
    w.indices[UNUSED_LAYER[0]] = UNUSED_LAYER[1]

    def put(table, key, step, value):
        table.setdefault(key, {})[step] = np.asarray(value)

    for run, steps in (("train", TRAIN_STEPS), ("eval", EVAL_STEPS)):
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        with writer.as_default():
            for step in steps:
                for layer, index, source in LAYERS:
                    targets = [metadata.DEFAULT_TARGET]
                    if run == "train" and layer == TENSOR_LAYER:
                        targets.append(AUX_TARGET)
                    for target in targets:
                        x = layer_data(run, target, layer, step)
                        summary.ops.write_tensor(
                            layer,
                            tf.constant(x),
                            step=step,
                            buckets=BUCKETS,
                            target=target,
                            source=source,
                            index=index,
                            max_elements=TENSOR_MAX_ELEMENTS if layer == TENSOR_LAYER else 0,
                        )
                        key = (run, target, source, layer)
                        ((h, s),) = write.reduce([tf.constant(x)], BUCKETS)
                        put(w.inputs, key, step, x)
                        put(w.hist, key, step, h.numpy())
                        put(w.stats, key, step, s.numpy())
                if run == "train":
                    summary.ops.write_tensor(
                        UNUSED_LAYER[0],
                        None,
                        step=step,
                        buckets=BUCKETS,
                        index=UNUSED_LAYER[1],
                        elements=10,
                    )
                    h, s = special_records.no_gradient_records(10, BUCKETS)
                    key = (run, metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, UNUSED_LAYER[0])
                    put(w.hist, key, step, h.numpy())
                    put(w.stats, key, step, s.numpy())
                norms = timestep_norms(run, step)
                summary.ops.write_timesteps(RNN_LAYER, tf.constant(norms), step=step, index=w.indices[RNN_LAYER])
                put(w.timesteps, (run, RNN_LAYER), step, norms)
        writer.close()
    return w


BIG_STEPS = 1000
BIG_LAYERS = ("net/first", "net/second")
BIG_NAN_STEP = 777


def write_big_logdir(logdir: str, steps: int = BIG_STEPS) -> None:
    """One run, two layers, `steps` steps; layer 0 has a NaN at BIG_NAN_STEP. Fast: one tf.function."""
    import tensorflow as tf

    from tb_layergrad import summary

    writer = tf.summary.create_file_writer(os.path.join(logdir, "long"), max_queue=1000, flush_millis=60_000)

    @tf.function
    def write_all() -> None:
        with writer.as_default():
            for step in tf.range(steps, dtype=tf.int64):
                for i, name in enumerate(BIG_LAYERS):
                    x = tf.fill([3, 4], tf.cast(step, tf.float32) + float(i))
                    if i == 0:
                        x = tf.where(tf.equal(step, BIG_NAN_STEP), x * float("nan"), x)
                    summary.ops.write_tensor(name, x, step=step, buckets=4, index=i)

    write_all()
    writer.close()


def big_expected_norm(layer_i: int, step: int) -> float:
    return float(np.sqrt(12.0) * (step + layer_i))


def as_float(values: List[Optional[float]]) -> np.ndarray:
    """JSON numbers (None for null) as a float array with NaN."""
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


# -- in-process TensorBoard ---------------------------------------------------------------------

FUTURE_RUN = "future"  # holds only a series of format version 2: skipped with a warning


def write_future_series(logdir: str) -> None:
    """A series written by a (pretend) newer tb_layergrad: the plugin must skip it, not crash."""
    import json

    import tensorflow as tf
    from tensorboard.compat.proto import summary_pb2

    content = json.dumps(
        {
            "layer": "model/new",
            "kind": "stats",
            "target": "loss",
            "source": "output",
            "index": 0,
            "dtype": "float32",
            "version": metadata.FORMAT_VERSION + 1,
        }
    ).encode()
    md = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
    writer = tf.summary.create_file_writer(os.path.join(logdir, FUTURE_RUN))
    with writer.as_default():
        tf.summary.write("loss/output/model/new/stats", tf.zeros([12], tf.float64), step=0, metadata=md)
    writer.close()


class RecordingProvider:
    """Wraps a data provider; records every list/read call (experiment id, filter)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: List[Tuple[str, str, Optional[frozenset], Optional[frozenset]]] = []

    def _record(self, name: str, experiment_id: str, run_tag_filter) -> None:
        runs = tags = None
        if run_tag_filter is not None:
            runs = None if run_tag_filter.runs is None else frozenset(run_tag_filter.runs)
            tags = None if run_tag_filter.tags is None else frozenset(run_tag_filter.tags)
        self.calls.append((name, experiment_id, runs, tags))

    def list_tensors(self, ctx=None, *, experiment_id, plugin_name, run_tag_filter=None):
        self._record("list_tensors", experiment_id, run_tag_filter)
        return self.inner.list_tensors(
            ctx, experiment_id=experiment_id, plugin_name=plugin_name, run_tag_filter=run_tag_filter
        )

    def read_tensors(self, ctx=None, *, experiment_id, plugin_name, downsample=None, run_tag_filter=None):
        self._record("read_tensors", experiment_id, run_tag_filter)
        return self.inner.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=plugin_name,
            downsample=downsample,
            run_tag_filter=run_tag_filter,
        )

    def __getattr__(self, name):
        found = getattr(self.inner, name)
        if name != "read_tensors_since":
            return found

        def read_since(ctx, experiment_id, run, since):
            """The plugin's own reading of new records (`record_index.LocalProvider`): a read of those tags."""
            self._record("read_tensors", experiment_id, tb_provider.RunTagFilter(runs=[run], tags=list(since)))
            return found(ctx, experiment_id, run, since)

        return read_since


class InProcess:
    """TensorBoardWSGI with only the layergrad plugin, over a MultiplexerDataProvider."""

    def __init__(
        self, logdir: str, path_prefix: str = "", frontend_root=None, keep: int = 0, read_ahead: bool = False
    ) -> None:
        """`keep`: records TensorBoard keeps per series (0: all), as `--samples_per_plugin=layergrad=<keep>`.
        `read_ahead`: the plugin reads the statistics in the background (`plugin.prefetch`), as TensorBoard's does."""
        from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

        from tb_layergrad.reader.record_index import LocalProvider

        self.logdir = logdir
        self._keep = keep
        self.multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: keep})
        self.multiplexer.AddRunsFromDirectory(logdir)
        self.multiplexer.Reload()
        provider = data_provider.MultiplexerDataProvider(self.multiplexer, logdir)
        if not keep:  # as the plugin reads a local logdir by default: its own series from the event files
            provider = LocalProvider(provider, logdir)
        self.provider = RecordingProvider(provider)
        self.prefix = path_prefix
        self._plugin_options = {"frontend_root": frontend_root, "read_ahead": read_ahead}
        self._serve()

    def _serve(self) -> None:
        """A new plugin over the same data provider, served as TensorBoard serves it."""
        from tensorboard.backend import application
        from tensorboard.plugins import base_plugin
        from werkzeug import test as wtest

        from tb_layergrad.plugin.loader import LayerGradPlugin

        # As TensorBoard's flags after the loader's `fix_flags`: a `keep` of the user's; else none (the plugin
        # reads the local event files, `reader.record_index`).
        flags = argparse.Namespace(samples_per_plugin={metadata.PLUGIN_NAME: self._keep}) if self._keep else None
        context = base_plugin.TBContext(logdir=self.logdir, data_provider=self.provider, flags=flags)
        self.plugin = LayerGradPlugin(context, **self._plugin_options)
        self.app = application.TensorBoardWSGI([self.plugin], data_provider=self.provider, path_prefix=self.prefix)
        self.client = wtest.Client(self.app)

    def forget_stats(self) -> None:
        """Drop what the plugin remembers (its stats tables, `reader.stats_store`), so the next route reads: a new
        plugin over the same data, as a restarted TensorBoard has."""
        self._serve()

    def reload(self) -> None:
        self.multiplexer.AddRunsFromDirectory(self.logdir)
        self.multiplexer.Reload()

    def get(self, route: str, query=None, prefix: str = "/data/plugin/layergrad/"):
        return self.client.get(self.prefix + prefix + route, query_string=query)


def strict_json(body: bytes):
    """Parse JSON, failing on NaN/Infinity literals (which JSON.parse would reject)."""
    import json

    def reject(literal):
        raise AssertionError(f"non-standard JSON literal {literal} in the body")

    return json.loads(body, parse_constant=reject)


# -- fixtures (import them into a test module to use them) --------------------------------------


@pytest.fixture(scope="session")
def small_logdir(tmp_path_factory) -> Written:
    """The small logdir, written once per session and shared by the plugin test modules."""
    logdir = str(tmp_path_factory.mktemp("layergrad_small"))
    written = write_small_logdir(logdir)
    write_future_series(logdir)
    return written


def get_json(tb: "InProcess", route: str, query: dict, status: int = 200):
    """A route's strict JSON answer, its status checked."""
    r = tb.get(route, query)
    assert r.status_code == status, r.data[:300]
    return strict_json(r.data)


# -- format version 2: the same data, grouped (docs/FORMAT.md) ------------------------------------

Record = Tuple[int, str, "metadata.SeriesInfo", np.ndarray]  # (step, tag, info, tensor)


def read_run_records(run_dir: str) -> List[Record]:
    """Every layergrad record of a run directory as version 1 lays them out (a record per layer, kind and step),
    in file order, its info from the tag's metadata: the writer's version-2 records are cut into their rows,
    a histogram's edges put back from its row's stats (`metadata.histogram_edges`, as every reader does)."""
    import glob

    import tensorflow as tf

    infos: Dict[str, metadata.Info] = {}
    read: List[Tuple[int, str, metadata.Info, np.ndarray]] = []
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("metadata") and value.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME:
                    infos.setdefault(value.tag, metadata.parse_plugin_content(value.metadata.plugin_data.content))
                if value.tag in infos:
                    read.append((int(event.step), value.tag, infos[value.tag], tf.make_ndarray(value.tensor)))
    stats = {
        (step, m.target, m.source, m.layer): row
        for step, _, info, value in read
        if isinstance(info, metadata.GroupInfo) and info.kind == metadata.KIND_STATS
        for m, row in zip(info.members(), value)
    }
    out: List[Record] = []
    for step, tag, info, value in read:
        if not isinstance(info, metadata.GroupInfo):
            out.append((step, tag, info, value))
            continue
        for m, row in zip(info.members(), value):
            layer = dataclasses.replace(m, version=metadata.LAYER_RECORD_VERSION)
            if info.kind == metadata.KIND_HISTOGRAM:
                st = stats[(step, m.target, m.source, m.layer)]
                left, right = metadata.histogram_edges(
                    st[metadata.STAT_INDEX["min"]], st[metadata.STAT_INDEX["max"]], row.size
                )
                row = np.stack([left, right, row.astype(np.float64)], axis=1)
            elif info.kind == metadata.KIND_FIRST_NONFINITE:
                if row < 0:
                    continue
                row = np.asarray([row], np.int64)
            out.append((step, layer.tag, layer, row))
    return out


def first_nonfinite_records(records: List[Record]) -> List[Record]:
    """`first_nonfinite` records (docs/FORMAT.md) of the stats series that go non-finite, from that step on;
    the value names one step earlier than the stats show (a stats record dropped by sampling), so that
    a reader that ignores the records gives another answer."""
    first: Dict[str, int] = {}
    out: List[Record] = []
    for step, tag, info, value in sorted(records, key=lambda r: r[0]):
        if info.kind != metadata.KIND_STATS:
            continue
        if tag not in first and np.asarray(value)[1:4].sum() > 0:
            first[tag] = max(step - 1, 0)
        if tag in first:
            f = dataclasses.replace(info, kind=metadata.KIND_FIRST_NONFINITE)
            out.append((step, f.tag, f, np.asarray([first[tag]], np.int64)))
    return out


def _layer_rank(info: "metadata.SeriesInfo") -> Tuple[bool, int, str]:
    return (info.index < 0, info.index, info.layer)


def grouped_records(
    records: List[Record],
    reorder_at: Optional[int] = None,
    drop: Optional[Tuple[str, int]] = None,
    block_steps: Optional[int] = None,
) -> List[Tuple[int, str, object, np.ndarray]]:
    """The records as version 2 writes them: per step, one record per (target, source, grouped kind) for all
    its layers (model order; reversed from step `reorder_at` on: a rebuilt model, another tag); `tensor` and
    `timesteps` records unchanged. `drop=(layer, step)`: the layer is left out of the layer list before `step`.
    Histograms keep their counts only, in the narrowest unsigned type; `first_nonfinite` is -1 for a layer
    with no record at that step. `block_steps`: blocks of that many steps (a power of two), not as the layer
    count sets them, for several blocks in few steps."""
    by_group: Dict[Tuple[int, str, str, str], Dict[str, Tuple["metadata.SeriesInfo", np.ndarray]]] = {}
    out: List[Tuple[int, str, object, np.ndarray]] = []
    for step, tag, info, value in records:
        if info.kind in metadata.GROUPED_KINDS:
            by_group.setdefault((step, info.target, info.source, info.kind), {})[info.layer] = (info, value)
        else:
            out.append((step, tag, info, value))
    stats_layers: Dict[Tuple[int, str, str], List["metadata.SeriesInfo"]] = {}
    for (step, target, source, kind), rows in sorted(by_group.items(), key=lambda kv: kv[0][3] != metadata.KIND_STATS):
        if kind == metadata.KIND_STATS:
            members = sorted((i for i, _ in rows.values()), key=_layer_rank)
            if drop is not None and step < drop[1]:
                members = [m for m in members if m.layer != drop[0]]
            if reorder_at is not None and step >= reorder_at:
                members = members[::-1]
            stats_layers[(step, target, source)] = members
        members = stats_layers[(step, target, source)]
        group = metadata.GroupInfo.of(kind, members)
        if block_steps is not None:
            group = dataclasses.replace(group, block_steps=block_steps)
        if kind == metadata.KIND_STATS:
            tensor = np.stack([rows[m.layer][1] for m in members]).astype(np.float64)
        elif kind == metadata.KIND_HISTOGRAM:
            counts = np.stack([rows[m.layer][1][:, 2] for m in members]).round()
            tensor = counts.astype(metadata.count_dtype(int(counts.max())))
        else:
            tensor = np.asarray([rows[m.layer][1][0] if m.layer in rows else -1 for m in members], np.int64)
        out.append((step, group.tag_at(step), group, tensor))
    return sorted(out, key=lambda r: r[0])  # stable: a step's records keep their order


def write_records(run_dir: str, records, metadata_once: bool = True) -> None:
    """Write records with `tf.summary.write`; the metadata only with a tag's first record (as TensorBoard
    keeps the first it sees, and as the version-2 writer does) unless `metadata_once` is False."""
    import tensorflow as tf

    seen = set()
    writer = tf.summary.create_file_writer(run_dir, max_queue=10_000, flush_millis=60_000)
    with writer.as_default():
        for step, tag, info, value in records:
            md = None
            if tag not in seen or not metadata_once:
                md = (
                    metadata.create_group_metadata(info)
                    if isinstance(info, metadata.GroupInfo)
                    else metadata.create_summary_metadata(info)
                )
                seen.add(tag)
            tf.summary.write(tag, tf.constant(value), step=step, metadata=md)
    writer.close()


def write_twin_runs(src_run_dir: str, logdir: str, run: str, reorder_at: Optional[int] = None) -> Tuple[str, str]:
    """Runs `run` (version 1) and `run_v2` (the same numbers as version 2) in `logdir`, from a run the writer
    wrote (`read_run_records`); both with `first_nonfinite` records. Returns their names."""
    records = read_run_records(src_run_dir)
    records = records + first_nonfinite_records(records)
    records.sort(key=lambda r: r[0])
    v2 = f"{run}_v2"
    write_records(os.path.join(logdir, run), records)
    write_records(os.path.join(logdir, v2), grouped_records(records, reorder_at))
    return run, v2
