"""The on-disk contract: plugin name, tags, versioned metadata, tensor layouts.

This module must stay free of TensorFlow: the TensorBoard plugin imports it and
TensorBoard may run without TensorFlow installed. `docs/FORMAT.md` is the prose
version of what is encoded here; change both together and bump FORMAT_VERSION
when a reader written for the old version would misread the new files. Only the
newest version is written; `parse_plugin_content` reads every older one.

Modules: `records` (names, kinds, sources, the statistics' order, per-layer
`SeriesInfo`), `groups` (format version 2: `GroupInfo`, one record per step
for all layers of one target and source), `parse` (reading any version).
Every name is read as `tb_layergrad.metadata.<name>`.
"""

from __future__ import annotations

from tb_layergrad.metadata.groups import (
    BLOCK_BYTES,
    COUNT_DTYPES,
    FIELDS_OF_KIND,
    GROUPED_KINDS,
    GroupInfo,
    block_start,
    block_steps,
    count_dtype,
    create_group_metadata,
    group_tag,
    histogram_edges,
)
from tb_layergrad.metadata.parse import (
    Info,
    UnsupportedFormatError,
    parse_plugin_content,
    try_parse_plugin_content,
)
from tb_layergrad.metadata.records import (
    ACTIVATION_TARGET,
    DEFAULT_TARGET,
    EXAMPLE_COUPLED,
    EXAMPLE_EXACT,
    EXAMPLE_FIELDS,
    EXAMPLE_INDEX,
    EXAMPLE_TOP_K,
    EXAMPLE_UNSUPPORTED,
    FORMAT_VERSION,
    GRADIENT_SOURCES,
    KIND_EXAMPLES,
    KIND_FIRST_NONFINITE,
    KIND_HISTOGRAM,
    KIND_STATS,
    KIND_TENSOR,
    KIND_TIMESTEPS,
    KINDS,
    LAYER_RECORD_VERSION,
    NOISE_SCALE_TAGS,
    PLUGIN_NAME,
    SOURCE_ACTIVATION,
    SOURCE_OUTPUT,
    SOURCE_TARGET,
    SOURCE_WEIGHT,
    SOURCES,
    STAT_FIELDS,
    STAT_INDEX,
    SeriesInfo,
    create_summary_metadata,
    make_tag,
    stat_values,
)

__all__ = [
    "ACTIVATION_TARGET",
    "BLOCK_BYTES",
    "COUNT_DTYPES",
    "DEFAULT_TARGET",
    "EXAMPLE_COUPLED",
    "EXAMPLE_EXACT",
    "EXAMPLE_FIELDS",
    "EXAMPLE_INDEX",
    "EXAMPLE_TOP_K",
    "EXAMPLE_UNSUPPORTED",
    "FIELDS_OF_KIND",
    "FORMAT_VERSION",
    "GRADIENT_SOURCES",
    "GROUPED_KINDS",
    "GroupInfo",
    "Info",
    "KINDS",
    "KIND_EXAMPLES",
    "KIND_FIRST_NONFINITE",
    "KIND_HISTOGRAM",
    "KIND_STATS",
    "KIND_TENSOR",
    "KIND_TIMESTEPS",
    "LAYER_RECORD_VERSION",
    "NOISE_SCALE_TAGS",
    "PLUGIN_NAME",
    "SOURCES",
    "SOURCE_ACTIVATION",
    "SOURCE_OUTPUT",
    "SOURCE_TARGET",
    "SOURCE_WEIGHT",
    "STAT_FIELDS",
    "STAT_INDEX",
    "SeriesInfo",
    "UnsupportedFormatError",
    "block_start",
    "block_steps",
    "count_dtype",
    "create_group_metadata",
    "create_summary_metadata",
    "group_tag",
    "histogram_edges",
    "make_tag",
    "parse_plugin_content",
    "stat_values",
    "try_parse_plugin_content",
]
