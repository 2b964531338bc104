"""The `stats` series of a run as compact tables, remembered while TensorBoard reports them unchanged.

Why: the overview asks for every layer's statistics at every step twice (the
`matrix` and `anomalies` routes) and again on every poll. Reading 200 layers x
5,000 steps through a data provider converts a million tensor protos one by one,
which takes far longer than a poll may (docs/DESIGN.md, "Reading side"), while the
result is only 200 float64 tables of [5000, 12]. So each tag is kept as such a table (a version-2
group tag as one [steps, layers, 12] table, which its layers share), keyed by
(experiment, run, tag) and valid while `list_tensors` reports the same
`max_step` and `max_wall_time` for it: a new or rewritten record (a later
wall time) or a reload that drops the series invalidates it. Tables of one
request are read in one `read_tensors` call; the least recently used are
dropped beyond `max_bytes`.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata
from tb_layergrad.reader import catalog, series

# Enough for every layer of several 200-layer x 5,000-step runs (~112 MB each).
DEFAULT_MAX_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class StatsRows:
    """One stats series after step selection: ascending unique steps and their stats records."""

    steps: np.ndarray  # int64 [n]
    wall_times: np.ndarray  # float64 [n]
    table: np.ndarray  # float64 [n, len(series.STORED_STATS)]

    @classmethod
    def of(cls, points: series.Points) -> "StatsRows":
        return cls(points.steps, points.wall_times, series.stats_table(points.values))

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.steps.nbytes + self.wall_times.nbytes + self.table.nbytes)

    def between(self, start: Optional[int], end: Optional[int]) -> "StatsRows":
        """The rows with start <= step <= end (None: unbounded)."""
        lo = 0 if start is None else int(np.searchsorted(self.steps, start, side="left"))
        hi = len(self) if end is None else int(np.searchsorted(self.steps, end, side="right"))
        if lo == 0 and hi == len(self):
            return self
        return StatsRows(self.steps[lo:hi], self.wall_times[lo:hi], self.table[lo:hi])

    def thinned(self, max_steps: Optional[int]) -> "StatsRows":
        if max_steps is None or len(self) <= max_steps:
            return self
        keep = series.pick_evenly(len(self), max_steps)
        return StatsRows(self.steps[keep], self.wall_times[keep], self.table[keep])

    def column(self, stat: str) -> np.ndarray:
        return series.stat_column(self.table, stat)


def union(parts: Sequence[StatsRows]) -> StatsRows:
    """One layer's rows from several tags (docs/FORMAT.md, version 2): by step, the later wall time wins."""
    parts = [p for p in parts if len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else StatsRows(np.zeros([0], np.int64), np.zeros([0]), np.zeros([0, len(series.STORED_STATS)]))
    ordered = sorted(parts, key=lambda p: int(p.steps[0]))
    if all(int(a.steps[-1]) < int(b.steps[0]) for a, b in zip(ordered, ordered[1:])):
        # The blocks of one group (docs/FORMAT.md): disjoint step ranges, so no step to choose between.
        return StatsRows(np.concatenate([p.steps for p in ordered]), np.concatenate([p.wall_times for p in ordered]),
                         np.concatenate([p.table for p in ordered]))
    steps = np.concatenate([p.steps for p in parts])
    walls = np.concatenate([p.wall_times for p in parts])
    order = np.lexsort((walls, steps))  # stable: at equal step and wall time, the later part wins
    steps, walls = steps[order], walls[order]
    last = np.append(steps[1:] != steps[:-1], True)
    table = np.concatenate([p.table for p in parts])[order][last]
    return StatsRows(steps[last], walls[last], table)


@dataclasses.dataclass(frozen=True)
class GroupRows:
    """The stats records of one version-2 tag: every layer's row, kept once; a layer's rows are a view."""

    steps: np.ndarray  # int64 [n]
    wall_times: np.ndarray  # float64 [n]
    table: np.ndarray  # float64 [n, layers, len(series.STORED_STATS)]

    @property
    def nbytes(self) -> int:
        return int(self.steps.nbytes + self.wall_times.nbytes + self.table.nbytes)

    def layer(self, row: int) -> StatsRows:
        return StatsRows(self.steps, self.wall_times, self.table[:, row, :])


def group_rows(data: Sequence[tb_provider.TensorDatum], part: catalog.Part, run: str) -> GroupRows:
    """A version-2 stats tag as a table in STAT_FIELDS order: columns mapped by name (an unknown one
    ignored, a missing one NaN); a record whose shape is not [layers, fields] is skipped (warned)."""
    width = len(part.fields)
    kept = [d for d in data if series.fits(d, part.tag, run, (part.rows, width))]
    points = series.select(kept)
    table = np.full([len(points), part.rows, len(series.STORED_STATS)], np.nan, dtype=np.float64)
    if len(points):
        raw = np.stack([np.asarray(v, dtype=np.float64) for v in points.values])
        for j, name in enumerate(part.fields):
            if name in metadata.STAT_INDEX:
                table[:, :, metadata.STAT_INDEX[name]] = raw[:, :, j]
    return GroupRows(points.steps, points.wall_times, table)


_Key = Tuple[str, str, str]  # (experiment id, run, tag)
_Version = Tuple[Optional[int], Optional[float]]  # (max_step, max_wall_time) from list_tensors
_Rows = Union[StatsRows, GroupRows]


class StatsStore:
    """Reads stats series through a data provider; thread-safe (TensorBoard serves requests in threads).

    Keeps one table per tag: a version-1 tag's [n, fields], or a version-2 group's [n, layers, fields]
    once, whose layers are sliced as views (no copy per layer)."""

    def __init__(self, data_provider: tb_provider.DataProvider, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._provider = data_provider
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._tables: "collections.OrderedDict[_Key, Tuple[_Version, _Rows]]" = collections.OrderedDict()
        self._bytes = 0

    def read(
        self,
        ctx: object,
        experiment_id: str,
        run: str,
        stats_series: Sequence[catalog.Series],
        start: Optional[int] = None,
        end: Optional[int] = None,
    ) -> Dict[catalog.SeriesKey, StatsRows]:
        """`{series key: StatsRows}` of the given stats series of one run, within [start, end]."""
        parts = {p.tag: p for s in stats_series for p in s.parts}
        found: Dict[str, _Rows] = {}
        missing = []
        with self._lock:
            for tag, p in parts.items():
                key, version = (experiment_id, run, tag), (p.max_step, p.max_wall_time)
                hit = self._tables.get(key)
                if hit is not None and hit[0] == version:
                    self._tables.move_to_end(key)
                    found[tag] = hit[1]
                else:
                    missing.append(p)
        if missing:
            data = series.read(self._provider, ctx, experiment_id, run, [p.tag for p in missing],
                               alone=[p.tag for p in missing if p.grouped])
            fresh = {p.tag: self._rows(data.get(p.tag, ()), p, run) for p in missing}
            with self._lock:
                for p in missing:
                    self._put((experiment_id, run, p.tag), (p.max_step, p.max_wall_time), fresh[p.tag])
            found.update(fresh)
        out = {}
        for s in stats_series:
            rows = [found[p.tag] if not p.grouped else found[p.tag].layer(p.row) for p in s.parts]
            out[s.key] = union(rows).between(start, end)
        return out

    @staticmethod
    def _rows(data: Sequence[tb_provider.TensorDatum], part: catalog.Part, run: str) -> _Rows:
        if part.grouped:
            return group_rows(data, part, run)
        return StatsRows.of(series.select(data))

    def _put(self, key: _Key, version: _Version, rows: _Rows) -> None:
        old = self._tables.pop(key, None)
        if old is not None:
            self._bytes -= old[1].nbytes
        if rows.nbytes > self._max_bytes:
            return
        self._tables[key] = (version, rows)
        self._bytes += rows.nbytes
        while self._bytes > self._max_bytes:
            _, (_, dropped) = self._tables.popitem(last=False)
            self._bytes -= dropped.nbytes
