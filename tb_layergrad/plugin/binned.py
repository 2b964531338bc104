"""The binned answers of `matrix`, `stats` and `compare` with `points=N` (docs/HTTP_API.md, "Binned answers").

Why a module of its own: the routes read the same tables either way; only when the range holds
more steps than `points` do they cut them into bins (`reader.downsample`) and send each bin's
first and last step, min and max per column, whether a value in it was NaN/Inf, the ORed anomaly
flags, and the kept steps (where a flag starts) exactly. Fewer steps than `points`: the ordinary
answer, marked `"binned": false`, so zooming in ends at full resolution.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tb_layergrad.plugin.responses import count_list, float_list
from tb_layergrad.reader import anomalies, downsample, series
from tb_layergrad.reader.series import align

Columns = Sequence[Tuple[np.ndarray, np.ndarray]]  # (steps, values) per column


def needed(points: Optional[int], steps: np.ndarray) -> bool:
    """Whether an answer for `points` pixels is binned: more steps than pixels."""
    return points is not None and steps.size > points


def _values(values: np.ndarray, stat: str) -> list:
    return count_list(values) if stat in series.COUNT_STATS else float_list(values)


def _bits(mask: np.ndarray) -> List[int]:
    return [int(x) for x in mask]


def _head(b: downsample.Binned, points: int) -> dict:
    return {
        "binned": True,
        "points": points,
        "steps": [int(s) for s in b.first],
        "last_steps": [int(s) for s in b.last],
        "counts": [int(c) for c in b.count],
    }


def _on_axis(columns: Columns, steps: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(values float [c, n], recorded bool [c, n]) of the columns placed on the `steps` axis."""
    values = np.stack([align(s, v, steps) for s, v in columns]) if columns else np.zeros((0, steps.size))
    recorded = (
        np.stack([~np.isnan(align(s, np.ones(s.size), steps)) for s, _ in columns])
        if columns
        else np.zeros((0, steps.size), bool)
    )
    return values, recorded


def columns_body(
    columns: Columns,
    steps: np.ndarray,
    stat: str,
    points: int,
    start: Optional[int],
    end: Optional[int],
    flags: Optional[np.ndarray] = None,
) -> dict:
    """The binned body of `matrix` (a column per layer) or `compare` (per run): `min`, `max`,
    `not_finite`, `flags` per column and bin, and `kept` = {steps, values, flags} at full resolution."""
    values, recorded = _on_axis(columns, steps)
    b = downsample.downsample(steps, values, points, start, end, flags=flags, recorded=recorded)
    flags = np.zeros(values.shape, np.uint8) if flags is None else flags
    return binned_columns(b, steps, stat, points, values[:, b.kept], flags[:, b.kept], recorded[:, b.kept])


def binned_columns(
    b: downsample.Binned,
    steps: np.ndarray,
    stat: str,
    points: int,
    kept_values: np.ndarray,
    kept_flags: np.ndarray,
    kept_recorded: np.ndarray,
) -> dict:
    """`columns_body` of bins made already (`downsample.downsample`, or `bin_pyramid` for a whole run being
    written): `kept_*` [columns, kept] are the columns at the kept rows `b.kept` of `steps`."""
    return {
        **_head(b, points),
        "min": [_values(row, stat) for row in b.lo],
        "max": [_values(row, stat) for row in b.hi],
        "not_finite": [_bits(row) for row in b.not_finite],
        "flags": downsample.encode(b.flags, b.recorded),
        "kept": {
            "steps": [int(s) for s in steps[b.kept]],
            "values": [_values(row, stat) for row in kept_values],
            "flags": downsample.encode(kept_flags, kept_recorded),
        },
    }


def nonfinite_flags(tables: Sequence[Tuple[np.ndarray, np.ndarray]], steps: np.ndarray) -> np.ndarray:
    """uint8 [c, n]: the non-finite bit where a stats table counts a NaN/Inf (for `compare`: runs differ
    in their layers, so the other rules, which compare layers of one run, are not applied)."""
    out = [align(s, series.stat_column(t, "nonfinite"), steps) > 0 for s, t in tables]
    return (np.stack(out) * anomalies.NONFINITE).astype(np.uint8) if out else np.zeros((0, steps.size), np.uint8)


def stats_body(
    steps: np.ndarray,
    wall_times: np.ndarray,
    table: np.ndarray,
    flags: np.ndarray,
    points: int,
    start: Optional[int],
    end: Optional[int],
) -> dict:
    """The binned body of `stats` (one layer): per statistic `min`, `max`, `not_finite` per bin, the
    bins' `flags`, the first wall time of each bin, and `kept` = {steps, wall_times, stats, flags}."""
    names = series.ALL_STATS
    values = np.stack([series.stat_column(table, name) for name in names]) if steps.size else np.zeros((len(names), 0))
    recorded = np.ones(values.shape, bool)
    row_flags = np.repeat(flags, len(names), axis=0)
    b = downsample.downsample(steps, values, points, start, end, flags=row_flags, recorded=recorded)
    return binned_stats(b, steps, wall_times, points, values[:, b.kept], flags[:, b.kept])


def binned_stats(
    b: downsample.Binned,
    steps: np.ndarray,
    wall_times: np.ndarray,
    points: int,
    kept_values: np.ndarray,
    kept_flags: np.ndarray,
) -> dict:
    """`stats_body` of bins made already (`downsample.downsample` of `series.ALL_STATS`' columns, or `bin_pyramid`
    for a whole run being written): `kept_values` [statistics, kept], `kept_flags` [1, kept] at `b.kept`."""
    names = series.ALL_STATS
    recorded = np.ones((1, b.kept.size), bool)
    first_rows = np.searchsorted(steps, b.first)
    per: Dict[str, dict] = {"min": {}, "max": {}, "not_finite": {}}
    for k, name in enumerate(names):
        per["min"][name] = _values(b.lo[k], name)
        per["max"][name] = _values(b.hi[k], name)
        per["not_finite"][name] = _bits(b.not_finite[k])
    return {
        **_head(b, points),
        "wall_times": float_list(wall_times[first_rows]),
        **per,
        "flags": downsample.encode(b.flags[:1], b.recorded[:1])[0],
        "kept": {
            "steps": [int(s) for s in steps[b.kept]],
            "wall_times": float_list(wall_times[b.kept]),
            "stats": {name: _values(kept_values[k], name) for k, name in enumerate(names)},
            "flags": downsample.encode(kept_flags, recorded)[0],
        },
    }
