"""The anomaly rules of a run being written, extended by its new steps instead of applied to the whole run again.

Why: `anomalies.evaluate` takes every step of the run, and a run appended at every step changes before each
request: the rules were the part of the `anomalies`, `sweep` and `matrix` routes that grew with the run. What
the rules give extends exactly from the new steps: a cell's flags depend on its own column and on its layer's
growth baseline (the median of its first BASELINE_STEPS positive rms values, fixed once they exist, and no
earlier cell is "after" a baseline found later); a layer's summary is counts, firsts and lasts, and windows
at the run's ends (`trends`: the last TREND_WINDOW usable steps, the first and last EDGE_STEPS), which are
kept or found in the run's last rows. So a fold keeps the state of the run evaluated so far and extends it.

When: the layers' tables (`StatsStore`'s) are the same memory as at the last evaluation with rows after them
(the store writes a growing run's new rows after the others, never over them, `stats_store._Room`), every
layer has the same steps, and the target's rows follow the steps evaluated. Anything else (a table rebuilt,
a step written again, a file shrunk or read anew, layers logged at other steps) is evaluated whole, as
`anomalies.evaluate` does, and the fold starts again from it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import weakref
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tb_layergrad.reader import anomalies, series, trends
from tb_layergrad.reader.stats_store import StatsRows

_EDGE = trends.EDGE_STEPS
_TAIL = 64  # last rows looked at first for a layer's windows at the end (grown until they hold enough)


def mark(table: np.ndarray) -> tuple:
    """What says that a later table begins with these rows: the memory that holds them (a weak reference, so
    that a table dropped by the store is not kept alive here), where they begin, their layout and count."""
    owner = table.base if table.base is not None else table
    return (weakref.ref(owner), table.__array_interface__["data"][0], table.strides, table.shape[0])


def extends(kept: tuple, table: np.ndarray) -> bool:
    """`table` is the rows `kept` (a `mark`) was taken of, with or without rows after them."""
    ref, at, strides, n = kept
    owner = table.base if table.base is not None else table
    return (
        n > 0
        and ref() is owner
        and table.__array_interface__["data"][0] == at
        and table.strides == strides
        and table.shape[0] >= n
    )


@dataclasses.dataclass
class _Layer:
    """One layer's running summary (what `anomalies.evaluate` computes over its whole row)."""

    positives: List[float] = dataclasses.field(default_factory=list)  # its first BASELINE_STEPS rms > 0
    base_end: int = -1  # the column of the last of them
    recorded: int = 0
    last: Optional[int] = None  # its last recorded column
    now: int = 0  # the flags there
    first_nonfinite: Optional[int] = None  # the column
    counts: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(anomalies.FLAG_BITS), np.int64))
    firsts: Dict[str, int] = dataclasses.field(default_factory=dict)  # kind -> the column first flagged with it
    usable: int = 0  # steps whose norm is finite and > 0 without a NaN/Inf (`trends.usable`)
    early: List[float] = dataclasses.field(default_factory=list)  # the first EDGE_STEPS of their norms
    decay_col: Optional[int] = None  # `trends.collapse_step`'s column, once the layer has an early level

    @property
    def base(self) -> float:
        return float(np.median(self.positives)) if len(self.positives) == anomalies.BASELINE_STEPS else math.nan


@dataclasses.dataclass
class _State:
    key: tuple  # layers, indices, whether the target's value is given
    marks: List[tuple]  # each layer's table, then the target's
    n: int
    flags: np.ndarray  # uint8 [layers, room]
    recorded: np.ndarray  # bool [layers, room]
    top: np.ndarray  # float [room]
    reference: np.ndarray  # float [room]
    layers: List[_Layer]
    target_finite: int = 0
    target_early: List[float] = dataclasses.field(default_factory=list)
    target_rows: int = 0


def _grown(a: np.ndarray, n: int, k: int, fill) -> np.ndarray:
    """`a` with room for `n + k` columns: itself, or a copy with an eighth more (the views handed out keep theirs)."""
    if a.shape[-1] >= n + k:
        return a
    out = np.full((*a.shape[:-1], n + k + (n + k) // 8 + 256), fill, dtype=a.dtype)
    out[..., :n] = a[..., :n]
    return out


def _columns(tables: Sequence[np.ndarray], a: int) -> Dict[str, np.ndarray]:
    """The four statistics the rules read, [layers, columns], of the rows from `a` on."""
    return {name: np.stack([series.stat_column(t[a:], name) for t in tables]) for name in anomalies.REQUIRED_STATS}


def _tail(table: np.ndarray, n: int, need: int) -> int:
    """The first row of the shortest tail of `table[:n]` that holds `need` usable rows (0: the whole table)."""
    k = _TAIL
    while True:
        a = max(n - k, 0)
        t = table[a:n]
        if (
            a == 0
            or int(trends.usable(series.stat_column(t, "norm"), series.stat_column(t, "nonfinite")).sum()) >= need
        ):
            return a
        k *= 4


class RuleFold:
    """`anomalies.evaluate` of each (run, target, source) asked, extended by the run's new steps; thread-safe.

    Args:
      max_runs: how many evaluated runs to keep (the least recently used are dropped).
    """

    def __init__(self, max_runs: int = 64) -> None:
        self._max = max_runs
        self._states: Dict[Hashable, _State] = {}
        self._lock = threading.Lock()
        self._key_locks: Dict[Hashable, threading.Lock] = {}
        self._firsts: "collections.OrderedDict[Hashable, Tuple[tuple, Optional[int]]]" = collections.OrderedDict()

    def first_nonfinite(self, key: Hashable, rows: StatsRows) -> Optional[int]:
        """The first step of `rows` (one series' whole table) whose record counts a NaN/Inf, or None; only the rows
        after those looked at last under `key` are looked at when the table is the same memory with rows after
        them (where a run first went non-finite, `origin`, asked at every change of a run being written)."""
        with self._lock:
            kept = self._firsts.get(key)
        n0, found = 0, None
        if kept is not None and extends(kept[0], rows.table):
            n0, found = kept[0][3], kept[1]
        if found is None and len(rows) > n0:
            bad = np.flatnonzero(series.stat_column(rows.table[n0:], "nonfinite") > 0)
            found = int(rows.steps[n0 + bad[0]]) if bad.size else None
        if len(rows):
            with self._lock:
                self._firsts[key] = (mark(rows.table), found)
                self._firsts.move_to_end(key)
                while len(self._firsts) > self._max * 64:
                    self._firsts.popitem(last=False)
        return found

    def evaluate(
        self,
        key: Hashable,
        layers: Sequence[str],
        tables: Sequence[StatsRows],
        *,
        run: str,
        target: str,
        source: str,
        indices: Sequence[int],
        running_first_steps: Sequence[Optional[int]],
        timesteps: Optional[Mapping[str, Sequence[np.ndarray]]],
        target_rows: Optional[StatsRows],
    ) -> Optional[anomalies.RunAnomalies]:
        """The rules over the whole of `tables` (each layer's rows, model order), as `anomalies.evaluate` gives
        them; None when the layers do not share their steps (the caller evaluates them on the union of steps)."""
        first = tables[0].steps if tables else None
        if first is None or not len(first):
            return None
        if any(len(t.steps) != len(first) for t in tables):
            return None
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                state = self._states.pop(key, None)
            shape = (tuple(layers), tuple(int(i) for i in indices), target_rows is not None)
            marks = [t.table for t in tables] + ([target_rows.table] if target_rows is not None else [])
            n0 = 0
            if (
                state is not None
                and state.key == shape
                and all(extends(m, t) for m, t in zip(state.marks, marks))
                and (target_rows is None or self._target_follows(state, target_rows, first))
            ):
                n0 = state.n
            if n0 and not all(np.array_equal(t.steps[n0:], first[n0:]) for t in tables[1:]):
                return None
            if not n0:
                if not all(t.steps is first or np.array_equal(t.steps, first) for t in tables[1:]):
                    return None
                state = self._new_state(shape, len(layers))
            result = self._extend(
                state, n0, tables, target_rows, run, target, source, layers, indices, running_first_steps, timesteps
            )
            state.marks = [mark(m) for m in marks]
            with self._lock:
                self._states[key] = state
                while len(self._states) > self._max:
                    self._states.pop(next(iter(self._states)))
            return result

    @staticmethod
    def _target_follows(state: _State, rows: StatsRows, steps: np.ndarray) -> bool:
        """The target's new rows are all after the steps evaluated (its value at those steps is unchanged)."""
        nt = state.target_rows
        return len(rows.steps) >= nt and (len(rows.steps) == nt or int(rows.steps[nt]) > int(steps[state.n - 1]))

    @staticmethod
    def _new_state(shape: tuple, n_layers: int) -> _State:
        return _State(
            key=shape,
            marks=[],
            n=0,
            flags=np.zeros((n_layers, 0), np.uint8),
            recorded=np.zeros((n_layers, 0), bool),
            top=np.zeros(0),
            reference=np.zeros(0),
            layers=[_Layer() for _ in range(n_layers)],
        )

    def _extend(
        self,
        state: _State,
        n0: int,
        tables: Sequence[StatsRows],
        target_rows: Optional[StatsRows],
        run: str,
        target: str,
        source: str,
        layers: Sequence[str],
        indices: Sequence[int],
        running_first_steps: Sequence[Optional[int]],
        timesteps: Optional[Mapping[str, Sequence[np.ndarray]]],
    ) -> anomalies.RunAnomalies:
        steps = np.asarray(tables[0].steps, dtype=np.int64)
        n, k = steps.size, steps.size - n0
        raw = [t.table for t in tables]
        m = _columns(raw, n0)
        for i, lay in enumerate(state.layers):  # the baselines first: the new columns' flags use them
            pos = np.flatnonzero(m["rms"][i] > 0)[: anomalies.BASELINE_STEPS - len(lay.positives)]
            if pos.size:
                lay.positives += [float(v) for v in m["rms"][i, pos]]
                lay.base_end = n0 + int(pos[-1])
        base = np.asarray([lay.base for lay in state.layers])
        base_end = np.asarray([lay.base_end for lay in state.layers], np.int64)
        flags = anomalies.detect(m["rms"], m["norm"], m["nonfinite"], m["zero_frac"], (base, base_end), n0)
        rec = anomalies.recorded(m["rms"], m["norm"], m["nonfinite"], m["zero_frac"])
        state.flags = _grown(state.flags, n0, k, 0)
        state.recorded = _grown(state.recorded, n0, k, False)
        state.top = _grown(state.top, n0, k, np.nan)
        state.reference = _grown(state.reference, n0, k, np.nan)
        state.flags[:, n0:n], state.recorded[:, n0:n] = flags, rec
        state.top[n0:n] = anomalies.max_rms(m["rms"])
        state.reference[n0:n] = anomalies.reference_rms(m["rms"], flags)
        state.n = n
        summaries = [
            self._layer(
                state.layers[i],
                i,
                n0,
                steps,
                raw[i],
                m,
                flags[i],
                rec[i],
                layers[i],
                indices,
                running_first_steps,
                timesteps,
            )
            for i in range(len(layers))
        ]
        edges = self._target_edges(state, n0, steps, target_rows) if target_rows is not None else None
        return anomalies.RunAnomalies(
            run,
            target,
            source,
            list(layers),
            steps,
            state.flags[:, :n],
            state.recorded[:, :n],
            state.top[:n],
            summaries,
            vanish_reference=state.reference[:n],
            target_edges=edges,
        )

    @staticmethod
    def _layer(
        lay: _Layer,
        i: int,
        n0: int,
        steps: np.ndarray,
        table: np.ndarray,
        m: Dict[str, np.ndarray],
        row: np.ndarray,
        rec: np.ndarray,
        layer: str,
        indices: Sequence[int],
        running_first_steps: Sequence[Optional[int]],
        timesteps: Optional[Mapping[str, Sequence[np.ndarray]]],
    ) -> anomalies.LayerSummary:
        n = steps.size
        cols = np.flatnonzero(rec)
        lay.recorded += int(cols.size)
        if cols.size:
            lay.last, lay.now = n0 + int(cols[-1]), int(row[cols[-1]])
        bad = np.flatnonzero(row & anomalies.NONFINITE)
        if lay.first_nonfinite is None and bad.size:
            lay.first_nonfinite = n0 + int(bad[0])
        lay.counts += [int(((row[cols] & bit) > 0).sum()) for bit in anomalies.FLAG_BITS.values()]
        for kind, col in anomalies.first_flagged(row[cols], n0 + cols).items():
            lay.firsts.setdefault(kind, col)  # the new columns' first, where no earlier one was flagged
        ok = trends.usable(m["norm"][i], m["nonfinite"][i])
        had_edges = lay.usable >= 2 * _EDGE
        lay.usable += int(ok.sum())
        if len(lay.early) < _EDGE:
            lay.early += [float(v) for v in m["norm"][i, np.flatnonzero(ok)[: _EDGE - len(lay.early)]]]
        # The windows at the end: the last TREND_WINDOW usable rows hold the last EDGE_STEPS.
        a = _tail(table, n, trends.TREND_WINDOW)
        t = table[a:n]
        norm_t, nf_t = series.stat_column(t, "norm"), series.stat_column(t, "nonfinite")
        trend = trends.trend(steps[a:n], norm_t, nf_t)
        step_decay = None
        if lay.usable >= 2 * _EDGE:
            late = norm_t[np.flatnonzero(trends.usable(norm_t, nf_t))[-_EDGE:]]
            early, late = float(np.median(lay.early)), float(np.median(late))
            step_decay = math.log10(late) - math.log10(early)
            if (
                lay.decay_col is None
            ):  # the collapse: looked for in the new rows, or everywhere once there is an early level
                b = n0 if had_edges else 0
                norm_b = m["norm"][i] if b == n0 else series.stat_column(table[:n], "norm")
                nf_b = m["nonfinite"][i] if b == n0 else series.stat_column(table[:n], "nonfinite")
                with np.errstate(invalid="ignore"):
                    low = np.flatnonzero(
                        trends.usable(norm_b, nf_b) & (norm_b <= early * 10.0**-trends.STEP_DECAY_DECADES)
                    )
                if low.size:
                    lay.decay_col = b + int(low[0])
        first = int(steps[lay.first_nonfinite]) if lay.first_nonfinite is not None else None
        named = running_first_steps[i] if running_first_steps is not None else None
        if named is not None and (first is None or named < first):
            first = int(named)
        last = lay.last
        at = table[last : last + 1] if last is not None else None
        ts = (timesteps or {}).get(layer)

        def value(name: str) -> Optional[float]:
            return anomalies._num(series.stat_column(at, name)[0]) if at is not None else None  # noqa: SLF001

        return anomalies.LayerSummary(
            layer=layer,
            index=int(indices[i]) if indices is not None else -1,
            recorded=lay.recorded,
            last_step=int(steps[last]) if last is not None else None,
            last_norm=value("norm"),
            last_rms=value("rms"),
            last_zero_frac=value("zero_frac"),
            last_nonfinite=value("nonfinite"),
            trend=trend,
            first_nonfinite_step=first,
            counts={name: int(c) for name, c in zip(anomalies.FLAG_BITS, lay.counts)},
            firsts={kind: int(steps[col]) for kind, col in lay.firsts.items()},
            now=lay.now if last is not None else 0,
            timestep_decay=trends.timestep_decay(ts) if ts else None,
            has_timesteps=ts is not None,
            step_decay=step_decay,
            decay_step=int(steps[lay.decay_col]) if lay.decay_col is not None else None,
        )

    @staticmethod
    def _target_edges(state: _State, n0: int, steps: np.ndarray, rows: StatsRows) -> Optional[Tuple[float, float]]:
        """`trends.target_edges` of the target's value on the run's steps, from its first finite values kept and
        its last ones in the last rows."""
        n = steps.size
        lo = int(np.searchsorted(rows.steps, steps[n0])) if n0 < n else len(rows.steps)
        new = series.align(rows.steps[lo:], series.stat_column(rows.table[lo:], "mean"), steps[n0:])
        fin = np.flatnonzero(np.isfinite(new))
        state.target_finite += int(fin.size)
        state.target_rows = len(rows.steps)
        if len(state.target_early) < _EDGE:
            state.target_early += [float(v) for v in new[fin[: _EDGE - len(state.target_early)]]]
        if state.target_finite < 2 * _EDGE:
            return None
        k = _TAIL
        while True:
            a = max(n - k, 0)
            lo = int(np.searchsorted(rows.steps, steps[a]))
            tail = series.align(rows.steps[lo:], series.stat_column(rows.table[lo:], "mean"), steps[a:])
            fin = np.flatnonzero(np.isfinite(tail))
            if fin.size >= _EDGE or a == 0:
                break
            k *= 4
        return float(np.median(state.target_early)), float(np.median(tail[fin[-_EDGE:]]))
