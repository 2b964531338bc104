"""The `stats` series of a run as compact tables, remembered while TensorBoard reports them unchanged.

Why: the overview asks for every layer's statistics at every step twice (the
`matrix` and `anomalies` routes) and again on every poll. Reading 200 layers x
5,000 steps through a data provider converts a million tensor protos one by one,
which takes far longer than a poll may (docs/DESIGN.md, "Reading side"), while the
result is only 200 float64 tables of [5000, 12]. So each version-1 tag is kept as such a table, and each
version-2 group (its blocks of steps, a tag each) as one [steps, layers, 12] table its layers share as
views (`UnitedGroup`), keyed by (experiment, run, tag or group) and valid while `list_tensors` reports the
same `max_step` and `max_wall_time` for the tag (for every block of the group): a new or rewritten record
(a later wall time) or a reload that drops the series invalidates it, and only the blocks that changed
are read again. Version-1 tags of one request are read in one `read_tensors` call, each block in a call
of its own (an answer is capped, docs/FORMAT.md); the least recently used tables are dropped beyond
`max_bytes`.
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
        return (
            parts[0]
            if parts
            else StatsRows(np.zeros([0], np.int64), np.zeros([0]), np.zeros([0, len(series.STORED_STATS)]))
        )
    ordered = sorted(parts, key=lambda p: int(p.steps[0]))
    if all(int(a.steps[-1]) < int(b.steps[0]) for a, b in zip(ordered, ordered[1:])):
        # The blocks of one group (docs/FORMAT.md): disjoint step ranges, so no step to choose between.
        return StatsRows(
            np.concatenate([p.steps for p in ordered]),
            np.concatenate([p.wall_times for p in ordered]),
            np.concatenate([p.table for p in ordered]),
        )
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
    points = series.select_fitting(data, part.tag, run, (part.rows, width))
    if not len(points):
        return GroupRows(points.steps, points.wall_times, np.zeros([0, part.rows, len(series.STORED_STATS)]))
    raw = np.stack([np.asarray(v, dtype=np.float64) for v in points.values])
    if tuple(part.fields) == series.STORED_STATS:  # as written here: the columns are already in place
        return GroupRows(points.steps, points.wall_times, raw)
    table = np.full([len(points), part.rows, len(series.STORED_STATS)], np.nan, dtype=np.float64)
    for j, name in enumerate(part.fields):
        if name in metadata.STAT_INDEX:
            table[:, :, metadata.STAT_INDEX[name]] = raw[:, :, j]
    return GroupRows(points.steps, points.wall_times, table)


class _Room:
    """A united table's memory with room for steps to come: the table is a view of its first `used` steps.

    Why: a run being written grows its last block at every step; copying the whole group into a new table
    at every change is work in proportion to the run, per request. With room, the new steps are written
    after the others, where no view handed out looks, and the table is rebuilt only when the room is full."""

    def __init__(self, steps: int, rows: int) -> None:
        self.table = column_major(steps, rows)
        self.used = 0


@dataclasses.dataclass(frozen=True)
class UnitedGroup:
    """The blocks of one version-2 group (a tag each, docs/FORMAT.md) as one table, and where each block is in it.

    Why: a long run's group is many blocks, and its layers are read as whole columns; slicing each
    layer out of each block and joining them again cost as much as reading. Kept united, a layer is a
    view; when TensorBoard reports one block changed (the last, while training goes on) only that
    block is read again and the table rebuilt around the others; read through the plugin's own index
    (`series.read_since`), only the block's new records are read, and written after the others (`_Room`).
    """

    versions: Dict[str, "_Version"]  # block tag -> (max_step, max_wall_time)
    spans: Dict[str, Tuple[int, int]]  # block tag -> its rows [a, b) in `rows`
    rows: GroupRows
    positions: Dict[str, tuple] = dataclasses.field(default_factory=dict)  # block tag -> where its read stopped
    room: Optional[_Room] = None

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes if self.room is None else int(self.room.table.nbytes + 2 * self.rows.steps.nbytes)

    def block(self, tag: str) -> GroupRows:
        a, b = self.spans[tag]
        r = self.rows
        return GroupRows(r.steps[a:b], r.wall_times[a:b], r.table[a:b])

    def appended(
        self, tag: str, new: GroupRows, versions: Dict[str, "_Version"], positions: Dict[str, tuple]
    ) -> Optional["UnitedGroup"]:
        """This group with `new` rows after the last of block `tag`, written in its room; None when that cannot
        be done in place (not the last block, no room left, or another table grew from this one already)."""
        a, b = self.spans.get(tag, (-1, -1))
        n, k = len(self.rows.steps), len(new.steps)
        room = self.room
        if b != n or room is None or room.used != n or n + k > room.table.shape[0]:
            return None
        room.table[n : n + k] = new.table
        room.used = n + k
        rows = GroupRows(
            np.concatenate([self.rows.steps, new.steps]),
            np.concatenate([self.rows.wall_times, new.wall_times]),
            room.table[: n + k],
        )
        return UnitedGroup(dict(versions), {**self.spans, tag: (a, n + k)}, rows, dict(positions), room)


def column_major(steps: int, rows: int) -> np.ndarray:
    """An empty [steps, rows, fields] table laid out so that one layer's one statistic over all steps is contiguous.

    Why: the routes read a group column by column (a statistic of a layer, derived ones computed from
    several); in step-major order each of those values sits a whole record apart, so every column touched
    the whole table's memory. Filling this layout costs little more than a plain copy.
    """
    return np.empty([rows, len(series.STORED_STATS), steps], np.float64).transpose(2, 0, 1)


def unite(
    blocks: Dict[str, Union[GroupRows, series.Points]],
    versions: Dict[str, "_Version"],
    rows: int,
    positions: Optional[Dict[str, tuple]] = None,
    growing: bool = False,
) -> UnitedGroup:
    """Blocks of one group, ordered by their first step (their step ranges are disjoint), copied once into
    one table: a block read now (`series.Points` of [layers, STAT_FIELDS] records) or one kept (`GroupRows`).
    `growing`: the group is being written, so the table gets room for an eighth more steps (`_Room`)."""
    order = sorted((t for t in blocks if len(blocks[t].steps)), key=lambda t: int(blocks[t].steps[0]))
    spans, at = {}, 0
    for t in order:
        spans[t] = (at, at + len(blocks[t].steps))
        at = spans[t][1]
    for t in blocks:
        spans.setdefault(t, (at, at))  # an empty block: no rows
    room = _Room(at + at // 8 + 256, rows) if growing else None
    table = room.table[:at] if room is not None else column_major(at, rows)
    if room is not None:
        room.used = at
    for t in order:
        a, b = spans[t]
        block = blocks[t]
        if isinstance(block, GroupRows):
            table[a:b] = block.table
        else:
            np.stack(block.values, out=table[a:b])
    steps = np.concatenate([blocks[t].steps for t in order]) if order else np.zeros([0], np.int64)
    walls = np.concatenate([blocks[t].wall_times for t in order]) if order else np.zeros([0], np.float64)
    return UnitedGroup(dict(versions), spans, GroupRows(steps, walls, table), dict(positions or {}), room)


def as_group_rows(block: Union[GroupRows, series.Points], rows: int) -> GroupRows:
    """`block_points`' answer as a `GroupRows` table."""
    if isinstance(block, GroupRows):
        return block
    table = np.zeros([len(block.steps), rows, len(series.STORED_STATS)])
    if len(block.steps):
        np.stack(block.values, out=table)
    return GroupRows(block.steps, block.wall_times, table)


def block_points(
    data: Sequence[tb_provider.TensorDatum], part: catalog.Part, run: str
) -> Union[GroupRows, series.Points]:
    """A version-2 stats block as read: its fitting records (`series.Points`) when its columns are STAT_FIELDS
    (`unite` copies them once), else already mapped to them (`group_rows`)."""
    if tuple(part.fields) != series.STORED_STATS:
        return group_rows(data, part, run)
    if isinstance(data, series.Batch) and len(data) and data.fit((part.rows, len(part.fields))):
        # Records as arrays: `select`'s records at once (a record that does not fit is said record by record below).
        at = data.last_of_each_step()
        table = np.asarray(data.values[at], dtype=np.float64)
        return GroupRows(data.steps[at].astype(np.int64), data.wall_times[at].astype(np.float64), table)
    return series.select_fitting(data, part.tag, run, (part.rows, len(part.fields)))


_Key = Tuple[str, str, str]  # (experiment id, run, tag)
_Version = Tuple[Optional[int], Optional[float]]  # (max_step, max_wall_time) from list_tensors
_Rows = Union[StatsRows, UnitedGroup]


def _version(part: catalog.Part) -> "_Version":
    return (part.max_step, part.max_wall_time)


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
        # One reader of a run at a time: a request that arrives while the run is being read (by another
        # request, or by `plugin.prefetch` in the background) waits for that read and uses it, instead of
        # converting the same records a second time on the same cores.
        self._run_locks: Dict[Tuple[str, str], threading.Lock] = {}

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def nbytes(self) -> int:
        """The bytes of the tables kept now."""
        with self._lock:
            return self._bytes

    def holds(self, experiment_id: str, run: str) -> bool:
        """Whether any table of the run is kept (it was read before, and not dropped since)."""
        with self._lock:
            return any(k[0] == experiment_id and k[1] == run for k in self._tables)

    def is_current(self, experiment_id: str, run: str, stats_series: Sequence[catalog.Series]) -> bool:
        """Whether `read` of these series would find every table kept and current (no read at all)."""
        parts = {p.tag: p for s in stats_series for p in s.parts}
        groups: Dict[str, Dict[str, "_Version"]] = {}
        for t, p in parts.items():
            if p.grouped:
                groups.setdefault(p.group, {})[t] = _version(p)
        with self._lock:
            singles = [(t, p) for t, p in parts.items() if not p.grouped]
            if any((self._tables.get((experiment_id, run, t)) or (None,))[0] != _version(p) for t, p in singles):
                return False
            return all(
                k in self._tables and self._tables[k][1].versions == want
                for k, want in (((experiment_id, run, g), w) for g, w in groups.items())
            )

    def holds_all(self, experiment_id: str, run: str, stats_series: Sequence[catalog.Series]) -> bool:
        """Whether every part of these series is kept as listed (a group may hold more blocks besides)."""
        with self._lock:
            return self._holds_all(experiment_id, run, stats_series)

    def _holds_all(self, experiment_id: str, run: str, stats_series: Sequence[catalog.Series]) -> bool:
        for s in stats_series:
            for p in s.parts:
                hit = self._tables.get((experiment_id, run, p.group if p.grouped else p.tag))
                held = None if hit is None else (hit[1].versions.get(p.tag) if p.grouped else hit[0])
                if held != _version(p):
                    return False
        return True

    def read_ahead(self, ctx: object, experiment_id: str, run: str, stats_series: Sequence[catalog.Series]) -> bool:
        """Read what of these series is not kept as listed; False if all was (then a group keeps any block it
        holds besides, say the last one a request read). Whether to read is decided under the run's lock, so
        a request that read the run meanwhile is not undone."""
        with self._run_lock(experiment_id, run):
            if self.holds_all(experiment_id, run, stats_series):
                return False
            self._read(ctx, experiment_id, run, stats_series, None, None)
            return True

    def _run_lock(self, experiment_id: str, run: str) -> threading.Lock:
        with self._lock:
            return self._run_locks.setdefault((experiment_id, run), threading.Lock())

    def read(
        self,
        ctx: object,
        experiment_id: str,
        run: str,
        stats_series: Sequence[catalog.Series],
        start: Optional[int] = None,
        end: Optional[int] = None,
    ) -> Dict[catalog.SeriesKey, StatsRows]:
        """`{series key: StatsRows}` of the given stats series of one run, within [start, end] (`read_listed`'s
        rows)."""
        return self.read_listed(ctx, experiment_id, run, stats_series, start, end)[0]

    def read_listed(
        self,
        ctx: object,
        experiment_id: str,
        run: str,
        stats_series: Sequence[catalog.Series],
        start: Optional[int] = None,
        end: Optional[int] = None,
    ) -> Tuple[Dict[catalog.SeriesKey, StatsRows], bool]:
        """(`{series key: StatsRows}` of the given stats series of one run, within [start, end]; whether they are
        the records the series' listing says: False when they are tables kept as of another listing).

        While another request (or the read-ahead) reads the run, the tables kept of every series asked are
        answered at once (a run being written: as of that read's start) instead of waiting for the read and
        then reading the run's new records again: a run appended at every step is then read by one request at
        a time, however many ask, and none waits longer than one read. With nothing kept, it waits for that
        read, and answers what it kept if it read what is asked. Why say which: an answer made of rows older
        than the listing it was asked with must not be kept as that listing's answer (`AnswerCache`,
        `HealthCache`), or a run that then stops changing (a finished run, a record completed) would show its
        earlier steps for good."""
        lock = self._run_lock(experiment_id, run)
        if not lock.acquire(blocking=False):
            kept = self._kept(experiment_id, run, stats_series, start, end)
            if kept is not None:
                return kept
            lock.acquire()
            try:  # the read waited for may have kept what is asked (as of its start): not read a second time
                kept = self._kept(experiment_id, run, stats_series, start, end)
                if kept is not None:
                    return kept
                return self._read(ctx, experiment_id, run, stats_series, start, end), True
            finally:
                lock.release()
        try:
            return self._read(ctx, experiment_id, run, stats_series, start, end), True
        finally:
            lock.release()

    def _kept(
        self,
        experiment_id: str,
        run: str,
        stats_series: Sequence[catalog.Series],
        start: Optional[int],
        end: Optional[int],
    ) -> Optional[Tuple[Dict[catalog.SeriesKey, StatsRows], bool]]:
        """The series as the tables kept hold them, whatever their version, and whether that is the version listed
        (as `holds_all`, in the same hold of the lock); None if one has no table kept."""
        out = {}
        with self._lock:
            for s in stats_series:
                rows = []
                for key, row in dict.fromkeys((p.group, p.row) if p.grouped else (p.tag, None) for p in s.parts):
                    hit = self._tables.get((experiment_id, run, key))
                    if hit is None:
                        return None
                    rows.append(hit[1].rows.layer(row) if row is not None else hit[1])
                out[s.key] = union(rows).between(start, end)
            return out, self._holds_all(experiment_id, run, stats_series)

    def _read(
        self,
        ctx: object,
        experiment_id: str,
        run: str,
        stats_series: Sequence[catalog.Series],
        start: Optional[int],
        end: Optional[int],
    ) -> Dict[catalog.SeriesKey, StatsRows]:
        parts = {p.tag: p for s in stats_series for p in s.parts}
        singles = {t: p for t, p in parts.items() if not p.grouped}
        groups: Dict[str, Dict[str, catalog.Part]] = {}
        for t, p in parts.items():
            if p.grouped:
                groups.setdefault(p.group, {})[t] = p
        found: Dict[str, StatsRows] = {}
        united: Dict[str, UnitedGroup] = {}
        missing: Dict[str, catalog.Part] = {}
        stale: Dict[str, Optional[UnitedGroup]] = {}  # group -> its cached blocks (None: none) to rebuild
        with self._lock:
            for tag, p in singles.items():
                hit = self._get((experiment_id, run, tag), _version(p))
                if hit is not None:
                    found[tag] = hit
                else:
                    missing[tag] = p
            for group, blocks in groups.items():
                want = {t: _version(p) for t, p in blocks.items()}
                hit = self._tables.get((experiment_id, run, group))
                if hit is not None and hit[1].versions == want:
                    self._tables.move_to_end((experiment_id, run, group))
                    united[group] = hit[1]
                    continue
                old = hit[1] if hit is not None else None
                stale[group] = old
                for t, p in blocks.items():
                    if old is None or old.versions.get(t) != want[t]:
                        missing[t] = p
        # A stale group may lack nothing: it holds a block no longer listed (a reload dropped it); rebuilt all the same.
        # A block kept and grown since is read from where its last read stopped, when the provider can say so.
        tails = series.read_since(
            self._provider,
            ctx,
            experiment_id,
            run,
            {
                t: (stale[p.group].positions.get(t) if stale.get(p.group) is not None else None)
                for t, p in missing.items()
                if p.grouped
            },
        )
        whole = [t for t, p in missing.items() if not (p.grouped and tails is not None)]
        data = (
            series.read(
                self._provider,
                ctx,
                experiment_id,
                run,
                whole,
                alone=[t for t in whole if missing[t].grouped],
            )
            if whole
            else {}
        )
        if missing or stale:
            with self._lock:
                for tag, p in missing.items():
                    if not p.grouped:
                        found[tag] = StatsRows.of(series.select(data.get(tag, ())))
                        self._put((experiment_id, run, tag), _version(p), found[tag])
            for group, old in stale.items():
                united[group] = self._rebuilt(ctx, experiment_id, run, groups[group], old, missing, data, tails)
            with self._lock:
                for group in stale:
                    self._put((experiment_id, run, group), None, united[group])
        out = {}
        for s in stats_series:
            # A layer's blocks of one group are one view of the united table; other groups and tags join it.
            where = dict.fromkeys((p.group, p.row) if p.grouped else (p.tag, None) for p in s.parts)
            rows = [united[k].rows.layer(row) if row is not None else found[k] for k, row in where]
            out[s.key] = union(rows).between(start, end)
        return out

    def _rebuilt(
        self,
        ctx: object,
        experiment_id: str,
        run: str,
        parts: Dict[str, catalog.Part],
        old: Optional[UnitedGroup],
        missing: Dict[str, catalog.Part],
        data: Dict[str, Sequence[tb_provider.TensorDatum]],
        tails: Optional[Dict[str, tuple]],
    ) -> UnitedGroup:
        """A stale group's table as listed now: its unchanged blocks kept, the others read whole (`data`) or
        their new records (`tails`) after the kept ones. The same table as a read of every block: new records
        are appended only when all their steps follow the block's kept ones (else the block is read whole)."""
        some = next(iter(parts.values()))
        versions = {t: _version(p) for t, p in parts.items()}
        blocks: Dict[str, Union[GroupRows, series.Points]] = {}
        positions: Dict[str, tuple] = {}
        grown: Dict[str, GroupRows] = {}
        again = []
        for t, p in parts.items():
            if t not in missing:
                blocks[t] = old.block(t)
                if t in old.positions:
                    positions[t] = old.positions[t]
                continue
            if tails is None:
                blocks[t] = block_points(data.get(t, ()), p, run)
                continue
            pos, is_whole, records = tails.get(t, (None, True, ()))
            if pos is not None:
                positions[t] = pos
            if is_whole:
                blocks[t] = block_points(records, p, run)
                continue
            kept = old.block(t)
            new = as_group_rows(block_points(records, p, run), p.rows)
            if not len(new.steps):
                blocks[t] = kept
            elif not len(kept.steps) or int(new.steps[0]) > int(kept.steps[-1]):
                grown[t] = new
            else:
                again.append(t)  # a step written again (a restarted run): the block is read whole
        if again:
            read = series.read_since(self._provider, ctx, experiment_id, run, {t: None for t in again}) or {}
            for t in again:
                pos, _, records = read.get(t, (None, True, ()))
                positions.pop(t, None)
                if pos is not None:
                    positions[t] = pos
                blocks[t] = block_points(records, parts[t], run)
        if (
            len(grown) == 1
            and len(blocks) == len(parts) - 1
            and all(isinstance(b, GroupRows) and t not in missing for t, b in blocks.items())
        ):
            ((t, new),) = grown.items()
            done = old.appended(t, new, versions, positions)
            if done is not None:
                return done
        for t, new in grown.items():
            kept = old.block(t)
            blocks[t] = GroupRows(
                np.concatenate([kept.steps, new.steps]),
                np.concatenate([kept.wall_times, new.wall_times]),
                np.concatenate([kept.table, new.table]),
            )
        return unite(blocks, versions, some.rows, positions, growing=old is not None)

    def _get(self, key: "_Key", version: "_Version") -> Optional[StatsRows]:
        hit = self._tables.get(key)
        if hit is None or hit[0] != version:
            return None
        self._tables.move_to_end(key)
        return hit[1]

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
