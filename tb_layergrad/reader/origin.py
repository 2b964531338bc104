"""Where it broke: the first non-finite step of one run and target, and the pass it was born in.

Reads what `tb_layergrad.nonfinite_origin.locate` needs and calls it; the rules themselves are
that module's (docs/ANOMALIES.md, "Where it broke"), never restated here. Shared by the
plugin's `anomalies` route, `tb-layergrad report` and `tb_layergrad.load()`.

The series looked at, for one target (e.g. `loss`): its output and weight gradients, its
`target` series (the loss value) and every activation (source `activation`, target `forward`:
one forward pass for every target). Each series' first non-finite step is the earlier of its
first `stats` record holding a NaN/Inf and the step named by its `first_nonfinite` records
(docs/FORMAT.md: they survive TensorBoard's sampling). The run's step is the earliest of those;
a series is non-finite there exactly when its own first non-finite step is that step (none can
be earlier). No histogram is needed: the target series has none.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata, nonfinite_origin
from tb_layergrad.reader import catalog, layer_points, series
from tb_layergrad.reader.stats_store import StatsStore


def first_nonfinite_hint(points: series.Points, start: Optional[int]) -> Optional[int]:
    """The earliest step named by `first_nonfinite` records (docs/FORMAT.md) within the range.

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


def first_steps(
    data_provider: tb_provider.DataProvider,
    ctx: object,
    experiment_id: str,
    rc: catalog.RunCatalog,
    stats_series: Sequence[catalog.Series],
    start: Optional[int] = None,
    end: Optional[int] = None,
    store: Optional[StatsStore] = None,
) -> Dict[catalog.SeriesKey, Optional[int]]:
    """{stats series key: the series' first non-finite step in [start, end], or None}."""
    store = store if store is not None else StatsStore(data_provider)
    tables = store.read(ctx, experiment_id, rc.run, stats_series, start, end)
    hint_series = {}
    for s in stats_series:
        i = s.info
        f = rc.find(i.layer, i.target, i.source, metadata.KIND_FIRST_NONFINITE)
        if f is not None:
            hint_series[s.key] = f
    hints = layer_points.read_points(
        data_provider, ctx, experiment_id, rc, list(hint_series.values()), start, end, store
    )
    out: Dict[catalog.SeriesKey, Optional[int]] = {}
    for s in stats_series:
        rows = tables[s.key]
        bad = np.flatnonzero(rows.column("nonfinite") > 0)
        first = int(rows.steps[bad[0]]) if bad.size else None
        f = hint_series.get(s.key)
        if f is not None:
            hint = first_nonfinite_hint(hints[f.key], start)
            if hint is not None and (first is None or hint < first):
                first = hint
        out[s.key] = first
    return out


def locate_run(
    data_provider: tb_provider.DataProvider,
    ctx: object,
    experiment_id: str,
    rc: catalog.RunCatalog,
    target: str = metadata.DEFAULT_TARGET,
    start: Optional[int] = None,
    end: Optional[int] = None,
    store: Optional[StatsStore] = None,
) -> Optional[nonfinite_origin.Origin]:
    """Where run `rc` first went non-finite for `target` within [start, end]; None if it never did.

    `target_nonfinite` is None (pass `unknown` possible) when the run has no target series for
    `target`; `activations` None (pass `forward_or_loss` possible) when it has no activation series.
    """
    roles = series_of(rc, target)
    every = [s for group in roles.values() for s in group]
    if not every:
        return None
    firsts = first_steps(data_provider, ctx, experiment_id, rc, every, start, end, store)
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
