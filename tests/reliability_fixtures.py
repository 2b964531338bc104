"""Helpers of the reliability tests (test_reliability_*.py): fast event writing, hostile names, counts.

Event files are written here record by record (no TensorFlow: fast; and byte-exact, so tests can
truncate, corrupt or extend them), with the metadata and tensor layouts of `tb_layergrad.metadata`,
metadata on the first record of each tag of each file (as TensorFlow's writer does). Values are chosen so that a test knows the exact number
every route must answer: `norm(layer_i, step)`.

`record(section, what, count)` appends a JSON line to `$RELIABILITY_REPORT` (if set): the numbers
of docs/RELIABILITY.md come from there.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import time
from typing import Dict, Iterable, List, Sequence

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from tb_layergrad import metadata
from tb_layergrad.reader import damage

HOSTILE_RUNS = ["<img src=x onerror=alert(1)>", "ünï cødé 🚀", 'comma,quote"run', "..%2f..%2fetc", "space run"]
HOSTILE_LAYERS = [
    "</script><script>alert(1)</script>",
    "a/../../b",
    'quote"comma,new\nline',
    "日本語/层",
    "\u202eevil",
    "__proto__",
    "x" * 1000,
]
HOSTILE_TARGET = "<b>t</b>"
STATS_WIDTH = len(metadata.STAT_FIELDS)


def norm(layer_i: int, step: int, shift: float = 0.0) -> float:
    """The `norm` written for layer number `layer_i` at `step` (exact in float64)."""
    return float(step % 100000) + layer_i / 8.0 + shift


def stats_vector(layer_i: int, step: int, shift: float = 0.0) -> np.ndarray:
    s = np.zeros(STATS_WIDTH, np.float64)
    s[metadata.STAT_INDEX["elements"]] = 10
    s[metadata.STAT_INDEX["min"]] = -1.0
    s[metadata.STAT_INDEX["max"]] = 1.0
    s[metadata.STAT_INDEX["std"]] = 0.5
    s[metadata.STAT_INDEX["norm"]] = norm(layer_i, step, shift)
    s[metadata.STAT_INDEX["mean_abs"]] = 0.25
    return s


def histogram(step: int) -> np.ndarray:
    """Two buckets; the count of the second is the step (mod 1000), so a test can tell steps apart."""
    return np.asarray([[-1.0, 0.0, 4.0], [0.0, 1.0, float(step % 1000)]], np.float64)


def _array(kind: str, layer_i: int, step: int, shift: float = 0.0) -> np.ndarray:
    if kind == metadata.KIND_STATS:
        return stats_vector(layer_i, step, shift)
    if kind == metadata.KIND_HISTOGRAM:
        return histogram(step)
    if kind == metadata.KIND_TENSOR:
        return np.asarray([[norm(layer_i, step), np.nan, np.inf], [-np.inf, 0.0, 1.0]], np.float32)
    if kind == metadata.KIND_TIMESTEPS:
        return np.asarray([norm(layer_i, step), np.nan, 1.0], np.float64)
    return np.asarray([min(step, 3)], np.int64)  # any other kind (first_nonfinite): a step number


_DTYPES = {
    np.dtype(np.float64): types_pb2.DT_DOUBLE,
    np.dtype(np.float32): types_pb2.DT_FLOAT,
    np.dtype(np.int64): types_pb2.DT_INT64,
}


def _tensor_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
    """What `make_tensor_proto` gives, ~10x faster (10,000-tag runs are written in tests)."""
    dims = [tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in array.shape]
    return tensor_pb2.TensorProto(
        dtype=_DTYPES[array.dtype],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=dims),
        tensor_content=array.tobytes(),
    )


def frame(payload: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, payload, masked CRC of the payload."""
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", masked_crc32c(header)) + payload + struct.pack("<I", masked_crc32c(payload))


_FILE_COUNTER = itertools.count()


class EventFile:
    """One event file, written record by record (so a test can damage or extend it byte-exactly).

    The name sorts by creation order within a run (`events.out.tfevents.<n>.reliability<suffix>`),
    as TensorFlow's timestamped names do. Metadata goes with the first record of each tag.
    """

    def __init__(self, run_dir: str, suffix: str = "") -> None:
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, f"events.out.tfevents.{1700000000 + next(_FILE_COUNTER)}.reliability{suffix}")
        self._metadata: Dict[tuple, summary_pb2.SummaryMetadata] = {}
        self.offsets: List[int] = []  # where each record starts
        self.append_raw(frame(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()))

    def event(
        self,
        step: int,
        layers: Sequence[str],
        *,
        target: str = metadata.DEFAULT_TARGET,
        kinds: Iterable[str] = (metadata.KIND_HISTOGRAM, metadata.KIND_STATS),
        first_index: int = 0,
        shift: float = 0.0,
    ) -> bytes:
        """The serialized Event holding every layer's records at `step`."""
        values = []
        for i, layer in enumerate(layers):
            for kind in kinds:
                key = (layer, kind, target, first_index + i)
                value = summary_pb2.Summary.Value(
                    tag=metadata.make_tag(target, metadata.SOURCE_OUTPUT, layer, kind),
                    tensor=_tensor_proto(_array(kind, first_index + i, step, shift)),
                )
                if key not in self._metadata:
                    info = metadata.SeriesInfo(
                        layer=layer, kind=kind, target=target, index=first_index + i, dtype="float32"
                    )
                    self._metadata[key] = metadata.create_summary_metadata(info)
                    value.metadata.CopyFrom(self._metadata[key])
                values.append(value)
        return event_pb2.Event(
            step=step, wall_time=time.time(), summary=summary_pb2.Summary(value=values)
        ).SerializeToString()

    def write(self, step: int, layers: Sequence[str], **kwargs) -> None:
        self.append_raw(frame(self.event(step, layers, **kwargs)))

    def append_raw(self, data: bytes) -> None:
        """Append bytes as they are (a record, a piece of one, garbage), flushed at once."""
        with open(self.path, "ab") as f:
            self.offsets.append(f.tell())
            f.write(data)


def write_run(run_dir: str, layers: Sequence[str], steps: Iterable[int], suffix: str = "", **kwargs) -> EventFile:
    """A whole run in one new file."""
    f = EventFile(run_dir, suffix)
    for step in steps:
        f.write(step, layers, **kwargs)
    return f


def write_hostile_logdir(logdir: str) -> Dict[str, List[str]]:
    """Runs named like attacks, layers named like attacks, a hostile target; {run: layers}."""
    written: Dict[str, List[str]] = {}
    for r, run in enumerate(HOSTILE_RUNS):
        layers = HOSTILE_LAYERS if r == 0 else HOSTILE_LAYERS[: 2 + r]
        kinds = metadata.KINDS if r == 0 else (metadata.KIND_HISTOGRAM, metadata.KIND_STATS)
        write_run(os.path.join(logdir, run), layers, range(0, 6), kinds=kinds)
        written[run] = list(layers)
    # Every kind, for the tensor and timesteps routes.
    write_run(os.path.join(logdir, "train"), ["m/dense", "m/rnn"], range(0, 8), kinds=metadata.KINDS)
    written["train"] = ["m/dense", "m/rnn"]
    # An odd run: a hostile target name, the largest step, a negative step.
    write_run(os.path.join(logdir, "odd"), ["odd/layer"], [-3, 0, 2**63 - 1], target=HOSTILE_TARGET)
    written["odd"] = ["odd/layer"]
    return written


def record(section: str, what: str, count: int, **detail) -> None:
    """Append one count (and details, e.g. answers by status class) to $RELIABILITY_REPORT, if set."""
    path = os.environ.get("RELIABILITY_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"section": section, "what": what, "count": int(count), **detail}) + "\n")


def summarize(path: str) -> str:
    """The counts of a $RELIABILITY_REPORT file as a markdown table (for docs/RELIABILITY.md)."""
    lines = ["| section | what | count | details |", "|---|---|---:|---|"]
    with open(path, encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            detail = ", ".join(f"{k} {v}" for k, v in entry.items() if k not in ("section", "what", "count"))
            lines.append(f"| {entry['section']} | {entry['what']} | {entry['count']:,} | {detail} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python tests/reliability_fixtures.py report.jsonl
    import sys

    print(summarize(sys.argv[1]))


# The damaged logdir of the damage tests (tests/reader/test_damage.py, test_record_index.py, the tab's):
# one run per kind of damage, each named by `reader.damage` as TensorBoard's own loader reads it.
DAMAGE_LAYERS = ["net/a", "net/b"]


def age(*paths: str) -> None:
    """Makes `paths` older than the damage check's settling time (a file still being written is not damaged)."""
    old = time.time() - 2 * damage.SETTLED_S
    for p in paths:
        os.utime(p, (old, old))


def cut(f) -> int:
    """Cuts the last record of `f` in the middle of its payload; returns the size left."""
    size = os.path.getsize(f.path)
    left = f.offsets[-1] + 12 + (size - f.offsets[-1] - 12) // 2
    with open(f.path, "r+b") as fh:
        fh.truncate(left)
    return left


def flip(f, record: int) -> None:
    """Flips one byte in the payload of record `record` of `f` (its checksum then fails)."""
    with open(f.path, "r+b") as fh:
        fh.seek(f.offsets[record] + 12 + 40)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def damaged_logdir(root: str) -> dict:
    """One run per damage (and an intact one); returns {run: (kind, offset, step, records)} expected."""
    expect = {}
    write_run(os.path.join(root, "intact"), DAMAGE_LAYERS, range(6))
    f = write_run(os.path.join(root, "truncated"), DAMAGE_LAYERS, range(6))
    cut(f)
    age(f.path)
    expect["truncated"] = (damage.TRUNCATED, f.offsets[-1], 4, 6)  # file version + steps 0..4
    f = write_run(os.path.join(root, "garbage"), DAMAGE_LAYERS, range(6))
    end = os.path.getsize(f.path)
    f.append_raw(np.random.default_rng(3).bytes(300))
    expect["garbage"] = (damage.CORRUPT, end, 5, 7)
    f = write_run(os.path.join(root, "flipped"), DAMAGE_LAYERS, range(6))
    flip(f, 1 + 3)  # step 3's record
    expect["flipped"] = (damage.CORRUPT, f.offsets[4], 2, 4)
    f = EventFile(os.path.join(root, "noise"))
    with open(f.path, "wb") as fh:  # random bytes only: TensorBoard lists no run
        fh.write(np.random.default_rng(4).bytes(500))
    expect["noise"] = (damage.CORRUPT, 0, None, 0)
    os.makedirs(os.path.join(root, "empty"))
    empty = os.path.join(root, "empty", "events.out.tfevents.1.empty")
    open(empty, "wb").close()
    age(empty)
    expect["empty"] = (damage.EMPTY, 0, None, 0)
    os.makedirs(os.path.join(root, "unreadable"))
    os.symlink(os.path.join(root, "nowhere"), os.path.join(root, "unreadable", "events.out.tfevents.1.gone"))
    expect["unreadable"] = (damage.UNREADABLE, 0, None, 0)
    return expect
