"""`list_tensors` without re-walking every stored record under TensorBoard's Python loader.

Why: `MultiplexerDataProvider.list_tensors` computes each series' `max_step` and
`max_wall_time` by folding over every record the multiplexer holds, in Python,
on every call, so a listing costs in proportion to everything stored, and every
route of the tab lists.
`TensorLister` gives the same answer, but keeps each series' fold and continues
it over the records added since the last listing only.

Why that is exact: the records of a series live in a TensorBoard reservoir, whose
only changes are appending at the end, replacing the last record, removing a
record then appending (sampling), and an order-keeping filter (purge after a
restart). None inserts before an existing record, so a record's position never
grows; and each record is its own `TensorEvent` object, never re-added, which the
multiplexer's public `Tensors(run, tag)` hands out as it holds it (a new list, the
same objects). So a record that is still the very same object at the same position
`n - 1` proves the first `n` records unchanged (a removal or replacement before or
at it would have moved or dropped it). Then the fold of those `n` records, kept
from last time, continued over the rest, is the fold over all records, done in
the same order with the same comparisons as `list_tensors` (so even unordered
steps, earlier wall times or NaN give identical results). Anything else (a new
run's accumulator, a purge, a sampled replacement) fails the check and the
series is folded again from its first record.

Under the Rust data server (`context.multiplexer` is None), the data server
folds every record of every listed series on each `ListTensors`, outside Python:
cheap for one tag, in proportion to every record for whole runs. A listing of
several runs with no tag filter is then split by run into a few calls made at
once, so that the server folds the runs on all its cores instead of one
(measured in docs/DESIGN.md, "Reading side"). Any other data provider gets
`list_tensors` as is.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tensorboard.compat.proto import summary_pb2
from tensorboard.data import provider as tb_provider

Listing = Dict[str, Dict[str, tb_provider.TensorTimeSeries]]


@dataclasses.dataclass(frozen=True)
class _Fold:
    """`list_tensors`' running maxima over the first `count` records; `last` is record `count - 1`."""

    count: int
    last: Any  # the TensorEvent itself: compared by identity (held, so its id is never reused)
    max_step: Optional[int]
    max_wall_time: Optional[float]


def multiplexer_of(data_provider: Any, multiplexer: Any) -> Any:
    """The multiplexer to list from directly, or None to go through `data_provider.list_tensors`.

    Only when TensorBoard's own `MultiplexerDataProvider` serves this very multiplexer (the Python
    loader builds `TBContext.multiplexer` and the provider from the same `EventMultiplexer`), so that
    reading the multiplexer is reading the provider. The provider has no public way to say which
    multiplexer it reads: this is the plugin's one read of a private TensorBoard attribute, and a
    provider without it (renamed, another provider, a wrapper) gets the public `list_tensors`.
    """
    if multiplexer is None:
        return None
    try:
        from tensorboard.backend.event_processing import data_provider as mux_provider
    except ImportError:
        return None
    if not isinstance(data_provider, mux_provider.MultiplexerDataProvider):
        return None
    if getattr(data_provider, "_multiplexer", None) is not multiplexer:  # noqa: SLF001 - see the docstring
        return None
    return multiplexer


# Concurrent `list_tensors` calls of one listing under the Rust loader: one per core, at least 4
# (the data server spreads concurrent calls over its cores; at most 8, a round trip each).
LISTING_CALLS = max(4, min(8, os.cpu_count() or 1))


def folds_outside_python(data_provider: Any) -> bool:
    """Whether `list_tensors` is answered by another process (the Rust data server over gRPC),
    so that listing runs concurrently uses more cores instead of contending for the GIL."""
    try:
        from tensorboard.data import grpc_provider
    except ImportError:
        return False
    return isinstance(data_provider, grpc_provider.GrpcDataProvider)


class TensorLister:
    """`list_tensors` with the data provider's signature and results; thread-safe."""

    def __init__(self, data_provider: tb_provider.DataProvider, multiplexer: Any = None) -> None:
        """`multiplexer`: `TBContext.multiplexer` (None under the Rust loader)."""
        self._provider = data_provider
        self._mux = multiplexer_of(data_provider, multiplexer)
        self._by_run = self._mux is None and folds_outside_python(data_provider)
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self._folds: Dict[Tuple[str, str], _Fold] = {}
        # Without a multiplexer: the tags of each run seen by its last listing not filtered by tag.
        self._run_tags: Dict[Tuple[str, str], Tuple[str, ...]] = {}

    @property
    def incremental(self) -> bool:
        """Whether listings skip records already seen (False: every call is `list_tensors`)."""
        return self._mux is not None

    def tags_of(self, ctx: Any, experiment_id: str, run: str, plugin_name: str) -> Tuple[str, ...]:
        """The run's tag names, for finding its version-2 group tags (`{target}/{source}/layers-.../{kind}`)
        without folding its records: from the multiplexer's metadata (the Python loader); else those of the
        run's last listing not filtered by tag, or one such listing when the run was never listed whole
        (a group tag born since that listing shows from the next one, which every tab poll makes)."""
        if self._mux is not None:
            try:
                return tuple(self._mux.GetAccumulator(run).PluginTagToContent(plugin_name))
            except KeyError:
                return ()
        with self._lock:
            known = self._run_tags.get((experiment_id, run))
        if known is None:
            self.list_tensors(
                ctx,
                experiment_id=experiment_id,
                plugin_name=plugin_name,
                run_tag_filter=tb_provider.RunTagFilter(runs=[run]),
            )
            with self._lock:
                known = self._run_tags.get((experiment_id, run), ())
        return known

    def list_tensors(
        self,
        ctx: Any = None,
        *,
        experiment_id: str,
        plugin_name: str,
        run_tag_filter: Optional[tb_provider.RunTagFilter] = None,
    ) -> Listing:
        if self._mux is not None:
            return self._list(plugin_name, run_tag_filter)
        result = None
        if self._by_run and (run_tag_filter is None or run_tag_filter.tags is None):
            runs = None if run_tag_filter is None else run_tag_filter.runs
            if runs is None:
                runs = [r.run_name for r in self._provider.list_runs(ctx, experiment_id=experiment_id)]
            if len(runs) > 1:
                result = self._list_concurrently(ctx, experiment_id, plugin_name, sorted(runs))
        if result is None:
            result = self._provider.list_tensors(
                ctx, experiment_id=experiment_id, plugin_name=plugin_name, run_tag_filter=run_tag_filter
            )
        if run_tag_filter is None or run_tag_filter.tags is None:
            with self._lock:
                listed = run_tag_filter.runs if run_tag_filter is not None and run_tag_filter.runs else ()
                for run in listed:
                    self._run_tags[(experiment_id, run)] = ()
                for run, tags in result.items():
                    self._run_tags[(experiment_id, run)] = tuple(tags)
        return result

    def latest_records(self, run: str, tags: Sequence[str], step: Optional[int]) -> Optional[Dict[str, List[Any]]]:
        """Under the Python loader: `{tag: [TensorDatum]}`, each tag's latest record at or before `step` (None: its
        last), converted alone: the provider's `read_tensors` converts every record of a tag before it samples,
        a thousand for a run's one histogram. None without the multiplexer (ask the provider then)."""
        if self._mux is None:
            return None
        from tensorboard.util import tensor_util  # only under the Python loader

        out: Dict[str, List[Any]] = {}
        for tag in tags:
            try:
                records = self._mux.Tensors(run, tag)
            except KeyError:
                continue
            kept = [r for r in records if step is None or r.step <= step]
            if kept:
                last = max(kept, key=lambda r: r.step)  # a repeated step: the later record (max keeps the first)
                last = [r for r in kept if r.step == last.step][-1]
                datum = tb_provider.TensorDatum(
                    step=last.step, wall_time=last.wall_time, numpy=tensor_util.make_ndarray(last.tensor_proto)
                )
                out[tag] = [datum]
        return out

    def list_scalars(
        self,
        ctx: Any = None,
        *,
        experiment_id: str,
        plugin_name: str,
        run_tag_filter: Optional[tb_provider.RunTagFilter] = None,
    ) -> Dict[str, Dict[str, Any]]:
        """The data provider's `list_scalars` (`max_step`, `max_wall_time` per series), its records folded once
        under the Python loader as `list_tensors`' are (each answer a `TensorTimeSeries`)."""
        if self._mux is None:
            return self._provider.list_scalars(
                ctx, experiment_id=experiment_id, plugin_name=plugin_name, run_tag_filter=run_tag_filter
            )
        return self._list(plugin_name, run_tag_filter, summary_pb2.DATA_CLASS_SCALAR)

    def _list_concurrently(self, ctx: Any, experiment_id: str, plugin_name: str, runs: List[str]) -> Listing:
        """`list_tensors` over `runs` split into up to LISTING_CALLS calls (a few runs each), made
        at once: the same answer as one call. Not one call per run: a logdir of a hundred runs
        would pay a hundred round trips."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=LISTING_CALLS, thread_name_prefix="layergrad-listing"
                )
            pool = self._pool
        calls = min(len(runs), LISTING_CALLS)
        futures = [
            pool.submit(
                self._provider.list_tensors,
                ctx,
                experiment_id=experiment_id,
                plugin_name=plugin_name,
                run_tag_filter=tb_provider.RunTagFilter(runs=runs[i::calls]),
            )
            for i in range(calls)
        ]
        result: Listing = {}
        for future in futures:
            result.update(future.result())
        return result

    def _list(
        self,
        plugin_name: str,
        run_tag_filter: Optional[tb_provider.RunTagFilter],
        data_class: int = summary_pb2.DATA_CLASS_TENSOR,
    ) -> Listing:
        """`MultiplexerDataProvider._index` then `_list`, step by step, with the fold continued."""
        mux = self._mux
        runs = None if run_tag_filter is None else run_tag_filter.runs
        tags = None if run_tag_filter is None else run_tag_filter.tags
        if runs and len(runs) == 1 and tags and len(tags) == 1:
            (run,) = runs
            (tag,) = tags
            try:
                all_metadata = {run: {tag: mux.SummaryMetadata(run, tag)}}
            except KeyError:
                return {}
        else:
            all_metadata = mux.AllSummaryMetadata()
        result: Listing = {}
        for run, tag_to_metadata in all_metadata.items():
            if runs is not None and run not in runs:
                continue
            for tag, md in tag_to_metadata.items():
                if tags is not None and tag not in tags:
                    continue
                if md.data_class != data_class or md.plugin_data.plugin_name != plugin_name:
                    continue
                fold = self._fold(run, tag)
                md = mux.SummaryMetadata(run, tag)
                result.setdefault(run, {})[tag] = tb_provider.TensorTimeSeries(
                    max_step=fold.max_step,
                    max_wall_time=fold.max_wall_time,
                    plugin_content=md.plugin_data.content,
                    description=md.summary_description,
                    display_name=md.display_name,
                )
        if runs is None and tags is None and data_class == summary_pb2.DATA_CLASS_TENSOR:
            self._forget_except(all_metadata)
        return result

    def _fold(self, run: str, tag: str) -> _Fold:
        """The maxima of the series' records, continuing the kept fold when its records are unchanged."""
        key = (run, tag)
        with self._lock:
            kept = self._folds.get(key)
        new, count, continued = _new_records(self._mux, run, tag, kept)
        if continued:
            max_step, max_wall_time, last = kept.max_step, kept.max_wall_time, kept.last
        else:
            max_step, max_wall_time, last = None, None, None
        # The same comparisons, in the same order, as MultiplexerDataProvider._list.
        for event in new:
            if max_step is None or max_step < event.step:
                max_step = event.step
            if max_wall_time is None or max_wall_time < event.wall_time:
                max_wall_time = event.wall_time
        fold = _Fold(count, new[-1] if new else last, max_step, max_wall_time)
        with self._lock:
            self._folds[key] = fold
        return fold

    def _forget_except(self, all_metadata: Dict[str, Dict[str, Any]]) -> None:
        """Drop the folds of series no longer listed (a deleted run), after an unfiltered listing."""
        with self._lock:
            gone = [k for k in self._folds if k[1] not in all_metadata.get(k[0], ())]
            for k in gone:
                del self._folds[k]


def _continues(records: Sequence[Any], kept: Optional[_Fold]) -> bool:
    """Whether `records` start with the `kept.count` records folded before (see the module docstring)."""
    return kept is not None and 0 < kept.count <= len(records) and records[kept.count - 1] is kept.last


def _new_records(mux: Any, run: str, tag: str, kept: Optional[_Fold]) -> Tuple[List[Any], int, bool]:
    """(records to fold, how many the series has, whether they are those after `kept`'s); else all of them.

    `mux.Tensors` copies the series' list (of the same record objects): cheap beside folding them.
    A KeyError (the tag gone) propagates, as from `list_tensors`.
    """
    records = mux.Tensors(run, tag)
    if _continues(records, kept):
        return records[kept.count :], len(records), True
    return records, len(records), False
