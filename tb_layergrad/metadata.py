"""The on-disk contract: plugin name, tags, versioned metadata, tensor layouts.

This module must stay free of TensorFlow: the TensorBoard plugin imports it and
TensorBoard may run without TensorFlow installed. `docs/FORMAT.md` is the prose
version of what is encoded here; change both together and bump FORMAT_VERSION
when a reader written for the old version would misread the new files.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "layergrad"

# The newest version of the JSON document stored in `SummaryMetadata.plugin_data.content` that this
# package reads, and the one it writes by default. Version 1: one record per layer, kind and step
# (`SeriesInfo`). Version 2: the `stats`, `histogram` and `first_nonfinite` records of all layers of
# one (target, source) in one record per step (`GroupInfo`); `tensor` and `timesteps` records keep
# their version-1 form. docs/FORMAT.md.
FORMAT_VERSION = 2
# The content version of per-layer records (`SeriesInfo`), which version 2 did not change.
LAYER_RECORD_VERSION = 1
WRITABLE_VERSIONS = (1, 2)

# What a record holds (the `kind` field). Each kind has its own tensor layout.
KIND_HISTOGRAM = "histogram"  # float64 [k, 3]: (left edge, right edge, count)
KIND_STATS = "stats"  # float64 [len(STAT_FIELDS)]
KIND_TENSOR = "tensor"  # float32 [rows, cols]: bounded raw gradient
KIND_TIMESTEPS = "timesteps"  # float64 [T]: L2 norm of dL/dh_t per timestep
# int64 [1]: the first logged step with a NaN/Inf in the series so far; written with the
# stats from that step on, so TensorBoard's sampling (which keeps the last record) cannot lose it.
KIND_FIRST_NONFINITE = "first_nonfinite"
# float64 [layers, len(EXAMPLE_FIELDS)], version 2 only: the distribution of each example's own gradient
# norm (`capture(per_example=True)`), written when asked for (docs/FORMAT.md, "Per-example records").
KIND_EXAMPLES = "examples"
KINDS = (KIND_HISTOGRAM, KIND_STATS, KIND_TENSOR, KIND_TIMESTEPS, KIND_FIRST_NONFINITE, KIND_EXAMPLES)

# What the record describes (the `source` field).
SOURCE_OUTPUT = "output"  # d target / d (layer output)
SOURCE_WEIGHT = "weight"  # d target / d (trainable variable)
SOURCE_ACTIVATION = (
    "activation"  # the layer output itself: the forward value (kinds histogram, stats, tensor, first_nonfinite)
)
SOURCE_TARGET = "target"  # the differentiated scalar itself, e.g. the loss (kinds stats, first_nonfinite)
SOURCES = (SOURCE_OUTPUT, SOURCE_WEIGHT, SOURCE_ACTIVATION, SOURCE_TARGET)
GRADIENT_SOURCES = (SOURCE_OUTPUT, SOURCE_WEIGHT)

DEFAULT_TARGET = "loss"
# The `target` field of activation records: the forward pass is one, whatever is differentiated after it.
ACTIVATION_TARGET = "forward"

# Order of the values in a `stats` record. Counts are exact integers stored as
# float64; moments are over the finite elements only. Undefined values (min of
# nothing, mean of nothing) are NaN.
STAT_FIELDS = (
    "elements",  # total number of elements, finite or not
    "nan",  # number of NaN elements
    "pos_inf",  # number of +Inf elements
    "neg_inf",  # number of -Inf elements
    "zeros",  # number of elements equal to 0 (either sign)
    "min",  # smallest finite element
    "max",  # largest finite element
    "mean",  # mean of the finite elements
    "std",  # population standard deviation of the finite elements
    "norm",  # L2 norm of the finite elements
    "mean_abs",  # mean of |g| over the finite elements
    "no_gradient",  # 1 when the target does not depend on this tensor (gradient None)
)
STAT_INDEX = {name: i for i, name in enumerate(STAT_FIELDS)}

# How many of the largest per-example norms an `examples` record names, with their batch positions.
EXAMPLE_TOP_K = 5
# Order of the values in a row of an `examples` record (one row per layer). `norm` is ||g_i||, the L2 norm of
# example i's own gradient (docs/PER_EXAMPLE.md); counts and positions are exact integers stored as float64.
EXAMPLE_FIELDS = (
    (
        "examples",  # number of examples of the (global) batch
        "status",  # EXAMPLE_EXACT, or why there are no numbers: EXAMPLE_UNSUPPORTED, EXAMPLE_COUPLED
        "min",  # smallest per-example norm
        "median",  # median per-example norm (the mean of the middle two for an even count)
        "max",  # largest per-example norm
        "sum_sq",  # sum over the examples of the squared norms
        "top_share",  # the largest example's share of sum_sq: max^2 / sum_sq (NaN when sum_sq is 0)
    )
    + tuple(f"top_index_{i}" for i in range(1, EXAMPLE_TOP_K + 1))
    + tuple(f"top_norm_{i}" for i in range(1, EXAMPLE_TOP_K + 1))
)
# top_index_j: the batch position (global batch order) of the j-th largest norm, -1 past `examples`;
# top_norm_j: that norm (NaN past `examples`).
EXAMPLE_INDEX = {name: i for i, name in enumerate(EXAMPLE_FIELDS)}
# The gradient noise scale's TensorBoard scalars (plugin `scalars`, docs/FORMAT.md), by what they hold.
NOISE_SCALE_TAGS = {
    "noise_scale": "layergrad/gradient_noise_scale",  # B_simple = trace / signal
    "trace": "layergrad/gradient_noise_scale/trace",  # tr(Sigma) estimate
    "signal": "layergrad/gradient_noise_scale/signal",  # |G|^2 estimate
    "coverage": "layergrad/gradient_noise_scale/coverage",  # share of trainable parameters covered
}
EXAMPLE_EXACT = 0  # the numbers are each example's own gradient norm
EXAMPLE_UNSUPPORTED = 1  # no exact per-example rule for this layer's weights: no numbers (NaN)
EXAMPLE_COUPLED = 2  # the examples are coupled (e.g. BatchNormalization in training): not defined, no numbers


def stat_values(**values: Any) -> list:
    """The values of a `stats` record in STAT_FIELDS order, given by name.

    Why: every writer (TensorFlow's ops, the replica merge, "no gradient") builds
    its record through this, so that the position of a statistic is decided here
    only; the C++ kernel's enum is pinned to STAT_FIELDS by a test.
    """
    missing = [name for name in STAT_FIELDS if name not in values]
    unknown = [name for name in values if name not in STAT_INDEX]
    if missing or unknown:
        raise ValueError(f"a stats record needs exactly {STAT_FIELDS}; missing {missing}, unknown {unknown}")
    return [values[name] for name in STAT_FIELDS]


@dataclasses.dataclass(frozen=True)
class SeriesInfo:
    """What one tag holds; constant for the life of the tag."""

    layer: str
    kind: str
    target: str = DEFAULT_TARGET
    source: str = SOURCE_OUTPUT
    index: int = -1  # position of the layer in the model (pre-order walk), -1 if unknown
    dtype: str = ""  # dtype of the captured tensor, for display
    version: int = LAYER_RECORD_VERSION

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown record kind {self.kind!r}; expected one of {KINDS}")
        if self.source not in SOURCES:
            raise ValueError(f"unknown source {self.source!r}; expected one of {SOURCES}")
        if not self.layer:
            raise ValueError("a series needs a non-empty layer path")
        if not self.target:
            raise ValueError("a series needs a non-empty target name")

    @property
    def tag(self) -> str:
        return make_tag(self.target, self.source, self.layer, self.kind)

    def to_content(self) -> bytes:
        doc = dataclasses.asdict(self)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


_SERIES_INFO_FIELDS = frozenset(f.name for f in dataclasses.fields(SeriesInfo))


def make_tag(target: str, source: str, layer: str, kind: str) -> str:
    """The tag of a series: readable, unique per (target, source, layer, kind)."""
    return f"{target}/{source}/{layer}/{kind}"


def create_summary_metadata(info: SeriesInfo, description: str = "") -> summary_pb2.SummaryMetadata:
    """Metadata that makes TensorBoard route the series to this plugin."""
    return summary_pb2.SummaryMetadata(
        display_name=info.layer,
        summary_description=description,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=info.to_content()),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


# -- format version 2: one record per step for all layers of one (target, source) ------------------
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
        if self.kind not in GROUPED_KINDS:
            raise ValueError(f"kind {self.kind!r} is not a version-2 record; expected one of {GROUPED_KINDS}")
        if self.source not in SOURCES:
            raise ValueError(f"unknown source {self.source!r}; expected one of {SOURCES}")
        if not self.target:
            raise ValueError("a series needs a non-empty target name")
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
        return dataclasses.replace(self, kind=kind, fields=FIELDS_OF_KIND.get(kind, ()))

    def members(self) -> Tuple[SeriesInfo, ...]:
        """One `SeriesInfo` per row (version 2), as a reader lists layers."""
        return tuple(
            SeriesInfo(
                layer=layer,
                kind=self.kind,
                target=self.target,
                source=self.source,
                index=index,
                dtype=dtype,
                version=self.version,
            )
            for layer, index, dtype in zip(self.layers, self.indexes, self.dtypes)
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


class UnsupportedFormatError(ValueError):
    """The content was written by a newer tb_layergrad than this reader."""


Info = Union[SeriesInfo, GroupInfo]


def parse_plugin_content(content: bytes) -> Info:
    """Decode `plugin_data.content`: a `SeriesInfo` (version 1) or a `GroupInfo` (version 2).

    Raises UnsupportedFormatError for a version newer than FORMAT_VERSION and
    ValueError on anything malformed. Memoized by the bytes: every listing of
    the tab parses the content of every series again, and a run's contents
    repeat across runs and calls (decoding was most of the Python side of a
    3 x 200-layer listing). Both infos are frozen, so sharing one is safe;
    malformed content is not cached (it raises).
    """
    if not isinstance(content, (bytes, bytearray)):
        raise TypeError("plugin content must be bytes")
    return _parse_content(bytes(content))


@functools.lru_cache(maxsize=1 << 16)
def _parse_content(content: bytes) -> Info:
    try:
        doc: Dict[str, Any] = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"plugin content is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("plugin content is not a JSON object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError("plugin content has no valid version")
    if version > FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"format version {version} is newer than this reader ({FORMAT_VERSION}); upgrade tb_layergrad"
        )
    if version >= 2 and doc.get("kind") in GROUPED_KINDS:
        return _group_info(doc)
    kwargs = {k: v for k, v in doc.items() if k in _SERIES_INFO_FIELDS}
    try:
        return SeriesInfo(**kwargs)
    except TypeError as e:
        raise ValueError(f"plugin content is incomplete: {e}") from None


def _group_info(doc: Dict[str, Any]) -> GroupInfo:
    lists = {}
    for name in ("layers", "indexes", "dtypes"):
        value = doc.get(name)
        if not isinstance(value, list):
            raise ValueError(f"version-2 plugin content needs a list {name!r}")
        lists[name] = value
    fields = doc.get("fields", [])
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise ValueError("version-2 plugin content: 'fields' must be a list of names")
    try:
        return GroupInfo(
            kind=doc["kind"],
            target=doc["target"],
            source=doc["source"],
            version=doc["version"],
            fields=tuple(fields),
            block_steps=doc.get("block_steps", 0),
            **lists,
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"plugin content is incomplete: {e}") from None


def try_parse_plugin_content(content: bytes) -> Optional[Info]:
    """Like parse_plugin_content, but None for content this reader cannot use."""
    try:
        return parse_plugin_content(content)
    except (ValueError, TypeError):
        return None
