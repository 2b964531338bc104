"""The per-layer side of the contract: names, kinds, sources, the statistics' order, `SeriesInfo`.

Read `tb_layergrad.metadata` (which re-exports every name) for the whole contract; docs/FORMAT.md.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Tuple

from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "layergrad"

# The version of the JSON document in `SummaryMetadata.plugin_data.content`: the newest this package reads,
# the only one it writes. Version 2: the `stats`, `histogram`, `first_nonfinite` and `examples` records of
# all layers of one (target, source) in one record per step (`GroupInfo`). Version 1 (read only): one
# record per layer, kind and step (`SeriesInfo`), the form `tensor` and `timesteps` records keep.
FORMAT_VERSION = 2
# The content version of per-layer records (`SeriesInfo`), which version 2 did not change.
LAYER_RECORD_VERSION = 1

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
        check_names(self.kind, KINDS, self.source, self.target)
        if not self.layer:
            raise ValueError("a series needs a non-empty layer path")

    @property
    def tag(self) -> str:
        return make_tag(self.target, self.source, self.layer, self.kind)

    def to_content(self) -> bytes:
        doc = dataclasses.asdict(self)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


SERIES_INFO_FIELDS = frozenset(f.name for f in dataclasses.fields(SeriesInfo))


def check_names(kind: str, kinds: Tuple[str, ...], source: str, target: str) -> None:
    """What every record's info needs: a known kind and source, a target name."""
    if kind not in kinds:
        raise ValueError(f"unknown record kind {kind!r} here; expected one of {kinds}")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {SOURCES}")
    if not target:
        raise ValueError("a series needs a non-empty target name")


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
