"""The JSON routes of docs/HTTP_API.md, one method each.

Every handler follows the same three steps: validate the query (400), look the
names up in the reader's catalog, built from `list_tensors` (404; `listing.TensorLister`), then read
only the tags it shows, filtered by run and tag. The catalog is built anew for every
request, so a run being written shows its new steps on the next call; `stats`
series are read through a `StatsStore`, which keeps each one as a table while
`list_tensors` reports it unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider as tb_provider
from werkzeug import wrappers

from tb_layergrad import metadata
from tb_layergrad.plugin import binned, bodies, example_bodies, listing, params, prefetch
from tb_layergrad.plugin.responses import (
    count_list,
    csv_number,
    csv_response,
    csv_text,
    dumps,
    finite_or_none,
    float_list,
    float_matrix,
    float_rows_json,
    json_errors,
    json_response,
)
from tb_layergrad.plugin.static import StaticFiles
from tb_layergrad.reader import catalog, downsample, examples, layer_points, run_anomalies, series
from tb_layergrad.reader.block_cache import BlockCache
from tb_layergrad.reader.catalog import quote
from tb_layergrad.reader.series import align
from tb_layergrad.reader.stats_store import StatsStore

PLUGIN_PREFIX = f"/data/plugin/{metadata.PLUGIN_NAME}/"
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")


def _column(values: np.ndarray, stat: str) -> list:
    return count_list(values) if stat in series.COUNT_STATS else float_list(values)


def _columns_json(columns: Sequence[np.ndarray], stat: str) -> str:
    """JSON text of `[_column(c, stat) for c in columns]`; floats written fast (`float_rows_json`)."""
    if stat in series.COUNT_STATS:
        return dumps([count_list(c) for c in columns])
    return float_rows_json(columns)


def _int_list(steps: np.ndarray) -> List[int]:
    return [int(s) for s in steps]


def _series_range(args) -> Tuple[str, str, Optional[int], Optional[int]]:
    """`params.series_range`, with the target of the series read: `forward` for activations."""
    target, source, start, end = params.series_range(args)
    return catalog.series_target(target, source), source, start, end


def _missing_series(rc: catalog.RunCatalog, target: str, source: str, kind: str) -> errors.NotFoundError:
    """The 404 for a run with no series of `kind` for (target, source)."""
    if source == metadata.SOURCE_ACTIVATION:
        return errors.NotFoundError(
            f"run {quote(rc.run)} has no activation {kind} records (forward values were not recorded)"
        )
    if target not in rc.targets():
        return errors.NotFoundError(f"target {quote(target)} not found in run {quote(rc.run)}; it has {rc.targets()}")
    return errors.NotFoundError(f"run {quote(rc.run)} has no {source!r} {kind} records for target {quote(target)}")


def _matrix_response(
    request: wrappers.Request,
    head: dict,
    columns: Sequence[Tuple[np.ndarray, np.ndarray]],
    steps: np.ndarray,
    stat: str,
    points: Optional[int],
    max_steps: Optional[int],
    start: Optional[int],
    end: Optional[int],
    flags: Optional[np.ndarray] = None,
) -> wrappers.Response:
    """The `matrix` answer of per-layer (steps, values) columns on the union `steps`: binned to `points` when
    there are more steps (`flags`: each step's anomaly flags, for the bins), else every step or `max_steps`."""
    if binned.needed(points, steps):
        return json_response(request, {**head, **binned.columns_body(columns, steps, stat, points, start, end, flags)})
    steps = steps[series.pick_evenly(steps.size, None if points else max_steps)]
    extra = {"binned": False} if points else {}
    return json_response(
        request,
        {**head, **extra, "steps": _int_list(steps)},
        raw={"values": _columns_json([align(pts, col, steps) for pts, col in columns], stat)},
    )


@dataclasses.dataclass
class LayerQuery:
    """The validated query of a one-layer route and the series it names."""

    head: dict  # echoed at the top of the response
    series: Optional[catalog.Series] = None
    listed: Optional[catalog.RunCatalog] = None  # the catalog `series` was found in
    step: Optional[int] = None
    start: Optional[int] = None
    end: Optional[int] = None
    max_steps: Optional[int] = None
    points: Optional[int] = None


class Routes:
    """Handlers bound to one data provider; each is a WSGI app (see `json_errors`)."""

    def __init__(
        self,
        data_provider: tb_provider.DataProvider,
        static: StaticFiles,
        multiplexer: object = None,
        read_ahead: bool = False,
    ) -> None:
        """`multiplexer`: `TBContext.multiplexer`, for listing without a walk of every record (`listing`).
        `read_ahead`: read the runs' statistics in the background (`prefetch.StatsPrefetcher`)."""
        self._provider = data_provider
        self._lister = listing.TensorLister(data_provider, multiplexer)
        self._static = static
        self._stats = StatsStore(data_provider)
        self._blocks = BlockCache()
        self._prefetch: Optional[prefetch.StatsPrefetcher] = None
        if read_ahead:
            self._prefetch = prefetch.StatsPrefetcher(self._stats, self._lister)
            self._prefetch.start()

    # -- helpers ---------------------------------------------------------------

    def _where(self, request: wrappers.Request) -> Tuple[object, str]:
        if self._prefetch is not None:
            self._prefetch.request_seen()
        return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)

    def _run_catalog(self, request: wrappers.Request, run: str) -> catalog.RunCatalog:
        ctx, eid = self._where(request)
        return catalog.load(self._lister, ctx, eid, runs=[run]).run(run)

    def _points(
        self,
        request: wrappers.Request,
        q: "LayerQuery",
        start: Optional[int],
        end: Optional[int],
        max_steps: Optional[int] = None,
    ) -> series.Points:
        ctx, eid = self._where(request)
        return layer_points.read_one(
            self._provider, ctx, eid, q.listed, q.series, start, end, self._stats, max_steps, self._blocks
        )

    def _layer_query(self, request: wrappers.Request, kind: str) -> "LayerQuery":
        """Validate every parameter of a one-layer route (400), then find its series (404).

        All parameters are checked before any lookup, so a malformed value is a
        400 even when the names are unknown too.
        """
        args = request.args
        run = params.required_name(args, "run")
        layer = params.required_name(args, "layer")
        target = params.target(args)
        if kind == metadata.KIND_TIMESTEPS:  # only ever written for layer outputs
            source, head = metadata.SOURCE_OUTPUT, {"run": run, "layer": layer, "target": target}
        else:
            source = params.source(args)
            target = catalog.series_target(target, source)  # activations: `forward`, whatever was asked
            head = {"run": run, "layer": layer, "target": target, "source": source}
        q = LayerQuery(head=head)
        if kind == metadata.KIND_TENSOR:
            q.step = params.step(args)
        else:
            q.start, q.end = params.step_range(args)
            q.max_steps = params.max_steps(args)
            q.points = params.points(args) if kind == metadata.KIND_STATS else None
        q.series, q.listed = self._one_series(request, run, layer, target, source, kind)
        return q

    def _layer_tags(
        self, request: wrappers.Request, run: str, layer: str, target: str, source: str, kinds: Sequence[str]
    ) -> List[str]:
        """The tags that may hold a layer's `kinds`: its version-1 tags and the run's version-2 group tags
        of (target, source), found by name (`listing.TensorLister.tags_of`), never by folding the run."""
        tags = [metadata.make_tag(target, source, layer, kind) for kind in kinds]
        grouped = [k for k in kinds if k in metadata.GROUPED_KINDS]
        if grouped:
            ctx, eid = self._where(request)
            prefix = f"{target}/{source}/layers-"
            kinds = tuple(f"/{k}/" for k in grouped)  # `.../layers-{digest}/{kind}/{block}` (docs/FORMAT.md)
            tags += [
                t
                for t in self._lister.tags_of(ctx, eid, run, metadata.PLUGIN_NAME)
                if t.startswith(prefix) and any(k in t[len(prefix) :] for k in kinds)
            ]
        return tags

    def _one_series(
        self, request: wrappers.Request, run: str, layer: str, target: str, source: str, kind: str
    ) -> Tuple[catalog.Series, catalog.RunCatalog]:
        """The series a one-layer route shows, and the catalog it was found in: listed by run AND tag, so its
        cost does not grow with the run; the whole run's catalog is listed only to explain a miss (404).
        A histogram comes with its layer's stats (a version-2 histogram's edges are the stats' min and max)."""
        ctx, eid = self._where(request)
        tags = self._layer_tags(request, run, layer, target, source, [kind])
        if kind == metadata.KIND_HISTOGRAM and len(tags) > 1:  # version-2 groups: their edges need the stats
            tags += self._layer_tags(request, run, layer, target, source, [metadata.KIND_STATS])
        listed = catalog.load(self._lister, ctx, eid, runs=[run], tags=tags).runs.get(run)
        found = listed.find(layer, target, source, kind) if listed is not None else None
        if found is not None:
            return found, listed
        full = self._run_catalog(request, run)
        return full.require(layer, target, source, kind), full

    # -- routes ----------------------------------------------------------------

    @json_errors
    def runs(self, request: wrappers.Request) -> wrappers.Response:
        run = params.optional_name(request.args, "run", None)
        ctx, eid = self._where(request)
        cat = catalog.load(self._lister, ctx, eid, runs=None if run is None else [run])
        if run is not None:
            cat.run(run)  # 404 if unknown
        cat = layer_points.without_clean_hints(self._provider, ctx, eid, cat)

        def statistics_read(rc: catalog.RunCatalog) -> bool:
            stats = [s for s in rc.series if s.info.kind == metadata.KIND_STATS]
            return bool(stats) and self._stats.is_current(eid, rc.run, stats)

        return json_response(request, bodies.runs_body(cat, statistics_read))

    @json_errors
    def matrix(self, request: wrappers.Request) -> wrappers.Response:
        """A statistic of every layer at every step: of the `stats` records, or of the per-example records
        for a `stat` named `example_norm_*` (`examples.MATRIX_STATS`)."""
        stat = params.single(request.args, "stat")
        if stat in examples.MATRIX_STATS:
            return self._examples_matrix(request, stat)
        return self._stats_matrix(request)

    def _stats_matrix(self, request: wrappers.Request) -> wrappers.Response:
        args = request.args
        run = params.required_name(args, "run")
        stat = params.stat(args)
        target, source, start, end = _series_range(args)
        max_steps = params.max_steps(args)
        points = params.points(args)
        rc = self._run_catalog(request, run)
        stats_series = rc.with_kind(target, source, metadata.KIND_STATS)
        if not stats_series:
            raise _missing_series(rc, target, source, "stats")
        ctx, eid = self._where(request)
        rows = self._stats.read(ctx, eid, run, stats_series, start, end)
        columns = [(rows[s.key].steps, rows[s.key].column(stat)) for s in stats_series]
        head = {
            "run": run,
            "target": target,
            "source": source,
            "stat": stat,
            "layers": [s.info.layer for s in stats_series],
        }
        steps = series.union_steps([c[0] for c in columns])
        flags = None
        if binned.needed(points, steps):
            whole = (
                rows if start is None and end is None else self._stats.read(ctx, eid, run, stats_series)
            )  # the rules see the whole run
            flags, _ = downsample.run_flags([(whole[s.key].steps, whole[s.key].table) for s in stats_series], steps)
        return _matrix_response(request, head, columns, steps, stat, points, max_steps, start, end, flags)

    @json_errors
    def stats(self, request: wrappers.Request) -> wrappers.Response:
        q = self._layer_query(request, metadata.KIND_STATS)
        s = q.series
        ctx, eid = self._where(request)
        rows = self._stats.read(ctx, eid, s.run, [s], q.start, q.end)[s.key]
        head = {**q.head, "index": s.info.index, "dtype": s.info.dtype}
        if binned.needed(q.points, rows.steps):
            whole = (
                rows if q.start is None and q.end is None else self._stats.read(ctx, eid, s.run, [s])[s.key]
            )  # the layer's own rules, over the whole run
            flags, _ = downsample.run_flags([(whole.steps, whole.table)], rows.steps)
            body = binned.stats_body(rows.steps, rows.wall_times, rows.table, flags, q.points, q.start, q.end)
            return json_response(request, {**head, **body})
        rows = rows.thinned(None if q.points else q.max_steps)
        return json_response(
            request,
            {
                **head,
                **({"binned": False} if q.points else {}),
                "steps": _int_list(rows.steps),
                "wall_times": float_list(rows.wall_times),
                "stats": {name: _column(rows.column(name), name) for name in series.ALL_STATS},
            },
        )

    @json_errors
    def histograms(self, request: wrappers.Request) -> wrappers.Response:
        q = self._layer_query(request, metadata.KIND_HISTOGRAM)
        points = self._points(request, q, q.start, q.end, q.max_steps)
        hists = []
        for value in points.values:
            arr = np.asarray(value, dtype=np.float64)
            hists.append(float_matrix(arr.reshape(-1, 3)) if arr.size % 3 == 0 and arr.size else [])
        return json_response(
            request,
            {
                **q.head,
                "steps": _int_list(points.steps),
                "wall_times": float_list(points.wall_times),
                "histograms": hists,
            },
        )

    @json_errors
    def tensor(self, request: wrappers.Request) -> wrappers.Response:
        q = self._layer_query(request, metadata.KIND_TENSOR)
        s, step = q.series, q.step
        points = self._points(request, q, None, None)
        if not len(points):
            raise errors.NotFoundError(f"no tensor records for layer {quote(s.info.layer)} yet")
        if step is None:
            i = len(points) - 1
        else:
            i = int(np.searchsorted(points.steps, step))
            if i >= len(points) or int(points.steps[i]) != step:
                raise errors.NotFoundError(f"no tensor record at step {step} for layer {quote(s.info.layer)}")
        arr = np.asarray(points.values[i], dtype=np.float64)
        if arr.ndim != 2:
            arr = arr.reshape(1, -1) if arr.ndim < 2 else arr.reshape(arr.shape[0], -1)
        finite = np.isfinite(arr)
        nonfinite = [
            [int(r), int(c), "nan" if np.isnan(arr[r, c]) else ("+inf" if arr[r, c] > 0 else "-inf")]
            for r, c in np.argwhere(~finite)
        ]
        return json_response(
            request,
            {
                **q.head,
                "step": int(points.steps[i]),
                "wall_time": finite_or_none(points.wall_times[i]),
                "shape": [int(d) for d in arr.shape],
                "values": float_matrix(arr),
                "nonfinite": nonfinite,
                "min": float(arr[finite].min()) if finite.any() else None,
                "max": float(arr[finite].max()) if finite.any() else None,
                "steps": _int_list(points.steps),
            },
        )

    @json_errors
    def timesteps(self, request: wrappers.Request) -> wrappers.Response:
        q = self._layer_query(request, metadata.KIND_TIMESTEPS)
        points = self._points(request, q, q.start, q.end, q.max_steps)
        return json_response(
            request,
            {
                **q.head,
                "steps": _int_list(points.steps),
                "wall_times": float_list(points.wall_times),
                "norms": [float_list(np.asarray(v, dtype=np.float64).reshape(-1)) for v in points.values],
            },
        )

    @json_errors
    def compare(self, request: wrappers.Request) -> wrappers.Response:
        args = request.args
        names = params.runs(args)
        layer = params.required_name(args, "layer")
        stat = params.stat(args)
        target, source, start, end = _series_range(args)
        max_steps = params.max_steps(args)
        points = params.points(args)
        ctx, eid = self._where(request)
        tags = [
            t for name in names for t in self._layer_tags(request, name, layer, target, source, [metadata.KIND_STATS])
        ]
        listed = catalog.load(self._lister, ctx, eid, runs=names, tags=tags).runs  # cheap: the layer's tags
        found: Dict[str, catalog.Series] = {}
        others = [name for name in names if name not in listed]
        full = catalog.load(self._lister, ctx, eid, runs=others) if others else None
        for name in names:
            rc = listed[name] if name in listed else full.run(name)  # 404 for a run with no layergrad data
            s = rc.find(layer, target, source, metadata.KIND_STATS)
            if s is not None:
                found[name] = s
        if not found:
            raise errors.NotFoundError(
                f"no {source!r} stats for layer {quote(layer)}, target {quote(target)} in any of the runs"
            )
        columns: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        tables: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        for name, s in found.items():
            rows = self._stats.read(ctx, eid, name, [s], start, end)[s.key]
            columns[name] = (rows.steps, rows.column(stat))
            tables[name] = (rows.steps, rows.table)
        head = {
            "layer": layer,
            "target": target,
            "source": source,
            "stat": stat,
            "runs": names,
            "missing": [n for n in names if n not in found],
        }
        empty = np.zeros([0], np.int64)
        steps = series.union_steps([c[0] for c in columns.values()])
        if binned.needed(points, steps):
            per_run = [columns.get(name, (empty, np.zeros([0]))) for name in names]
            no_table = (empty, np.zeros([0, len(series.STORED_STATS)]))
            flags = binned.nonfinite_flags([tables.get(name, no_table) for name in names], steps)
            return json_response(
                request, {**head, **binned.columns_body(per_run, steps, stat, points, start, end, flags)}
            )
        steps = steps[series.pick_evenly(steps.size, None if points else max_steps)]
        values = []
        for name in names:
            pts, col = columns.get(name, (empty, np.zeros([0])))
            values.append(_column(align(pts, col, steps), stat))
        return json_response(
            request, {**head, **({"binned": False} if points else {}), "steps": _int_list(steps), "values": values}
        )

    @json_errors
    def csv(self, request: wrappers.Request) -> wrappers.Response:
        args = request.args
        run = params.required_name(args, "run")
        layer = params.optional_name(args, "layer", None)
        target, source, start, end = _series_range(args)
        rc = self._run_catalog(request, run)
        if layer is not None:
            chosen = [rc.require(layer, target, source, metadata.KIND_STATS)]
        else:
            chosen = rc.with_kind(target, source, metadata.KIND_STATS)
            if not chosen:
                raise _missing_series(rc, target, source, "stats")
        ctx, eid = self._where(request)
        tables = self._stats.read(ctx, eid, run, chosen, start, end)
        rows = []
        for s in chosen:
            t = tables[s.key]
            for step, wall, record in zip(t.steps, t.wall_times, t.table):
                rows.append(
                    [
                        run,
                        target,
                        source,
                        s.info.layer,
                        str(rc.layer_index(s.info.layer)),
                        str(int(step)),
                        csv_number(wall),
                    ]
                    + [csv_number(v, name in series.COUNT_STATS) for name, v in zip(series.STORED_STATS, record)]
                )
        header = ["run", "target", "source", "layer", "index", "step", "wall_time", *series.STORED_STATS]
        filename = "layergrad-" + (_UNSAFE_FILENAME.sub("_", run).strip("._") or "run") + ".csv"
        return csv_response(request, csv_text(header, rows), filename)

    @json_errors
    def anomalies(self, request: wrappers.Request) -> wrappers.Response:
        """The anomaly rules (docs/ANOMALIES.md) applied to one run: flags per step, summaries."""
        args = request.args
        run = params.required_name(args, "run")
        asked, source, start, end = params.series_range(args)
        target = catalog.series_target(asked, source)
        layer = params.optional_name(args, "layer", None)
        rc = self._run_catalog(request, run)
        if layer is not None:
            rc.require(layer, target, source, metadata.KIND_STATS)  # 404 naming what is unknown
        ctx, eid = self._where(request)
        # Where it broke is a question about a differentiated target: for activations, the one asked for.
        origin_target = metadata.DEFAULT_TARGET if asked == metadata.ACTIVATION_TARGET else asked
        result = run_anomalies.read_run(
            self._provider, ctx, eid, rc, target, source, start, end, store=self._stats, origin_target=origin_target
        )
        if result is None:
            raise _missing_series(rc, target, source, "stats")
        # One example dominating a layer (docs/ANOMALIES.md): the report's reader, None without per-example records.
        result.dominated = run_anomalies.read_dominance(
            self._provider, ctx, eid, rc, target, source, start, end, self._blocks
        )
        return json_response(request, bodies.anomalies_body(result, layer))

    # -- per-example records and the noise scale -----------------------------------

    def _examples_matrix(self, request: wrappers.Request, stat: str) -> wrappers.Response:
        args = request.args
        run = params.required_name(args, "run")
        target, source, start, end = _series_range(args)
        max_steps = params.max_steps(args)
        points = params.points(args)
        rc = self._run_catalog(request, run)
        chosen = rc.with_kind(target, source, metadata.KIND_EXAMPLES)
        if not chosen:
            if not rc.with_kind(target, source, metadata.KIND_STATS):
                raise _missing_series(rc, target, source, "stats")
            raise errors.NotFoundError(
                f"run {quote(run)} has no per-example records ({source!r}, target {quote(target)})"
            )
        ctx, eid = self._where(request)
        rows = examples.read(self._provider, ctx, eid, rc, chosen, start, end, self._blocks)
        field = examples.MATRIX_STATS[stat]
        columns = [(rows[s.key].steps, rows[s.key].column(field)) for s in chosen]
        head = {"run": run, "target": target, "source": source, "stat": stat, "layers": [s.info.layer for s in chosen]}
        steps = series.union_steps([c[0] for c in columns])
        return _matrix_response(request, head, columns, steps, stat, points, max_steps, start, end)

    @json_errors
    def examples(self, request: wrappers.Request) -> wrappers.Response:
        """One layer's per-example spread per step (binned with `points`), and the top positions at `step`."""
        args = request.args
        run = params.required_name(args, "run")
        layer = params.required_name(args, "layer")
        target, source, start, end = _series_range(args)
        points = params.points(args)
        step = params.step(args)
        ctx, eid = self._where(request)
        s, rc = self._one_series(request, run, layer, target, source, metadata.KIND_EXAMPLES)
        rows = examples.read(self._provider, ctx, eid, rc, [s], start, end, self._blocks)[s.key]
        head = {
            "run": run,
            "layer": layer,
            "target": target,
            "source": source,
            "index": s.info.index,
            "dtype": s.info.dtype,
            "top_k": metadata.EXAMPLE_TOP_K,
        }
        if step is not None:
            whole = (
                rows
                if start is None and end is None
                else examples.read(self._provider, ctx, eid, rc, [s], blocks=self._blocks)[s.key]
            )
            row = whole.at(step)
            if row is None:
                raise errors.NotFoundError(f"no per-example record at step {step} for layer {quote(layer)}")
            at = example_bodies.at_body(step, row)
        else:
            at = example_bodies.at_body(int(rows.steps[-1]), rows.table[-1]) if len(rows) else None
        if binned.needed(points, rows.steps):
            body = example_bodies.binned_body(rows, points, start, end)
        else:
            body = {**({"binned": False} if points else {}), **example_bodies.spread_body(rows)}
        return json_response(request, {**head, **body, "at": at})

    @json_errors
    def noise_scale(self, request: wrappers.Request) -> wrappers.Response:
        """The gradient noise scale scalars of one or several runs (plugin `scalars`), raw: the tab smooths."""
        args = request.args
        names = params.runs(args)
        start, end = params.step_range(args)
        ctx, eid = self._where(request)
        answer = self._provider.read_scalars(
            ctx,
            experiment_id=eid,
            plugin_name="scalars",
            downsample=series.READ_ALL,
            run_tag_filter=tb_provider.RunTagFilter(runs=names, tags=list(example_bodies.NOISE_SCALE_TAGS.values())),
        )
        # A run without the scalars is `missing`, not an error: the tab asks for every run it shows and
        # hides the chart when none has them (a 404 per plain run would be noise in the browser's console).
        found = [n for n in names if example_bodies.has_noise_scale(answer.get(n, {}))]
        return json_response(
            request,
            {
                "runs": names,
                "missing": [n for n in names if n not in found],
                "tags": dict(example_bodies.NOISE_SCALE_TAGS),
                "series": [example_bodies.noise_scale_run(n, answer[n], start, end) for n in found],
            },
        )

    @json_errors
    def static_file(self, request: wrappers.Request) -> wrappers.Response:
        path = request.path
        if not path.startswith(PLUGIN_PREFIX):
            raise errors.NotFoundError("no such file in the layergrad frontend")
        content, content_type = self._static.read(path[len(PLUGIN_PREFIX) :])
        return http_util.Respond(request, content, content_type)
