"""The JSON bodies of the `examples` and `noise_scale` routes (docs/HTTP_API.md), shaped from what the reader read.

No reading here, as in `bodies`: the routes hand over an `examples.ExampleRows` or the scalars a data
provider answered, and these functions only shape them for the wire (NaN and Inf as null).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from tb_layergrad import metadata
from tb_layergrad.plugin.responses import count_list, float_list
from tb_layergrad.reader import examples, noise_scale

# The noise-scale scalars (docs/FORMAT.md), by the name each has in the `noise_scale` route.
NOISE_SCALE_TAGS = metadata.NOISE_SCALE_TAGS


def _column(rows: examples.ExampleRows, name: str) -> list:
    values = rows.column(name)
    return count_list(values) if name in examples.COUNT_FIELDS else float_list(values)


def spread_body(rows: examples.ExampleRows) -> dict:
    """Per step: the spread of the per-example norms, the top share, the number of examples, the status."""
    return {
        "steps": [int(s) for s in rows.steps],
        "wall_times": float_list(rows.wall_times),
        **{name: _column(rows, name) for name in examples.SPREAD},
    }


def at_body(step: int, row: np.ndarray) -> dict:
    """One step's record: its spread, `sum_sq`, and the batch positions of the largest norms."""
    value = {name: row[metadata.EXAMPLE_INDEX[name]] for name in (*examples.SPREAD, "sum_sq")}
    out = {
        name: (count_list([v]) if name in examples.COUNT_FIELDS else float_list([v]))[0] for name, v in value.items()
    }
    return {"step": int(step), **out, "top": examples.top_at(row)}


def binned_body(rows: examples.ExampleRows, points: int, start: Optional[int], end: Optional[int]) -> dict:
    b = examples.binned(rows, points, start, end)
    return {
        "binned": True,
        "points": points,
        "steps": b.pop("first"),
        "last_steps": b.pop("last"),
        "counts": b.pop("count"),
        **b,
    }


def noise_scale_run(
    run: str, answer: Dict[str, Sequence], start: Optional[int], end: Optional[int], smoothing: float
) -> dict:
    """One run's noise-scale scalars on the union of their steps (null where a scalar has no value there:
    the writer leaves `noise_scale` out at a step whose signal estimate is <= 0), and `estimate`, B_simple
    averaged with weight `smoothing` over the steps answered (`reader.noise_scale.estimate`)."""
    by_name = {}
    for name, tag in NOISE_SCALE_TAGS.items():
        data = [d for d in answer.get(tag, ()) if (start is None or d.step >= start) and (end is None or d.step <= end)]
        last: Dict[int, tuple] = {}
        for d in data:  # a repeated step: the later record wins, as for the layergrad records
            last[int(d.step)] = (float(d.wall_time), float(d.value))
        by_name[name] = last
    steps = sorted(set().union(*(set(v) for v in by_name.values())))
    walls: List[float] = []
    for s in steps:
        walls.append(max(v[s][0] for v in by_name.values() if s in v))
    out = {"run": run, "steps": steps, "wall_times": float_list(walls)}
    for name, values in by_name.items():
        out[name] = float_list([values[s][1] if s in values else np.nan for s in steps])
    trace, signal = ([by_name[n][s][1] if s in by_name[n] else None for s in steps] for n in ("trace", "signal"))
    out["estimate"] = float_list([np.nan if v is None else v for v in noise_scale.estimate(trace, signal, smoothing)])
    return out


def has_noise_scale(answer: Dict[str, Sequence]) -> bool:
    return any(answer.get(tag) for tag in NOISE_SCALE_TAGS.values())
