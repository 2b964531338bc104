"""The routes of docs/HTTP_API.md: each parses its request, calls an `*_impl` that returns the body, responds.

A JSON route is one row of `JSON_ROUTES`: the function that validates its query whole (`queries`: 400),
and the `*_impl` that looks the names up (`lookups`: 404) and answers (`layer_impl`, `run_impl`, `depth_impl`,
`hists_at_impl`). Every
route is a WSGI app whose errors are JSON (`responses.json_errors`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider as tb_provider
from werkzeug import wrappers

from tb_layergrad import metadata
from tb_layergrad.plugin import depth_impl, hists_at_impl, layer_impl, prefetch, queries, run_impl, sweep_impl
from tb_layergrad.plugin.lookups import Reading
from tb_layergrad.plugin.responses import csv_response, json_errors, json_response
from tb_layergrad.plugin.static import StaticFiles

PLUGIN_PREFIX = f"/data/plugin/{metadata.PLUGIN_NAME}/"

Parse = Callable[[Any], Any]  # request.args -> the validated query (400 if it is not)
Answer = Callable[[Reading, object, str, Any], dict]  # (reading, ctx, experiment id, query) -> the JSON body

JSON_ROUTES: Dict[str, Tuple[Parse, Answer]] = {
    "/runs": (queries.runs_query, run_impl.runs_impl),
    "/matrix": (queries.matrix_query, run_impl.matrix_impl),
    "/stats": (functools.partial(queries.layer_query, kind=metadata.KIND_STATS), layer_impl.stats_impl),
    "/histograms": (functools.partial(queries.layer_query, kind=metadata.KIND_HISTOGRAM), layer_impl.histograms_impl),
    "/tensor": (functools.partial(queries.layer_query, kind=metadata.KIND_TENSOR), layer_impl.tensor_impl),
    "/timesteps": (functools.partial(queries.layer_query, kind=metadata.KIND_TIMESTEPS), layer_impl.timesteps_impl),
    "/compare": (queries.compare_query, run_impl.compare_impl),
    "/depth": (queries.depth_query, depth_impl.depth_impl),
    "/histograms_at": (queries.histograms_at_query, hists_at_impl.histograms_at_impl),
    "/anomalies": (queries.anomalies_query, run_impl.anomalies_impl),
    "/examples": (queries.examples_query, layer_impl.examples_impl),
    "/noise_scale": (queries.noise_scale_query, run_impl.noise_scale_impl),
    "/hparams": (queries.runs_query, run_impl.hparams_impl),
    "/sweep": (queries.sweep_query, sweep_impl.sweep_impl),
}


class JsonRoute:
    """One JSON route as a WSGI app: parse the query, answer it, respond."""

    def __init__(self, routes: "Routes", parse: Parse, answer: Answer) -> None:
        self._routes = routes
        self._parse = parse
        self._answer = answer

    @json_errors
    def __call__(self, request: wrappers.Request) -> wrappers.Response:
        q = self._parse(request.args)
        ctx, eid = self._routes.where(request)
        return json_response(request, self._answer(self._routes.reading, ctx, eid, q))


class Routes:
    """Handlers bound to one data provider; each is a WSGI app (see `json_errors`).

    Args:
      data_provider: `TBContext.data_provider`.
      static: the files of the tab (`static.StaticFiles`).
      multiplexer: `TBContext.multiplexer`, for listing without a walk of every record (`listing`).
      logdir: `TBContext.logdir`: its event files are checked for damage (`reading.Reading`).
      read_ahead: read the runs' statistics in the background (`prefetch.StatsPrefetcher`), and compute the
        `sweep` route's rows of the runs read (`sweep_impl.warm`).
    """

    def __init__(
        self,
        data_provider: tb_provider.DataProvider,
        static: StaticFiles,
        multiplexer: object = None,
        read_ahead: bool = False,
        logdir: str = "",
    ) -> None:
        self.reading = Reading(data_provider, multiplexer, logdir)
        self._static = static
        self._prefetch: Optional[prefetch.StatsPrefetcher] = None
        if read_ahead:
            self._prefetch = prefetch.StatsPrefetcher(
                self.reading.stats, self.reading.lister, then=functools.partial(sweep_impl.warm, self.reading)
            )
            self._prefetch.start()

    def apps(self) -> Dict[str, Callable]:
        """{route: WSGI app} of every route but the static files'."""
        apps: Dict[str, Callable] = {route: JsonRoute(self, *how) for route, how in JSON_ROUTES.items()}
        return {**apps, "/csv": self.csv}

    def where(self, request: wrappers.Request) -> Tuple[object, str]:
        """(the request's context, its experiment id); tells the prefetcher that the tab is open."""
        if self._prefetch is not None:
            self._prefetch.request_seen()
        return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)

    @json_errors
    def csv(self, request: wrappers.Request) -> wrappers.Response:
        q = queries.csv_query(request.args)
        ctx, eid = self.where(request)
        text, filename = run_impl.csv_impl(self.reading, ctx, eid, q)
        return csv_response(request, text, filename)

    @json_errors
    def static_file(self, request: wrappers.Request) -> wrappers.Response:
        path = request.path
        if not path.startswith(PLUGIN_PREFIX):
            raise errors.NotFoundError("no such file in the layergrad frontend")
        content, content_type = self._static.read(path[len(PLUGIN_PREFIX) :])
        return http_util.Respond(request, content, content_type)
