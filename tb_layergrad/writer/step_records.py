"""One step's records as `Summary.Value`s, from numbers already reduced (numpy): the format-v2 group records.

Why on the host and in numpy: a backend other than TensorFlow reduces on its device and hands out only the
numbers (`stats` float64 [L, 12], histogram counts [L, k]); what remains is the on-disk contract
(docs/FORMAT.md), the same bytes TensorFlow's path writes: counts in the narrowest unsigned type, metadata in a
tag's first record of a file, a `first_nonfinite` row per layer from the group's first non-finite step on.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
from tensorboard.compat.proto import summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata

from tb_layergrad import metadata

_NONFINITE_COLUMNS = [metadata.STAT_INDEX[name] for name in ("nan", "pos_inf", "neg_inf")]

# The element types the records hold (docs/FORMAT.md), as TensorFlow's `DataType`s.
_DATA_TYPES = {
    np.dtype(np.float32): types_pb2.DT_FLOAT,
    np.dtype(np.float64): types_pb2.DT_DOUBLE,
    np.dtype(np.int64): types_pb2.DT_INT64,
    np.dtype(np.uint8): types_pb2.DT_UINT8,
    np.dtype(np.uint16): types_pb2.DT_UINT16,
    np.dtype(np.uint32): types_pb2.DT_UINT32,
    np.dtype(np.uint64): types_pb2.DT_UINT64,
}


def tensor_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
    """A numeric array as TensorFlow's summary writer serializes it: its bytes in `tensor_content`.

    Why not TensorBoard's `make_tensor_proto`: it keeps the 16- and 32-bit unsigned counts element by element
    (a Python call per count), which made building a step's records the larger part of the writer thread's
    work; the readers decode either form. Little-endian, as every platform the package runs on.
    """
    array = np.ascontiguousarray(array)
    proto = tensor_pb2.TensorProto(dtype=_DATA_TYPES[array.dtype], tensor_content=array.tobytes())
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    return proto


@dataclasses.dataclass
class GroupStep:
    """One (target, source) group at one step: its layers' stats rows and histogram counts (None: no histogram)."""

    group: metadata.GroupInfo  # of kind `stats`; the other kinds are derived from it
    stats: np.ndarray  # float64 [L, len(STAT_FIELDS)]
    counts: "np.ndarray | None"  # [L, k], any integer or float dtype holding whole numbers
    raw: "Sequence[np.ndarray] | None" = None  # one bounded float32 [rows, cols] view per layer (kind `tensor`)
    examples: "np.ndarray | None" = None  # float64 [L, len(EXAMPLE_FIELDS)]: the `examples` rows (`example_rows`)


class StepRecords:
    """Turns each step's `GroupStep`s into values, keeping what a file's records depend on across steps.

    Kept per writer (one event file): which tags already carried their metadata, and each layer's first
    non-finite step (by layer, so that a changed layer list keeps it, as `summary/writer_state.py` does).
    """

    def __init__(self) -> None:
        self._described: set = set()
        self._first_nonfinite: Dict[tuple, Dict[str, int]] = {}

    def values(
        self, step: int, groups: Sequence[GroupStep], scalars: Optional[Mapping[str, float]] = None
    ) -> List[summary_pb2.Summary.Value]:
        """The step's values; `scalars`: {tag: value} written as TensorBoard scalars (the noise scale's)."""
        out: List[summary_pb2.Summary.Value] = []
        for g in groups:
            stats = np.asarray(g.stats, dtype=np.float64)
            out.append(self._value(g.group, step, stats))
            if g.counts is not None:
                counts = np.asarray(g.counts)
                top = int(counts.max()) if counts.size else 0
                out.append(
                    self._value(
                        g.group.with_kind(metadata.KIND_HISTOGRAM), step, counts.astype(metadata.count_dtype(top))
                    )
                )
            for layer, index, dtype, tensor in zip(g.group.layers, g.group.indexes, g.group.dtypes, g.raw or ()):
                out.append(self._raw(g.group, layer, index, dtype, step, tensor))
            rows = self._nonfinite_rows(g.group, step, stats)
            if rows is not None:
                out.append(self._value(g.group.with_kind(metadata.KIND_FIRST_NONFINITE), step, rows))
            if g.examples is not None:
                examples = np.asarray(g.examples, dtype=np.float64)
                out.append(self._value(g.group.with_kind(metadata.KIND_EXAMPLES), step, examples))
        for tag, number in (scalars or {}).items():
            value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_proto(np.asarray(number, np.float32)))
            value.metadata.CopyFrom(scalar_metadata.create_summary_metadata(display_name=tag, description=""))
            out.append(value)
        return out

    def _nonfinite_rows(self, group: metadata.GroupInfo, step: int, stats: np.ndarray) -> "np.ndarray | None":
        """int64 [L]: each layer's first non-finite step (-1: none yet); None before the group's first one."""
        seen = self._first_nonfinite.setdefault((group.target, group.source), {})
        bad = stats[:, _NONFINITE_COLUMNS].sum(axis=1) > 0
        for layer, is_bad in zip(group.layers, bad):
            if is_bad and layer not in seen:
                seen[layer] = step
        if not any(layer in seen for layer in group.layers):
            return None
        return np.array([seen.get(layer, -1) for layer in group.layers], dtype=np.int64)

    @staticmethod
    def _raw(
        group: metadata.GroupInfo, layer: str, index: int, dtype: str, step: int, tensor: np.ndarray
    ) -> summary_pb2.Summary.Value:
        """A per-layer `tensor` record: its metadata in every record of the tag (docs/FORMAT.md)."""
        info = metadata.SeriesInfo(
            layer=layer, kind=metadata.KIND_TENSOR, target=group.target, source=group.source, index=index, dtype=dtype
        )
        array = np.asarray(tensor, dtype=np.float32)
        value = summary_pb2.Summary.Value(tag=info.tag, tensor=tensor_proto(array))
        value.metadata.CopyFrom(metadata.create_summary_metadata(info))
        return value

    def _value(self, info: metadata.GroupInfo, step: int, array: np.ndarray) -> summary_pb2.Summary.Value:
        tag = info.tag_at(step)
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_proto(array))
        if tag not in self._described:
            self._described.add(tag)
            value.metadata.CopyFrom(metadata.create_group_metadata(info))
        return value
