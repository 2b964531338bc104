"""The JSON bodies of the `runs` and `anomalies` routes (docs/HTTP_API.md), built from what the reader found.

No reading here: `routes` asks `tb_layergrad.reader` for a catalog or an evaluated run
and hands it to these functions, which only shape it for the wire (api_version is
added by `responses.json_response`).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from tb_layergrad import metadata
from tb_layergrad.plugin.responses import finite_or_none, float_list
from tb_layergrad.reader import anomalies, catalog, dominance, series, trends


def runs_body(cat: catalog.Catalog, statistics_read: Callable[[catalog.RunCatalog], bool]) -> dict:
    """The `runs` route: the statistics' names, then every run of the catalog with its layers.
    `statistics_read`: whether the plugin holds a run's statistics as listed (docs/HTTP_API.md)."""
    return {
        "format_version": metadata.FORMAT_VERSION,
        "stats": list(series.ALL_STATS),
        "stored_stats": list(series.STORED_STATS),
        "default_stat": series.DEFAULT_STAT,
        "runs": [describe_run(rc, statistics_read(rc)) for rc in cat.runs.values()],
        "warnings": cat.warnings,
    }


def describe_run(rc: catalog.RunCatalog, statistics_read: bool) -> dict:
    all_series = rc.series
    max_steps = [s.max_step for s in all_series if s.max_step is not None]
    max_walls = [s.max_wall_time for s in all_series if s.max_wall_time is not None]
    return {
        "run": rc.run,
        "format_versions": rc.format_versions(),
        "max_step": max(max_steps) if max_steps else None,
        "max_wall_time": finite_or_none(max(max_walls)) if max_walls else None,
        "statistics_read": statistics_read,
        "targets": rc.targets(),
        "sources": rc.sources(),
        "activations": rc.has_activations(),
        "target_series": rc.target_series(),
        "layers": [describe_layer(rc, layer) for layer in rc.layers()],
    }


def describe_layer(rc: catalog.RunCatalog, layer: str) -> dict:
    """One layer of the listing: what it has, and per (target, source) its kinds and last step.

    One pass over the layer's series: the listing describes every layer of every
    run on each call, so its cost is most of the Python side of the tab's first request.
    """
    groups: Dict[Tuple[str, str], List[catalog.Series]] = {}
    kinds = set()
    targets = set()
    sources = set()
    output_dtypes: List[Tuple[bool, str]] = []
    any_dtype = ""
    for s in rc.of_layer(layer):
        info = s.info
        groups.setdefault((info.target, info.source), []).append(s)
        kinds.add(info.kind)
        if info.source != metadata.SOURCE_ACTIVATION:  # `forward` is no differentiated target
            targets.add(info.target)
        sources.add(info.source)
        if info.dtype:
            any_dtype = any_dtype or info.dtype
            if info.source == metadata.SOURCE_OUTPUT:
                output_dtypes.append((info.kind == metadata.KIND_TIMESTEPS, info.dtype))
    # The captured gradient's dtype: from its stats/histogram records, not from a
    # derived record (timesteps norms are always float64); stable, so the first such.
    dtype = min(output_dtypes, key=lambda d: d[0])[1] if output_dtypes else any_dtype
    detail = []
    for target, source in sorted(groups, key=lambda ts: (ts[0], metadata.SOURCES.index(ts[1]))):
        group = groups[(target, source)]
        group_kinds = {s.info.kind for s in group}
        steps = [s.max_step for s in group if s.max_step is not None]
        walls = [s.max_wall_time for s in group if s.max_wall_time is not None]
        detail.append(
            {
                "target": target,
                "source": source,
                "kinds": [k for k in metadata.KINDS if k in group_kinds],
                "max_step": max(steps) if steps else None,
                "max_wall_time": finite_or_none(max(walls)) if walls else None,
            }
        )
    return {
        "layer": layer,
        "index": rc.layer_index(layer),
        "dtype": dtype,
        "histograms": metadata.KIND_HISTOGRAM in kinds,
        "stats": metadata.KIND_STATS in kinds,
        "tensors": metadata.KIND_TENSOR in kinds,
        "timesteps": metadata.KIND_TIMESTEPS in kinds,
        "targets": sorted(targets),
        "sources": [src for src in metadata.SOURCES if src in sources],
        "series": detail,
    }


def anomalies_body(
    result: anomalies.RunAnomalies,
    only_layer: Optional[str] = None,
    flags_start: Optional[int] = None,
    flags_end: Optional[int] = None,
    points: Optional[int] = None,
) -> dict:
    """The `anomalies` route: the rules' flags per step and the summaries, of one layer or all; `dominated`
    only when the reader could say (the run has per-example records for the target and source).

    The per-step fields (`steps`, `max_rms`, `vanish_reference`, each layer's `flags`) are those of the steps in
    [flags_start, flags_end]; more of them than `points`: none (`"binned": true`), so that the answer a chart asks
    for is as long as the chart is wide, not as the run is long (the binned `matrix` carries the flags per bin)."""
    lo = 0 if flags_start is None else int(np.searchsorted(result.steps, flags_start, side="left"))
    hi = result.steps.size if flags_end is None else int(np.searchsorted(result.steps, flags_end, side="right"))
    hi = max(lo, hi)
    binned = points is not None and hi - lo > points
    if binned:
        lo = hi
    cut = slice(lo, hi)
    layers = []
    for i, s in enumerate(result.summaries):
        if only_layer is not None and s.layer != only_layer:
            continue
        entry = result.layer_json(i)  # with its `verdict` (`anomalies.layer_verdicts`)
        entry["flags"] = anomalies.encode_flags(result.flags[i, cut], result.recorded[i, cut])
        layers.append(entry)
    body = {
        "run": result.run,
        "target": result.target,
        "source": result.source,
        "thresholds": dict(anomalies.THRESHOLDS),
        "trend_window": trends.TREND_WINDOW,
        "flag_bits": dict(anomalies.FLAG_BITS),
        **({"binned": binned} if points is not None else {}),
        "steps": [int(x) for x in result.steps[cut]],
        "max_rms": float_list(result.max_rms[cut]),
        "vanish_reference": float_list(result.vanish_reference[cut]),
        "layers": layers,
        "summary": result.summary_json(),
    }
    if result.dominated is not None:
        body["dominated"] = [dominance_json(d) for d in result.dominated if only_layer in (None, d.layer)]
        body["example_thresholds"] = dict(dominance.EXAMPLE_THRESHOLDS)
    return body


def dominance_json(d: dominance.Dominance) -> dict:
    """One dominated layer as `tb-layergrad report --format json` gives it, with the report's sentence (`line`):
    the tab inserts it as text, so that both say the same."""
    return {**d.to_json(), "worst_share": finite_or_none(d.worst_share), "line": d.line}
