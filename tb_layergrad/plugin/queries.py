"""The query of each route, validated whole (400) before any name is looked up (404).

Why whole first: a malformed value is a 400 even when the names are unknown too. Each function checks
the parameters in one fixed order (`params` checks each value), so that of two bad values the same one
is reported every time.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from werkzeug.datastructures import MultiDict

from tb_layergrad import metadata
from tb_layergrad.plugin import params
from tb_layergrad.reader import catalog, examples, noise_scale


@dataclasses.dataclass(frozen=True)
class LayerQuery:
    """One layer's series of one run: `stats`, `histograms`, `tensor`, `timesteps`, `examples`."""

    run: str
    layer: str
    target: str  # of the series read: `forward` for activations, whatever was asked
    source: str
    step: Optional[int] = None
    start: Optional[int] = None
    end: Optional[int] = None
    max_steps: Optional[int] = None
    points: Optional[int] = None

    def head(self) -> dict:
        """The names echoed at the top of the answer."""
        return {"run": self.run, "layer": self.layer, "target": self.target, "source": self.source}


@dataclasses.dataclass(frozen=True)
class RunQuery:
    """Every layer of one run: `matrix`, `csv`, `anomalies`."""

    run: str
    target: str  # of the series read: `forward` for activations
    source: str
    start: Optional[int]
    end: Optional[int]
    asked_target: str  # the `target` given (default `loss`): for activations, the target whose origin is asked
    layer: Optional[str] = None
    stat: Optional[str] = None
    max_steps: Optional[int] = None
    points: Optional[int] = None
    flags_start: Optional[int] = None  # `anomalies`: the steps whose flags are sent (the rules see [start, end])
    flags_end: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class CompareQuery:
    """One layer's statistic in several runs: `compare`."""

    runs: List[str]
    layer: str
    stat: str
    target: str
    source: str
    start: Optional[int]
    end: Optional[int]
    max_steps: Optional[int]
    points: Optional[int]


@dataclasses.dataclass(frozen=True)
class DepthQuery:
    """Every layer's statistic in several runs at one step: `depth`."""

    runs: List[str]
    stat: str
    target: str
    source: str
    step: Optional[int]  # None: each run's last


@dataclasses.dataclass(frozen=True)
class NoiseScaleQuery:
    """The noise-scale scalars of several runs: `noise_scale`."""

    runs: List[str]
    start: Optional[int]
    end: Optional[int]
    smoothing: float = noise_scale.DEFAULT_SMOOTHING  # the averaging weight of B_simple (`estimate`)


@dataclasses.dataclass(frozen=True)
class HistogramsAtQuery:
    """One layer's histogram in several runs at one step: `histograms_at`."""

    runs: List[str]
    layers: List[str]  # one per run
    target: str
    source: str
    step: Optional[int]  # None: each run's last


@dataclasses.dataclass(frozen=True)
class SweepQuery:
    """One row per run: `sweep`. `target` None: the worst of each run's own (`run_health.row_targets`). `run`:
    that run's row only (the target the tab opens a run on), None for every run."""

    target: Optional[str]
    source: str
    run: Optional[str] = None


def sweep_query(args: MultiDict) -> SweepQuery:
    return SweepQuery(
        params.optional_name(args, "target", None), params.source(args), params.optional_name(args, "run", None)
    )


def runs_query(args: MultiDict) -> Optional[str]:
    """`runs`: one run, or None for every run."""
    return params.optional_name(args, "run", None)


def noise_scale_query(args: MultiDict) -> NoiseScaleQuery:
    runs = params.runs(args)
    start, end = params.step_range(args)
    return NoiseScaleQuery(runs, start, end, params.smoothing(args, noise_scale.DEFAULT_SMOOTHING))


def _run_query(args: MultiDict, run: str, **more) -> RunQuery:
    asked, source, start, end = params.series_range(args)
    return RunQuery(run, catalog.series_target(asked, source), source, start, end, asked, **more)


def layer_query(args: MultiDict, kind: str) -> LayerQuery:
    """`stats`, `histograms`, `tensor`, `timesteps` (kind `timesteps`: layer outputs only, no `source`)."""
    run = params.required_name(args, "run")
    layer = params.required_name(args, "layer")
    target = params.target(args)
    source = metadata.SOURCE_OUTPUT if kind == metadata.KIND_TIMESTEPS else params.source(args)
    q = LayerQuery(run, layer, catalog.series_target(target, source), source)
    if kind == metadata.KIND_TENSOR:
        return dataclasses.replace(q, step=params.step(args))
    start, end = params.step_range(args)
    points = params.points(args) if kind == metadata.KIND_STATS else None
    return dataclasses.replace(q, start=start, end=end, max_steps=params.max_steps(args), points=points)


def examples_query(args: MultiDict) -> LayerQuery:
    run = params.required_name(args, "run")
    layer = params.required_name(args, "layer")
    q = _run_query(args, run)
    points = params.points(args)
    return LayerQuery(run, layer, q.target, q.source, params.step(args), q.start, q.end, None, points)


def matrix_query(args: MultiDict) -> RunQuery:
    """`stat`: a statistic of the `stats` records, or a per-example one (`examples.MATRIX_STATS`)."""
    stat = params.single(args, "stat")
    run = params.required_name(args, "run")
    if stat not in examples.MATRIX_STATS:
        stat = params.stat(args)
    q = _run_query(args, run, stat=stat)
    return dataclasses.replace(q, max_steps=params.max_steps(args), points=params.points(args))


def csv_query(args: MultiDict) -> RunQuery:
    run = params.required_name(args, "run")
    layer = params.optional_name(args, "layer", None)
    return _run_query(args, run, layer=layer)


def anomalies_query(args: MultiDict) -> RunQuery:
    """`flags_start`/`flags_end`: the steps whose flags are sent; `points`: none sent if they are more (a binned
    `matrix` carries them per bin), so that a long run's answer is not every step's flags."""
    run = params.required_name(args, "run")
    q = _run_query(args, run)
    flags_start, flags_end = params.step_range(args, "flags_start", "flags_end")
    return dataclasses.replace(
        q,
        layer=params.optional_name(args, "layer", None),
        points=params.points(args),
        flags_start=flags_start,
        flags_end=flags_end,
    )


def compare_query(args: MultiDict) -> CompareQuery:
    runs = params.runs(args)
    layer = params.required_name(args, "layer")
    stat = params.stat(args)
    asked, source, start, end = params.series_range(args)
    target = catalog.series_target(asked, source)
    return CompareQuery(runs, layer, stat, target, source, start, end, params.max_steps(args), params.points(args))


def depth_query(args: MultiDict) -> DepthQuery:
    runs = params.runs(args)
    stat = params.stat(args)
    asked, source = params.target(args), params.source(args)
    return DepthQuery(runs, stat, catalog.series_target(asked, source), source, params.step(args))


def histograms_at_query(args: MultiDict) -> HistogramsAtQuery:
    runs = params.runs(args)
    layers = params.layers(args, runs)
    asked, source = params.target(args), params.source(args)
    return HistogramsAtQuery(runs, layers, catalog.series_target(asked, source), source, params.step(args))
