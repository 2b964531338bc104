"""Reads every run's statistics into the `StatsStore` in the background, so the tab's first request finds them.

Why: a long run's overview needs every step of every layer, and the data providers hand tensors over one
record at a time: converting 100,000 records takes seconds however the routes are written
(docs/DESIGN.md, "Reading side"). TensorBoard itself loads event files in the background for the same
reason; this does the same for the tables the routes read, once TensorBoard reports the records.

What it costs, and its bounds:
- A pass lists the plugin's series (metadata only) every `interval` seconds and reads what changed and then
  stopped changing (`_settled`): of a version-2 group, the blocks a later block follows, and the last one
  once a pass finds it as it was. A run still being written is read at most every `BUSY_INTERVAL` and up
  to its last block; the request reads that one.
  A request for a run being read waits for that read (`StatsStore`) rather than doing it again.
- It never makes the store drop a table: a run is read only if its statistics fit in what the store has
  free (`estimated_bytes`, an upper bound), most recently written runs first.
- After `idle_after` seconds with no request to the plugin (the tab is closed), it stops re-reading runs
  that keep changing (a training run); a run never read yet is still read once.
- After each pass, `then(ctx, catalog)` runs (the routes compute the `sweep` route's rows of the runs held
  and not computed yet, whoever read them, `sweep_impl.warm`), so that the Runs view's first request finds them.
- `--layergrad_prefetch=false` turns it off (`loader.PREFETCH`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from tensorboard import context as tb_context

from tb_layergrad import metadata
from tb_layergrad.reader import catalog
from tb_layergrad.reader.stats_store import StatsStore

logger = logging.getLogger(__name__)

# A pass that finds nothing changed costs one `list_tensors` (metadata only), so passes are frequent: a run
# TensorBoard has just loaded is read within about this long, before a person has opened the tab.
DEFAULT_INTERVAL = 1.0
DEFAULT_IDLE_AFTER = 600.0
LISTING_DUTY = 10  # wait at least this many times as long as the last pass's listing took
# A run whose listing changed since the last pass (being written, or being loaded by TensorBoard) is read ahead
# at most this often: only its blocks that stopped changing, so a training run costs a read now and then, and a
# run TensorBoard is still loading is read once loaded rather than while its loader works.
BUSY_INTERVAL = 10.0
_Version = Tuple[Optional[int], Optional[float]]


def estimated_bytes(stats_series: List[catalog.Series]) -> int:
    """At most how many bytes the store needs for these series (`StatsStore.nbytes` once read): per step of a
    tag, its step and wall time and a float64 row of statistics per layer; a block of a version-2 group spans
    at most its first step to its last, a version-1 tag step 0 to its last."""
    per_tag = {}
    for s in stats_series:
        for p in s.parts:
            if p.max_step is None:
                continue
            first = _block_first_step(p) if p.grouped else 0
            steps = max(0, p.max_step - first + 1)
            layers = p.rows if p.grouped else 1
            per_tag[p.tag] = steps * (8 + 8 + layers * len(metadata.STAT_FIELDS) * 8)
    return sum(per_tag.values())


def _block_first_step(part: catalog.Part) -> int:
    """The first step of a version-2 block, the last component of its tag (`GroupInfo.tag_at`, docs/FORMAT.md)."""
    tail = part.tag[len(part.group) + 1 :] if part.tag.startswith(part.group + "/") else ""
    return int(tail) if tail.isdigit() else 0


class StatsPrefetcher:
    """Keeps the runs' statistics read ahead of the tab (module docstring); one daemon thread."""

    def __init__(
        self,
        store: StatsStore,
        lister: object,
        interval: float = DEFAULT_INTERVAL,
        idle_after: float = DEFAULT_IDLE_AFTER,
        experiment_id: str = "",
        clock: Callable[[], float] = time.monotonic,
        then: Optional[Callable[[tb_context.RequestContext, catalog.Catalog], None]] = None,
    ) -> None:
        """`lister`: anything with a data provider's `list_tensors` (the routes' `listing.TensorLister`).
        `experiment_id`: "" is the logdir TensorBoard was started on. `then`: called after each pass, with
        that pass's catalog."""
        self._store = store
        self._lister = lister
        self._interval = max(float(interval), 0.05)
        self._idle_after = float(idle_after)
        self._experiment_id = experiment_id
        self._clock = clock
        self._last_request = clock()  # TensorBoard's start counts as use: the tab is usually opened next
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._listing_seconds = 0.0
        self._last_listing = 0.0
        self._listed: Dict[str, Dict[str, _Version]] = {}  # run -> its stats tags' versions at the last pass
        self._last_read: Dict[str, float] = {}  # run -> when a pass last read it (or first saw it changing)
        self._then = then

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="layergrad-prefetch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def request_seen(self) -> None:
        """Called by every route: the tab is open, so runs that keep changing are kept read."""
        self._last_request = self._clock()

    def warm_once(self) -> List[str]:
        """One pass: read the runs that changed and fit; returns the runs read."""
        ctx = tb_context.RequestContext()
        started = self._clock()
        cat = catalog.load(self._lister, ctx, self._experiment_id)
        # What a listing costs is the lesser of the last two: a listing that first indexed a run's event files
        # (`record_index`: a 500 MB run read once) is not what the next one costs, and waiting ten times as long
        # after it left a run just loaded unread for minutes.
        took = self._clock() - started
        self._listing_seconds, self._last_listing = min(took, self._last_listing), took
        idle = self._clock() - self._last_request > self._idle_after
        newest_first = sorted(cat.runs.values(), key=lambda rc: -_latest_wall_time(rc))
        read = []
        for rc in newest_first:
            if self._stop.is_set():
                break
            all_stats = [s for s in rc.series if s.info.kind == metadata.KIND_STATS]
            now = {p.tag: (p.max_step, p.max_wall_time) for s in all_stats for p in s.parts}
            before, self._listed[rc.run] = self._listed.get(rc.run, {}), now
            if now != before:  # being written (or loaded): read it ahead now and then, not at every pass
                since = self._last_read.setdefault(rc.run, self._clock())
                if self._clock() - since < BUSY_INTERVAL:
                    continue
            stats = _settled(all_stats, before)
            if not stats:
                continue
            held = self._store.holds(self._experiment_id, rc.run)
            if held and idle:
                continue  # changing, but nobody looks: the next request reads what changed
            if not held and estimated_bytes(stats) > self._store.max_bytes - self._store.nbytes:
                continue  # would make the store drop tables; a held run replaces its own
            self._last_read[rc.run] = self._clock()
            if self._store.read_ahead(ctx, self._experiment_id, rc.run, stats):
                read.append(rc.run)
        if self._then is not None and not self._stop.is_set():
            self._then(ctx, cat)
        return read

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                runs = self.warm_once()
                if runs:
                    logger.debug("layergrad: read ahead the statistics of %d runs", len(runs))
            except Exception:  # noqa: BLE001 - a failed pass (a data server starting, a file being cut) is retried
                logger.debug("layergrad: reading ahead failed; retrying in %.1f s", self._interval, exc_info=True)
            # A logdir of very many tags makes the listing itself cost: it gets at most a tenth of a core.
            self._stop.wait(max(self._interval, LISTING_DUTY * self._listing_seconds))


def _settled(stats: List[catalog.Series], before: Dict[str, "_Version"]) -> List[catalog.Series]:
    """The series with only their tags that stopped changing: one listed as in the last pass (`before`), or a
    block of a version-2 group that a later block follows (its steps end where the next block's begin).

    Why: a tag still being written (a training run, or one TensorBoard is still loading) would be read
    again at every pass, each time whole; the request that finally asks for it reads it once.
    """
    last_block: Dict[str, Tuple[int, str]] = {}
    for s in stats:
        for p in s.parts:
            if p.grouped:
                last_block[p.group] = max(last_block.get(p.group, (-1, "")), (_block_first_step(p), p.tag))
    out = []
    for s in stats:
        parts = tuple(
            p
            for p in s.parts
            if before.get(p.tag) == (p.max_step, p.max_wall_time) or (p.grouped and last_block[p.group][1] != p.tag)
        )
        if parts:
            out.append(dataclasses.replace(s, parts=parts))
    return out


def _latest_wall_time(rc: catalog.RunCatalog) -> float:
    walls = [s.max_wall_time for s in rc.series if s.max_wall_time is not None]
    return max(walls) if walls else float("-inf")
