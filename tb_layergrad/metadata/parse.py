"""Reading `SummaryMetadata.plugin_data.content`: every version up to FORMAT_VERSION, nothing newer."""

from __future__ import annotations

import functools
import json
from typing import Any, Dict, Optional, Union

from tb_layergrad.metadata.groups import GROUPED_KINDS, GroupInfo
from tb_layergrad.metadata.series_info import FORMAT_VERSION, SERIES_INFO_FIELDS, SeriesInfo


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
    kwargs = {k: v for k, v in doc.items() if k in SERIES_INFO_FIELDS}
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
