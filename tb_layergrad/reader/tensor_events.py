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

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import tensor_shape_pb2

# One record: (step, wall_time, tag, dtype enum, shape, start of its tensor_content in the buffer, its length).
Fields = Tuple[int, float, str, int, List[int], int, int]

_SHIFTS = np.arange(10, dtype=np.uint64) * np.uint64(7)
_FAR = 1 << 40  # a length past any buffer: where a varint read from bytes that are no field leads


def _varint(data: np.ndarray, pos: np.ndarray, end: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value as uint64, bytes it takes, whether it is a whole varint before `end`) of the varint at each `pos`."""
    at = pos[:, None] + np.arange(10)
    b = data[np.clip(at, 0, data.size - 1)].astype(np.uint64)
    last = (b & np.uint64(0x80)) == 0
    n = np.argmax(last, axis=1) + 1
    ok = last.any(axis=1) & (pos + n <= end)
    parts = np.where(np.arange(10) < n[:, None], (b & np.uint64(0x7F)) << _SHIFTS, np.uint64(0))
    return np.bitwise_or.reduce(parts, axis=1), n, ok


def _length(data: np.ndarray, pos: np.ndarray, end: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start of the field's bytes, their length, whether both are inside `end`) of the length-delimited field
    whose length is the varint at `pos`."""
    value, n, ok = _varint(data, pos, end)
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


def decode(buf: bytes, starts: Sequence[int], lengths: Sequence[int]) -> List[Optional[Fields]]:
    """The fields of each record `buf[s : s + n]` (`starts`, `lengths`) that is an Event of one tensor summary in
    the layout above; None for every other record (to be parsed with protobuf)."""
    if not len(starts):
        return []
    data = np.frombuffer(buf, np.uint8)
    s = np.asarray(starts, np.int64)
    end = s + np.asarray(lengths, np.int64)
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

    out: List[Optional[Fields]] = [None] * len(starts)
    idx = np.flatnonzero(ok)
    columns = zip(
        idx.tolist(),
        step.view(np.int64)[idx].tolist(),
        wall[idx].tolist(),
        tag_at[idx].tolist(),
        tag_len[idx].tolist(),
        dtype[idx].tolist(),
        shape_at[idx].tolist(),
        shape_len[idx].tolist(),
        content_at[idx].tolist(),
        content_len[idx].tolist(),
    )
    for j, st, w, ta, tl, dt, sa, sl, ca, cl in columns:
        tag = _tag(buf[ta : ta + tl])
        shape = _shape(buf[sa : sa + sl])
        if tag is not None and shape is not None:
            out[j] = (st, w, tag, dt, shape, ca, cl)
    return out
