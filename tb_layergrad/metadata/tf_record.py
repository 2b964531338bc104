"""TFRecord framing, the container of event files: each record is its length (uint64, little-endian), that
length's masked CRC-32C, the payload (a serialized `Event`), the payload's masked CRC-32C (docs/FORMAT.md).

Why one module for both sides: the package writes such files where TensorFlow does not (`writer/event_writer`)
and checks the files it reads (`reader/damage`), with the same checksums. They are google-crc32c's, in C, one
call per record (a dependency: with TensorBoard's pure-Python CRC the checksums were most of a walk of a large
run, and of a written step's work on the host), and numpy's for many records at once where its C extension is
missing (CRC is linear: a byte's contribution depends only on its value and on how many bytes follow it,
`_CONTRIBUTIONS`), never TensorBoard's own.
"""

from __future__ import annotations

import struct
import warnings
from typing import Callable, Optional, Sequence

import numpy as np

HEADER = 12  # uint64 length + uint32 masked CRC of it
FOOTER = 4  # uint32 masked CRC of the payload
_MASK_DELTA = 0xA282EAD8


def _crc_table() -> np.ndarray:
    poly = 0x82F63B78  # CRC-32C (Castagnoli), reflected
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(poly), table >> 1).astype(np.uint32)
    return table


_TABLE = _crc_table()
# Bytes of a record whose checksums are computed in one pass; longer records take several.
_CRC_BLOCK = 1024
# The rows of `_CONTRIBUTIONS`: row k is the register (initial 0) after one byte of each value followed by k
# zero bytes. A CRC without its initial and final XOR is linear over GF(2), so the register after a block is the
# XOR of its bytes' rows, each picked by the byte's value and by how many bytes follow it in the block.
_CONTRIBUTIONS = [_TABLE.copy()]
for _ in range(1, _CRC_BLOCK):
    _CONTRIBUTIONS.append(_TABLE[_CONTRIBUTIONS[-1] & 0xFF] ^ (_CONTRIBUTIONS[-1] >> np.uint32(8)))
_CONTRIBUTIONS = np.stack(_CONTRIBUTIONS)
del _


def masked_crc32c_many(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """The masked CRC-32C of `data[s : s + length]` for each `s` of `starts` (uint8 `data`), all at once.

    Block by block: a register `r` followed by a block of `m` bytes is the register 0 followed by the block
    with `r`'s bytes XOR-ed into its first four (what the initial 0xFFFFFFFF is too), plus what of `r` has not
    shifted out when `m < 4`."""
    n = starts.shape[0]
    reg = np.full([n], 0xFFFFFFFF, np.uint32)
    rows_at_once = max(1, (4 << 20) // _CRC_BLOCK)
    for a in range(0, length, _CRC_BLOCK):
        m = min(_CRC_BLOCK, length - a)
        table = _CONTRIBUTIONS[m - 1 :: -1].reshape(-1) if m > 1 else _CONTRIBUTIONS[:1].reshape(-1)
        cols = np.arange(m, dtype=np.int64)
        offsets = (cols * 256).astype(np.int32)
        out = np.zeros([n], np.uint32)
        for lo in range(0, n, rows_at_once):
            block = data[starts[lo : lo + rows_at_once, None] + a + cols[None, :]].astype(np.int32)
            r = reg[lo : lo + rows_at_once]
            for j in range(min(4, m)):
                block[:, j] ^= ((r >> np.uint32(8 * j)) & np.uint32(0xFF)).astype(np.int32)
            block += offsets
            out[lo : lo + rows_at_once] = np.bitwise_xor.reduce(np.take(table, block), axis=1)
        reg = out ^ (reg >> np.uint32(8 * m)) if m < 4 else out
    return _masked(reg ^ np.uint32(0xFFFFFFFF))


def _masked(crc: np.ndarray) -> np.ndarray:
    """TFRecord's mask of CRC-32C values (uint32): rotated right by 15 bits, plus a constant."""
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


def _c_crc32c() -> Optional[Callable[[bytes], int]]:
    """google-crc32c's CRC-32C of a `bytes`, in C; None where it is not installed or has no C extension (its
    pure-Python fallback checks byte by byte in Python, slower than `masked_crc32c_many`)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # its notice that it fell back to pure Python
            import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value if google_crc32c.implementation == "c" else None


_C_VALUE = _c_crc32c()


def masked_crc32c_each(buf: bytes, starts: Sequence[int], lengths: Sequence[int]) -> np.ndarray:
    """The masked CRC-32C of `buf[s : s + n]` for each `s` of `starts` and `n` of `lengths` (uint32): one call of
    C code per record (`_C_VALUE`), else `masked_crc32c_many` for the records of each length at once."""
    if _C_VALUE is not None:
        starts = np.asarray(starts, np.int64)
        ends = (starts + np.asarray(lengths, np.int64)).tolist()
        # The records' bytes sliced and checked from C iterators: no Python frame per record.
        crc = np.fromiter(map(_C_VALUE, map(buf.__getitem__, map(slice, starts.tolist(), ends))), np.uint32, len(ends))
        return _masked(crc)
    data = np.frombuffer(buf, np.uint8)
    starts_a = np.asarray(starts, np.int64)
    lengths_a = np.asarray(lengths, np.int64)
    out = np.zeros([starts_a.size], np.uint32)
    for length in np.unique(lengths_a):
        idx = np.flatnonzero(lengths_a == length)
        out[idx] = masked_crc32c_many(data, starts_a[idx], int(length))
    return out


def frame(payload: bytes) -> bytes:
    """`payload` as one record: its length, the length's checksum, the payload, the payload's checksum."""
    length = struct.pack("<Q", len(payload))
    buf = length + payload
    length_crc, payload_crc = (int(c) for c in masked_crc32c_each(buf, [0, 8], [8, len(payload)]))
    return b"".join((length, struct.pack("<I", length_crc), payload, struct.pack("<I", payload_crc)))
