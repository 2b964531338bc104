"""The on-disk contract: plugin name, tags, versioned metadata, tensor layouts.

This module must stay free of TensorFlow: the TensorBoard plugin imports it and
TensorBoard may run without TensorFlow installed. `docs/FORMAT.md` is the prose
version of what is encoded here; change both together and bump FORMAT_VERSION
when a reader written for the old version would misread the new files.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Dict, Optional

from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "layergrad"

# Version of the JSON document stored in `SummaryMetadata.plugin_data.content`.
FORMAT_VERSION = 1

# What a record holds (the `kind` field). Each kind has its own tensor layout.
KIND_HISTOGRAM = "histogram"  # float64 [k, 3]: (left edge, right edge, count)
KIND_STATS = "stats"  # float64 [len(STAT_FIELDS)]
KIND_TENSOR = "tensor"  # float32 [rows, cols]: bounded raw gradient
KIND_TIMESTEPS = "timesteps"  # float64 [T]: L2 norm of dL/dh_t per timestep
# int64 [1]: the first logged step with a NaN/Inf in the series so far; written with the
# stats from that step on, so TensorBoard's sampling (which keeps the last record) cannot lose it.
KIND_FIRST_NONFINITE = "first_nonfinite"
KINDS = (KIND_HISTOGRAM, KIND_STATS, KIND_TENSOR, KIND_TIMESTEPS, KIND_FIRST_NONFINITE)

# What the record describes (the `source` field).
SOURCE_OUTPUT = "output"  # d target / d (layer output)
SOURCE_WEIGHT = "weight"  # d target / d (trainable variable)
SOURCE_ACTIVATION = "activation"  # the layer output itself: the forward value (kinds histogram, stats, tensor, first_nonfinite)
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
    version: int = FORMAT_VERSION

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
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=info.to_content()
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


class UnsupportedFormatError(ValueError):
    """The content was written by a newer tb_layergrad than this reader."""


def parse_plugin_content(content: bytes) -> SeriesInfo:
    """Decode `plugin_data.content`; raises ValueError on anything malformed.

    Memoized by the bytes: every listing of the tab parses the content of every
    series again, and a run's contents repeat across runs and calls (decoding
    was most of the Python side of a 3 x 200-layer listing). `SeriesInfo` is
    frozen, so sharing one is safe; malformed content is not cached (it raises).
    """
    if not isinstance(content, (bytes, bytearray)):
        raise TypeError("plugin content must be bytes")
    return _parse_content(bytes(content))


@functools.lru_cache(maxsize=1 << 16)
def _parse_content(content: bytes) -> SeriesInfo:
    try:
        doc: Dict[str, Any] = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"plugin content is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("plugin content is not a JSON object")
    version = doc.get("version")
    if not isinstance(version, int):
        raise ValueError("plugin content has no integer version")
    if version > FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"format version {version} is newer than this reader ({FORMAT_VERSION}); upgrade tb_layergrad"
        )
    kwargs = {k: v for k, v in doc.items() if k in _SERIES_INFO_FIELDS}
    try:
        return SeriesInfo(**kwargs)
    except TypeError as e:
        raise ValueError(f"plugin content is incomplete: {e}") from None


def try_parse_plugin_content(content: bytes) -> Optional[SeriesInfo]:
    """Like parse_plugin_content, but None for content this reader cannot use."""
    try:
        return parse_plugin_content(content)
    except (ValueError, TypeError):
        return None
