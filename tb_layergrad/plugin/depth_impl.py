"""The answer of `depth`: each of several runs' statistic by layer, in model order, at one step.

Why a route of its own: the compare view draws this depth profile for every run it compares, and one
`matrix` request per run cost a hundred requests at a sweep's scale. Here the runs are listed in one
catalog call and read through the plugin's `StatsStore`, so a warm answer is a lookup per layer.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
from tensorboard import errors

from tb_layergrad import metadata
from tb_layergrad.plugin.layer_impl import stat_values
from tb_layergrad.plugin.lookups import Reading
from tb_layergrad.plugin.queries import DepthQuery
from tb_layergrad.reader import series
from tb_layergrad.reader.catalog import quote
from tb_layergrad.reader.stats_store import StatsRows


def profile(run: str, layers: List[str], rows: Sequence[StatsRows], stat: str, step: Optional[int]) -> dict:
    """One run's profile: the latest step at or before `step` (None: the last) that any layer recorded, and each
    layer's value there (None: no record of that layer at that step, as `matrix` answers it).

    Args:
      run: the run's name, echoed.
      layers: its layers in model order.
      rows: each layer's stats rows (`StatsStore.read`).
      stat: the statistic (`series.ALL_STATS`).
      step: the step asked.

    Returns:
      `{"run", "step", "layers", "values"}`; `step` None when no layer has a record that early.

    Example:

        body = profile("train", ["m/dense"], [rows], "norm", 100)  # rows: StatsStore.read(...)[key]
    """
    ends: Dict[int, int] = {}  # id(steps) -> how many of them are <= step: a version-2 group's layers share one
    last = np.full(len(rows), -1)
    for i, r in enumerate(rows):
        n = ends.get(id(r.steps))
        if n is None:
            n = ends[id(r.steps)] = len(r) if step is None else int(np.searchsorted(r.steps, step, side="right"))
        last[i] = r.steps[n - 1] if n else -1
    if not (last >= 0).any():
        return {"run": run, "step": None, "layers": layers, "values": [None] * len(layers)}
    at_step = int(last.max())
    table = np.full((len(rows), len(series.STORED_STATS)), np.nan)  # each layer's record at that step
    for i, r in enumerate(rows):
        if last[i] == at_step:
            table[i] = r.table[ends[id(r.steps)] - 1]
    values = np.where(last == at_step, series.stat_column(table, stat), np.nan)  # a count of no record: null
    return {"run": run, "step": at_step, "layers": layers, "values": stat_values(values, stat)}


def depth_impl(reading: Reading, ctx: object, eid: str, q: DepthQuery) -> dict:
    """Each run's statistic of every layer at `q.step` (None: each run's last step), or at the latest step
    before it that the run recorded; a run without `stats` for (target, source) is named in `missing`
    (404 when none has them, or when a run has no layergrad data at all)."""
    cat = reading.catalog(ctx, eid, runs=q.runs)
    for name in q.runs:
        if name not in cat.runs:
            cat.run(name)  # the catalog's own 404, naming the run
    profiles: List[dict] = []
    missing: List[str] = []
    for name in q.runs:
        rc = cat.runs[name]
        chosen = rc.with_kind(q.target, q.source, metadata.KIND_STATS)
        if not chosen:
            missing.append(name)
            profiles.append({"run": name, "step": None, "layers": [], "values": []})
            continue
        tables = reading.source(ctx, eid, rc).stats(chosen)  # whole: a slice per layer costs more than the profile
        rows = [tables[s.key] for s in chosen]
        profiles.append(profile(name, [s.info.layer for s in chosen], rows, q.stat, q.step))
    if len(missing) == len(q.runs):
        recorded = " (forward values were not recorded)" if q.source == metadata.SOURCE_ACTIVATION else ""
        raise errors.NotFoundError(f"no {q.source!r} stats for target {quote(q.target)} in any of the runs{recorded}")
    head = {"target": q.target, "source": q.source, "stat": q.stat, "step": q.step, "runs": q.runs}
    return {**head, "missing": missing, "profiles": profiles}
