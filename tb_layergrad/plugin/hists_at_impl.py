"""The answer of `histograms_at`: one layer's histogram in each of several runs at one step.

Why a route of its own: the compare view draws the histograms of every run it compares at the chosen step,
and one `histograms` request per run put a hundred requests (and their listings) between the overlay and
these outlines at a sweep's scale. Here the runs are listed in one catalog call, and each run's histogram is
read at that step only, or, where the run has no record there, at the latest step before it: one record per run,
found in the record index of a local logdir (`Reading.latest_records`), else read through TensorBoard's provider.
"""

from __future__ import annotations

import dataclasses
from concurrent import futures
from typing import Dict, List, Optional, Set

import numpy as np
from tensorboard import errors

from tb_layergrad import metadata
from tb_layergrad.plugin import listing
from tb_layergrad.plugin.lookups import Reading
from tb_layergrad.plugin.queries import HistogramsAtQuery
from tb_layergrad.plugin.responses import float_matrix
from tb_layergrad.reader import catalog, layer_points
from tb_layergrad.reader.catalog import quote

READERS = 8  # runs read at once


def _buckets(value: object) -> list:
    arr = np.asarray(value, dtype=np.float64)
    return float_matrix(arr.reshape(-1, 3)) if arr.size % 3 == 0 and arr.size else []


def near(s: catalog.Series, step: Optional[int]) -> catalog.Series:
    """`s` with only the parts that can hold its latest record at or before `step` (None: its last): of each
    version-2 group, the block of steps reaching `step` and the one before it (a block holds a range of steps,
    and `max_step` says where it ends); every version-1 part. A run of 1,000 steps reads 2 blocks, not all."""
    by_group: Dict[str, List[catalog.Part]] = {}
    keep = [p for p in s.parts if not p.grouped]
    for p in s.parts:
        if p.grouped:
            by_group.setdefault(p.group, []).append(p)
    for blocks in by_group.values():
        ends = sorted(blocks, key=lambda p: -1 if p.max_step is None else p.max_step)
        if step is None:
            keep.append(ends[-1])
            continue
        after = [p for p in ends if p.max_step is not None and p.max_step >= step]
        before = [p for p in ends if p.max_step is None or p.max_step < step]
        keep += after[:1] + before[-1:]
    return dataclasses.replace(s, parts=tuple(p for p in s.parts if p in keep))


def at_step(reading: Reading, ctx: object, eid: str, rc: catalog.RunCatalog, s: catalog.Series, step: Optional[int]):
    """(the step read, its buckets) of series `s`: at `step`, else the latest step before it (None: the last);
    (None, []) when the run has no record that early."""
    points = layer_points.latest(reading.source(ctx, eid, rc), near(s, step), step, reading.latest_records)
    if not len(points):
        return None, []
    return int(points.steps[-1]), _buckets(points.values[-1])


def histograms_at_impl(reading: Reading, ctx: object, eid: str, q: HistogramsAtQuery) -> dict:
    """Each run's histogram of its layer at `q.step` (or the latest step before it; None: each run's last); a
    run without that histogram is named in `missing` (404 when none has it, or a run has no layergrad data)."""
    # Listed by run AND tag (the layer's histogram, and the stats its version-2 edges come from): a run's whole
    # catalog costs more than reading its histogram.
    kinds = [metadata.KIND_HISTOGRAM, metadata.KIND_STATS]
    tags = {
        t
        for run, layer in zip(q.runs, q.layers)
        for t in reading.layer_tags(ctx, eid, run, layer, q.target, q.source, kinds)
    }
    wanted: Dict[str, Set[str]] = {}  # each run's layers asked: of its group tags' rows, only theirs are built
    for run, layer in zip(q.runs, q.layers):
        wanted.setdefault(run, set()).add(layer)
    cat = reading.catalog(ctx, eid, runs=q.runs, tags=sorted(tags), layers=wanted)
    unlisted = [name for name in q.runs if name not in cat.runs]
    if unlisted:  # no such series, or no such run: the whole catalog of those says which (404 naming the run)
        full = reading.catalog(ctx, eid, runs=unlisted)
        for name in unlisted:
            cat.runs[name] = full.run(name)
    found = {
        name: cat.runs[name].find(layer, q.target, q.source, metadata.KIND_HISTOGRAM)
        for name, layer in zip(q.runs, q.layers)
    }
    missing = [name for name in q.runs if found[name] is None]

    def one(name: str):
        return at_step(reading, ctx, eid, cat.runs[name], found[name], q.step)

    # The runs read side by side where each read is a call to another process (the Rust data server); under the
    # Python loader the reads hold the GIL, and threads would only add their start and their contention.
    asked = [n for n in q.runs if n not in missing]
    if listing.folds_outside_python(reading.provider) and len(asked) > 1:
        with futures.ThreadPoolExecutor(max_workers=READERS) as pool:
            read = dict(zip(asked, pool.map(one, asked)))
    else:
        read = {n: one(n) for n in asked}
    out = []
    for name, layer in zip(q.runs, q.layers):
        step, buckets = read.get(name, (None, []))
        out.append({"run": name, "layer": layer, "step": step, "buckets": buckets})
    if len(missing) == len(q.runs):
        what = f"layer {quote(q.layers[0])}" if len(set(q.layers)) == 1 else "the layers asked"
        raise errors.NotFoundError(
            f"no {q.source!r} histograms of {what} for target {quote(q.target)} in any of the runs"
        )
    head = {"target": q.target, "source": q.source, "step": q.step, "runs": q.runs}
    return {**head, "missing": missing, "histograms": out}
