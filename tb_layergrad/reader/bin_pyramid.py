"""The binned answer over a whole run being written, from power-of-two bins appended to as the run grows.

Why: a binned `matrix` (`downsample.downsample`) cuts the run into `points` equal step ranges, which move as
the run grows, so each change of a run being written re-binned every step of it. What a bin reports is a
minimum, a maximum and ORed bits: exact in any grouping. So each column is kept as a pyramid of aligned
power-of-two bins of rows (level k: the rows [j * 2**k, (j + 1) * 2**k), complete ones only), and a run's
new rows add the bins they complete, level by level: work per change is the new rows. A bin of the answer is
made of at most two pyramid bins per level (a segment tree's query), so an answer costs its bins times the
levels, not the run's rows. The answer is `downsample.downsample`'s, bin for bin and kept row for kept row;
the rows where a flag starts are kept as they are found (`downsample.onsets` of each new row against the
row before it).

When: the whole run only (no `start`/`end`), every column with the same steps (a record at each), and each
column's table the same memory as at the last answer with rows after it (`rule_fold.extends`: the store
writes a growing run's rows after the others); anything else is answered by `downsample` (None here).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import warnings
from typing import Callable, Hashable, List, Optional, Sequence, Tuple

import numpy as np

from tb_layergrad.reader import downsample, series
from tb_layergrad.reader.rule_fold import extends, mark
from tb_layergrad.reader.stats_store import StatsRows

_LOW = 3  # levels below this are read from the rows (at most 8 a bin): the kept levels are an eighth of the rows
_NOT_FINITE = 16  # the bit above the four anomaly flags (docs/ANOMALIES.md) in a row's bits
_FLAGS = 15


def _room(array: np.ndarray, size: int) -> np.ndarray:
    """`array` ([c, m]) with room for at least `size` columns: the same array, or a copy an eighth larger."""
    if array.shape[1] >= size:
        return array
    out = np.empty((array.shape[0], max(size, array.shape[1] + array.shape[1] // 8 + 64)), array.dtype)
    out[:, : array.shape[1]] = array
    return out


@dataclasses.dataclass
class _Level:
    """Level k >= 1: per column and complete bin, the smallest and largest finite value (NaN: none) and the
    OR of the rows' bits."""

    lo: np.ndarray
    hi: np.ndarray
    bits: np.ndarray
    n: int = 0


@dataclasses.dataclass
class _Pyramid:
    marks: list
    n: int  # rows held
    values: np.ndarray  # float64 [c, room]: the rows' values as read
    bits: np.ndarray  # uint8 [c, room]: each row's flags and `_NOT_FINITE`
    levels: List[_Level]
    onset_rows: np.ndarray  # int64 [room]: rows where some column's flag starts
    onset_bits: np.ndarray  # uint8 [room]: the bits that start there
    onsets: int = 0


@dataclasses.dataclass(frozen=True)
class Kept:
    """The kept rows of an answer: each column's values and flags there, [columns, kept]."""

    values: np.ndarray
    flags: np.ndarray


def _rows_bins(p: _Pyramid, idx: np.ndarray, k: int) -> tuple:
    """(lo, hi, bits) [c, len(idx)] of the level-k bins `idx`, from the rows they hold."""
    rows = (idx[:, None] << k) + np.arange(1 << k)
    values, bits = p.values[:, rows], p.bits[:, rows]
    finite = np.where(np.isfinite(values), values, np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a bin without a finite value: NaN, as wanted
        return np.nanmin(finite, axis=2), np.nanmax(finite, axis=2), np.bitwise_or.reduce(bits, axis=2)


class BinPyramids:
    """The pyramids of the binned routes' columns, per (run, target, source, statistic) asked; thread-safe.

    Args:
      max_kept: how many to keep (the least recently used are dropped).
    """

    def __init__(self, max_kept: int = 16) -> None:
        self._max = max_kept
        self._kept: "collections.OrderedDict[Hashable, _Pyramid]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict = {}

    def binned(
        self, key: Hashable, tables: Sequence[StatsRows], stat: str, flags: np.ndarray, bins: int
    ) -> Optional[Tuple[downsample.Binned, "Kept"]]:
        """`downsample.downsample` of each table's `stat` over the whole run into `bins` (the binned `matrix`), with
        `flags` (uint8 [tables, rows]: the rules' flags of each row), and the values and flags of its kept rows;
        None where this cannot answer it (see the module)."""

        def values_of(n0: int) -> np.ndarray:
            return np.stack([series.stat_column(t.table[n0:], stat) for t in tables])

        return self._binned(key, [t.steps for t in tables], [t.table for t in tables], values_of, flags, bins)

    def binned_stats(
        self, key: Hashable, rows: StatsRows, names: Sequence[str], flags: np.ndarray, bins: int
    ) -> Optional[Tuple[downsample.Binned, "Kept"]]:
        """The same of one layer's statistics `names` (the binned `stats`), `flags` (uint8 [1, rows]) the layer's."""

        def values_of(n0: int) -> np.ndarray:
            return np.stack([series.stat_column(rows.table[n0:], name) for name in names])

        return self._binned(key, [rows.steps], [rows.table], values_of, flags, bins)

    def _binned(
        self,
        key: Hashable,
        steps_of: Sequence[np.ndarray],
        owners: Sequence[np.ndarray],
        values_of: Callable[[int], np.ndarray],
        flags: np.ndarray,
        bins: int,
    ) -> Optional[Tuple[downsample.Binned, "Kept"]]:
        """`steps_of`: the steps of each table (the same, else None); `owners`: the tables, whose memory says that
        the rows before are unchanged; `values_of(n0)`: the columns' values [c, rows from n0]; `flags` [c or 1,
        rows]."""
        if not steps_of or not len(steps_of[0]):
            return None
        steps = steps_of[0]
        if any(len(t) != len(steps) for t in steps_of) or flags.shape[1:] != (len(steps),):
            return None
        span = int(steps[-1]) - int(steps[0]) + 1
        if span * bins >= 2**62:  # `downsample.bin_of` computes in floats there
            return None
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                p = self._kept.pop(key, None)
            n0 = 0
            if p is not None and len(p.marks) == len(owners) and all(extends(m, t) for m, t in zip(p.marks, owners)):
                n0 = p.n
                if n0 and not all(np.array_equal(t[n0:], steps[n0:]) for t in steps_of[1:]):
                    return None
            if not n0:
                if not all(t is steps or np.array_equal(t, steps) for t in steps_of[1:]):
                    return None
                p = None
            p = self._append(p, n0, len(steps), values_of, flags)
            p.marks = [mark(t) for t in owners]
            out = self._answer(p, steps, bins)
            kept = Kept(p.values[:, out.kept], p.bits[:, out.kept] & _FLAGS)
            with self._lock:
                self._kept[key] = p
                while len(self._kept) > self._max:
                    self._kept.popitem(last=False)
            return out, kept

    @staticmethod
    def _new(c: int) -> _Pyramid:
        return _Pyramid(
            marks=[],
            n=0,
            values=np.zeros((c, 0)),
            bits=np.zeros((c, 0), np.uint8),
            levels=[],
            onset_rows=np.zeros(0, np.int64),
            onset_bits=np.zeros(0, np.uint8),
        )

    @classmethod
    def _append(
        cls, p: Optional[_Pyramid], n0: int, n: int, values_of: Callable[[int], np.ndarray], flags: np.ndarray
    ) -> _Pyramid:
        """The rows from `n0` on added (to a new pyramid when `p` is None): their values and bits, the bins they
        complete, the flags they start."""
        if n <= n0 and p is not None:
            return p
        new = values_of(n0)
        if p is None:
            p = cls._new(new.shape[0])
        new_flags = np.broadcast_to(np.asarray(flags[:, n0:n], np.uint8) & _FLAGS, new.shape)
        p.values = _room(p.values, n)
        p.bits = _room(p.bits, n)
        p.values[:, n0:n] = new
        p.bits[:, n0:n] = new_flags | np.where(np.isfinite(new), 0, _NOT_FINITE).astype(np.uint8)
        # Flags that start: against the row before (a record at every row: `recorded` is all True here).
        before = p.bits[:, n0 - 1 : n0] & _FLAGS if n0 else np.zeros((new.shape[0], 1), np.uint8)
        prev = np.concatenate([before, new_flags[:, :-1]], axis=1)
        started = np.bitwise_or.reduce(new_flags & ~prev, axis=0)
        rows = np.flatnonzero(started)
        if rows.size:
            size = p.onsets + rows.size
            p.onset_rows = _room(p.onset_rows[None, :], size)[0]
            p.onset_bits = _room(p.onset_bits[None, :], size)[0]
            p.onset_rows[p.onsets : size] = rows + n0
            p.onset_bits[p.onsets : size] = started[rows]
            p.onsets = size
        # The bins completed, level by level: level k's bin j is level k-1's bins 2j and 2j+1 (the lowest kept,
        # `_LOW`, is read from the rows themselves).
        k = _LOW
        while (n >> k) > 0:
            if len(p.levels) <= k - _LOW:
                c = new.shape[0]
                p.levels.append(_Level(np.zeros((c, 0)), np.zeros((c, 0)), np.zeros((c, 0), np.uint8)))
            level = p.levels[k - _LOW]
            j0, j1 = level.n, n >> k
            if j1 > j0:
                if k == _LOW:
                    lo, hi, bits = _rows_bins(p, np.arange(j0, j1), k)
                else:
                    below = p.levels[k - _LOW - 1]
                    with np.errstate(invalid="ignore"):
                        lo = np.fmin(below.lo[:, 2 * j0 : 2 * j1 : 2], below.lo[:, 2 * j0 + 1 : 2 * j1 : 2])
                        hi = np.fmax(below.hi[:, 2 * j0 : 2 * j1 : 2], below.hi[:, 2 * j0 + 1 : 2 * j1 : 2])
                    bits = below.bits[:, 2 * j0 : 2 * j1 : 2] | below.bits[:, 2 * j0 + 1 : 2 * j1 : 2]
                level.lo = _room(level.lo, j1)
                level.hi = _room(level.hi, j1)
                level.bits = _room(level.bits, j1)
                level.lo[:, j0:j1], level.hi[:, j0:j1], level.bits[:, j0:j1] = lo, hi, bits
                level.n = j1
            k += 1
        p.n = n
        return p

    @staticmethod
    def _answer(p: _Pyramid, steps: np.ndarray, bins: int) -> downsample.Binned:
        n, c = p.n, p.values.shape[0]
        first_step = int(steps[0])
        span = int(steps[-1]) - first_step + 1
        # Bin b holds the steps s with (s - first) * bins // span == b (`downsample.bin_of`): from the first step
        # whose offset is at least ceil(b * span / bins).
        b = np.arange(bins + 1, dtype=np.int64)
        edges = np.minimum(-((-b * span) // bins), span) + first_step
        starts = np.searchsorted(steps, edges[:-1], side="left")
        ends = np.append(starts[1:], n)
        ends[-1] = n
        used = ends > starts
        a, e = starts[used], ends[used]
        lo = np.full((c, a.size), np.nan)
        hi = np.full((c, a.size), np.nan)
        bits = np.zeros((c, a.size), np.uint8)
        left, right = a.copy(), e.copy()
        k = 0
        with np.errstate(invalid="ignore"):
            while np.any(left < right):
                for take, at in (((left & 1) == 1, left), ((right & 1) == 1, right - 1)):
                    take = take & (left < right)
                    if not take.any():
                        continue
                    idx = at[take]
                    if k < _LOW:
                        node_lo, node_hi, node_bits = _rows_bins(p, idx, k)
                    else:
                        level = p.levels[k - _LOW]
                        node_lo, node_hi, node_bits = level.lo[:, idx], level.hi[:, idx], level.bits[:, idx]
                    lo[:, take] = np.fmin(lo[:, take], node_lo)
                    hi[:, take] = np.fmax(hi[:, take], node_hi)
                    bits[:, take] |= node_bits
                    if at is left:
                        left = left + take
                    else:
                        right = right - take
                left, right = left >> 1, right >> 1
                k += 1
        rows = p.onset_rows[: p.onsets]
        kept = downsample.choose_kept(rows, p.onset_bits[: p.onsets], bins)
        return downsample.Binned(
            first=steps[a],
            last=steps[e - 1],
            count=e - a,
            lo=lo,
            hi=hi,
            not_finite=(bits & _NOT_FINITE) > 0,
            recorded=np.ones((c, a.size), bool),
            flags=bits & _FLAGS,
            kept=kept,
        )
