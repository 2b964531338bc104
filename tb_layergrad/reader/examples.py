"""The per-example records of a layer (kind `examples`, docs/FORMAT.md) as tables, and their bins.

Why a module of its own: the `examples`, `matrix` (colour by `example_norm_*`) routes and the report
all read the same numbers; `layer_points` reads the records (columns mapped by name), this shapes
them as a [steps, len(EXAMPLE_FIELDS)] table and cuts a long series into bins the way the `stats`
route does (`reader.downsample.bin_of`), keeping in each bin what a band and a dominance flag need.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence

import numpy as np

from tb_layergrad import metadata
from tb_layergrad.reader import catalog, downsample, layer_points, series
from tb_layergrad.reader.run_source import RunSource

# The `stat` names of `matrix` that colour by a per-example column, as `tb_layergrad.load()` names them.
MATRIX_STATS = {
    "example_norm_min": "min",
    "example_norm_median": "median",
    "example_norm_max": "max",
    "example_norm_top_share": "top_share",
}
# Sent as JSON integers.
COUNT_FIELDS = frozenset({"examples", "status"})
TOP_INDEX = tuple(f"top_index_{i}" for i in range(1, metadata.EXAMPLE_TOP_K + 1))
TOP_NORM = tuple(f"top_norm_{i}" for i in range(1, metadata.EXAMPLE_TOP_K + 1))
SPREAD = ("min", "median", "max", "top_share", "examples", "status")  # per step, in the `examples` route


@dataclasses.dataclass(frozen=True)
class ExampleRows:
    """One layer's `examples` series: ascending unique steps and their rows in EXAMPLE_FIELDS order."""

    steps: np.ndarray  # int64 [n]
    wall_times: np.ndarray  # float64 [n]
    table: np.ndarray  # float64 [n, len(EXAMPLE_FIELDS)]

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def column(self, name: str) -> np.ndarray:
        return self.table[:, metadata.EXAMPLE_INDEX[name]]

    def at(self, step: int) -> Optional[np.ndarray]:
        """The row at `step`, None without a record there."""
        i = int(np.searchsorted(self.steps, step))
        return self.table[i] if i < len(self) and int(self.steps[i]) == step else None


def rows_of(points: series.Points) -> ExampleRows:
    width = len(metadata.EXAMPLE_FIELDS)
    table = np.stack([_row(v, width) for v in points.values]) if len(points) else np.zeros([0, width])
    return ExampleRows(points.steps, points.wall_times, table)


def _row(value, width: int) -> np.ndarray:
    """One record as a row of `width`: a short one (not what a writer of docs/FORMAT.md writes) ends in NaN,
    which reads as absent, never as a number of another column."""
    flat = np.asarray(value, np.float64).reshape(-1)[:width]
    return flat if flat.size == width else np.concatenate([flat, np.full(width - flat.size, np.nan)])


def read(
    src: RunSource, chosen: Sequence[catalog.Series], start: Optional[int] = None, end: Optional[int] = None
) -> Dict[catalog.SeriesKey, ExampleRows]:
    """`{key: ExampleRows}` of `examples` series of run `src.rc` within [start, end] (every layer of a group is a
    row of the same records: `src.blocks` keeps them decoded for the next layer)."""
    return {key: rows_of(p) for key, p in layer_points.read_points(src, chosen, start, end).items()}


def binned(rows: ExampleRows, points: int, start: Optional[int], end: Optional[int]) -> dict:
    """Each bin of [start, end]'s steps (as `stats` cuts them): its first and last step, its count,
    the smallest `min`, the largest `max`, the range of `median`, the largest `top_share` and the step
    that had it (where to look), the fewest `examples` and the largest `status`. NaN-only bins give None."""
    steps = rows.steps
    lo_step = start if start is not None else (int(steps[0]) if steps.size else 0)
    hi_step = max(lo_step, end if end is not None else (int(steps[-1]) if steps.size else lo_step))
    inside = np.flatnonzero((steps >= lo_step) & (steps <= hi_step))
    steps, table = steps[inside], rows.table[inside]
    which = downsample.bin_of(steps, points, lo_step, hi_step)
    starts = np.flatnonzero(np.diff(which, prepend=-1)) if steps.size else np.zeros(0, np.int64)
    ends = np.append(starts[1:], steps.size) - 1
    col = {name: table[:, metadata.EXAMPLE_INDEX[name]] for name in SPREAD}
    out = {
        "first": [],
        "last": [],
        "count": [],
        "min": [],
        "max": [],
        "median_min": [],
        "median_max": [],
        "top_share": [],
        "top_share_step": [],
        "examples": [],
        "status": [],
    }
    for a, b in zip(starts, ends):
        sl = slice(int(a), int(b) + 1)
        share = col["top_share"][sl]
        out["first"].append(int(steps[a]))
        out["last"].append(int(steps[b]))
        out["count"].append(int(b - a + 1))
        out["min"].append(_reduce(np.nanmin, col["min"][sl]))
        out["max"].append(_reduce(np.nanmax, col["max"][sl]))
        out["median_min"].append(_reduce(np.nanmin, col["median"][sl]))
        out["median_max"].append(_reduce(np.nanmax, col["median"][sl]))
        finite = np.isfinite(share)
        if finite.any():
            k = int(np.argmax(np.where(finite, share, -np.inf)))
            out["top_share"].append(float(share[k]))
            out["top_share_step"].append(int(steps[a + k]))
        else:
            out["top_share"].append(None)
            out["top_share_step"].append(None)
        out["examples"].append(_count(np.nanmin, col["examples"][sl]))
        out["status"].append(_count(np.nanmax, col["status"][sl]))
    return out


def _reduce(fn, values: np.ndarray) -> Optional[float]:
    values = values[np.isfinite(values)]
    return float(fn(values)) if values.size else None


def _count(fn, values: np.ndarray) -> Optional[int]:
    values = values[np.isfinite(values)]
    return int(fn(values)) if values.size else None


def top_at(row: np.ndarray) -> list:
    """The top positions of one row: [{"position", "norm"}] largest first, those past `examples` left out."""
    out = []
    for i_name, n_name in zip(TOP_INDEX, TOP_NORM):
        pos, norm = row[metadata.EXAMPLE_INDEX[i_name]], row[metadata.EXAMPLE_INDEX[n_name]]
        if not np.isfinite(pos) or pos < 0:
            continue
        out.append({"position": int(pos), "norm": float(norm) if np.isfinite(norm) else None})
    return out
