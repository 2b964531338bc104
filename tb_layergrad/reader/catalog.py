"""Which series exist: runs, layers in model order, kinds, targets, sources.

Built from `list_tensors` only (metadata, never tensor bodies), once per
request: no cache, so a layer or run that appears during training shows up on
the next request. Every "unknown name" 404 is decided here, before any tensor
is read, so a made-up name never reaches `read_tensors`.

Format version 2 (docs/FORMAT.md) stores the stats, histograms and first_nonfinite of all layers of a
(target, source) in one tag per layer list: the catalog still lists one `Series` per layer, whose
`parts` name the tags and rows that hold it (`reader.layer_points` reads them).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Collection, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from tensorboard import errors
from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata

SeriesKey = Tuple[str, str, str, str]  # (layer, target, source, kind)

# Keeps a quoted user value in a message short.
_MAX_QUOTED = 120


def quote(value: Any) -> str:
    """repr() of a user-supplied value (a run or layer name...), truncated for messages."""
    text = repr(value)
    if len(text) > _MAX_QUOTED:
        text = text[: _MAX_QUOTED - 4] + "...'"
    return text


@dataclasses.dataclass(frozen=True)
class Part:
    """Where some of a layer's records are: a version-1 tag of its own, or one row of a version-2 group tag."""

    tag: str
    row: Optional[int]  # None: a per-layer (version-1) record; else the layer's row of a group record
    max_step: Optional[int]  # of the whole tag, as `list_tensors` reports it (the cache's version)
    max_wall_time: Optional[float]
    rows: int = 0  # a group tag: how many layers its records hold (len(layers)); 0 for a per-layer tag
    fields: Tuple[str, ...] = ()  # a group `stats` tag: its columns' names
    group: str = ""  # a group tag: the tag without its block of steps (`GroupInfo.tag`), shared by its blocks

    @property
    def grouped(self) -> bool:
        return self.row is not None


@dataclasses.dataclass(frozen=True)
class Series:
    """One layer's time series of one kind in one run, wherever it is stored (`parts`).

    Why parts: from format version 2 on, the stats, histograms and first_nonfinite records of all
    layers of a (target, source) share one tag per layer list, and a model rebuilt mid-run writes
    to another; a layer's series is the union of its rows in all of them, and of a version-1 tag.
    """

    run: str
    info: metadata.SeriesInfo
    parts: Tuple[Part, ...]
    max_step: Optional[int]
    max_wall_time: Optional[float]

    @property
    def key(self) -> SeriesKey:
        i = self.info
        return (i.layer, i.target, i.source, i.kind)

    @property
    def tags(self) -> Tuple[str, ...]:
        return tuple(p.tag for p in self.parts)

    @property
    def versions(self) -> FrozenSet[int]:
        """The format versions of its parts: 2 for a group row, 1 for a per-layer record of a grouped kind."""
        return frozenset(2 if p.grouped else 1 for p in self.parts)


def _max(values: Iterable[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def merge(run: str, infos_parts: Sequence[Tuple[metadata.SeriesInfo, Part]]) -> Series:
    """One layer's series from its parts; `info` is that of the part written last (display: dtype)."""
    latest = max(infos_parts, key=lambda ip: -float("inf") if ip[1].max_wall_time is None else ip[1].max_wall_time)
    known = [ip[0].index for ip in infos_parts if ip[0].index >= 0]
    info = latest[0] if not known or latest[0].index >= 0 else dataclasses.replace(latest[0], index=min(known))
    parts = tuple(sorted((ip[1] for ip in infos_parts), key=lambda p: (p.row is not None, p.tag)))
    return Series(run, info, parts, _max(p.max_step for p in parts), _max(p.max_wall_time for p in parts))


def members(
    tag: str,
    info: metadata.Info,
    max_step: Optional[int],
    max_wall: Optional[float],
    layers: Optional[Collection[str]] = None,
) -> List[Tuple[metadata.SeriesInfo, Part]]:
    """The per-layer series one listed tag holds: itself (version 1) or one per row (version 2); `layers`: only
    those layers' (None: all)."""
    if isinstance(info, metadata.GroupInfo):
        rows = range(len(info.layers)) if layers is None else [i for i, x in enumerate(info.layers) if x in layers]
        group = info.tag
        return [
            (m, Part(tag, i, max_step, max_wall, len(info.layers), info.fields, group))
            for i, m in zip(rows, info.members(rows))
        ]
    if layers is not None and info.layer not in layers:
        return []
    return [(info, Part(tag, None, max_step, max_wall))]


def _layer_order(index: int, layer: str) -> Tuple[bool, int, str]:
    """Model order: known index first (ascending), unknown (-1) last, then path."""
    return (index < 0, index, layer)


def owned_by(layer: str, target: str) -> bool:
    """Whether `layer` belongs to the sub-model a target is named after: a custom `train_step`'s tape is named after
    the sub-model whose weights it trains (a GAN's `generator`, the k-th repeat `generator#k`), so its own layers are
    those with a path segment of that name (`gan/generator/g_out`)."""
    name = target.split("#", 1)[0]
    return name in layer.split("/")


def series_target(target: str, source: str) -> str:
    """The `target` field of the series a (target, source) query names: activations are one forward pass,
    stored under `metadata.ACTIVATION_TARGET` whatever target a view shows (docs/FORMAT.md)."""
    return metadata.ACTIVATION_TARGET if source == metadata.SOURCE_ACTIVATION else target


class RunCatalog:
    """The series of one run, indexed for lookups and listed in model order.

    The sources `activation` and `target` (docs/FORMAT.md) are not gradients: the activation
    pseudo-target `forward` is not one of `targets()`, and a target series (the loss value, its
    `layer` the target's name) is not one of `layers()`; `target_series` and `has_activations`
    name them.
    """

    def __init__(
        self,
        run: str,
        series: Iterable[Series],
        signature: Optional[tuple] = None,
        warnings: Sequence[str] = (),
    ) -> None:
        """`signature`: the run's `listing_signature` (default: from its series' parts); `warnings`: what its
        listing skipped (`from_listing`)."""
        self.run = run
        self.warnings = list(warnings)
        series = list(series)
        self.signature = (
            signature
            if signature is not None
            else tuple(sorted({(p.tag, p.max_step, p.max_wall_time) for s in series for p in s.parts}))
        )
        self._by_key: Dict[SeriesKey, Series] = {}
        self._layer_index: Dict[str, int] = {}
        for s in series:
            i = s.info
            self._by_key[(i.layer, i.target, i.source, i.kind)] = s
            if i.source == metadata.SOURCE_TARGET:
                continue  # the differentiated scalar: no layer of the model
            known = self._layer_index.get(i.layer, -1)
            if i.index >= 0 and (known < 0 or i.index < known):
                self._layer_index[i.layer] = i.index
            else:
                self._layer_index.setdefault(i.layer, known)
        # By layer, for `of_layer`: a scan of every series per layer made `runs` O(layers x tags),
        # which a run of many tags feels (docs/DESIGN.md, "Reading side").
        self._by_layer: Dict[str, List[Series]] = {}
        for key, s in self._by_key.items():
            if key[2] != metadata.SOURCE_TARGET:
                self._by_layer.setdefault(key[0], []).append(s)

    @property
    def series(self) -> List[Series]:
        return list(self._by_key.values())

    def layers(self) -> List[str]:
        """Every layer path of the run, in model order."""
        return sorted(self._layer_index, key=lambda layer: _layer_order(self._layer_index[layer], layer))

    def layer_index(self, layer: str) -> int:
        return self._layer_index.get(layer, -1)

    def targets(self) -> List[str]:
        """The differentiated scalars (`loss`, ...): of gradients and target series, never `forward`."""
        return sorted({key[1] for key in self._by_key if key[2] != metadata.SOURCE_ACTIVATION})

    def target_series(self) -> List[str]:
        """The targets whose value was recorded (source `target`, docs/FORMAT.md)."""
        return sorted({key[1] for key in self._by_key if key[2] == metadata.SOURCE_TARGET})

    def has_activations(self) -> bool:
        """Whether forward values (source `activation`) were recorded in this run."""
        return any(key[2] == metadata.SOURCE_ACTIVATION for key in self._by_key)

    def format_versions(self) -> List[int]:
        """The format versions the run's records were written in (docs/HTTP_API.md, `runs`).

        Judged by the kinds version 2 groups: a group row is 2, a per-layer record of such a kind 1;
        `tensor` and `timesteps` records are the same in both, so they decide only when alone.
        """
        grouped = [s for s in self._by_key.values() if s.info.kind in metadata.GROUPED_KINDS]
        if grouped:
            return sorted(set().union(*(s.versions for s in grouped)))
        return sorted({s.info.version for s in self._by_key.values()})

    def sources(self) -> List[str]:
        present = {key[2] for key in self._by_key}
        return [s for s in metadata.SOURCES if s in present]

    def of_layer(self, layer: str) -> List[Series]:
        return list(self._by_layer.get(layer, ()))

    def with_kind(self, target: str, source: str, kind: str) -> List[Series]:
        """Series of one kind for (target, source), in model order of their layers, the target's own layers first
        (`owned_by`: a GAN's `generator` target lists the generator's layers before the discriminator's)."""
        found = [s for (layer, t, src, k), s in self._by_key.items() if (t, src, k) == (target, source, kind)]
        own = {s.info.layer for s in found if owned_by(s.info.layer, target)}
        if len(own) == len(found):
            own = set()  # every layer is the target's: model order alone
        return sorted(
            found, key=lambda s: (s.info.layer not in own, *_layer_order(self.layer_index(s.info.layer), s.info.layer))
        )

    def has_layer(self, layer: str) -> bool:
        return layer in self._layer_index

    def find(self, layer: str, target: str, source: str, kind: str) -> Optional[Series]:
        return self._by_key.get((layer, target, source, kind))

    def require(self, layer: str, target: str, source: str, kind: str) -> Series:
        """The series, or a 404 saying which part of the name is unknown."""
        found = self.find(layer, target, source, kind)
        if found is not None:
            return found
        if not self.has_layer(layer):
            raise errors.NotFoundError(f"layer {quote(layer)} not found in run {quote(self.run)}")
        mine = self.of_layer(layer)
        targets = sorted({s.info.target for s in mine})
        if target not in targets:
            raise errors.NotFoundError(
                f"target {quote(target)} not found for layer {quote(layer)} in run {quote(self.run)}; it has {targets}"
            )
        sources = sorted({s.info.source for s in mine if s.info.target == target})
        if source not in sources:
            raise errors.NotFoundError(
                f"no {source!r} gradients for layer {quote(layer)}, target {quote(target)} in run {quote(self.run)}"
            )
        raise errors.NotFoundError(
            f"no {kind!r} records for layer {quote(layer)} (target {quote(target)}, source {source!r}) in run {quote(self.run)}"
        )


def _content_version(content: bytes) -> int:
    """The `version` of a content this reader refused as too new (for the warning)."""
    try:
        return int(json.loads(bytes(content).decode("utf-8"))["version"])
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return metadata.FORMAT_VERSION + 1


@dataclasses.dataclass
class Catalog:
    runs: Dict[str, RunCatalog]
    warnings: List[str]

    def run(self, name: str) -> RunCatalog:
        found = self.runs.get(name)
        if found is None:
            raise errors.NotFoundError(f"run {quote(name)} not found (or it has no layergrad data)")
        return found


def load(
    data_provider: Any,
    ctx: object,
    experiment_id: str,
    runs: Optional[Iterable[str]] = None,
    tags: Optional[Iterable[str]] = None,
    layers: Optional[Mapping[str, Collection[str]]] = None,
) -> Catalog:
    """List the plugin's series, optionally only of some runs and tags (metadata only); `layers`: of each run, only
    the series of these layers (`from_listing`).

    `data_provider`: a TensorBoard data provider, or anything with its `list_tensors`
    (the plugin passes one that walks only new records). Filter by tag whenever the
    caller knows it: the Python loader's `list_tensors` walks every record of every
    series it lists, so an unfiltered listing costs in proportion to the whole run.
    """
    run_filter = None
    if runs is not None or tags is not None:
        run_filter = tb_provider.RunTagFilter(
            runs=None if runs is None else sorted(set(runs)), tags=None if tags is None else sorted(set(tags))
        )
    listing = data_provider.list_tensors(
        ctx,
        experiment_id=experiment_id,
        plugin_name=metadata.PLUGIN_NAME,
        run_tag_filter=run_filter,
    )
    return from_listing(listing, layers)


def listing_signature(tags: Mapping[str, Any]) -> tuple:
    """What a run's listing says of its records: each tag with its `max_step` and `max_wall_time`, sorted. A new
    or rewritten record changes it (as it does the versions `stats_store` keeps), so a result computed from the
    run's records holds while it is the same.

    Example:

        listing_signature({"t": tb_provider.TensorTimeSeries(max_step=3, max_wall_time=1.5, plugin_content=b"")})
        # (("t", 3, 1.5),)
    """
    return tuple(sorted((tag, ts.max_step, ts.max_wall_time) for tag, ts in tags.items()))


def from_listing(
    listing: Mapping[str, Mapping[str, Any]], layers: Optional[Mapping[str, Collection[str]]] = None
) -> Catalog:
    """The catalog of a `list_tensors(plugin_name="layergrad")` answer (`load` lists, then calls this): each
    run with its series in model order and its `listing_signature`; series of a newer format or with
    unreadable metadata skipped, with a warning. `layers`: `{run: layers}`, only the series of those layers of
    each run (a run's group tag holds every layer's row: a route about one layer of many runs builds the rest for
    nothing); a run not named there keeps every layer."""
    catalogs: Dict[str, RunCatalog] = {}
    warnings: List[str] = []
    for run in sorted(listing):
        parts: Dict[SeriesKey, List[Tuple[metadata.SeriesInfo, Part]]] = {}
        newer: Dict[int, int] = {}
        malformed = 0
        for tag, ts in listing[run].items():
            try:
                info = metadata.parse_plugin_content(ts.plugin_content)
            except metadata.UnsupportedFormatError:
                version = _content_version(ts.plugin_content)
                newer[version] = newer.get(version, 0) + 1
                continue
            except (ValueError, TypeError):
                malformed += 1
                continue
            max_step = None if ts.max_step is None else int(ts.max_step)
            max_wall = None if ts.max_wall_time is None else float(ts.max_wall_time)
            for member, part in members(tag, info, max_step, max_wall, None if layers is None else layers.get(run)):
                key = (member.layer, member.target, member.source, member.kind)
                parts.setdefault(key, []).append((member, part))
        series = [merge(run, found) for found in parts.values()]
        said = len(warnings)
        for version, count in sorted(newer.items()):
            warnings.append(
                f"run {run!r}: {count} series were written by a newer tb_layergrad (format version {version}; "
                f"this one reads up to {metadata.FORMAT_VERSION}) and are skipped; upgrade tb_layergrad"
            )
        if malformed:
            warnings.append(f"run {run!r}: {malformed} series have unreadable metadata and are skipped")
        if series:
            catalogs[run] = RunCatalog(run, series, listing_signature(listing[run]), warnings[said:])
    return Catalog(catalogs, warnings)
