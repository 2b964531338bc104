"""Where it broke: the origin of a run's first NaN/Inf for one target (its step, pass and layer).

Reads what `tb_layergrad.nonfinite_origin.locate` needs and calls it; the rules themselves are
that module's (docs/ANOMALIES.md, "Where it broke"), never restated here. Shared by the
plugin's `anomalies` route, `tb-layergrad report` and `tb_layergrad.load()`.

The series looked at, for one target (e.g. `loss`): its output and weight gradients, its
`target` series (the loss value) and every activation (source `activation`, target `forward`:
one forward pass for every target). Each series' first non-finite step is the earlier of its
first `stats` record holding a NaN/Inf and the step named by its running records (kind
`first_nonfinite`, docs/FORMAT.md: they survive TensorBoard's sampling). The run's step is the earliest of those;
a series is non-finite there exactly when its own first non-finite step is that step (none can
be earlier). No histogram is needed: the target series has none.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from tb_layergrad import metadata, nonfinite_origin
from tb_layergrad.reader import catalog, layer_points, series
from tb_layergrad.reader.run_source import RunSource


def running_first_step(points: series.Points, start: Optional[int]) -> Optional[int]:
    """The first non-finite step of a series as its running records (kind `first_nonfinite`,
    docs/FORMAT.md) name it: the earliest they name within the range.

    A record at step s holding f says "the first logged step <= s with a NaN/Inf in this
    series was f". Values that are not whole numbers in [start, s] are ignored (a
    malformed or foreign record must not invent a step).
    """
    best = None
    for step, value in zip(points.steps, points.values):
        flat = np.asarray(value).reshape(-1)
        if not flat.size:
            continue
        try:
            f = float(flat[0])
        except (TypeError, ValueError):
            continue
        if not np.isfinite(f) or f != int(f) or f < 0 or f > int(step):
            continue
        f = int(f)
        if start is not None and f < start:
            continue
        if best is None or f < best:
            best = f
    return best


def series_of(rc: catalog.RunCatalog, target: str) -> Dict[str, List[catalog.Series]]:
    """The `stats` series `locate` looks at, by role: outputs, weights, target, activations."""
    target_stats = rc.find(target, target, metadata.SOURCE_TARGET, metadata.KIND_STATS)
    return {
        "outputs": rc.with_kind(target, metadata.SOURCE_OUTPUT, metadata.KIND_STATS),
        "weights": rc.with_kind(target, metadata.SOURCE_WEIGHT, metadata.KIND_STATS),
        "target": [target_stats] if target_stats is not None else [],
        "activations": rc.with_kind(metadata.ACTIVATION_TARGET, metadata.SOURCE_ACTIVATION, metadata.KIND_STATS),
    }


def first_nonfinite_steps(
    src: RunSource, stats_series: Sequence[catalog.Series], start: Optional[int] = None, end: Optional[int] = None
) -> Dict[catalog.SeriesKey, Optional[int]]:
    """{stats series key: the series' first non-finite step in [start, end], or None}."""
    rc = src.rc
    tables = src.stats(stats_series, start, end)
    running = {}
    for s in stats_series:
        i = s.info
        f = rc.find(i.layer, i.target, i.source, metadata.KIND_FIRST_NONFINITE)
        if f is not None:
            running[s.key] = f
    records = layer_points.read_points(src, list(running.values()), start, end)
    out: Dict[catalog.SeriesKey, Optional[int]] = {}
    whole = start is None and end is None and src.folds is not None  # kept by the plugin, extended by new rows
    for s in stats_series:
        rows = tables[s.key]
        if whole:
            first = src.folds.first_nonfinite((src.experiment_id, rc.run, s.key), rows)
        else:
            bad = np.flatnonzero(rows.column("nonfinite") > 0)
            first = int(rows.steps[bad[0]]) if bad.size else None
        f = running.get(s.key)
        if f is not None:
            named = running_first_step(records[f.key], start)
            if named is not None and (first is None or named < first):
                first = named
        out[s.key] = first
    return out


def locate_run(
    src: RunSource, target: str = metadata.DEFAULT_TARGET, start: Optional[int] = None, end: Optional[int] = None
) -> Optional[nonfinite_origin.Origin]:
    """Where run `src.rc` first went non-finite for `target` within [start, end]; None if it never did.

    `target_nonfinite` is None (pass `unknown` possible) when the run has no target series for
    `target`; `activations` None (pass `forward_or_loss` possible) when it has no activation series.
    """
    rc = src.rc
    roles = series_of(rc, target)
    every = [s for group in roles.values() for s in group]
    if not every:
        return None
    firsts = first_nonfinite_steps(src, every, start, end)
    known = [f for f in firsts.values() if f is not None]
    if not known:
        return None
    step = min(known)

    def seen(group: Sequence[catalog.Series]) -> List[nonfinite_origin.Seen]:
        return [nonfinite_origin.Seen(s.info.layer, rc.layer_index(s.info.layer), firsts[s.key] == step) for s in group]

    return nonfinite_origin.locate(
        step,
        target=target,
        target_nonfinite=(firsts[roles["target"][0].key] == step) if roles["target"] else None,
        activations=seen(roles["activations"]) if roles["activations"] else None,
        outputs=seen(roles["outputs"]),
        weights=seen(roles["weights"]),
    )
