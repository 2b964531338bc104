"""Read what the anomaly rules need for one run, through a TensorBoard data provider, and apply them.

Shared by the plugin's `anomalies` route and `tb-layergrad report`, so that both
give the numbers the tab shows: the same catalog (layers in model order), the same
statistics table and derived statistics as the `matrix` route, then
`anomalies.evaluate`. No TensorFlow.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from tb_layergrad import metadata, nonfinite_origin
from tb_layergrad.reader import anomalies, catalog, dominance, downsample, examples, layer_points, origin, series
from tb_layergrad.reader.origin import running_first_step
from tb_layergrad.reader.run_source import RunSource
from tb_layergrad.reader.stats_store import StatsRows


def read_run(
    src: RunSource,
    target: str,
    source: str,
    start: Optional[int] = None,
    end: Optional[int] = None,
    origin_target: Optional[str] = None,
) -> Optional[anomalies.RunAnomalies]:
    """The rules applied to run `src.rc` for (target, source) over [start, end]; None if it has no stats series.

    Reads through `src.store`, so that the plugin reuses the tables its `matrix` route read.
    The result's `origin` is where the run first went non-finite (`reader.origin`) for
    `origin_target` (default `target`; give it for `source="activation"`, whose target is `forward`).
    """
    rc = src.rc
    stats_series = rc.with_kind(target, source, metadata.KIND_STATS)
    if not stats_series:
        return None
    layers = [s.info.layer for s in stats_series]
    running: Dict[str, catalog.Series] = {}
    ts_series: Dict[str, catalog.Series] = {}
    for layer in layers:
        f = rc.find(layer, target, source, metadata.KIND_FIRST_NONFINITE)
        if f is not None:
            running[layer] = f
        if source == metadata.SOURCE_OUTPUT:
            t = rc.find(layer, target, source, metadata.KIND_TIMESTEPS)
            if t is not None:
                ts_series[layer] = t
    data = layer_points.read_points(src, [*running.values(), *ts_series.values()], start, end)
    tables = src.stats(stats_series, start, end)
    named = [None if layer not in running else running_first_step(data[running[layer].key], start) for layer in layers]
    timesteps = {layer: data[s.key].values for layer, s in ts_series.items()}
    indices = [rc.layer_index(layer) for layer in layers]
    # The whole run: the rules kept by the plugin, extended by the new steps (`rule_fold`).
    whole = start is None and end is None
    result = _folded(src, target, source, stats_series, tables, named, timesteps) if whole else None
    if result is None:
        columns = [(tables[s.key].steps, tables[s.key].table) for s in stats_series]
        steps = series.union_steps([c[0] for c in columns])
        stats = {
            name: np.stack([series.align(pts, series.stat_column(table, name), steps) for pts, table in columns])
            if columns
            else np.zeros([0, steps.size])
            for name in anomalies.REQUIRED_STATS
        }
        result = anomalies.evaluate(
            layers,
            steps,
            stats,
            run=rc.run,
            target=target,
            source=source,
            indices=indices,
            running_first_steps=named,
            timesteps=timesteps,
            target_values=_target_values(src, target, steps, start, end),
        )
    result.origin = origin.locate_run(src, origin_target or target, start, end)
    return result


def _folded(
    src: RunSource,
    target: str,
    source: str,
    chosen: Sequence[catalog.Series],
    tables: Dict[catalog.SeriesKey, StatsRows],
    named: Optional[List[Optional[int]]] = None,
    timesteps: Optional[Dict[str, list]] = None,
) -> Optional[anomalies.RunAnomalies]:
    """The rules over the whole run as the plugin keeps them (`rule_fold`, its key the run, target and source);
    None without a fold (`report`, `load()`) or where the layers do not share their steps."""
    if src.folds is None or not chosen:
        return None
    return src.folds.evaluate(
        (src.experiment_id, src.rc.run, target, source),
        [s.info.layer for s in chosen],
        [tables[s.key] for s in chosen],
        run=src.rc.run,
        target=target,
        source=source,
        indices=[src.rc.layer_index(s.info.layer) for s in chosen],
        running_first_steps=named,
        timesteps=timesteps,
        target_rows=_target_rows(src, target, None, None),
    )


def _target_rows(src: RunSource, target: str, start: Optional[int], end: Optional[int]) -> Optional[StatsRows]:
    """The rows of the target's own `target` series (its mean: the loss); None without one (an activation's
    `forward`, files of older writers)."""
    found = src.rc.find(target, target, metadata.SOURCE_TARGET, metadata.KIND_STATS)
    return None if found is None else src.stats([found], start, end)[found.key]


def _target_values(
    src: RunSource, target: str, steps: np.ndarray, start: Optional[int], end: Optional[int]
) -> Optional[np.ndarray]:
    """The target's own value (its `target` series' mean: the loss) at each of `steps`, NaN where not recorded;
    None without a target series."""
    rows = _target_rows(src, target, start, end)
    return None if rows is None else series.align(rows.steps, rows.column("mean"), steps)


def folded_flags(
    src: RunSource,
    target: str,
    source: str,
    chosen: Sequence[catalog.Series],
    tables: Dict[catalog.SeriesKey, StatsRows],
) -> Optional[np.ndarray]:
    """The rules' flags (uint8 [layers, steps]) of `chosen` over the whole run (`tables`: each one's whole rows, on
    the same steps) as the plugin keeps them (`rule_fold`); None without a fold or where the steps differ."""
    result = _folded(src, target, source, chosen, tables)
    if result is None or any(len(tables[s.key]) != result.steps.size for s in chosen):
        return None
    return result.flags


def whole_run_flags(
    src: RunSource, target: str, source: str, chosen: Sequence[catalog.Series], steps: np.ndarray
) -> np.ndarray:
    """`downsample.run_flags` of `chosen` (the run's stats series of (target, source), model order) over the whole
    run, on `steps`: from the rules the plugin keeps of the run (`rule_fold`), else evaluated whole."""
    whole = src.stats(chosen)
    result = _folded(src, target, source, chosen, whole)
    if result is not None:
        return downsample.on_steps(result.steps, result.flags, result.recorded, steps)[0]
    tables = [whole[s.key] for s in chosen]
    return downsample.run_flags([(t.steps, t.table) for t in tables], steps)[0]


def read_dominance(
    src: RunSource, target: str, source: str, start: Optional[int] = None, end: Optional[int] = None
) -> Optional[List[dominance.Dominance]]:
    """The layers of run `src.rc` where one example dominated a step (docs/ANOMALIES.md), in model order;
    None when the run has no per-example records for (target, source) (nothing could be said)."""
    chosen = src.rc.with_kind(target, source, metadata.KIND_EXAMPLES)
    if not chosen:
        return None
    rows = examples.read(src, chosen, start, end)
    out = []
    for s in chosen:
        r = rows[s.key]
        found = dominance.dominance(
            s.info.layer,
            r.steps,
            r.column("top_share"),
            r.column("examples"),
            r.column("status"),
            r.column("top_index_1"),
            r.column("max"),
        )
        if found is not None:
            out.append(found)
    return out


def read_states(src: RunSource) -> Dict[tuple, Dict[int, str]]:
    """{(layer, target, source): {step: state}} of every gradient series of run `src.rc` (`anomalies.cell_states`,
    the verdicts of the tab and the report, one example dominating included), and of its activations and target values: `nonfinite`,
    `nan_origin` on the cell where the first NaN/Inf was born (an activation in the forward pass, the target's
    own value in the loss, a layer's output gradient in the backward pass). Only the cells that are not `ok`:
    a long run is millions of cells, nearly all `ok`; a step absent is `ok` (or not recorded)."""
    rc = src.rc
    out: Dict[tuple, Dict[int, str]] = {}
    values = [s for s in rc.series if s.info.kind == metadata.KIND_STATS and s.info.source in _VALUE_SOURCES]
    tables = src.stats(values)
    value_steps = {}
    for s in values:
        rows = tables[s.key]
        key = (s.info.layer, s.info.target, s.info.source)
        value_steps[key] = rows.steps
        bad = rows.steps[rows.column("nonfinite") > 0]
        out[key] = dict.fromkeys(bad.tolist(), anomalies.NONFINITE_STATE)
    for target in rc.targets():
        for source in (metadata.SOURCE_OUTPUT, metadata.SOURCE_WEIGHT):
            result = read_run(src, target, source)
            if result is None:
                continue
            result.dominated = read_dominance(src, target, source)
            cells = anomalies.cell_states(result)
            steps = np.asarray(result.steps)
            for i, layer in enumerate(result.layers):
                kept = (cells[i] != anomalies.OK) & (cells[i] != "")
                out[(layer, target, source)] = dict(zip(steps[kept].tolist(), cells[i][kept].tolist()))
            o = result.origin
            if source != metadata.SOURCE_OUTPUT or o is None or o.origin is None:
                continue
            if o.pass_ == nonfinite_origin.PASS_FORWARD:
                key = (o.origin, metadata.ACTIVATION_TARGET, metadata.SOURCE_ACTIVATION)
            elif o.pass_ == nonfinite_origin.PASS_LOSS:
                key = (o.origin, target, metadata.SOURCE_TARGET)
            else:
                continue
            if key in value_steps and (value_steps[key] == o.step).any():
                out[key][o.step] = anomalies.NAN_ORIGIN
    return out


_VALUE_SOURCES = (metadata.SOURCE_ACTIVATION, metadata.SOURCE_TARGET)
