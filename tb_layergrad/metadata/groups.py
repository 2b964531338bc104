"""Format version 2: one record per step for all layers of one (target, source) (`GroupInfo`, docs/FORMAT.md)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, Dict, Optional, Sequence, Tuple

from tensorboard.compat.proto import summary_pb2

from tb_layergrad.metadata.series_info import (
    EXAMPLE_FIELDS,
    KIND_EXAMPLES,
    KIND_FIRST_NONFINITE,
    KIND_HISTOGRAM,
    KIND_STATS,
    PLUGIN_NAME,
    STAT_FIELDS,
    SeriesInfo,
    check_names,
)

GROUPED_KINDS = (KIND_HISTOGRAM, KIND_STATS, KIND_FIRST_NONFINITE, KIND_EXAMPLES)
# The kinds whose records name their columns (`GroupInfo.fields`), and the names this package writes.
FIELDS_OF_KIND = {KIND_STATS: STAT_FIELDS, KIND_EXAMPLES: EXAMPLE_FIELDS}
# The histogram counts of a version-2 record are stored in the narrowest of these that holds the
# record's largest count (one dtype per record): the edges follow from the stats' min and max.
COUNT_DTYPES = (("uint8", 1 << 8), ("uint16", 1 << 16), ("uint32", 1 << 32), ("uint64", 1 << 64))
_DIGEST_CHARS = 10
# A version-2 tag holds at most this many bytes of statistics: a tag is read in one answer of the data
# provider, and the Rust data server's answers are capped at 256 MiB. So the steps are cut into blocks,
# a tag each (`block_steps`).
BLOCK_BYTES = 1 << 26


def block_steps(layers: int) -> int:
    """Steps per tag of a version-2 group of `layers` rows: the largest power of two whose stats fit BLOCK_BYTES."""
    per_step = max(1, layers) * len(STAT_FIELDS) * 8
    steps = 1
    while steps * 2 * per_step <= BLOCK_BYTES:
        steps *= 2
    return steps


def block_start(step: int, steps_per_block: int) -> int:
    """The first step of the block holding `step` (floor division: negative steps too)."""
    return (step // steps_per_block) * steps_per_block


def count_dtype(max_count: int) -> str:
    """The narrowest unsigned integer type (a numpy/TensorFlow dtype name) that holds `max_count`."""
    for name, bound in COUNT_DTYPES:
        if max_count < bound:
            return name
    raise ValueError(f"a count of {max_count} does not fit 64 bits")


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """What one version-2 tag holds: one `kind` of every layer of one (target, source); constant for its life.

    Row i of each record is `layers[i]`. Why one record for all layers: a tag,
    its framing and its metadata per layer and step were most of the bytes of a
    version-1 run, and TensorBoard keeps every record in memory. The layer list
    is in the metadata, which only the tag's first record carries; a step whose
    layer list differs (a rebuilt model) writes to another tag, whose name
    carries a digest of the list; and the steps are cut into blocks of
    `block_steps`, a tag each (`tag_at`), so that no tag outgrows what a data
    provider answers at once.
    """

    kind: str
    target: str
    source: str
    layers: Tuple[str, ...]
    indexes: Tuple[int, ...]
    dtypes: Tuple[str, ...]
    version: int = 2
    fields: Tuple[str, ...] = ()  # kinds `stats`, `examples`: the columns' names (FIELDS_OF_KIND when written here)
    block_steps: int = 0  # steps per tag; 0: `block_steps(len(layers))`

    def __post_init__(self) -> None:
        for name in ("layers", "indexes", "dtypes", "fields"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_names(self.kind, GROUPED_KINDS, self.source, self.target)
        if not self.layers or not all(isinstance(x, str) and x for x in self.layers):
            raise ValueError("a version-2 record needs a non-empty list of non-empty layer paths")
        if len(set(self.layers)) != len(self.layers):
            raise ValueError("the layer paths of a version-2 record must be distinct")
        if len(self.indexes) != len(self.layers) or len(self.dtypes) != len(self.layers):
            raise ValueError("a version-2 record needs one index and one dtype per layer")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.indexes):
            raise ValueError("layer indexes must be integers")
        if self.kind in FIELDS_OF_KIND and not self.fields:
            object.__setattr__(self, "fields", FIELDS_OF_KIND[self.kind])
        if not isinstance(self.block_steps, int) or isinstance(self.block_steps, bool) or self.block_steps < 0:
            raise ValueError("block_steps must be an integer >= 1")
        if self.block_steps == 0:
            object.__setattr__(self, "block_steps", block_steps(len(self.layers)))

    @classmethod
    def of(cls, kind: str, members: Sequence[SeriesInfo]) -> "GroupInfo":
        """The group of these per-layer series (one target and source), in their order."""
        first = members[0]
        if any((m.target, m.source) != (first.target, first.source) for m in members):
            raise ValueError("the series of one version-2 record share their target and source")
        return cls(
            kind=kind,
            target=first.target,
            source=first.source,
            layers=tuple(m.layer for m in members),
            indexes=tuple(m.index for m in members),
            dtypes=tuple(m.dtype for m in members),
        )

    @property
    def digest(self) -> str:
        """Names the layer list: the same list (paths, indexes, dtypes) gives the same tags."""
        return _layer_list_digest(self.layers, self.indexes, self.dtypes)

    @property
    def tag(self) -> str:
        """The tags' common part (without the block), e.g. where a writer keeps what it wrote to them."""
        return group_tag(self.target, self.source, self.digest, self.kind)

    def tag_at(self, step: int) -> str:
        """The tag of the record at `step`: `{tag}/{first step of its block}`."""
        return f"{self.tag}/{block_start(step, self.block_steps)}"

    def with_kind(self, kind: str) -> "GroupInfo":
        return _with_kind(self, kind)

    def members(self, rows: Optional[Sequence[int]] = None) -> Tuple[SeriesInfo, ...]:
        """One `SeriesInfo` per row (version 2), as a reader lists layers; `rows`: only those rows, in that order."""
        return tuple(
            SeriesInfo(
                layer=self.layers[i],
                kind=self.kind,
                target=self.target,
                source=self.source,
                index=self.indexes[i],
                dtype=self.dtypes[i],
                version=self.version,
            )
            for i in (range(len(self.layers)) if rows is None else rows)
        )

    def to_content(self) -> bytes:
        doc: Dict[str, Any] = {
            "version": self.version,
            "kind": self.kind,
            "target": self.target,
            "source": self.source,
            "layers": list(self.layers),
            "indexes": list(self.indexes),
            "dtypes": list(self.dtypes),
            "block_steps": self.block_steps,
        }
        if self.fields:
            doc["fields"] = list(self.fields)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


@functools.lru_cache(maxsize=1 << 12)
def _layer_list_digest(layers: Tuple[str, ...], indexes: Tuple[int, ...], dtypes: Tuple[str, ...]) -> str:
    # Memoized: a reader names every group's tags for every layer of every request (`GroupInfo.tag`), and
    # hashing the list of a 200-layer model each time was most of the cost of listing such runs.
    text = json.dumps([layers, indexes, dtypes], separators=(",", ":"))
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]


def group_tag(target: str, source: str, digest: str, kind: str) -> str:
    """The common part of a version-2 record's tags: `{target}/{source}/layers-{digest}/{kind}`; each block
    of steps adds `/{its first step}` (`GroupInfo.tag_at`)."""
    return f"{target}/{source}/layers-{digest}/{kind}"


def create_group_metadata(info: GroupInfo, description: str = "") -> summary_pb2.SummaryMetadata:
    """Metadata of a version-2 tag; written with its first record only (TensorBoard keeps the first it sees)."""
    return summary_pb2.SummaryMetadata(
        display_name=f"{info.target}/{info.source}",
        summary_description=description,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=info.to_content()),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def histogram_edges(lo: float, hi: float, buckets: int) -> Tuple[list, list]:
    """(left edges, right edges) of a histogram of `buckets` over [lo, hi], as every writer computes them.

    `lo + i * ((hi - lo) / buckets)` in float64, the first `lo` and the last `hi`
    exactly; one unique value gives every edge that value; no finite element
    (lo, hi NaN) gives zeros (docs/FORMAT.md, `histogram`).
    """
    if not (lo == lo and hi == hi):  # NaN: no finite element
        lo = hi = 0.0
    width = (hi - lo) / buckets
    left = [lo if i == 0 else lo + i * width for i in range(buckets)]
    right = left[1:] + [hi]
    return left, right


@functools.lru_cache(maxsize=1024)
def _with_kind(info: GroupInfo, kind: str) -> GroupInfo:
    """Kept: a writer asks every step for the same few kinds of the same groups, and a new one is validated."""
    return dataclasses.replace(info, kind=kind, fields=FIELDS_OF_KIND.get(kind, ()))
