"""`reader.tensor_events`: a record read for many at once is read as protobuf parses it, and any other is left to
protobuf. Against protobuf's own parse of the same bytes: records of the layout every step is written in (TensorFlow's
writer, in `tests/reader/test_record_index.py` and the damage tests, reads through it too), the same with each of
their bytes changed, cut or added to, and records of other forms."""

from __future__ import annotations

import math

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

from tb_layergrad.reader import tensor_events


def _event(step: int, tag: str, values: np.ndarray, dtype: int = 2, wall: float = 1.7e9, **more) -> bytes:
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in values.shape])
    tensor = tensor_pb2.TensorProto(dtype=dtype, tensor_shape=shape, tensor_content=values.tobytes())
    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, **more)
    return event_pb2.Event(step=step, wall_time=wall, summary=summary_pb2.Summary(value=[value])).SerializeToString()


def _protobuf(payload: bytes):
    """The fields `decode` gives, as protobuf parses them; None where it does not parse."""
    try:
        e = event_pb2.Event.FromString(payload)
    except DecodeError:
        return None
    v = e.summary.value[0]
    t = v.tensor
    return (e.step, e.wall_time, v.tag, t.dtype, [d.size for d in t.tensor_shape.dim], t.tensor_content)


def _decoded(payloads):
    """`decode` of `payloads` framed in one buffer as an event file frames them (12 bytes before, 4 after)."""
    starts = np.cumsum([0] + [12 + len(p) + 4 for p in payloads])[:-1] + 12
    buf = b"".join(b"\0" * 12 + p + b"\1\2\3\4" for p in payloads)
    r = tensor_events.decode(buf, starts.tolist(), [len(p) for p in payloads])
    out = []
    for j, tag in enumerate(r.tags):
        at, n = int(r.content_at[j]), int(r.content_len[j])
        out.append(
            None
            if tag is None
            else (int(r.steps[j]), float(r.walls[j]), tag, r.dtypes[j], r.shapes[j], buf[at : at + n])
        )
    return out


def _same(a, b) -> bool:
    return a[:1] + a[2:] == b[:1] + b[2:] and (a[1] == b[1] or (math.isnan(a[1]) and math.isnan(b[1])))


def test_every_steps_records_are_read_as_protobuf_reads_them():
    rng = np.random.default_rng(0)
    written = [
        _event(0, "loss/output/layers-1/stats/0", rng.normal(size=(8, 12))),
        _event(300, "loss/output/layers-1/histogram/0", rng.integers(0, 9, size=(8, 30)).astype(np.int32), dtype=3),
        _event(2**40, "é/stats", rng.normal(size=(1, 12)), wall=float("nan")),
        _event(-5, "t", rng.normal(size=(3,)).astype(np.float32), dtype=1),  # a 10-byte varint step
    ]
    got = _decoded(written)
    assert all(g is not None and _same(g, _protobuf(p)) for g, p in zip(got, written)), got


def test_any_other_record_is_left_to_protobuf_or_read_as_it_reads_it():
    rng = np.random.default_rng(1)
    record = _event(12345, "loss/weight/layers-2/stats/1", rng.normal(size=(16, 12)))
    others = [
        _event(1, "a", np.ones((2, 2)), metadata=summary_pb2.SummaryMetadata(display_name="a")),  # a tag's first
        event_pb2.Event(step=3, wall_time=1.0, file_version="brain.Event:2").SerializeToString(),
        event_pb2.Event(
            step=3, summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="lr", simple_value=1)])
        ).SerializeToString(),
        record + record[-20:],  # a field more (repeated: protobuf keeps the last)
        record[:-1],
        b"",
        _event(1, "x", np.zeros((0, 4))),  # no tensor_content
        bytes([0x09])
        + bytes(8)
        + bytes([0x10, 1, 0x2A, 0x0C, 0x0A, 0x0A, 0x0A, 0x02, 0xFF, 0xFE, 0x42, 0x04])
        + bytes([0x08, 0x02, 0x12, 0x00]),  # a tag that is no UTF-8
    ]
    for p in others:
        (g,) = _decoded([p])
        assert g is None or _same(g, _protobuf(p)), p
    assert _decoded(others[:1]) == [None]  # metadata: protobuf reads it
    # Each byte of a record changed, the record cut or added to at each place: read as protobuf reads it, or left.
    mutants = []
    for i in range(len(record)):
        for b in (record[i] ^ 0x80, record[i] ^ 0x01, rng.integers(0, 256)):
            mutants.append(record[:i] + bytes([int(b)]) + record[i + 1 :])
        mutants += [record[:i], record[:i] + bytes([rng.integers(0, 256)]) + record[i:]]
    read = 0
    for p, g in zip(mutants, _decoded(mutants)):
        if g is not None:
            assert _same(g, _protobuf(p)), p
            read += 1
    assert 0 < read < len(mutants)  # some changes keep the layout (a value's byte), most do not
