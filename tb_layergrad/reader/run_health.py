"""One run's gradient health in one row: what the `sweep` route lists per run beside its hyperparameters.

Nothing is decided here: the row gathers what the readers already decide for the `anomalies` route and
`tb-layergrad report` (`run_anomalies.read_run` and `read_dominance`, `verdict`, `trends.trend`), over the
whole run, so that a sweep's columns are the numbers the tab's overview and the report show for that run.
Rows are kept per run while the run's listing is unchanged (`HealthCache`): a poll of a sweep whose runs
stopped recomputes nothing. No TensorFlow.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
from typing import List, Optional, Sequence, Tuple

import numpy as np

from tb_layergrad import metadata
from tb_layergrad.reader import anomalies, catalog, run_anomalies, series, trends
from tb_layergrad.reader.run_source import RunSource


@dataclasses.dataclass(frozen=True)
class Measure:
    """A numeric column of a health row: its key (dotted for nested), a label for a person, its kind."""

    key: str
    label: str
    kind: str  # "severity", "step", "count" (layers or steps), "value", "decades"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


MEASURES: Tuple[Measure, ...] = (
    Measure("severity", "severity of the worst finding", "severity"),
    Measure("first_nonfinite.step", "first NaN/Inf step", "step"),
    Measure("latest.nonfinite", "NaN/Inf layers at the last step", "count"),
    Measure("latest.exploding", "exploding layers at the last step", "count"),
    Measure("latest.dead", "dead layers at the last step", "count"),
    Measure("latest.vanishing", "vanishing layers at the last step", "count"),
    Measure("latest.vanishing_over_steps", "layers vanishing over steps", "count"),
    Measure("latest.vanishing_through_time", "layers vanishing through time", "count"),
    Measure("dominated_steps", "steps where one example dominates", "count"),
    Measure("noise_scale_end", "noise scale at the end (smoothed)", "value"),
    Measure("norm_trend", "trend of the global gradient norm (decades)", "decades"),
    Measure("last_step", "last step", "step"),
    Measure("layers", "layers", "count"),
)
# The fields of a row with no statistics for its target (the run is still listed).
EMPTY = {
    "last_step": None,
    "layers": 0,
    "severity": None,
    "verdict": None,
    "verdict_text": None,
    "first_nonfinite": None,
    "latest": None,
    "dominated_steps": None,
    "norm_trend": None,
    "line": None,
}


def default_targets(targets: Sequence[str]) -> List[str]:
    """The targets a run is reported on when none is asked: `loss` if the run has it, else every one of the run's.

    A custom `train_step` names its targets after what each tape trains (a GAN's `discriminator` and
    `generator`): such a run has no `loss`, and each of its targets may be where it went wrong. One row
    per run (the sweep) takes the first of these.

    Args:
      targets: the run's targets (the catalog's order).

    Returns:
      `["loss"]`, or `targets` as a list.

    Example:
      >>> default_targets(["discriminator", "generator"])
      ['discriminator', 'generator']
      >>> default_targets(["aux", "loss"])
      ['loss']
    """
    return [metadata.DEFAULT_TARGET] if metadata.DEFAULT_TARGET in targets else list(targets)


def row_targets(rc: catalog.RunCatalog, asked: Optional[str]) -> List[str]:
    """The targets a run's row may be about: the one asked, else `default_targets` (`loss` for a run without any)."""
    if asked is not None:
        return [asked]
    return default_targets(rc.targets()) or [metadata.DEFAULT_TARGET]


def worst_health(src: RunSource, targets: Sequence[str], source: str) -> Tuple[str, dict]:
    """(target, `health`) of the target in the worst state among `targets` (the first of equals).

    Why the worst: a run without `loss` (a GAN's `discriminator` and `generator`) can go wrong in any of its
    targets, and one row per run must not say "ok" while its generator's gradients vanish."""
    rows = [(target, health(src, target, source)) for target in targets]
    return max(rows, key=lambda row: -1 if row[1]["severity"] is None else row[1]["severity"])  # the first of equals


def global_norm_trend(src: RunSource, stats_series: Sequence[catalog.Series]) -> Optional[float]:
    """`trends.trend` of the global gradient norm: sqrt of the sum of the layers' squared norms, at the steps
    where every layer has a record (a NaN/Inf in any layer leaves the step out, as for a layer's trend).

    Read from the layers' last rows when their last steps are the same (the union's last steps then): the trend
    is over the last TREND_WINDOW usable steps, so a run being written is not stacked whole at each change."""
    if not stats_series:
        return None
    read = src.stats(stats_series)
    tables = [(read[s.key].steps, read[s.key].table) for s in stats_series]
    n = min(len(steps) for steps, _ in tables)
    k = _TAIL
    while k < n:
        tail = [(steps[len(steps) - k :], table[len(steps) - k :]) for steps, table in tables]
        if not all(np.array_equal(a, tail[0][0]) for a, _ in tail[1:]):
            break
        value, usable = _norm_trend(tail)
        if usable >= trends.TREND_WINDOW:
            return value
        k *= 4
    return _norm_trend(tables)[0]


_TAIL = 64  # the layers' last rows looked at first for the global norm's trend


def _norm_trend(tables: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[Optional[float], int]:
    """(the global norm's trend over these rows, how many of their steps it could use)."""
    steps = series.union_steps([t[0] for t in tables])
    norm = np.stack([series.align(pts, series.stat_column(table, "norm"), steps) for pts, table in tables])
    bad = np.stack([series.align(pts, series.stat_column(table, "nonfinite"), steps) for pts, table in tables])
    whole = ~np.isnan(norm).any(axis=0) & ~np.isnan(bad).any(axis=0)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sqrt(np.square(norm[:, whole]).sum(axis=0))
    nonfinite = bad[:, whole].sum(axis=0)
    value = trends.trend(steps[whole], total, nonfinite)
    usable = int(trends.usable(total, nonfinite).sum())
    return (value if value is None or math.isfinite(value) else None), usable


def health(src: RunSource, target: str, source: str = metadata.SOURCE_OUTPUT) -> dict:
    """The health fields of run `src.rc`'s row for (target, source), over the whole run.

    Args:
      src: the run to read (`RunSource`: the plugin's, with its store; or the report's).
      target: the differentiated target the row is about (`row_targets`).
      source: `output`, `weight` or `activation` (then the series of the forward pass, the origin for `target`).

    Returns:
      `last_step`, `layers`, `severity` and `verdict` (the worst layer's, `anomalies.SEVERITY`), `verdict_text`
      (that verdict with every other kind of finding of the run, `anomalies.run_text`), `first_nonfinite`
      (`step`, `pass`, `origin`, `line` of where the run first went non-finite, or null), `latest` (layers
      flagged at the last step, `RunAnomalies.latest`), `dominated_steps` (null without per-example records),
      `norm_trend` and `line` (the first finding's sentence); `EMPTY` when the run has no such statistics.

    Example:

        from tensorboard import context
        from tb_layergrad.reader import catalog, event_files, run_health
        provider = event_files.open_provider("logs")
        rc = catalog.load(provider, context.RequestContext(), "").run("train")
        run_health.health(run_health.RunSource(provider, context.RequestContext(), "", rc), "loss")["verdict"]
    """
    read_target = catalog.series_target(target, source)
    result = run_anomalies.read_run(src, read_target, source, origin_target=target)
    if result is None:
        return dict(EMPTY)
    result.dominated = run_anomalies.read_dominance(src, read_target, source)
    worst = anomalies.worst(result.verdicts())
    found = anomalies.findings(result)
    stats_series = src.rc.with_kind(read_target, source, metadata.KIND_STATS)
    return {
        "last_step": result.last_step,
        "layers": len(result.layers),
        "severity": anomalies.SEVERITY[worst.state] if worst is not None else None,
        "verdict": worst.state if worst is not None else None,
        "verdict_text": anomalies.run_text(result),
        "first_nonfinite": _first_nonfinite(result, found),
        "latest": result.latest,
        "dominated_steps": None if result.dominated is None else len({s for d in result.dominated for s in d.at}),
        "norm_trend": global_norm_trend(src, stats_series),
        "line": found[0]["line"]
        if found
        else f"no finding in {len(result.layers)} layers over {result.steps.size} steps",
    }


def _first_nonfinite(result, found: List[dict]) -> Optional[dict]:
    """Where the run first went non-finite (its origin: step, pass, layer), else its earliest non-finite
    gradient (pass and origin null), with the line of its finding (`anomalies.findings`); None if nothing ever was."""
    line = next((f["line"] for f in found if f["kind"] == anomalies.NONFINITE_STATE), None)
    o = result.origin
    if o is not None:
        return {"step": o.step, "pass": o.pass_, "origin": o.origin, "layers": list(o.layers), "line": line}
    first = result.earliest_nonfinite
    if first is None:
        return None
    return {"step": first["step"], "pass": None, "origin": None, "layers": list(first["layers"]), "line": line}


class HealthCache:
    """Rows by (experiment, run, asked target, source), kept while the run's listing is the same
    (`catalog.listing_signature`); thread-safe. `None` as the asked target: the worst of the run's own (`row_targets`, `worst_health`).

    Args:
      max_rows: how many rows to keep (the least recently used are dropped).
    """

    def __init__(self, max_rows: int = 4096) -> None:
        self._max_rows = max_rows
        self._rows: "collections.OrderedDict[tuple, Tuple[Optional[tuple], dict]]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._computing: set = set()  # rows being computed now
        self.computed = 0  # rows computed since start: what a test of "nothing recomputed" reads

    def get(self, experiment_id: str, run: str, target: Optional[str], source: str, signature: tuple) -> Optional[dict]:
        """The kept row of a run whose listing has this signature, or None."""
        with self._lock:
            hit = self._rows.get((experiment_id, run, target, source))
            if hit is None or hit[0] != signature:
                return None
            self._rows.move_to_end((experiment_id, run, target, source))
            return hit[1]

    def holds(self, experiment_id: str, rc: catalog.RunCatalog, target: Optional[str], source: str) -> bool:
        """Whether `row` would find the run's row kept and current (compute nothing)."""
        return self.get(experiment_id, rc.run, target, source, rc.signature) is not None

    def row(self, src: RunSource, target: Optional[str], source: str) -> dict:
        """The run's row: `{"target": the row's target, **health(...), "warnings": the run's listing's}`,
        computed only if the run's listing changed since it was last computed."""
        rc = src.rc
        hit = self.get(src.experiment_id, rc.run, target, source, rc.signature)
        if hit is not None:
            return hit
        key = (src.experiment_id, rc.run, target, source)
        with self._lock:
            # A run being written changes at every step: while one request computes its row, the others answer
            # with the row kept (as of an earlier step) instead of computing the same row again.
            if key in self._computing and key in self._rows:
                return self._rows[key][1]
            mine = key not in self._computing
            self._computing.add(key)
        try:
            chosen, found = worst_health(src, row_targets(rc, target), source)
        finally:
            if mine:
                with self._lock:
                    self._computing.discard(key)
        value = {"target": chosen, **found, "warnings": list(rc.warnings)}
        with self._lock:
            self.computed += 1
            # Computed from tables kept as of another listing (`RunSource.behind`): kept as no listing's row.
            self._rows[key] = (None if src.behind else rc.signature, value)
            self._rows.move_to_end(key)
            while len(self._rows) > self._max_rows:
                self._rows.popitem(last=False)
        return value
