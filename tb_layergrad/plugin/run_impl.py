"""The answers of the routes over every layer of a run, or several runs: `runs`, `matrix`, `compare`, `csv`,
`anomalies`, `noise_scale`, `hparams`.

Each `*_impl` takes the plugin's `Reading`, the request's context and experiment, and a validated query
(`queries`); it returns the body (docs/HTTP_API.md) as a dict, or encoded already where the body is kept per
change of the run (`lookups.AnswerCache`), or raises a `tensorboard.errors` 404 naming what is missing. A
`responses.RawJson` value is JSON text already (`responses.float_rows_json`).
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
from tensorboard import errors
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata
from tb_layergrad.plugin import binned, bodies, example_bodies
from tb_layergrad.plugin.layer_impl import int_list, stat_values
from tb_layergrad.plugin.lookups import Reading, missing_series
from tb_layergrad.plugin.queries import CompareQuery, NoiseScaleQuery, RunQuery
from tb_layergrad.plugin.responses import EncodedBody, RawJson, csv_cells, csv_line, dumps, float_rows_json
from tb_layergrad.reader import (
    catalog,
    examples,
    hparams,
    layer_points,
    run_anomalies,
    series,
)
from tb_layergrad.reader.catalog import quote
from tb_layergrad.reader.run_source import RunSource
from tb_layergrad.reader.series import align
from tb_layergrad.reader.stats_store import StatsRows

_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")
Columns = Sequence[Tuple[np.ndarray, np.ndarray]]  # (steps, values) per layer or run


def runs_impl(reading: Reading, ctx: object, eid: str, run: Optional[str]) -> dict:
    """Every run with layergrad data (or only `run`: 404 if it has none), its layers and series."""
    cat = reading.catalog(ctx, eid, runs=None if run is None else [run])
    if run is not None:
        cat.run(run)  # 404 if unknown
    cat = layer_points.without_clean_running_records(reading.provider, ctx, eid, cat)

    def statistics_read(rc: catalog.RunCatalog) -> bool:
        stats = [s for s in rc.series if s.info.kind == metadata.KIND_STATS]
        return bool(stats) and reading.stats.is_current(eid, rc.run, stats)

    body = bodies.runs_body(cat, statistics_read)
    said = reading.damaged(eid, list(cat.runs))
    for row in body["runs"]:  # the `sweep` route's row of the run is computed already (read ahead, or asked)
        rc = cat.runs[row["run"]]
        row["sweep_read"] = reading.health.holds(eid, rc, None, metadata.SOURCE_OUTPUT)
        row["damage"] = [d.to_json() for d in said.get(row["run"], ())]
    # Said first, on every view: a damaged run shows fewer steps than were written, or none at all.
    lines = [d.line() for name in sorted(said) if run is None or name == run for d in said[name]]
    body["warnings"] = lines + list(body["warnings"])
    return body


def _matrix_body(
    head: dict,
    columns: Columns,
    stat: str,
    q: RunQuery,
    flags_of_bins: Optional[Callable[[np.ndarray], np.ndarray]] = None,
) -> dict:
    """Per-layer (steps, values) columns on the union of their steps: binned to `q.points` when there are more
    steps (`flags_of_bins(steps)`: each step's anomaly flags, for the bins), else every step or `q.max_steps`."""
    steps = series.union_steps([c[0] for c in columns])
    if binned.needed(q.points, steps):
        flags = flags_of_bins(steps) if flags_of_bins is not None else None
        return {**head, **binned.columns_body(columns, steps, stat, q.points, q.start, q.end, flags)}
    steps = steps[series.pick_evenly(steps.size, None if q.points else q.max_steps)]
    aligned = [align(pts, col, steps) for pts, col in columns]
    values = dumps([stat_values(c, stat) for c in aligned]) if stat in series.COUNT_STATS else float_rows_json(aligned)
    return {**head, **({"binned": False} if q.points else {}), "steps": int_list(steps), "values": RawJson(values)}


def matrix_impl(reading: Reading, ctx: object, eid: str, q: RunQuery) -> EncodedBody:
    """A statistic of every layer at every step: of the `stats` records, or of the per-example records
    for a `stat` named `example_norm_*` (`examples.MATRIX_STATS`)."""
    per_example = q.stat in examples.MATRIX_STATS
    kind = metadata.KIND_EXAMPLES if per_example else metadata.KIND_STATS
    chosen, src = reading.every_layer(ctx, eid, q.run, q.target, q.source, kind)
    head = {"run": q.run, "target": q.target, "source": q.source, "stat": q.stat}
    head["layers"] = [s.info.layer for s in chosen]

    def compute() -> dict:
        if per_example:
            rows = examples.read(src, chosen, q.start, q.end)
            field = examples.MATRIX_STATS[q.stat]
            return _matrix_body(head, [(rows[s.key].steps, rows[s.key].column(field)) for s in chosen], q.stat, q)
        tables = src.stats(chosen, q.start, q.end)
        if q.points is not None and q.start is None and q.end is None:  # the whole run: its bins appended to
            got = _pyramid_body(reading, eid, q, head, src, chosen, tables)
            if got is not None:
                return got

        def flags_of_bins(steps: np.ndarray) -> np.ndarray:  # the rules see the whole run
            return run_anomalies.whole_run_flags(src, q.target, q.source, chosen, steps)

        columns = [(tables[s.key].steps, tables[s.key].column(q.stat)) for s in chosen]
        return _matrix_body(head, columns, q.stat, q, flags_of_bins)

    return reading.answers.answer((eid, "matrix", q), src, compute)


def _pyramid_body(
    reading: Reading,
    eid: str,
    q: RunQuery,
    head: dict,
    src: RunSource,
    chosen: Sequence[catalog.Series],
    tables: Dict[catalog.SeriesKey, StatsRows],
) -> Optional[dict]:
    """The binned matrix of a whole run from its power-of-two bins kept and appended to (`reader.bin_pyramid`):
    the body `_matrix_body` gives, at a cost of the run's new steps; None where those cannot answer it."""
    rows = [tables[s.key] for s in chosen]
    if not rows or not binned.needed(q.points, rows[0].steps):
        return None
    flags = run_anomalies.folded_flags(src, q.target, q.source, chosen, tables)
    if flags is None:
        return None
    got = reading.bins.binned((eid, q.run, q.target, q.source, q.stat), rows, q.stat, flags, q.points)
    if got is None:
        return None
    b, kept = got
    recorded = np.ones(kept.values.shape, bool)
    return {**head, **binned.binned_columns(b, rows[0].steps, q.stat, q.points, kept.values, kept.flags, recorded)}


def _compared(reading: Reading, ctx: object, eid: str, q: CompareQuery) -> Dict[str, catalog.Series]:
    """{run: the layer's stats series} of the runs that have it; 404 for a run with no layergrad data."""
    tags = [
        t
        for name in q.runs
        for t in reading.layer_tags(ctx, eid, name, q.layer, q.target, q.source, [metadata.KIND_STATS])
    ]
    listed = reading.catalog(ctx, eid, runs=q.runs, tags=tags).runs  # cheap: the layer's tags
    others = [name for name in q.runs if name not in listed]
    full = reading.catalog(ctx, eid, runs=others) if others else None
    found: Dict[str, catalog.Series] = {}
    for name in q.runs:
        rc = listed[name] if name in listed else full.run(name)
        s = rc.find(q.layer, q.target, q.source, metadata.KIND_STATS)
        if s is not None:
            found[name] = s
    if not found:
        raise errors.NotFoundError(
            f"no {q.source!r} stats for layer {quote(q.layer)}, target {quote(q.target)} in any of the runs"
        )
    return found


def compare_impl(reading: Reading, ctx: object, eid: str, q: CompareQuery) -> dict:
    """One layer's statistic in several runs, on the union of their steps (a run without the layer: `missing`)."""
    found = _compared(reading, ctx, eid, q)
    empty = (np.zeros([0], np.int64), np.zeros([0]))
    no_table = (empty[0], np.zeros([0, len(series.STORED_STATS)]))
    columns: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
    tables: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
    for name, s in found.items():
        rows = reading.stats.read(ctx, eid, name, [s], q.start, q.end)[s.key]
        columns[name] = (rows.steps, rows.column(q.stat))
        tables[name] = (rows.steps, rows.table)
    head = {"layer": q.layer, "target": q.target, "source": q.source, "stat": q.stat, "runs": q.runs}
    head["missing"] = [n for n in q.runs if n not in found]
    per_run = [columns.get(name, empty) for name in q.runs]
    steps = series.union_steps([c[0] for c in columns.values()])
    if binned.needed(q.points, steps):
        flags = binned.nonfinite_flags([tables.get(name, no_table) for name in q.runs], steps)
        return {**head, **binned.columns_body(per_run, steps, q.stat, q.points, q.start, q.end, flags)}
    steps = steps[series.pick_evenly(steps.size, None if q.points else q.max_steps)]
    aligned = [align(pts, col, steps) for pts, col in per_run]
    values = [stat_values(v, q.stat) for v in aligned]
    # A null is either no record at that step or a record without a value; a chart must break its line only at
    # the second (a run logged at other steps is joined across the others' steps).
    recorded = [~np.isnan(align(pts, np.ones(pts.size), steps)) for pts, _ in per_run]
    gaps = [int_list(np.flatnonzero(r & ~np.isfinite(v))) for r, v in zip(recorded, aligned)]
    body = {"steps": int_list(steps), "values": values, "gaps": gaps}
    return {**head, **({"binned": False} if q.points else {}), **body}


def csv_impl(reading: Reading, ctx: object, eid: str, q: RunQuery) -> Tuple[str, str]:
    """(CSV text, file name) of the stored statistics (as read) of one layer, or of every layer, of one run."""
    if q.layer is not None:
        rc = reading.run_catalog(ctx, eid, q.run)
        chosen, src = [rc.require(q.layer, q.target, q.source, metadata.KIND_STATS)], reading.source(ctx, eid, rc)
    else:
        chosen, src = reading.every_layer(ctx, eid, q.run, q.target, q.source, metadata.KIND_STATS)
    tables = src.stats(chosen, q.start, q.end)
    header = ["run", "target", "source", "layer", "index", "step", "wall_time", *series.STORED_STATS]
    lines = [csv_line(header)]
    for s in chosen:
        t = tables[s.key]
        # The names are quoted once per layer; the numbers never need quoting.
        prefix = csv_line([q.run, q.target, q.source, s.info.layer, str(src.rc.layer_index(s.info.layer))]) + ","
        # As read (`series.stat_column`): a `norm` without a finite element is nan, like the other moments.
        columns = [list(map(str, t.steps.tolist())), csv_cells(t.wall_times)]
        columns += [csv_cells(t.column(name), name in series.COUNT_STATS) for name in series.STORED_STATS]
        lines += [prefix + ",".join(cells) for cells in zip(*columns)]
    filename = "layergrad-" + (_UNSAFE_FILENAME.sub("_", q.run).strip("._") or "run") + ".csv"
    return "\n".join(lines) + "\n", filename


def anomalies_impl(reading: Reading, ctx: object, eid: str, q: RunQuery) -> EncodedBody:
    """The anomaly rules (docs/ANOMALIES.md) applied to one run: flags per step, summaries, where it broke."""
    rc = reading.run_catalog(ctx, eid, q.run)
    if q.layer is not None:
        rc.require(q.layer, q.target, q.source, metadata.KIND_STATS)  # 404 naming what is unknown
    src = reading.source(ctx, eid, rc)

    def compute() -> dict:
        # Where it broke is a question about a differentiated target: for activations, the one asked for.
        origin_target = metadata.DEFAULT_TARGET if q.asked_target == metadata.ACTIVATION_TARGET else q.asked_target
        result = run_anomalies.read_run(src, q.target, q.source, q.start, q.end, origin_target=origin_target)
        if result is None:
            raise missing_series(rc, q.target, q.source, "stats")
        # One example dominating a layer (docs/ANOMALIES.md): the report's reader, None without per-example records.
        result.dominated = run_anomalies.read_dominance(src, q.target, q.source, q.start, q.end)
        return bodies.anomalies_body(result, q.layer, q.flags_start, q.flags_end, q.points)

    return reading.answers.answer((eid, "anomalies", q), src, compute)


def noise_scale_impl(reading: Reading, ctx: object, eid: str, q: NoiseScaleQuery) -> dict:
    """The gradient noise scale scalars of one or several runs (plugin `scalars`), and B_simple averaged with the
    weight asked (`estimate`): computed here only, so that the chart and the `sweep` route's value agree."""
    runs = q.runs
    answer = reading.provider.read_scalars(
        ctx,
        experiment_id=eid,
        plugin_name="scalars",
        downsample=series.READ_ALL,
        run_tag_filter=tb_provider.RunTagFilter(runs=runs, tags=list(example_bodies.NOISE_SCALE_TAGS.values())),
    )
    # A run without the scalars is `missing`, not an error: the tab asks for every run it shows and
    # hides the chart when none has them (a 404 per plain run would be noise in the browser's console).
    found = [n for n in runs if example_bodies.has_noise_scale(answer.get(n, {}))]
    return {
        "runs": runs,
        "smoothing": q.smoothing,
        "missing": [n for n in runs if n not in found],
        "tags": dict(example_bodies.NOISE_SCALE_TAGS),
        "series": [example_bodies.noise_scale_run(n, answer[n], q.start, q.end, q.smoothing) for n in found],
    }


def hparams_impl(reading: Reading, ctx: object, eid: str, run: Optional[str]) -> dict:
    """Each run's hyperparameters as logged with TensorBoard's HParams API (`reader.hparams`: the nearest
    session at or above the run), every run with layergrad data or only `run` (404 if it has none)."""
    cat = reading.catalog(ctx, eid, runs=None if run is None else [run])
    if run is not None:
        cat.run(run)  # 404 if unknown
    values = hparams.by_run(reading.provider, ctx, eid, list(cat.runs))
    return {
        "names": hparams.names(values),
        "runs": [{"run": name, "hparams": hparams.json_values(hp)} for name, hp in values.items()],
    }
