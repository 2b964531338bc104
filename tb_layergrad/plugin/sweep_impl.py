"""The answer of the `sweep` route: one row per run, its hyperparameters beside its gradient health.

Why a route of its own: a sweep is tens to hundreds of runs, and the tab's Runs view lists them all at
once; asking the `anomalies` route run by run would send every layer's flags of every run. Each row is
the reader's (`run_health`), kept per run while the run's listing is unchanged, so a poll of a finished
sweep lists the runs and their hyperparameters and recomputes nothing.
"""

from __future__ import annotations

from tb_layergrad import metadata
from tb_layergrad.plugin.queries import SweepQuery
from tb_layergrad.plugin.reading import Reading
from tb_layergrad.plugin.responses import finite_or_none
from tb_layergrad.reader import catalog, hparams, run_health


def sweep_impl(reading: Reading, ctx: object, eid: str, q: SweepQuery) -> dict:
    """Every run with layergrad data: its hyperparameters (`reader.hparams`) and its health (`run_health`)."""
    cat = reading.catalog(ctx, eid)
    names = list(cat.runs)
    values = hparams.by_run(reading.provider, ctx, eid, names)
    noise = reading.noise_ends.read(reading.provider, ctx, eid, names)
    rows = []
    for name, rc in cat.runs.items():
        target = run_health.row_target(rc, q.target)
        row = reading.health.row(reading.source(ctx, eid, rc), target, q.source)
        rows.append(
            {
                "run": name,
                "target": target,
                **row,
                "norm_trend": None if row["norm_trend"] is None else finite_or_none(row["norm_trend"]),
                "noise_scale_end": None if noise[name] is None else finite_or_none(noise[name]),
                "hparams": hparams.json_values(values[name]),
            }
        )
    kinds = hparams.kinds(values)
    return {
        "source": q.source,
        "target": q.target,
        "hparams": [{"name": n, "kind": k} for n, k in kinds.items()],
        "measures": [m.to_json() for m in run_health.MEASURES],
        "runs": rows,
        "warnings": list(cat.warnings),
    }


def warm(reading: Reading, ctx: object, cat: catalog.Catalog, eid: str = "") -> None:
    """Compute the default rows (each run's own target, `output`) of the runs whose statistics the store holds
    as listed, and their noise scale: what the read-ahead does after reading (`prefetch`), so that the Runs
    view's first request finds its rows. A run not held is left to the request (no read here)."""
    for rc in cat.runs.values():
        stats = [s for s in rc.series if s.info.kind == metadata.KIND_STATS]
        if stats and reading.stats.is_current(eid, rc.run, stats):
            reading.health.row(reading.source(ctx, eid, rc), run_health.row_target(rc, None), metadata.SOURCE_OUTPUT)
    reading.noise_ends.read(reading.provider, ctx, eid, list(cat.runs))
