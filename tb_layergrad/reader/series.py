"""Reading tensor series of one run, selecting steps, and the statistics table.

Reads are always filtered by run AND tag (`RunTagFilter`): the Rust data
server caps a gRPC answer at 256 MiB and the Python one would copy every
tensor of the logdir, so a route never asks for more than it shows.

Step selection happens here, after the read, because the data provider has no
step filter: `downsample` picks a *random* subset, which could drop exactly the
step with the NaN. We read everything the server kept (the loader makes it keep
everything) and thin deterministically when a client asks for `max_steps`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata

logger = logging.getLogger(__name__)

# `downsample` for "every stored point"; both data providers return min(n, this).
READ_ALL = 2**31 - 1

STORED_STATS = metadata.STAT_FIELDS
DERIVED_STATS = ("nonfinite", "nonfinite_frac", "zero_frac", "rms")
ALL_STATS = STORED_STATS + DERIVED_STATS
# Sent as JSON integers.
COUNT_STATS = frozenset({"elements", "nan", "pos_inf", "neg_inf", "zeros", "no_gradient", "nonfinite"})
DEFAULT_STAT = "norm"


@dataclasses.dataclass
class Points:
    """One series after step selection: ascending unique steps, one value each."""

    steps: np.ndarray  # int64 [n]
    wall_times: np.ndarray  # float64 [n]
    values: List[np.ndarray]  # n tensors

    def __len__(self) -> int:
        return int(self.steps.shape[0])


EMPTY = Points(np.zeros([0], np.int64), np.zeros([0], np.float64), [])


@dataclasses.dataclass(eq=False)
class Batch(Sequence[tb_provider.TensorDatum]):
    """Records of one tag as arrays: a sequence of its `TensorDatum`s, in order, for any reader of them, whose
    columns a reader of many records reads at once (`stats_store.block_points`). Why: a long run's series is
    hundreds of thousands of records, and an object per record, then a check and a copy per record, cost more
    than reading them (`record_index` answers a series read as its file was walked this way)."""

    steps: np.ndarray  # int64 [n]
    wall_times: np.ndarray  # float64 [n]
    values: np.ndarray  # [n, ...]: each record's tensor, all of one dtype and shape

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - an index or a slice, as a list's
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return tb_provider.TensorDatum(
            step=int(self.steps[i]), wall_time=float(self.wall_times[i]), numpy=self.values[i]
        )

    def __iter__(self) -> Iterator[tb_provider.TensorDatum]:
        for step, wall, value in zip(self.steps.tolist(), self.wall_times.tolist(), self.values):
            yield tb_provider.TensorDatum(step=step, wall_time=wall, numpy=value)

    def fit(self, shape: Sequence[Optional[int]]) -> bool:
        """Whether every record has the shape `fits` asks for (they are of one shape)."""
        return _shape_fits(self.values.shape[1:], shape)

    def last_of_each_step(self) -> "np.ndarray | slice":
        """The positions of `select`'s records: by ascending step, the last record of a repeated step (all of them,
        a slice, when the steps ascend)."""
        steps = self.steps
        if steps.size < 2 or bool((steps[1:] > steps[:-1]).all()):
            return slice(None)
        order = np.argsort(steps, kind="stable")
        ordered = steps[order]
        last = np.ones(steps.size, bool)
        last[:-1] = ordered[1:] != ordered[:-1]
        return order[last]


def read(
    data_provider: tb_provider.DataProvider,
    ctx: object,
    experiment_id: str,
    run: str,
    tags: Iterable[str],
    alone: Iterable[str] = (),
) -> Dict[str, Sequence[tb_provider.TensorDatum]]:
    """`{tag: [TensorDatum...]}` for the given tags of one run (missing tags absent).

    `tags` are read in one call, each of `alone` in a call of its own: a
    version-2 tag holds up to `metadata.BLOCK_BYTES` of records, and the Rust
    data server refuses an answer past 256 MiB, so several such tags in one
    answer could fail where each alone does not. A call refused as too large
    (many long version-1 tags) is split in two and retried, down to one tag.
    """
    together = sorted(set(tags) - set(alone))
    out: Dict[str, Sequence[tb_provider.TensorDatum]] = {}
    for chunk in ([together] if together else []) + [[t] for t in sorted(set(alone))]:
        out.update(_read_split(data_provider, ctx, experiment_id, run, chunk))
    return out


def read_since(
    data_provider: tb_provider.DataProvider,
    ctx: object,
    experiment_id: str,
    run: str,
    since: Dict[str, Optional[tuple]],
) -> Optional[Dict[str, Tuple[tuple, bool, Sequence[tb_provider.TensorDatum]]]]:
    """`{tag: (position, whole, records)}`: each tag's records past where the last read stopped (`since[tag]`, a
    position this returned before, or None), when the provider can say so (the plugin's own reading of a local
    logdir, `record_index.LocalProvider`); None when it cannot (TensorBoard's providers: read every record)."""
    method = getattr(data_provider, "read_tensors_since", None)
    if method is None or not since:
        return None
    return method(ctx, experiment_id, run, since)


def read_last(
    data_provider: tb_provider.DataProvider, ctx: object, experiment_id: str, run: str, tags: Iterable[str]
) -> Dict[str, Sequence[tb_provider.TensorDatum]]:
    """`{tag: [TensorDatum...]}` holding each tag's latest record, in one call: a sample of one, which by the
    `DataProvider` contract always holds the latest datum (a provider may add the first: callers pick by step).
    Why: the latest histogram of a run's block of 1,000 steps is one record to send and convert, not 1,000."""
    tags = sorted(set(tags))
    if not tags:
        return {}
    result = data_provider.read_tensors(
        ctx,
        experiment_id=experiment_id,
        plugin_name=metadata.PLUGIN_NAME,
        downsample=1,
        run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=tags),
    )
    return result.get(run, {})


def _read_split(
    data_provider: tb_provider.DataProvider, ctx: object, experiment_id: str, run: str, tags: List[str]
) -> Dict[str, Sequence[tb_provider.TensorDatum]]:
    try:
        result = data_provider.read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=metadata.PLUGIN_NAME,
            downsample=READ_ALL,
            run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=tags),
        )
    except Exception as e:  # noqa: BLE001 - only an answer refused as too large is retried
        if len(tags) < 2 or not _too_large(e):
            raise
        half = len(tags) // 2
        return {
            **_read_split(data_provider, ctx, experiment_id, run, tags[:half]),
            **_read_split(data_provider, ctx, experiment_id, run, tags[half:]),
        }
    return result.get(run, {})


def _too_large(error: Exception) -> bool:
    """Whether a data provider refused an answer for its size (gRPC's RESOURCE_EXHAUSTED, from the Rust data server)."""
    code = getattr(error, "code", None)
    try:
        name = getattr(code(), "name", "") if callable(code) else ""
    except Exception:  # noqa: BLE001 - not a gRPC error after all
        name = ""
    return name == "RESOURCE_EXHAUSTED" or "RESOURCE_EXHAUSTED" in str(error)


def _shape_fits(got: Sequence[int], shape: Sequence[Optional[int]]) -> bool:
    return len(got) == len(shape) and all(want is None or g == want for g, want in zip(got, shape))


def fits(datum: tb_provider.TensorDatum, tag: str, run: str, shape: Sequence[Optional[int]]) -> bool:
    """Whether a version-2 record has the shape its metadata promises (None: any length there);
    one that does not (rows != len(layers)) is skipped with a warning rather than misread or fatal."""
    got = np.shape(datum.numpy)
    ok = _shape_fits(got, shape)
    if not ok:
        expected = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
        logger.warning(
            "layergrad: run %r, tag %r, step %d: record of shape %s, expected %s (one row per layer "
            "of its metadata); skipped",
            run,
            tag,
            int(datum.step),
            list(got),
            expected,
        )
    return ok


def select_fitting(
    data: Sequence[tb_provider.TensorDatum], tag: str, run: str, shape: Sequence[Optional[int]]
) -> Points:
    """`select` of the records that `fits`: each distinct shape checked once when every record holds an array (a
    block is 65,536 records of one shape), else record by record (each misfit warned, as `fits` does)."""
    arrays = [d.numpy for d in data]
    if all(type(a) is np.ndarray for a in arrays) and all(_shape_fits(got, shape) for got in {a.shape for a in arrays}):
        return select(data)
    return select([d for d in data if fits(d, tag, run, shape)])


def select(data: Sequence[tb_provider.TensorDatum], start: Optional[int] = None, end: Optional[int] = None) -> Points:
    """Sort by step, keep the last record of a repeated step, keep [start, end]. Records already in ascending
    steps, each once (a block as written), are kept by position: no dictionary of every step."""
    data = data if isinstance(data, (list, tuple)) else list(data)
    steps = np.asarray([int(d.step) for d in data], dtype=np.int64)
    if steps.size and bool(np.all(steps[1:] > steps[:-1])):
        lo = 0 if start is None else int(np.searchsorted(steps, start, side="left"))
        hi = steps.size if end is None else int(np.searchsorted(steps, end, side="right"))
        if lo >= hi:
            return EMPTY
        kept = data[lo:hi]
        return Points(
            steps=steps[lo:hi].copy(),
            wall_times=np.asarray([d.wall_time for d in kept], dtype=np.float64),
            values=[np.asarray(d.numpy) for d in kept],
        )
    by_step: Dict[int, tb_provider.TensorDatum] = {}
    for datum in data:
        step = int(datum.step)
        if (start is None or step >= start) and (end is None or step <= end):
            by_step[step] = datum  # later records win (a restarted run rewrites steps)
    if not by_step:
        return EMPTY
    steps = sorted(by_step)
    return Points(
        steps=np.asarray(steps, dtype=np.int64),
        wall_times=np.asarray([by_step[s].wall_time for s in steps], dtype=np.float64),
        values=[np.asarray(by_step[s].numpy) for s in steps],
    )


def pick_evenly(n: int, k: Optional[int]) -> np.ndarray:
    """Indices of at most k of n items, evenly spread, first and last kept (k=1: the last)."""
    if k is None or k >= n:
        return np.arange(n)
    if k == 1:
        return np.asarray([n - 1])
    # With k <= n the spacing is >= 1, so the rounded positions are distinct.
    return np.round(np.linspace(0, n - 1, k)).astype(np.int64)


def thin(points: Points, max_steps: Optional[int]) -> Points:
    if max_steps is None or len(points) <= max_steps:
        return points
    keep = pick_evenly(len(points), max_steps)
    return Points(points.steps[keep], points.wall_times[keep], [points.values[i] for i in keep])


def align(points_steps: np.ndarray, column: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """`column` (given at `points_steps`) placed on the `steps` axis; NaN where absent."""
    if points_steps is steps or (points_steps.shape == steps.shape and np.array_equal(points_steps, steps)):
        return np.asarray(column, dtype=np.float64)  # the layers of one group share their steps
    row = np.full(steps.shape, np.nan, dtype=np.float64)
    if steps.size and points_steps.size:
        pos = np.minimum(np.searchsorted(steps, points_steps), steps.size - 1)
        hit = steps[pos] == points_steps
        row[pos[hit]] = column[hit]
    return row


def union_steps(all_steps: Sequence[np.ndarray]) -> np.ndarray:
    """The sorted union of several series' steps (int64)."""
    if not all_steps:
        return np.zeros([0], np.int64)
    first = all_steps[0]
    if all(s is first or (s.shape == first.shape and np.array_equal(s, first)) for s in all_steps[1:]):
        return first.astype(np.int64)  # one group's layers: the same steps (each already sorted and unique)
    return np.unique(np.concatenate(all_steps)).astype(np.int64)


def stats_table(values: Sequence[np.ndarray]) -> np.ndarray:
    """Stats records as float64 [n, len(STAT_FIELDS)].

    A record of another length (a malformed file) is cut or padded with NaN
    rather than failing the whole route.
    """
    width = len(STORED_STATS)
    table = np.full([len(values), width], np.nan, dtype=np.float64)
    for i, value in enumerate(values):
        flat = np.asarray(value, dtype=np.float64).reshape(-1)[:width]
        table[i, : flat.shape[0]] = flat
    return table


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def no_finite_element(table: np.ndarray) -> np.ndarray:
    """bool per row: the tensor had elements and none of them was finite (all NaN/Inf), and it is not a
    "no gradient" record.

    Why: the writer stores `norm` = 0 there (the square root of an empty sum), which reads as a gradient of
    exactly 0 (a "dead" layer, a point at 0 on a chart) where there is no value at all. The on-disk format
    is kept (docs/FORMAT.md); every reader takes `norm` through `stat_column`, which says NaN there.
    """
    col = {field: table[:, i] for i, field in enumerate(STORED_STATS)}
    nonfinite = col["nan"] + col["pos_inf"] + col["neg_inf"]
    with np.errstate(invalid="ignore"):
        return (col["elements"] > 0) & (nonfinite >= col["elements"]) & ~(col["no_gradient"] > 0)


def stat_column(table: np.ndarray, name: str) -> np.ndarray:
    """One statistic (stored or derived) for every row of a stats table: NaN where it has no value (the
    statistics of the finite elements of a tensor without any, `no_finite_element`)."""
    col = {field: table[:, i] for i, field in enumerate(STORED_STATS)}
    if name == "norm":
        return np.where(no_finite_element(table), np.nan, col["norm"])
    if name in col:
        return col[name]
    nonfinite = col["nan"] + col["pos_inf"] + col["neg_inf"]
    if name == "nonfinite":
        return nonfinite
    if name == "nonfinite_frac":
        return _ratio(nonfinite, col["elements"])
    if name == "zero_frac":
        return _ratio(col["zeros"], col["elements"])
    if name == "rms":
        finite = col["elements"] - nonfinite
        with np.errstate(invalid="ignore"):
            rms = _ratio(col["norm"], np.sqrt(np.maximum(finite, 0.0)))
        return np.where(col["no_gradient"] > 0, np.nan, rms)
    raise KeyError(name)
