"""Read what the anomaly rules need for one run, through a TensorBoard data provider, and apply them.

Shared by the plugin's `anomalies` route and `tb-layergrad report`, so that both
give the numbers the tab shows: the same catalog (layers in model order), the same
statistics table and derived statistics as the `matrix` route, then
`anomalies.evaluate`. No TensorFlow.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata
from tb_layergrad.reader import anomalies, catalog, examples, layer_points, origin, series
from tb_layergrad.reader.block_cache import BlockCache
from tb_layergrad.reader.origin import first_nonfinite_hint
from tb_layergrad.reader.stats_store import StatsStore


def read_run(
    data_provider: tb_provider.DataProvider,
    ctx: object,
    experiment_id: str,
    rc: catalog.RunCatalog,
    target: str,
    source: str,
    start: Optional[int] = None,
    end: Optional[int] = None,
    store: Optional[StatsStore] = None,
    origin_target: Optional[str] = None,
) -> Optional[anomalies.RunAnomalies]:
    """The rules applied to run `rc` for (target, source) over [start, end]; None if it has no stats series.

    `store`: the plugin's `StatsStore`, so that this reuses the tables the `matrix` route read.
    The result's `origin` is where the run first went non-finite (`reader.origin`) for
    `origin_target` (default `target`; give it for `source="activation"`, whose target is `forward`).
    """
    stats_series = rc.with_kind(target, source, metadata.KIND_STATS)
    if not stats_series:
        return None
    layers = [s.info.layer for s in stats_series]
    extra: Dict[str, catalog.Series] = {}
    ts_series: Dict[str, catalog.Series] = {}
    for layer in layers:
        f = rc.find(layer, target, source, metadata.KIND_FIRST_NONFINITE)
        if f is not None:
            extra[layer] = f
        if source == metadata.SOURCE_OUTPUT:
            t = rc.find(layer, target, source, metadata.KIND_TIMESTEPS)
            if t is not None:
                ts_series[layer] = t
    store = store if store is not None else StatsStore(data_provider)
    data = layer_points.read_points(
        data_provider, ctx, experiment_id, rc, [*extra.values(), *ts_series.values()], start, end, store
    )
    tables = store.read(ctx, experiment_id, rc.run, stats_series, start, end)

    columns = [(tables[s.key].steps, tables[s.key].table) for s in stats_series]
    steps = series.union_steps([c[0] for c in columns])
    stats = {
        name: np.stack([series.align(pts, series.stat_column(table, name), steps) for pts, table in columns])
        if columns
        else np.zeros([0, steps.size])
        for name in anomalies.REQUIRED_STATS
    }
    hints: List[Optional[int]] = []
    for layer in layers:
        s = extra.get(layer)
        hints.append(None if s is None else first_nonfinite_hint(data[s.key], start))
    timesteps = {layer: data[s.key].values for layer, s in ts_series.items()}
    result = anomalies.evaluate(
        layers,
        steps,
        stats,
        run=rc.run,
        target=target,
        source=source,
        indices=[rc.layer_index(layer) for layer in layers],
        first_nonfinite_hints=hints,
        timesteps=timesteps,
    )
    result.origin = origin.locate_run(data_provider, ctx, experiment_id, rc, origin_target or target, start, end, store)
    return result


def read_dominance(
    data_provider: tb_provider.DataProvider,
    ctx: object,
    experiment_id: str,
    rc: catalog.RunCatalog,
    target: str,
    source: str,
    start: Optional[int] = None,
    end: Optional[int] = None,
    blocks: Optional[BlockCache] = None,
) -> Optional[List[anomalies.Dominance]]:
    """The layers of run `rc` where one example dominated a step (docs/ANOMALIES.md), in model order;
    None when the run has no per-example records for (target, source) (nothing could be said).
    `blocks`: the plugin's cache of decoded group blocks, shared with its `examples` route."""
    chosen = rc.with_kind(target, source, metadata.KIND_EXAMPLES)
    if not chosen:
        return None
    rows = examples.read(data_provider, ctx, experiment_id, rc, chosen, start, end, blocks)
    out = []
    for s in chosen:
        r = rows[s.key]
        found = anomalies.dominance(
            s.info.layer,
            r.steps,
            r.column("top_share"),
            r.column("examples"),
            r.column("status"),
            r.column("top_index_1"),
        )
        if found is not None:
            out.append(found)
    return out
