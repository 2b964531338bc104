"""A layer's points of one kind, whatever format version wrote them: the one reading function.

Every reader (the routes, `report`, `load()`, `origin`, `run_anomalies`) asks here, so that a run
written in version 1, in version 2 or in both reads the same. A series' `parts` (`catalog.Part`)
say where its records are: a version-1 tag of its own, or its row of version-2 group tags. The
points of all parts are united by step (the later wall time wins at a repeated step).

An `examples` record (version 2 only) is read as the layer's row in `metadata.EXAMPLE_FIELDS` order,
its columns mapped by the content's `fields` names (`by_name`).

Version 2 (docs/FORMAT.md): a group's `histogram` record holds counts only; the [k, 3] (left,
right, count) layout of version 1 is rebuilt from the same step's `stats` (min, max) of the same
layer (`metadata.histogram_edges`), and a step without stats is skipped. A `first_nonfinite`
group record holds one int64 per layer, read as a version-1 record of one element.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata
from tb_layergrad.reader import block_cache, catalog, series
from tb_layergrad.reader.run_source import RunSource
from tb_layergrad.reader.stats_store import StatsRows


def read_points(
    src: RunSource,
    chosen: Sequence[catalog.Series],
    start: Optional[int] = None,
    end: Optional[int] = None,
    max_steps: Optional[int] = None,
) -> Dict[catalog.SeriesKey, series.Points]:
    """`{series key: Points}` of `chosen` (series of run `src.rc`) within [start, end], in version-1 layouts.

    Stats, and the edges of version-2 histograms, come from `src.store`; `src.rc` must list the layers'
    `stats` series when version-2 histograms are asked for. `max_steps`: at most that many steps of each
    series other than `stats`, evenly spread (`series.thin`). Group blocks `src.blocks` holds as listed
    are not read again.
    """
    rc, experiment_id, blocks = src.rc, src.experiment_id, src.blocks
    out: Dict[catalog.SeriesKey, series.Points] = {}
    stats = [s for s in chosen if s.info.kind == metadata.KIND_STATS]
    for key, rows in src.stats(stats, start, end).items():
        out[key] = series.Points(rows.steps, rows.wall_times, list(rows.table))
    others = [s for s in chosen if s.info.kind != metadata.KIND_STATS]
    if not others:
        return out
    found = {}  # a group block's fitting records, whole: from the cache, or read below
    claimed = []  # blocks this thread reads (`BlockCache.claim`), claimed in the order of their tags
    grouped = {p.tag: p for s in others for p in s.parts if p.grouped} if blocks is not None else {}
    try:
        for tag in sorted(grouped):
            p = grouped[tag]
            found[tag] = blocks.get(experiment_id, rc.run, p)
            if found[tag] is None:
                kept_block = blocks.claim(experiment_id, rc.run, p)
                if kept_block is None:
                    claimed.append(p)
                else:
                    found[tag], as_listed = kept_block
                    src.behind = src.behind or not as_listed
        kept = {t: v for t, v in found.items() if v is not None}
        _read_others(src, others, kept, out, start, end, max_steps)
    finally:
        for p in claimed:
            blocks.release(experiment_id, rc.run, p)
    return out


def _read_others(
    src: RunSource,
    others: Sequence[catalog.Series],
    kept: Dict[str, series.Points],
    out: Dict[catalog.SeriesKey, series.Points],
    start: Optional[int],
    end: Optional[int],
    max_steps: Optional[int],
) -> None:
    """`read_points` of the series other than `stats`: the group blocks not `kept` are read, then every series
    selected and laid out into `out`."""
    rc, experiment_id, blocks = src.rc, src.experiment_id, src.blocks
    parts = {p.tag: (s.info.kind, p) for s in others for p in s.parts if p.grouped and p.tag not in kept}
    positions = _grown(src, parts, kept)
    data = series.read(
        src.provider,
        src.ctx,
        experiment_id,
        rc.run,
        [t for s in others for t in s.tags if t not in kept],
        alone=[p.tag for s in others for p in s.parts if p.grouped and p.tag not in kept],
    )
    edges = _edge_rows(src, others)
    groups: Dict[str, series.Points] = {}  # a group tag's records within [start, end], selected once for all its layers
    for s in others:
        selected = []
        for p in s.parts:
            if p.grouped and p.tag not in groups:
                if p.tag not in kept:
                    kept[p.tag] = _group_points(s.info.kind, p, data.get(p.tag, ()), rc.run)
                    if blocks is not None:
                        blocks.put(experiment_id, rc.run, p, kept[p.tag])
                elif p.tag in positions and blocks is not None:
                    blocks.put(experiment_id, rc.run, p, kept[p.tag], *positions[p.tag])
                groups[p.tag] = _between(kept[p.tag], start, end)
            selected.append(groups[p.tag] if p.grouped else series.select(data.get(p.tag, ()), start, end))
        selected = _thinned_together(selected, max_steps)
        out[s.key] = united([_part_points(s.info.kind, p, pts, edges.get(s.key)) for p, pts in zip(s.parts, selected)])


def _grown(
    src: RunSource, parts: Dict[str, Tuple[str, catalog.Part]], kept: Dict[str, series.Points]
) -> Dict[str, Tuple[tuple, Optional[int]]]:
    """Group blocks changed since `src.blocks` kept them, continued from where their read stopped when the provider
    can (`series.read_since`): the block as kept with its new records after it, into `kept`; the positions the
    reads stopped at (a block read whole that way too), each with the block's bytes where known (`BlockCache.put`). Why: the last block of a run being written grows at every
    step, and reading it whole at each change is work in proportion to the run. The same points as a whole read:
    new records are appended only when all their steps follow the kept ones, else the block is read whole."""
    blocks, run = src.blocks, src.rc.run
    if blocks is None or not parts:
        return {}
    before = {t: blocks.kept(src.experiment_id, run, p) for t, (_, p) in parts.items()}
    read = series.read_since(
        src.provider, src.ctx, src.experiment_id, run, {t: (b[1] if b else None) for t, b in before.items()}
    )
    if read is None:
        return {}
    out = {}
    for t, (kind, p) in parts.items():
        position, whole, records = read.get(t, (None, True, ()))
        new = _group_points(kind, p, records, run)
        size = None
        if whole:
            kept[t] = new
        else:
            old, _, old_size = before[t]
            if len(new) and len(old) and int(new.steps[0]) <= int(old.steps[-1]):
                continue  # a step written again (a restarted run): read whole below
            kept[t] = series.Points(
                np.concatenate([old.steps, new.steps]),
                np.concatenate([old.wall_times, new.wall_times]),
                [*old.values, *new.values],
            )
            size = old_size + block_cache.nbytes(new)
        if position is not None:
            out[t] = (position, size)
    return out


def _thinned_together(parts: List[series.Points], max_steps: Optional[int]) -> List[series.Points]:
    """Each part keeping only the steps `series.thin` keeps of their union: thinned before their rows are cut
    out and laid out (a chart of 60 histograms builds 60, not 5,000), to the steps thinning the united series
    would keep. Parts one after another (a layer's blocks) are thinned by position, without sorting their union:
    the work of the steps kept, not of the run."""
    if max_steps is None:
        return parts
    sizes = [len(p) for p in parts]
    filled = [p for p in parts if len(p)]
    if all(int(a.steps[-1]) < int(b.steps[0]) for a, b in zip(filled, filled[1:])):  # the union: one after another
        if sum(sizes) <= max_steps:
            return parts
        at = series.pick_evenly(sum(sizes), max_steps)
        starts = np.cumsum([0, *sizes])
        picks = [at[(at >= lo) & (at < hi)] - lo for lo, hi in zip(starts[:-1], starts[1:])]
    else:
        steps = np.unique(np.concatenate([p.steps for p in parts])) if parts else np.zeros([0], np.int64)
        if steps.size <= max_steps:
            return parts
        keep = steps[series.pick_evenly(steps.size, max_steps)]
        picks = [np.flatnonzero(np.isin(p.steps, keep)) for p in parts]
    return [series.Points(p.steps[idx], p.wall_times[idx], [p.values[i] for i in idx]) for p, idx in zip(parts, picks)]


def read_one(
    src: RunSource,
    s: catalog.Series,
    start: Optional[int] = None,
    end: Optional[int] = None,
    max_steps: Optional[int] = None,
) -> series.Points:
    """`read_points` of one series, at most `max_steps` of its steps (evenly spread; None: all)."""
    return series.thin(read_points(src, [s], start, end, max_steps)[s.key], max_steps)


def latest(src: RunSource, s: catalog.Series, step: Optional[int], last_records: Any = None) -> series.Points:
    """The record of series `s` (not `stats`) at the latest step at or before `step` (None: its last), in the
    version-1 layout: of the records read, only that one is decoded, and a group block is read whole only from
    `src.blocks` (a sweep's blocks, one per run, would not fit it: asking for one step must not evict them).
    `last_records(run, tags, step)`: each tag's records at its latest step at or before `step`, where the caller
    finds them without the provider reading a tag whole (`lookups.Reading.latest_records`: the record index of a
    local logdir, the multiplexer of the Python loader); None from it: the provider's sample of one for a tag ending
    at or before `step`, each other tag read whole."""
    found: List[Tuple[int, float, catalog.Part, series.Points]] = []  # (step, wall time, part, its one point)
    unread = []
    for p in s.parts:
        cached = src.blocks.get(src.experiment_id, src.rc.run, p) if p.grouped and src.blocks is not None else None
        if cached is None:
            unread.append(p)
            continue
        pts = _between(cached, None, step)
        if len(pts):
            k = len(pts) - 1
            one = series.Points(pts.steps[k:], pts.wall_times[k:], pts.values[k:])
            found.append((int(pts.steps[k]), float(pts.wall_times[k]), p, one))
    tags = [p.tag for p in unread]
    data = last_records(src.rc.run, tags, step) if last_records is not None and tags else None
    if data is None:
        data = _latest_from_provider(src, unread, step)
    for p in unread:
        records = [d for d in data.get(p.tag, ()) if step is None or d.step <= step]
        if not records:
            continue
        last = max(int(d.step) for d in records)
        at = [d for d in records if int(d.step) == last]  # a repeated step: the later record wins (`select`)
        one = _group_points(s.info.kind, p, at, src.rc.run) if p.grouped else series.select(at)
        if len(one):
            found.append((int(one.steps[-1]), float(one.wall_times[-1]), p, one))
    if not found:
        return series.EMPTY
    _, _, p, one = max(found, key=lambda f: (f[0], f[1]))
    return _part_points(s.info.kind, p, one, _edge_rows(src, [s]).get(s.key))


def _latest_from_provider(src: RunSource, parts: Sequence[catalog.Part], step: Optional[int]) -> Dict[str, Sequence]:
    """`{tag: records}` holding each part's latest record at or before `step`, from the provider: a tag ending at
    or before `step` (as its listing says) by its sample of one, any other tag whole."""
    tail = [p for p in parts if step is None or (p.max_step is not None and p.max_step <= step)]
    whole = [p for p in parts if p not in tail]
    data = dict(
        series.read(
            src.provider,
            src.ctx,
            src.experiment_id,
            src.rc.run,
            [p.tag for p in whole],
            alone=[p.tag for p in whole if p.grouped],
        )
    )
    data.update(series.read_last(src.provider, src.ctx, src.experiment_id, src.rc.run, [p.tag for p in tail]))
    return data


def united(parts: Sequence[series.Points]) -> series.Points:
    """The points of several parts as one series: by step, the later wall time wins."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return series.EMPTY
    if len(parts) == 1:
        return parts[0]
    steps = np.concatenate([p.steps for p in parts])
    walls = np.concatenate([p.wall_times for p in parts])
    values = [v for p in parts for v in p.values]
    order = np.lexsort((walls, steps))
    last = np.append(steps[order][1:] != steps[order][:-1], True)
    keep = order[last]
    return series.Points(steps[keep], walls[keep], [values[i] for i in keep])


def _edge_rows(src: RunSource, others: Sequence[catalog.Series]) -> Dict[catalog.SeriesKey, StatsRows]:
    """The stats rows of the layers whose version-2 histograms need edges (min, max at each step)."""
    need = {}
    for s in others:
        if s.info.kind == metadata.KIND_HISTOGRAM and any(p.grouped for p in s.parts):
            i = s.info
            found = src.rc.find(i.layer, i.target, i.source, metadata.KIND_STATS)
            if found is not None:
                need[s.key] = found
    if not need:
        return {}
    rows = src.stats(list(need.values()))
    return {key: rows[stats.key] for key, stats in need.items()}


def _group_points(kind: str, part: catalog.Part, data: Sequence[tb_provider.TensorDatum], run: str) -> series.Points:
    """A group tag's records, those whose shape disagrees with its layer list skipped."""
    if kind == metadata.KIND_HISTOGRAM:
        shape = (part.rows, None)
    elif kind == metadata.KIND_EXAMPLES:
        shape = (part.rows, len(part.fields))
    else:
        shape = (part.rows,)
    return series.select_fitting(data, part.tag, run, shape)


def _between(points: series.Points, start: Optional[int], end: Optional[int]) -> series.Points:
    """The points with start <= step <= end (None: unbounded); the same object when all are."""
    lo = 0 if start is None else int(np.searchsorted(points.steps, start, side="left"))
    hi = len(points) if end is None else int(np.searchsorted(points.steps, end, side="right"))
    if lo == 0 and hi == len(points):
        return points
    return series.Points(points.steps[lo:hi], points.wall_times[lo:hi], points.values[lo:hi])


def _part_points(kind: str, part: catalog.Part, points: series.Points, stats: Optional[StatsRows]) -> series.Points:
    """One part's points (selected) in the version-1 layout of the kind: a group's row sliced out."""
    if not part.grouped:
        return points
    rows = [np.asarray(v)[part.row] for v in points.values]
    if kind == metadata.KIND_FIRST_NONFINITE:
        return series.Points(points.steps, points.wall_times, [np.asarray(r, np.int64).reshape(1) for r in rows])
    if kind == metadata.KIND_HISTOGRAM:
        return _histograms(points, rows, stats)
    if kind == metadata.KIND_EXAMPLES:
        return series.Points(points.steps, points.wall_times, [by_name(r, part.fields) for r in rows])
    return series.Points(points.steps, points.wall_times, rows)


def by_name(row: np.ndarray, fields: Sequence[str]) -> np.ndarray:
    """An `examples` row in EXAMPLE_FIELDS order, its columns mapped by the content's `fields` names:
    an unknown name ignored, a known one that is absent NaN (docs/FORMAT.md, as for `stats`)."""
    row = np.asarray(row, dtype=np.float64).reshape(-1)
    if tuple(fields) == metadata.EXAMPLE_FIELDS:
        return row
    out = np.full(len(metadata.EXAMPLE_FIELDS), np.nan)
    for j, name in enumerate(fields):
        at = metadata.EXAMPLE_INDEX.get(name)
        if at is not None and j < row.shape[0]:
            out[at] = row[j]
    return out


def _histograms(points: series.Points, counts: List[np.ndarray], stats: Optional[StatsRows]) -> series.Points:
    """Version-2 counts as [k, 3] (left, right, count), edges from the same step's min and max;
    a step without a stats record is skipped."""
    if stats is None or not len(stats):
        return series.EMPTY
    lo, hi = stats.column("min"), stats.column("max")
    keep, values = [], []
    for i, (step, c) in enumerate(zip(points.steps, counts)):
        at = int(np.searchsorted(stats.steps, step))
        if at >= len(stats) or stats.steps[at] != step:
            continue
        left, right = metadata.histogram_edges(float(lo[at]), float(hi[at]), int(c.shape[0]))
        values.append(np.stack([np.asarray(left), np.asarray(right), c.astype(np.float64)], axis=1))
        keep.append(i)
    idx = np.asarray(keep, dtype=np.int64)
    return series.Points(points.steps[idx], points.wall_times[idx], values)


def without_clean_running_records(
    data_provider: tb_provider.DataProvider, ctx: object, experiment_id: str, cat: catalog.Catalog
) -> catalog.Catalog:
    """The catalog without the `first_nonfinite` series that exist only as version-2 rows of -1.

    Why: a version-1 `first_nonfinite` series exists only once its layer held a NaN/Inf, and the
    `runs` route lists it as such (docs/HTTP_API.md); a version-2 group has a row for every layer,
    -1 until then. The running value never returns to -1, so the last record of each group tag
    (which TensorBoard always keeps, and `downsample=1` returns) tells: one record per tag is read.
    """
    grouped = {
        p.tag
        for rc in cat.runs.values()
        for s in rc.series
        if s.info.kind == metadata.KIND_FIRST_NONFINITE
        for p in s.parts
        if p.grouped
    }
    if not grouped:
        return cat
    last = data_provider.read_tensors(
        ctx,
        experiment_id=experiment_id,
        plugin_name=metadata.PLUGIN_NAME,
        downsample=1,
        run_tag_filter=tb_provider.RunTagFilter(runs=sorted(cat.runs), tags=sorted(grouped)),
    )
    runs = {}
    for name, rc in cat.runs.items():
        data = last.get(name, {})
        kept = [s for s in rc.series if s.info.kind != metadata.KIND_FIRST_NONFINITE or _flagged(s, data, name)]
        runs[name] = rc if len(kept) == len(rc.series) else catalog.RunCatalog(name, kept)
    return catalog.Catalog(runs, cat.warnings)


def _flagged(s: catalog.Series, last: Dict[str, Sequence[tb_provider.TensorDatum]], run: str) -> bool:
    """Whether a first_nonfinite series names a step: a version-1 part, or a group row >= 0 in its last record."""
    for p in s.parts:
        if not p.grouped:
            return True
        for datum in last.get(p.tag, ())[-1:]:
            if series.fits(datum, p.tag, run, (p.rows,)) and int(np.asarray(datum.numpy)[p.row]) >= 0:
                return True
    return False
