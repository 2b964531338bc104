"""The answers of the one-layer routes (`stats`, `histograms`, `tensor`, `timesteps`, `examples`): read, then shape.

Each `*_impl` takes the plugin's `Reading`, the request's context and experiment, and a validated
query (`queries.LayerQuery`); it returns the JSON body (docs/HTTP_API.md) as a dict, or encoded already where
the body is kept per change of the run (`lookups.AnswerCache`), or raises a `tensorboard.errors` 404 naming what is
missing.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from tensorboard import errors

from tb_layergrad import metadata
from tb_layergrad.plugin import binned, example_bodies
from tb_layergrad.plugin.lookups import Reading
from tb_layergrad.plugin.queries import LayerQuery
from tb_layergrad.plugin.responses import EncodedBody, count_list, finite_or_none, float_list, float_matrix
from tb_layergrad.reader import catalog, downsample, examples, layer_points, series
from tb_layergrad.reader.catalog import quote
from tb_layergrad.reader.run_source import RunSource
from tb_layergrad.reader.stats_store import StatsRows


def stat_values(values: np.ndarray, stat: str) -> list:
    """A column of one statistic for the wire: counts as integers, NaN/Inf as null."""
    return count_list(values) if stat in series.COUNT_STATS else float_list(values)


def int_list(steps: np.ndarray) -> list:
    return [int(s) for s in steps]


def stats_impl(reading: Reading, ctx: object, eid: str, q: LayerQuery) -> EncodedBody:
    """Every statistic of one layer per step; binned to `q.points` when the range holds more steps."""
    s, src = reading.one_series(ctx, eid, q.run, q.layer, q.target, q.source, metadata.KIND_STATS)

    def compute() -> dict:
        return _stats_body(reading, eid, q, s, src)

    # Once per change of the layer's series, whoever asks (`AnswerCache`): the body is of its records alone.
    return reading.answers.answer((eid, "stats", q), src, compute)


def _stats_body(reading: Reading, eid: str, q: LayerQuery, s: catalog.Series, src: RunSource) -> dict:
    rows = src.stats([s], q.start, q.end)[s.key]
    head = {**q.head(), "index": s.info.index, "dtype": s.info.dtype}
    if binned.needed(q.points, rows.steps):
        if q.start is None and q.end is None:  # the whole run: its bins appended to
            got = _pyramid_stats(reading, eid, q, s, src, rows)
            if got is not None:
                return {**head, **got}
        whole = rows if q.start is None and q.end is None else src.stats([s])[s.key]  # the rules see the whole run
        flags, _ = downsample.run_flags([(whole.steps, whole.table)], rows.steps)
        return {**head, **binned.stats_body(rows.steps, rows.wall_times, rows.table, flags, q.points, q.start, q.end)}
    rows = rows.thinned(None if q.points else q.max_steps)
    return {
        **head,
        **({"binned": False} if q.points else {}),
        "steps": int_list(rows.steps),
        "wall_times": float_list(rows.wall_times),
        "stats": {name: stat_values(rows.column(name), name) for name in series.ALL_STATS},
    }


def _pyramid_stats(
    reading: Reading, eid: str, q: LayerQuery, s: catalog.Series, src: RunSource, rows: StatsRows
) -> Optional[dict]:
    """The binned `stats` of a whole run from its power-of-two bins kept and appended to (`reader.bin_pyramid`), the
    layer's own flags extended by its new steps (`rule_fold`, the layer alone): the body `binned.stats_body` gives,
    at a cost of the run's new steps; None where those cannot answer it."""
    if src.folds is None:
        return None
    key = (eid, q.run, q.target, q.source, s.info.layer)
    alone = src.folds.evaluate(
        (*key, "alone"),
        [s.info.layer],
        [rows],
        run=q.run,
        target=q.target,
        source=q.source,
        indices=[s.info.index],
        running_first_steps=[None],
        timesteps=None,
        target_rows=None,
    )
    if alone is None or alone.steps.size != len(rows):
        return None
    got = reading.bins.binned_stats(key, rows, series.ALL_STATS, alone.flags, q.points)
    if got is None:
        return None
    b, kept = got
    return binned.binned_stats(b, rows.steps, rows.wall_times, q.points, kept.values, kept.flags[:1])


def histograms_impl(reading: Reading, ctx: object, eid: str, q: LayerQuery) -> EncodedBody:
    """One layer's histograms as [k, 3] rows of (left, right, count) per step."""
    s, src = reading.one_series(ctx, eid, q.run, q.layer, q.target, q.source, metadata.KIND_HISTOGRAM)

    def compute() -> dict:
        points = layer_points.read_one(src, s, q.start, q.end, q.max_steps)
        hists = []
        for value in points.values:
            arr = np.asarray(value, dtype=np.float64)
            hists.append(float_matrix(arr.reshape(-1, 3)) if arr.size % 3 == 0 and arr.size else [])
        return {
            **q.head(),
            "steps": int_list(points.steps),
            "wall_times": float_list(points.wall_times),
            "histograms": hists,
        }

    # As `stats`: once per change of the layer's series (its tags are all `src.rc` lists), whoever asks.
    return reading.answers.answer((eid, "histograms", q), src, compute)


def tensor_impl(reading: Reading, ctx: object, eid: str, q: LayerQuery) -> dict:
    """One layer's whole recorded value at `q.step` (default: the last), as a matrix, with its NaN/Inf cells."""
    s, src = reading.one_series(ctx, eid, q.run, q.layer, q.target, q.source, metadata.KIND_TENSOR)
    points = layer_points.read_one(src, s)
    if not len(points):
        raise errors.NotFoundError(f"no tensor records for layer {quote(s.info.layer)} yet")
    i = len(points) - 1 if q.step is None else int(np.searchsorted(points.steps, q.step))
    if i >= len(points) or (q.step is not None and int(points.steps[i]) != q.step):
        raise errors.NotFoundError(f"no tensor record at step {q.step} for layer {quote(s.info.layer)}")
    arr = np.asarray(points.values[i], dtype=np.float64)
    if arr.ndim != 2:
        arr = arr.reshape(1, -1) if arr.ndim < 2 else arr.reshape(arr.shape[0], -1)
    finite = np.isfinite(arr)
    nonfinite = [
        [int(r), int(c), "nan" if np.isnan(arr[r, c]) else ("+inf" if arr[r, c] > 0 else "-inf")]
        for r, c in np.argwhere(~finite)
    ]
    return {
        **q.head(),
        "step": int(points.steps[i]),
        "wall_time": finite_or_none(points.wall_times[i]),
        "shape": [int(d) for d in arr.shape],
        "values": float_matrix(arr),
        "nonfinite": nonfinite,
        "min": float(arr[finite].min()) if finite.any() else None,
        "max": float(arr[finite].max()) if finite.any() else None,
        "steps": int_list(points.steps),
    }


def timesteps_impl(reading: Reading, ctx: object, eid: str, q: LayerQuery) -> dict:
    """An RNN layer's gradient norm per timestep, per step (layer outputs only: no `source` echoed)."""
    s, src = reading.one_series(ctx, eid, q.run, q.layer, q.target, q.source, metadata.KIND_TIMESTEPS)
    points = layer_points.read_one(src, s, q.start, q.end, q.max_steps)
    return {
        "run": q.run,
        "layer": q.layer,
        "target": q.target,
        "steps": int_list(points.steps),
        "wall_times": float_list(points.wall_times),
        "norms": [float_list(np.asarray(v, dtype=np.float64).reshape(-1)) for v in points.values],
    }


def examples_impl(reading: Reading, ctx: object, eid: str, q: LayerQuery) -> dict:
    """One layer's per-example spread per step (binned with `q.points`), and the top positions at `q.step`."""
    s, src = reading.one_series(ctx, eid, q.run, q.layer, q.target, q.source, metadata.KIND_EXAMPLES)
    rows = examples.read(src, [s], q.start, q.end)[s.key]
    head = {**q.head(), "index": s.info.index, "dtype": s.info.dtype, "top_k": metadata.EXAMPLE_TOP_K}
    if q.step is not None:
        whole = rows if q.start is None and q.end is None else examples.read(src, [s])[s.key]
        row = whole.at(q.step)
        if row is None:
            raise errors.NotFoundError(f"no per-example record at step {q.step} for layer {quote(q.layer)}")
        at = example_bodies.at_body(q.step, row)
    else:
        at = example_bodies.at_body(int(rows.steps[-1]), rows.table[-1]) if len(rows) else None
    if binned.needed(q.points, rows.steps):
        body = example_bodies.binned_body(rows, q.points, q.start, q.end)
    else:
        body = {**({"binned": False} if q.points else {}), **example_bodies.spread_body(rows)}
    return {**head, **body, "at": at}
