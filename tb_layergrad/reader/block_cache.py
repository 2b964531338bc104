"""Version-2 group blocks other than `stats`, kept decoded while TensorBoard reports them unchanged.

Why: a layer's histograms are one row of its group's records, so a layer view reads every record of
every block of the group, for every layer clicked (a 200-layer run of 5,000 steps: 5,000 records
converted one by one per click, docs/DESIGN.md, "Reading side"). The decoded records of a block serve
every layer of it. A block is valid while `list_tensors` reports the same `max_step` and `max_wall_time`
for its tag, as the `StatsStore`'s tables are; the least recently used are dropped beyond `max_bytes`.
(`stats` blocks are the `StatsStore`'s, kept as tables.)

A block is read by one thread at a time (`claim`): 16 readers of a run opened in the tab ask for the same
layer's histograms at once, and each decoding the whole run was work per request, not per step.
"""

from __future__ import annotations

import collections
import threading
from typing import Dict, Optional, Tuple

from tb_layergrad.reader import catalog, series

DEFAULT_MAX_BYTES = 256 << 20

_Key = Tuple[str, str, str]  # (experiment id, run, tag)
_Version = Tuple[Optional[int], Optional[float]]


def version(part: catalog.Part) -> _Version:
    return (part.max_step, part.max_wall_time)


def nbytes(points: series.Points) -> int:
    """The bytes a block's points hold (what `BlockCache` counts): its arrays, and the values' arrays."""
    return int(points.steps.nbytes + points.wall_times.nbytes + sum(getattr(v, "nbytes", 0) for v in points.values))


class BlockCache:
    """Thread-safe LRU of decoded group blocks (`series.Points` of whole records), bounded in bytes."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._read_done = threading.Condition(self._lock)  # notified when a block's reader lets go of it
        self._blocks: "collections.OrderedDict[_Key, Tuple[_Version, series.Points, int]]" = collections.OrderedDict()
        self._positions: Dict[_Key, tuple] = {}  # where the read of a kept block stopped (`series.read_since`)
        self._bytes = 0
        self._reading: Dict[_Key, int] = {}  # blocks being read now -> the reading thread

    def claim(self, experiment_id: str, run: str, part: catalog.Part) -> Optional[Tuple[series.Points, bool]]:
        """After a `get` that missed: (the block as kept at an earlier version, False) while another thread reads it
        now (a block being written changes at every step: one thread reads it, the others answer with what is
        kept, an answer then of no listing: `RunSource.behind`); with nothing kept, (the block as that thread keeps
        it once read, whether that is the version listed) (waited for, not read a second time); else None, and
        this thread is the block's reader until its `release`. A thread claims the blocks it reads in the order of
        their tags (`layer_points.read_points`), so two readers never wait for each other."""
        key = (experiment_id, run, part.tag)
        me = threading.get_ident()
        with self._lock:
            while key in self._reading and self._reading[key] != me:
                hit = self._blocks.get(key)
                if hit is not None:
                    return hit[1], hit[0] == version(part)
                self._read_done.wait()
            hit = self._blocks.get(key)
            if hit is not None and hit[0] == version(part) and key not in self._reading:
                self._blocks.move_to_end(key)
                return hit[1], True  # read meanwhile by the thread waited for
            self._reading[key] = me
            return None

    def release(self, experiment_id: str, run: str, part: catalog.Part) -> None:
        """This thread no longer reads the block (`claim`), read or not."""
        key = (experiment_id, run, part.tag)
        with self._lock:
            if self._reading.get(key) == threading.get_ident():
                del self._reading[key]
                self._read_done.notify_all()

    def get(self, experiment_id: str, run: str, part: catalog.Part) -> Optional[series.Points]:
        key = (experiment_id, run, part.tag)
        with self._lock:
            hit = self._blocks.get(key)
            if hit is None or hit[0] != version(part):
                return None
            self._blocks.move_to_end(key)
            return hit[1]

    def kept(self, experiment_id: str, run: str, part: catalog.Part) -> Optional[Tuple[series.Points, tuple, int]]:
        """The block as kept, whatever its version, where its read stopped, and its `nbytes`; None if not kept or
        the position is not known: what a read of the block's new records only (`series.read_since`) continues."""
        key = (experiment_id, run, part.tag)
        with self._lock:
            hit = self._blocks.get(key)
            position = self._positions.get(key)
            return None if hit is None or position is None else (hit[1], position, hit[2])

    def put(
        self,
        experiment_id: str,
        run: str,
        part: catalog.Part,
        points: series.Points,
        position: Optional[tuple] = None,
        size: Optional[int] = None,
    ) -> None:
        """Keep a block's `points` as of `part`'s version; `size`: their `nbytes` where the caller knows it (a block
        kept with new records after it: counted once per record, not per step of the block at each change)."""
        key = (experiment_id, run, part.tag)
        size = nbytes(points) if size is None else size
        with self._lock:
            old = self._blocks.pop(key, None)
            self._positions.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            if size > self._max_bytes:
                return
            self._blocks[key] = (version(part), points, size)
            if position is not None:
                self._positions[key] = position
            self._bytes += size
            while self._bytes > self._max_bytes:
                dropped_key, (_, _, dropped) = self._blocks.popitem(last=False)
                self._positions.pop(dropped_key, None)
                self._bytes -= dropped
