"""One run to read: where its records come from, what the catalog lists of it, and the caches that keep them.

Why one object: every reading function of the reader (`layer_points`, `examples`, `origin`,
`run_anomalies`) needs the same six things, and the plugin's routes, `tb-layergrad report` and
`tb_layergrad.load()` hand them over alike; passed one by one they made every signature the same
eight lines long.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence

from tensorboard.data import provider as tb_provider

from tb_layergrad.reader import catalog
from tb_layergrad.reader.block_cache import BlockCache
from tb_layergrad.reader.rule_fold import RuleFold
from tb_layergrad.reader.stats_store import StatsRows, StatsStore


@dataclasses.dataclass
class RunSource:
    """The run `rc` as read through `provider` for one request.

    Args:
      provider: a TensorBoard data provider (the plugin's, or `reader.event_files.open_provider`'s).
      ctx: the request's `tensorboard.context.RequestContext`.
      experiment_id: "" for the logdir TensorBoard was started on.
      rc: the run's catalog (`catalog.load(...).run(name)`).
      store: the plugin's `StatsStore`, so that routes share its tables; None: a store of this read alone.
      blocks: the plugin's cache of decoded version-2 blocks; None: none kept.
      folds: the plugin's rules of each run evaluated so far, extended by its new steps (`rule_fold`); None:
        each evaluation is whole.

    Example:

        from tensorboard import context
        from tb_layergrad.reader import catalog, event_files, run_source
        provider = event_files.open_provider("logs")
        ctx = context.RequestContext()
        rc = catalog.load(provider, ctx, "").run("train")
        rows = run_source.RunSource(provider, ctx, "", rc).stats(rc.with_kind("loss", "output", "stats"))
    """

    provider: tb_provider.DataProvider
    ctx: object
    experiment_id: str
    rc: catalog.RunCatalog
    store: Optional[StatsStore] = None
    blocks: Optional[BlockCache] = None
    folds: Optional[RuleFold] = None
    # Whether a read answered tables kept as of another listing than `rc`'s (`StatsStore.read_listed`): what is
    # computed from this source then holds for no listing, and is not kept as `rc.signature`'s.
    behind: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.store is None:
            self.store = StatsStore(self.provider)

    @property
    def run(self) -> str:
        return self.rc.run

    def stats(
        self, chosen: Sequence[catalog.Series], start: Optional[int] = None, end: Optional[int] = None
    ) -> Dict[catalog.SeriesKey, StatsRows]:
        """`{key: StatsRows}` of `stats` series of this run within [start, end], through the store."""
        rows, listed = self.store.read_listed(self.ctx, self.experiment_id, self.rc.run, chosen, start, end)
        self.behind = self.behind or not listed
        return rows
