"""The records of an event file that hold one tensor summary each, their fields read for many records at once.

Why: `load()` and `report` walk every record of a long run (`record_index.RecordIndex.walk`), and parsing each
with protobuf then reading its fields through protobuf's Python objects (a wrapper per message, per field read)
cost several times protobuf's parse itself, record by record in Python. The records tb_layergrad writes, every
step, all have one layout: an Event of wall_time, step and a summary of one value, a tag and a tensor of dtype,
shape and packed bytes (`tensor_content`), each field once, in field-number order (what protobuf's serializers,
TensorFlow's and TensorBoard's, write). Those are read here with numpy, the fields of every record of a chunk at
once. A record of any other form (metadata on a tag's first record, another plugin's summary, a field more or
less, bytes that are no Event) is not read here: its caller parses it with protobuf as before. So every record
read here is one protobuf would parse to the same values, byte for byte: each field's tag, length and place is
checked, and the fields fill the record exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import tensor_shape_pb2


@dataclasses.dataclass
class Records:
    """What `decode` read of each record given, by position: `tags[j]` None for a record not read (the other
    columns' values there mean nothing)."""

    tags: List[Optional[str]]
    steps: np.ndarray  # int64
    walls: np.ndarray  # float64
    dtypes: List[int]  # the dtype enum of the tensor
    shapes: List[Optional[List[int]]]
    content_at: np.ndarray  # int64: where its tensor_content starts in the buffer
    content_len: np.ndarray  # int64


_SHIFTS = np.arange(10, dtype=np.uint64) * np.uint64(7)
_FAR = 1 << 40  # a length past any buffer: where a varint read from bytes that are no field leads


def _varint(
    data: np.ndarray, pos: np.ndarray, end: np.ndarray, width: int = 10
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value as uint64, bytes it takes, whether it is a whole varint of at most `width` bytes before `end`) of
    the varint at each `pos`."""
    at = pos[:, None] + np.arange(width)
    b = data[np.clip(at, 0, data.size - 1)].astype(np.uint64)
    last = (b & np.uint64(0x80)) == 0
    n = np.argmax(last, axis=1) + 1
    ok = last.any(axis=1) & (pos + n <= end)
    parts = np.where(np.arange(width) < n[:, None], (b & np.uint64(0x7F)) << _SHIFTS[:width], np.uint64(0))
    return np.bitwise_or.reduce(parts, axis=1), n, ok


def _length(data: np.ndarray, pos: np.ndarray, end: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start of the field's bytes, their length, whether both are inside `end`) of the length-delimited field
    whose length is the varint at `pos`: of at most 5 bytes (32 GiB; a longer one, which no record of ours
    has, is left to protobuf like any other record)."""
    value, n, ok = _varint(data, pos, end, 5)
    length = np.minimum(value, np.uint64(_FAR)).astype(np.int64)
    start = pos + n
    return start, length, ok & (start + length <= end)


def _byte(data: np.ndarray, pos: np.ndarray, end: np.ndarray, value: int) -> np.ndarray:
    return (pos < end) & (data[np.clip(pos, 0, data.size - 1)] == value)


_SHAPES: Dict[bytes, Optional[List[int]]] = {}  # a TensorShapeProto's bytes -> its dims' sizes (None: no shape)
_TAGS: Dict[bytes, Optional[str]] = {}  # a tag's bytes -> the tag (None: not UTF-8, which protobuf refuses)


def _shape(blob: bytes) -> Optional[List[int]]:
    shape = _SHAPES.get(blob, False)
    if shape is False:
        try:
            shape = [d.size for d in tensor_shape_pb2.TensorShapeProto.FromString(blob).dim]
        except DecodeError:
            shape = None
        if len(_SHAPES) < 4096:
            _SHAPES[blob] = shape
    return shape


def _tag(blob: bytes) -> Optional[str]:
    tag = _TAGS.get(blob, False)
    if tag is False:
        try:
            tag = blob.decode("utf-8")
        except UnicodeDecodeError:
            tag = None
        if len(_TAGS) < 65536:
            _TAGS[blob] = tag
    return tag


def decode(buf: bytes, starts: Sequence[int], lengths: Sequence[int]) -> Records:
    """The fields of each record `buf[s : s + n]` (`starts`, `lengths`) that is an Event of one tensor summary in
    the layout above; the others are left (`Records.tags` None: to be parsed with protobuf)."""
    data = np.frombuffer(buf, np.uint8)
    s = np.asarray(starts, np.int64)
    end = s + np.asarray(lengths, np.int64)
    if not s.size:
        return Records([], np.zeros([0], np.int64), np.zeros([0]), [], [], s, s)
    # Event: wall_time (field 1, fixed64), step (2, varint; absent at step 0), summary (5, the rest of the record).
    ok = _byte(data, s, end, 0x09)
    has_step = _byte(data, s + 9, end, 0x10)
    step, n, good = _varint(data, s + 10, end)
    step[~has_step] = 0
    ok &= good | ~has_step
    p = np.where(has_step, s + 10 + n, s + 9)
    ok &= _byte(data, p, end, 0x2A)
    p, length, good = _length(data, p + 1, end)
    ok &= good & (p + length == end)
    # Summary: one value (field 1, the rest); Summary.Value: tag (1), tensor (8, the rest).
    ok &= _byte(data, p, end, 0x0A)
    p, length, good = _length(data, p + 1, end)
    ok &= good & (p + length == end)
    ok &= _byte(data, p, end, 0x0A)
    tag_at, tag_len, good = _length(data, p + 1, end)
    ok &= good
    p = tag_at + tag_len
    ok &= _byte(data, p, end, 0x42)
    p, length, good = _length(data, p + 1, end)
    ok &= good & (p + length == end)
    # TensorProto: dtype (1, one byte of varint), tensor_shape (2), tensor_content (4, the rest, not empty).
    ok &= _byte(data, p, end, 0x08)
    dtype = data[np.clip(p + 1, 0, data.size - 1)]
    ok &= (p + 1 < end) & (dtype < 0x80)
    ok &= _byte(data, p + 2, end, 0x12)
    shape_at, shape_len, good = _length(data, p + 3, end)
    ok &= good
    p = shape_at + shape_len
    ok &= _byte(data, p, end, 0x22)
    content_at, content_len, good = _length(data, p + 1, end)
    ok &= good & (content_at + content_len == end) & (content_len > 0)
    wall = data[np.where(ok, s, 0)[:, None] + 1 + np.arange(8)].copy().view("<f8").reshape(-1)

    tags: List[Optional[str]] = [None] * s.size
    shapes: List[Optional[List[int]]] = [None] * s.size
    idx = np.flatnonzero(ok)
    tag_end, shape_end = tag_at + tag_len, shape_at + shape_len
    columns = zip(
        idx.tolist(), tag_at[idx].tolist(), tag_end[idx].tolist(), shape_at[idx].tolist(), shape_end[idx].tolist()
    )
    known_tags, known_shapes = _TAGS, _SHAPES
    for j, ta, te, sa, se in columns:
        key = buf[ta:te]
        tag = known_tags.get(key) or _tag(key)
        key = buf[sa:se]
        shape = known_shapes.get(key) or _shape(key)
        if tag is not None and shape is not None:
            tags[j], shapes[j] = tag, shape
    return Records(tags, step.view(np.int64), wall, dtype.tolist(), shapes, content_at, content_len)
