"""Downsampling a long series to the pixels that show it, without losing what matters in it.

Why: a run of 100,000 steps is 100,000 columns, but a chart is about 1,000 pixels wide. Picking
steps evenly (`series.pick_evenly`) can drop the one step with the NaN, and averaging hides a
spike. So the steps of [start, end] are cut into `bins` equal step ranges, one per pixel, and each
non-empty bin reports its first and last step, each column's minimum and maximum (over finite
values), whether a value of the column in the bin was NaN/Inf, and the OR of the rows' anomaly
flags (docs/ANOMALIES.md bits). The steps where a flag *starts* for a column (its first
non-finite step, the onset of a vanishing run...) are returned as row indices, `kept`, for the
caller to send at full resolution: never averaged away, and bounded (a layer dead for the whole
run is one kept step, not 100,000).

Pure numpy; the plugin's routes apply it to the tables `StatsStore` already holds.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import numpy as np

from tb_layergrad.reader import anomalies, series

# The order in which kept steps are chosen when there are more than the limit: the most serious first.
_PRIORITY = (anomalies.NONFINITE, anomalies.EXPLODING, anomalies.DEAD, anomalies.VANISHING)


@dataclasses.dataclass(frozen=True)
class Binned:
    """Columns cut into non-empty step bins (b of them) and the rows kept at full resolution."""

    first: np.ndarray  # int64 [b]: first step of each bin
    last: np.ndarray  # int64 [b]: last step of each bin
    count: np.ndarray  # int64 [b]: rows in each bin
    lo: np.ndarray  # float64 [c, b]: smallest finite value; NaN if none
    hi: np.ndarray  # float64 [c, b]: largest finite value; NaN if none
    not_finite: np.ndarray  # bool [c, b]: a recorded value in the bin is NaN or +-Inf
    recorded: np.ndarray  # bool [c, b]: the column has a record in the bin
    flags: np.ndarray  # uint8 [c, b]: OR of the rows' flags
    kept: np.ndarray  # int64 [k]: ascending row indices to send at full resolution

    def __len__(self) -> int:
        return int(self.first.shape[0])


def bin_of(steps: np.ndarray, bins: int, start: int, end: int) -> np.ndarray:
    """Bin number (0..bins-1) of each step of [start, end]: `bins` equal step ranges, bin b holding
    the steps s with b <= (s - start) * bins / (end - start + 1) < b + 1.

    Exact integer arithmetic while it fits in int64; float64 beyond (steps near 2**63), still monotone.
    """
    span = int(end) - int(start) + 1
    offset = np.asarray(steps, np.int64) - np.int64(start)
    if span * bins < 2**62:
        which = offset * np.int64(bins) // np.int64(span)
    else:
        which = np.floor(offset.astype(np.float64) / float(span) * bins).astype(np.int64)
    return np.clip(which, 0, bins - 1)


def onsets(flags: np.ndarray, recorded: np.ndarray) -> np.ndarray:
    """uint8 [c, n]: the flag bits each row sets that the column's previous recorded row did not."""
    out = np.zeros(flags.shape, np.uint8)
    for c in range(flags.shape[0]):
        rows = np.flatnonzero(recorded[c])
        f = flags[c, rows]
        before = np.concatenate([np.zeros(1, np.uint8), f[:-1]]) if f.size else f
        out[c, rows] = f & ~before
    return out


def kept_rows(flags: np.ndarray, recorded: np.ndarray, limit: int) -> np.ndarray:
    """Ascending rows where any column's flag starts; beyond `limit`, the most serious kinds first, then the earliest."""
    started = (
        np.bitwise_or.reduce(onsets(flags, recorded), axis=0) if flags.shape[0] else np.zeros(flags.shape[1], np.uint8)
    )
    rows = np.flatnonzero(started)
    return choose_kept(rows, started[rows], limit)


def choose_kept(rows: np.ndarray, started: np.ndarray, limit: int) -> np.ndarray:
    """Of the ascending `rows` where flags start (`started`: the bits each starts), at most `limit`: the most serious
    kinds first, then the earliest; ascending."""
    if rows.size <= limit:
        return rows
    rank = np.full(rows.size, len(_PRIORITY), np.int64)
    for r, bit in reversed(list(enumerate(_PRIORITY))):
        rank[(started & bit) > 0] = r
    chosen = rows[np.lexsort((rows, rank))[:limit]]
    return np.sort(chosen)


def _reduce(values: np.ndarray, starts: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin (given by its first row): min and max of the finite values (NaN if none), and any non-finite."""
    finite = np.isfinite(values)
    lo = np.minimum.reduceat(np.where(finite, values, np.inf), starts, axis=1)
    hi = np.maximum.reduceat(np.where(finite, values, -np.inf), starts, axis=1)
    none = ~np.logical_or.reduceat(finite, starts, axis=1)
    lo[none] = np.nan
    hi[none] = np.nan
    return lo, hi, none


def _bounds(steps: np.ndarray, start: Optional[int], end: Optional[int]) -> Tuple[int, int]:
    """[start, end], each defaulting to the first or last step (0 for an empty series)."""
    lo = start if start is not None else (int(steps[0]) if steps.size else 0)
    hi = end if end is not None else (int(steps[-1]) if steps.size else lo)
    return lo, max(lo, hi)


def downsample(
    steps: np.ndarray,
    columns: np.ndarray,
    bins: int,
    start: Optional[int] = None,
    end: Optional[int] = None,
    flags: Optional[np.ndarray] = None,
    recorded: Optional[np.ndarray] = None,
    keep_limit: Optional[int] = None,
) -> Binned:
    """Cut `columns` (float [c, n], one value per ascending step) into at most `bins` step bins over [start, end].

    `recorded` (bool [c, n], default: not NaN) tells a missing value from a NaN one; `flags`
    (uint8 [c, n], docs/ANOMALIES.md bits, default none) are ORed per bin and choose the kept
    rows, at most `keep_limit` (default `bins`). Rows outside [start, end] are ignored.
    """
    steps = np.asarray(steps, np.int64)
    columns = np.asarray(columns, np.float64).reshape(-1, steps.size)
    recorded = ~np.isnan(columns) if recorded is None else np.asarray(recorded, bool)
    flags = np.zeros(columns.shape, np.uint8) if flags is None else np.asarray(flags, np.uint8)
    lo_step, hi_step = _bounds(steps, start, end)
    inside = np.flatnonzero((steps >= lo_step) & (steps <= hi_step))
    steps, columns, recorded, flags = steps[inside], columns[:, inside], recorded[:, inside], flags[:, inside]
    which = bin_of(steps, bins, lo_step, hi_step)
    starts = np.flatnonzero(np.diff(which, prepend=-1)) if steps.size else np.zeros(0, np.int64)
    ends = np.append(starts[1:], steps.size) - 1 if steps.size else starts
    if not steps.size:
        empty = np.zeros((columns.shape[0], 0))
        return Binned(
            starts, starts, starts, empty, empty, empty.astype(bool), empty.astype(bool), empty.astype(np.uint8), starts
        )
    lo, hi, _ = _reduce(columns, starts)
    bad = recorded & ~np.isfinite(columns)
    kept = kept_rows(flags, recorded, bins if keep_limit is None else keep_limit)
    return Binned(
        first=steps[starts],
        last=steps[ends],
        count=ends - starts + 1,
        lo=lo,
        hi=hi,
        not_finite=np.logical_or.reduceat(bad, starts, axis=1),
        recorded=np.logical_or.reduceat(recorded, starts, axis=1),
        flags=np.bitwise_or.reduceat(flags, starts, axis=1).astype(np.uint8),
        kept=inside[kept],
    )


def run_flags(tables: Sequence[Tuple[np.ndarray, np.ndarray]], steps: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(flags uint8 [layers, n], recorded bool [layers, n]) of the anomaly rules on the `steps` axis.

    `tables`: each layer's (steps, stats table) over the WHOLE run, so that a growth baseline is
    the layer's first steps, as the `anomalies` route asked without a range computes it. One
    layer alone gets its own flags only (non-finite, dead, exploding; vanishing needs the others).
    """
    every = series.union_steps([t[0] for t in tables])
    stats = {
        name: np.stack([series.align(s, series.stat_column(t, name), every) for s, t in tables])
        for name in anomalies.REQUIRED_STATS
    }
    flags = anomalies.detect(stats["rms"], stats["norm"], stats["nonfinite"], stats["zero_frac"])
    present = anomalies.recorded(stats["rms"], stats["norm"], stats["nonfinite"], stats["zero_frac"])
    return on_steps(every, flags, present, steps)


def on_steps(
    every: np.ndarray, flags: np.ndarray, present: np.ndarray, steps: np.ndarray
) -> Tuple[np.ndarray, np.ndarray]:
    """(flags, recorded) of the run's steps `every` taken at `steps` (0 and False at a step not among them)."""
    at = np.minimum(np.searchsorted(every, steps), max(every.size - 1, 0))
    hit = every[at] == steps if every.size else np.zeros(steps.shape, bool)
    out_flags = np.where(hit[None, :], flags[:, at], 0).astype(np.uint8)
    out_rec = np.where(hit[None, :], present[:, at], False)
    return out_flags, out_rec


def encode(flags: np.ndarray, recorded: np.ndarray) -> list:
    """Each column's flags as the `anomalies` route's text: a hex digit per bin or row, '.' without a record."""
    return [anomalies.encode_flags(f, r) for f, r in zip(flags, recorded)]
