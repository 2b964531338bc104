"""The answer of the `sweep` route: one row per run, its hyperparameters beside its gradient health.

Why a route of its own: a sweep is tens to hundreds of runs, and the tab's Runs view lists them all at
once; asking the `anomalies` route run by run would send every layer's flags of every run. Each row is
the reader's (`run_health`), kept per run while the run's listing is unchanged: a poll of a finished sweep
lists the runs (metadata only), their hyperparameters and noise-scale scalars, and builds no catalog and
recomputes nothing. The read-ahead (`prefetch`) computes the rows of the runs it read (`warm`).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from tb_layergrad import metadata
from tb_layergrad.plugin.lookups import Reading
from tb_layergrad.plugin.queries import SweepQuery
from tb_layergrad.plugin.responses import finite_or_none
from tb_layergrad.reader import catalog, hparams, run_health


def _rows(reading: Reading, ctx: object, eid: str, q: SweepQuery) -> Tuple[Dict[str, dict], List[str]]:
    """({run: its health row}, the warnings of runs with no row): rows kept for a run listed as before are
    reused (with its listing's warnings); the catalog is built of the other runs only."""
    listing = reading.lister.list_tensors(ctx, experiment_id=eid, plugin_name=metadata.PLUGIN_NAME)
    rows: Dict[str, Optional[dict]] = {}
    for run in sorted(listing):
        if q.run is not None and run != q.run:
            continue
        rows[run] = reading.health.get(eid, run, q.target, q.source, catalog.listing_signature(listing[run]))
    unknown = {run: listing[run] for run, row in rows.items() if row is None}
    cat = catalog.from_listing(unknown) if unknown else catalog.Catalog({}, [])
    warnings = [w for w in cat.warnings if not any(w in rc.warnings for rc in cat.runs.values())]
    for run in unknown:
        rc = cat.runs.get(run)
        if rc is None:  # no series this version reads (warned): not a run of the plugin
            del rows[run]
            continue
        rows[run] = reading.health.row(reading.source(ctx, eid, rc), q.target, q.source)
    return rows, warnings


def sweep_impl(reading: Reading, ctx: object, eid: str, q: SweepQuery) -> dict:
    """Every run with layergrad data: its hyperparameters (`reader.hparams`) and its health (`run_health`)."""
    rows, warnings = _rows(reading, ctx, eid, q)
    warnings += [w for row in rows.values() for w in row["warnings"]]
    names = list(rows)
    values = hparams.by_run(reading.provider, ctx, eid, names)
    noise = reading.noise_ends.read(reading.provider, ctx, eid, names, reading.lister)
    said = reading.damaged(eid, names)
    warnings = [d.line() for name in sorted(said) if q.run in (None, name) for d in said[name]] + warnings
    out = []
    for name, row in rows.items():
        trend = row["norm_trend"]
        out.append(
            {
                "run": name,
                **{k: v for k, v in row.items() if k != "warnings"},
                "norm_trend": None if trend is None else finite_or_none(trend),
                "noise_scale_end": None if noise[name] is None else finite_or_none(noise[name]),
                "hparams": hparams.json_values(values[name]),
                "damage": [d.to_json() for d in said.get(name, ())],
            }
        )
    return {
        "source": q.source,
        "target": q.target,
        "hparams": [{"name": n, "kind": k} for n, k in hparams.kinds(values).items()],
        "measures": [m.to_json() for m in run_health.MEASURES],
        "runs": out,
        "warnings": warnings,
    }


def warm(reading: Reading, ctx: object, cat: catalog.Catalog, eid: str = "") -> None:
    """Compute the default rows (each run's own target, `output`) of the runs whose statistics the store holds
    as listed and whose row is not kept, then their noise scale: what the read-ahead does after each pass
    (`prefetch`), so that the Runs view's first request finds its rows. A run not held is left to the request
    (no read here); a pass that finds every row kept costs a comparison per run."""
    computed = False
    for rc in cat.runs.values():
        if reading.health.holds(eid, rc, None, metadata.SOURCE_OUTPUT):
            continue
        stats = [s for s in rc.series if s.info.kind == metadata.KIND_STATS]
        if stats and reading.stats.is_current(eid, rc.run, stats):
            reading.health.row(reading.source(ctx, eid, rc), None, metadata.SOURCE_OUTPUT)
            computed = True
    if computed:
        reading.noise_ends.read(reading.provider, ctx, eid, list(cat.runs), reading.lister)
