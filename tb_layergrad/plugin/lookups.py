"""What every route reads through: the data provider, its lister, the caches the routes share, and the lookups.

Why the lookups here: a route names a run, a layer, a target and a source; finding that series (404 when
there is none) must not cost in proportion to the run, so it is listed by run AND tag, and the whole run's
catalog is listed only to explain a miss. The catalog is built anew for every request, so a run being
written shows its new steps on the next call; its `stats` are kept as tables in one `StatsStore` while
`list_tensors` reports them unchanged, and decoded version-2 blocks in one `BlockCache`.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Set, Tuple

from tensorboard import errors
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata
from tb_layergrad.plugin import listing, responses
from tb_layergrad.reader import catalog, damage, noise_scale, run_health
from tb_layergrad.reader.bin_pyramid import BinPyramids
from tb_layergrad.reader.block_cache import BlockCache
from tb_layergrad.reader.catalog import quote
from tb_layergrad.reader.rule_fold import RuleFold
from tb_layergrad.reader.run_source import RunSource
from tb_layergrad.reader.stats_store import StatsStore


class Reading:
    """The plugin's reading state, shared by its routes; thread-safe (TensorBoard serves requests in threads).

    Args:
      data_provider: `TBContext.data_provider`.
      multiplexer: `TBContext.multiplexer` (None under the Rust loader), for listing without a walk of
        every record (`listing.TensorLister`).
      logdir: `TBContext.logdir`, whose event files are checked for damage (`reader.damage`); "" for none.
    """

    def __init__(self, data_provider: tb_provider.DataProvider, multiplexer: object = None, logdir: str = "") -> None:
        self.provider = data_provider
        self.lister = listing.TensorLister(data_provider, multiplexer)
        self.stats = StatsStore(data_provider)
        self.blocks = BlockCache()
        self.health = run_health.HealthCache()  # the `sweep` route's rows, per run while it is unchanged
        self.answers = AnswerCache()  # the `anomalies`, `matrix`, `stats` bodies, while their series are unchanged
        self.folds = RuleFold()  # the rules of each run, extended by its new steps
        self.bins = BinPyramids()  # the binned matrix's bins of each run, appended to by its new steps
        self.noise_ends = noise_scale.EndCache()
        self.damage = damage.Watch(logdir or "")

    def damaged(self, eid: str, listed: Sequence[str]) -> Dict[str, List[damage.Damage]]:
        """{run: its damaged event files} as the last check in the background found them (`damage.Watch`);
        `listed`: the runs with layergrad series. Only the logdir TensorBoard was started on is checked."""
        return self.damage.said(listed) if eid == "" else {}

    def catalog(
        self,
        ctx: object,
        eid: str,
        runs: Optional[Sequence[str]] = None,
        tags: Optional[Sequence[str]] = None,
        layers: Optional[Dict[str, Set[str]]] = None,
    ) -> catalog.Catalog:
        return catalog.load(self.lister, ctx, eid, runs=runs, tags=tags, layers=layers)

    def run_catalog(self, ctx: object, eid: str, run: str) -> catalog.RunCatalog:
        """The whole catalog of `run`; 404 if it has no layergrad series."""
        return self.catalog(ctx, eid, runs=[run]).run(run)

    def source(self, ctx: object, eid: str, rc: catalog.RunCatalog) -> RunSource:
        return RunSource(self.provider, ctx, eid, rc, self.stats, self.blocks, self.folds)

    def latest_records(self, run: str, tags: Sequence[str], step: Optional[int]) -> Optional[Dict[str, list]]:
        """`{tag: [TensorDatum...]}`: each tag's records at its latest step at or before `step` (None: its last), found
        without reading the tag whole: in the record index of a local logdir (`record_index.LocalProvider`), else in
        the Python loader's multiplexer; None where neither is read (the provider is asked then, `layer_points`).
        Why not through the provider: a tag's one record is all that is wanted, and each call to the provider
        lists TensorBoard's runs (a round trip to the Rust data server) before the index answers."""
        index = getattr(self.provider, "index", None)
        if index is not None:
            return index.latest(run, tags, step)
        return self.lister.latest_records(run, tags, step)

    def layer_tags(
        self, ctx: object, eid: str, run: str, layer: str, target: str, source: str, kinds: Sequence[str]
    ) -> List[str]:
        """The tags that may hold a layer's `kinds`: its version-1 tags and the run's version-2 group tags
        of (target, source), found by name (`listing.TensorLister.tags_of`), never by folding the run."""
        tags = [metadata.make_tag(target, source, layer, kind) for kind in kinds]
        grouped = [k for k in kinds if k in metadata.GROUPED_KINDS]
        if grouped:
            prefix = f"{target}/{source}/layers-"
            marks = tuple(f"/{k}/" for k in grouped)  # `.../layers-{digest}/{kind}/{block}` (docs/FORMAT.md)
            tags += [
                t
                for t in self.lister.tags_of(ctx, eid, run, metadata.PLUGIN_NAME)
                if t.startswith(prefix) and any(k in t[len(prefix) :] for k in marks)
            ]
        return tags

    def one_series(
        self, ctx: object, eid: str, run: str, layer: str, target: str, source: str, kind: str
    ) -> Tuple[catalog.Series, RunSource]:
        """The series a one-layer route shows, and the run to read it from: listed by run AND tag, so its
        cost does not grow with the run; the whole run's catalog is listed only to explain a miss (404).
        A histogram comes with its layer's stats (a version-2 histogram's edges are the stats' min and max)."""
        tags = self.layer_tags(ctx, eid, run, layer, target, source, [kind])
        if kind == metadata.KIND_HISTOGRAM and len(tags) > 1:  # version-2 groups: their edges need the stats
            tags += self.layer_tags(ctx, eid, run, layer, target, source, [metadata.KIND_STATS])
        listed = self.catalog(ctx, eid, runs=[run], tags=tags).runs.get(run)
        found = listed.find(layer, target, source, kind) if listed is not None else None
        if found is not None:
            return found, self.source(ctx, eid, listed)
        full = self.run_catalog(ctx, eid, run)
        return full.require(layer, target, source, kind), self.source(ctx, eid, full)

    def every_layer(
        self, ctx: object, eid: str, run: str, target: str, source: str, kind: str
    ) -> Tuple[List[catalog.Series], RunSource]:
        """Every layer's series of `kind` (`stats` or `examples`) for (target, source) in `run`, in model
        order, and the run to read them from; 404 naming what is missing."""
        rc = self.run_catalog(ctx, eid, run)
        chosen = rc.with_kind(target, source, kind)
        if not chosen:
            if kind == metadata.KIND_STATS or not rc.with_kind(target, source, metadata.KIND_STATS):
                raise missing_series(rc, target, source, "stats")
            raise errors.NotFoundError(
                f"run {quote(run)} has no per-example records ({source!r}, target {quote(target)})"
            )
        return chosen, self.source(ctx, eid, rc)


class AnswerCache:
    """A route's answers by (experiment, query), kept while the run's listing is the same (`RunCatalog.signature`)
    as the JSON body they are sent as (`responses.encode`: encoded once, however many readers it answers);
    thread-safe.

    Why: the anomaly rules (and the binned matrix, and a layer's binned statistics) take every step of the run, and
    16 readers of a run being written would each compute them again on the same cores, for the same new steps. So an answer is computed once per change of
    the run, and a request that finds it being computed answers the one kept, as of an earlier step (as
    `HealthCache.row` does), or with none kept (the run's first read, seconds on a long run) waits for that
    computation's answer rather than computing it again beside it; requests one after another still see every
    new step.

    Args:
      max_answers: how many to keep (the least recently used are dropped).
    """

    def __init__(self, max_answers: int = 64) -> None:
        self._max = max_answers
        # key -> (the listing's signature the answer is of, None: of none; the answer)
        self._kept: "collections.OrderedDict[Hashable, Tuple[Optional[tuple], responses.EncodedBody]]" = (
            collections.OrderedDict()
        )
        self._computing: set = set()
        self._lock = threading.Lock()
        self._computed = threading.Condition(self._lock)  # notified when a computation ends

    def answer(self, key: Hashable, src: RunSource, compute: Callable[[], dict]) -> responses.EncodedBody:
        """The body of the kept answer for `key` if computed at the listing of `src.rc` (`signature`), or being
        computed again now, else of `compute()` (which reads through `src`); with none kept while another thread
        computes it, that thread's answer (its own `compute()` if that one failed). An answer computed from tables kept as of another
        listing (`src.behind`: read while another request read the run) answers this request but is kept as no
        listing's: the next request computes it again, so a run that stops changing shows its last steps."""
        signature = src.rc.signature
        with self._lock:
            hit = self._kept.get(key)
            if hit is None and key in self._computing:
                self._computed.wait_for(lambda: key not in self._computing)
                hit = self._kept.get(key)  # None: the computation waited for failed, this thread computes
                if hit is not None:
                    self._kept.move_to_end(key)
                    return hit[1]
            if hit is not None and (hit[0] == signature or key in self._computing):
                self._kept.move_to_end(key)
                return hit[1]
            mine = key not in self._computing
            self._computing.add(key)
        try:
            value = responses.encode(compute())
        except BaseException:
            if mine:
                with self._lock:
                    self._computing.discard(key)
                    self._computed.notify_all()
            raise
        with self._lock:
            self._kept[key] = (None if src.behind else signature, value)
            self._kept.move_to_end(key)
            while len(self._kept) > self._max:
                self._kept.popitem(last=False)
            if mine:
                self._computing.discard(key)
                self._computed.notify_all()
        return value


def missing_series(rc: catalog.RunCatalog, target: str, source: str, kind: str) -> errors.NotFoundError:
    """The 404 for a run with no series of `kind` for (target, source)."""
    if source == metadata.SOURCE_ACTIVATION:
        return errors.NotFoundError(
            f"run {quote(rc.run)} has no activation {kind} records (forward values were not recorded)"
        )
    if target not in rc.targets():
        return errors.NotFoundError(f"target {quote(target)} not found in run {quote(rc.run)}; it has {rc.targets()}")
    return errors.NotFoundError(f"run {quote(rc.run)} has no {source!r} {kind} records for target {quote(target)}")
