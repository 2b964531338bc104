"""`metadata.tf_record`: the TFRecord checksums the reader checks and the TensorFlow-free writer writes, against
TensorBoard's own (pure-Python) masked CRC32C, with google-crc32c's C extension and without it (numpy); a framed
record read back by TensorBoard's own record reader."""

from __future__ import annotations

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from tb_layergrad.metadata import tf_record

# Around the 8-byte length a header checksums, the 4 bytes a register holds, and numpy's 1024-byte blocks.
LENGTHS = (0, 1, 3, 4, 5, 7, 8, 9, 1023, 1024, 1025, 2500)


@pytest.fixture(params=["google-crc32c", "numpy"])
def checksums(request, monkeypatch):
    """Each way the checksums are computed: google-crc32c's C code where it is there, numpy's without it."""
    if request.param == "numpy":
        monkeypatch.setattr(tf_record, "_C_VALUE", None)
    elif tf_record._C_VALUE is None:
        pytest.skip("google-crc32c has no C extension here")
    return request.param


def test_checksums_are_tensorboards(checksums):
    rng = np.random.default_rng(0)
    for length in LENGTHS:
        data = rng.integers(0, 256, size=3 * length + 7, dtype=np.uint8)
        starts = np.minimum([1, length + 3, 2 * length + 7 - 1 - 3 if length else 5], data.size - length)
        theirs = [masked_crc32c(data[s : s + length].tobytes()) for s in starts]
        assert [int(c) for c in tf_record.masked_crc32c_many(data, np.asarray(starts), length)] == theirs
        buf, lengths = data.tobytes(), [length] * len(starts)
        assert [int(c) for c in tf_record.masked_crc32c_each(buf, list(starts), lengths)] == theirs


def test_a_framed_record_is_read_back_by_tensorboard(checksums, tmp_path):
    rng = np.random.default_rng(1)
    payloads = [event_pb2.Event(step=n, file_version="x" * n).SerializeToString() for n in (0, 1, 9, 1500)] + [
        rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in LENGTHS
    ]
    path = tmp_path / "events.out.tfevents.0.host"
    path.write_bytes(b"".join(tf_record.frame(p) for p in payloads))
    for p in payloads:
        framed = tf_record.frame(p)
        length = framed[:8]
        assert framed[8:12] == masked_crc32c(length).to_bytes(4, "little")
        assert framed[tf_record.HEADER : -tf_record.FOOTER] == p
        assert framed[-tf_record.FOOTER :] == masked_crc32c(p).to_bytes(4, "little")
    assert list(event_file_loader.RawEventFileLoader(str(path)).Load()) == payloads
