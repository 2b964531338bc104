"""Damage in a logdir's event files: what TensorBoard's loaders skip without saying, named.

Why our own check: a record cut in the middle, bytes appended after the last record, a record whose
checksum does not match, an empty or unreadable event file: both TensorBoard loaders stop reading that
file there (the Rust one logs it on its own stderr), and a run whose only file is damaged from its start
is not listed at all. Neither loader tells a plugin. So the reader checks the files itself, as the
loaders read them: TFRecord framing (length, its masked CRC32C, payload, its masked CRC32C), file by
file, and says for each damaged one which run, which file, and up to which step it was read.

The check is incremental: each file keeps how far it was verified, so a run being written costs the
bytes appended since the last scan, never the whole file again. The payloads' checksums are
`metadata.tf_record`'s, one call of C code per record where google-crc32c has it (the checksums were most of
a walk), numpy's for many records at once otherwise; the lengths' checksums, eight bytes each, are numpy's for
every record of a chunk at once (a call per record cost more than the bytes).
Only local paths are checked: a `gs://` logdir is read by TensorBoard through
TensorFlow's file systems, which the reader does not import (`Scanner.checked` is False, and `scan` finds nothing).

A partial last record and an empty file are what a writer leaves between two flushes (TensorFlow's
summary writers flush at least every two minutes), so they are damage only once the file has not changed
for `SETTLED_S`. A checksum that does not match or an unreadable file is damage at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import struct
import threading
import time
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from tb_layergrad.metadata.tf_record import FOOTER, HEADER, masked_crc32c_each, masked_crc32c_many

# How long a partial last record or an empty file must stay unchanged to be named (TensorFlow's summary writers
# flush every two minutes by default, `flush_millis=120000`, and a flush may leave a record half written
# until the next one).
SETTLED_S = 180.0
# How much of a file one read takes: bounds the memory of a scan, whatever the file's size.
CHUNK_BYTES = 16 << 20

TRUNCATED = "truncated"
CORRUPT = "corrupt"
EMPTY = "empty"
UNREADABLE = "unreadable"


def _steps(buf: bytes, starts: List[int], lengths: List[int]) -> np.ndarray:
    """The `step` of each Event record (field 2, a varint; 0 when absent) of the payloads `buf[s : s + n]`, read
    from their first bytes only, all at once (a loop over each record's bytes in Python cost more than their
    checksums in C)."""
    data = np.frombuffer(buf, np.uint8)
    s = np.asarray(starts, np.int64)
    end = s + np.asarray(lengths, np.int64)
    # A payload is followed by its checksum, so `s` and the byte after a 9-byte wall time are inside `buf`.
    pos = np.where((end - s >= 9) & (data[s] == 0x09), s + 9, s)  # wall_time: field 1, a double
    has = pos < end
    has[has] = data[pos[has]] == 0x10
    at = pos[:, None] + 1 + np.arange(10)  # a varint of up to 10 bytes (64 bits), no further than the payload
    b = data[np.minimum(at, data.size - 1)].astype(np.uint64)
    last = (b & np.uint64(0x80)) == 0
    used = (at < end[:, None]) & (np.cumsum(last, axis=1) - last == 0)  # up to its last byte
    parts = np.where(used, (b & np.uint64(0x7F)) << (np.arange(10, dtype=np.uint64) * np.uint64(7)), np.uint64(0))
    value = np.bitwise_or.reduce(parts, axis=1)
    return np.where(has, value, np.uint64(0)).view(np.int64)


@dataclasses.dataclass(frozen=True)
class Damage:
    """One damaged event file: where reading it stopped and what was read before."""

    run: str  # as TensorBoard names it: the folder relative to the logdir, "." for the logdir itself
    file: str  # relative to the logdir
    kind: str  # TRUNCATED, CORRUPT, EMPTY or UNREADABLE
    offset: int  # the byte where reading stopped
    size: int  # the file's size
    records: int  # complete records read before it
    step: Optional[int]  # the last step read before it; None when no record with a step was read
    detail: str = ""

    def line(self) -> str:
        where = {
            TRUNCATED: f"ends inside a record (cut at byte {self.size:,}; the record began at byte {self.offset:,})",
            CORRUPT: f"has a record that fails its checksum at byte {self.offset:,} of {self.size:,} ({self.detail}); "
            "TensorBoard reads no further in this file",
            EMPTY: "is empty",
            UNREADABLE: f"cannot be read ({self.detail})",
        }[self.kind]
        if self.kind in (EMPTY, UNREADABLE) or not self.records:
            read = "nothing was read from it"
        elif self.step is None:
            read = f"{self.records:,} records read before it"
        else:
            read = f"read up to step {self.step:,}"
        return f"run {self.run!r}: event file {self.file!r} {where}: {read}"

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "line": self.line()}


@dataclasses.dataclass
class FileState:
    """How far one file was verified: every record before `offset` is whole and its checksums match."""

    offset: int = 0
    records: int = 0
    step: Optional[int] = None  # the largest step read
    size: int = -1
    mtime: float = 0.0
    stopped: Optional[Tuple[str, int, str]] = None  # (kind, offset, detail): a fault no later bytes can mend
    partial: bool = False  # bytes after `offset` that are not yet a whole record
    unreadable: str = ""


class DamageWarning(UserWarning):
    """`tb_layergrad.load()` read a logdir with a damaged event file (`Damage.line()` says which)."""


_checked: Optional[Dict[Tuple[int, int], int]] = None  # inside `checked_once`: (device, inode) -> bytes verified
_checked_lock = threading.Lock()


@contextlib.contextmanager
def checked_once() -> Iterator[None]:
    """While inside, a file's bytes whose checksums were verified once are not verified again.

    Why: `load()` and `report` may walk an event file more than once in one read (TensorBoard's multiplexer and the
    record index share one walk, `RecordIndex.walk`, but a file that walk did not take is read by each), each
    walk checking every record's two checksums, the most costly part of a walk. In one read the file is the same,
    so the first walk's checks stand for the others;
    each walk still frames the records itself (a damaged file is found where it was). Outside, every walk
    checks (a server reads files that may be rewritten between its walks). Re-entrant."""
    global _checked
    with _checked_lock:
        outer = _checked
        if outer is None:
            _checked = {}
    try:
        yield
    finally:
        if outer is None:
            with _checked_lock:
                _checked = None


def _verified(fh) -> Tuple[Optional[Tuple[int, int]], int]:
    """(the open file's key in `checked_once`'s registry, or None outside it; how many of its first bytes are
    verified)."""
    if _checked is None:
        return None, 0
    st = os.fstat(fh.fileno())
    key = (st.st_dev, st.st_ino)
    with _checked_lock:
        return key, (_checked or {}).get(key, 0)


def _mark_verified(key: Optional[Tuple[int, int]], upto: int) -> None:
    if key is None:
        return
    with _checked_lock:
        if _checked is not None and _checked.get(key, 0) < upto:
            _checked[key] = upto


def is_event_file(name: str) -> bool:
    """TensorBoard's rule (both loaders): a file whose name contains `tfevents`."""
    return "tfevents" in name


def _run_name(logdir: str, folder: str) -> str:
    rel = os.path.relpath(folder, logdir)
    return "." if rel == "." else rel.replace(os.sep, "/")


class Scanner:
    """The damage of one logdir's event files, checked incrementally; thread-safe.

    Args:
      logdir: a local folder (TensorBoard's `--logdir`); a URL is not checked (`checked` is False).
      settled_s: how long a partial last record or an empty file must stay unchanged to be damage.
    """

    def __init__(self, logdir: str, settled_s: float = SETTLED_S, known: Optional[Dict[str, FileState]] = None) -> None:
        """`known`: {normalized path: its state} of files another walk of this read verified already (the record
        index's, `RecordIndex.file_states`): a scan reads only what it did not."""
        self.logdir = logdir
        self.checked = bool(logdir) and "://" not in logdir
        self._settled_s = settled_s
        self._files: Dict[str, FileState] = dict(known or {})
        self._lock = threading.RLock()
        self._bytes_read = 0

    def scan(self, runs: Optional[Iterable[str]] = None) -> Dict[str, List[Damage]]:
        """{run: its damaged files} after reading what was appended to each event file since the last scan
        (of `runs` only, when given); runs without damage are absent."""
        if not self.checked:
            return {}
        wanted = None if runs is None else set(runs)
        with self._lock:
            now = time.time()
            seen = set()
            out: Dict[str, List[Damage]] = {}
            for folder, files in self._event_files(wanted):
                run = _run_name(self.logdir, folder)
                for name in sorted(files):
                    path = os.path.normpath(os.path.join(folder, name))
                    seen.add(path)
                    state = self._files.setdefault(path, FileState())
                    self._bytes_read += _advance(path, state)
                    found = self._damage_of(run, path, state, now)
                    if found is not None:
                        out.setdefault(run, []).append(found)
            if wanted is None:
                for gone in set(self._files) - seen:
                    del self._files[gone]
            return out

    @property
    def bytes_read(self) -> int:
        """Bytes of event files read by every scan so far (each appended byte is read once)."""
        return self._bytes_read

    def said(self, listed: Iterable[str], runs: Optional[Iterable[str]] = None) -> Dict[str, List[Damage]]:
        """`scan(runs)`, kept to the damage a reader of tb_layergrad should be told of: that of the runs
        `listed` (those with tb_layergrad series), and that of runs nothing could be read from (no file
        with a record past the first, the file version every writer starts with), which TensorBoard does
        not list at all. A damaged run of other summaries only (a `validation` folder of scalars) is not ours."""
        found = self.scan(runs)
        listed = set(listed)
        return {run: d for run, d in found.items() if run in listed or self._records(run) <= 1}

    def _records(self, run: str) -> int:
        folder = os.path.normpath(os.path.join(self.logdir, *([] if run == "." else run.split("/"))))
        with self._lock:
            return max((s.records for p, s in self._files.items() if os.path.dirname(p) == folder), default=0)

    def _event_files(self, wanted: Optional[set]) -> Iterable[Tuple[str, List[str]]]:
        if wanted is not None:  # only the folders of these runs, not a walk of the logdir
            for run in sorted(wanted):
                folder = os.path.join(self.logdir, *([] if run == "." else run.split("/")))
                try:
                    names = [n for n in os.listdir(folder) if is_event_file(n)]
                except OSError:
                    continue
                yield folder, [n for n in names if not os.path.isdir(os.path.join(folder, n))]
            return
        for folder, dirs, files in os.walk(self.logdir):
            dirs.sort()
            names = [n for n in files if is_event_file(n)]
            if names:
                yield folder, names

    def _damage_of(self, run: str, path: str, state: FileState, now: float) -> Optional[Damage]:
        rel = os.path.relpath(path, self.logdir).replace(os.sep, "/")
        common = dict(run=run, file=rel, size=max(state.size, 0), records=state.records, step=state.step)
        if state.unreadable:
            return Damage(kind=UNREADABLE, offset=state.offset, detail=state.unreadable, **common)
        if state.stopped is not None:
            kind, offset, detail = state.stopped
            return Damage(kind=kind, offset=offset, detail=detail, **common)
        settled = now - state.mtime >= self._settled_s
        if state.size == 0 and settled:
            return Damage(kind=EMPTY, offset=0, **common)
        if state.partial and settled:
            return Damage(kind=TRUNCATED, offset=state.offset, **common)
        return None


def _advance(path: str, state: FileState) -> int:
    """Verify the records appended to `path` since `state` was taken (a file that shrank: anew); returns the
    bytes read."""
    try:
        st = os.stat(path)
    except OSError as e:
        state.unreadable = e.strerror or type(e).__name__
        return 0
    if st.st_size < state.size or (st.st_size == state.size and st.st_mtime != state.mtime and state.stopped):
        state.__init__()  # rewritten: start over
    changed = st.st_size != state.size or state.unreadable
    state.size, state.mtime = st.st_size, st.st_mtime
    if not changed or state.stopped is not None:
        return 0  # nothing new; or a fault the loaders read no further than, nor do we
    read = 0
    try:
        with open(path, "rb") as fh:
            state.unreadable = ""
            key, known = _verified(fh)
            while state.offset < state.size:
                fh.seek(state.offset)
                buf = fh.read(max(CHUNK_BYTES, _needed(fh, state)))
                read += len(buf)
                used = _verify(buf, state, known=known - state.offset) if buf else 0
                _mark_verified(key, state.offset)
                if used == 0 or state.stopped is not None or fh.tell() >= state.size:
                    break  # a fault, or the end: what is left is a partial record, read again when it grows
    except OSError as e:
        state.unreadable = e.strerror or type(e).__name__
    return read


def _needed(fh, state: FileState) -> int:
    """The bytes the record at `state.offset` takes, when its header says more than a chunk."""
    head = fh.read(HEADER)
    fh.seek(state.offset)
    if len(head) < 8:
        return 0
    (length,) = struct.unpack_from("<Q", head)
    return min(HEADER + length + FOOTER, max(state.size - state.offset, 0))


def read_records(path: str) -> Iterator[bytes]:
    """The payload of every whole record of the event file `path` whose checksums match, in order, up to the
    first damage or partial record: the records TensorBoard's loaders read, checked as `Scanner` checks them
    (many at once), for readers that would otherwise check each byte in Python (`event_files`)."""
    state = FileState()
    for _, payload in read_new_records(path, state):
        yield bytes(payload)


def read_new_records(path: str, state: FileState) -> Iterator[Tuple[int, memoryview]]:
    """(offset in the file, payload) of each whole record of `path` after `state.offset` whose checksums match,
    in order, up to the first damage or partial record; `state` advances past each chunk read, so the next
    call reads what was appended since (an index kept as a file grows, `record_index`)."""
    for start, buf, good in read_new_chunks(path, state):
        view = memoryview(buf)
        for at, length in zip(good[0].tolist(), good[1].tolist()):
            yield start + at, view[at : at + length]


def read_new_chunks(path: str, state: FileState) -> Iterator[Tuple[int, bytes, Tuple[np.ndarray, np.ndarray]]]:
    """`read_new_records` a chunk at a time: (offset in the file of `buf`, `buf`, (starts, lengths): int64 arrays
    of where in `buf` the payload of each record of it that `read_new_records` yields starts, and its length),
    for a reader of many records at once."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        state.size, state.mtime = st.st_size, st.st_mtime  # as `Scanner` takes them: it may go on from `state`
        key, known = _verified(fh)
        while state.offset < state.size and state.stopped is None:
            fh.seek(state.offset)
            start = state.offset
            buf = fh.read(max(CHUNK_BYTES, _needed(fh, state)))
            good: List[np.ndarray] = []
            if not buf or _verify(buf, state, good, known - start) == 0:
                break
            _mark_verified(key, state.offset)
            yield start, buf, (good[0], good[1])


_LENGTH = struct.Struct("<Q")


def _frame(buf: bytes) -> Tuple[List[int], int, bool]:
    """(where each whole record of `buf` starts, from its start; where the header of a record that is not whole
    starts, -1 if none; whether bytes that are no whole record end `buf`). TFRecord framing is read record by
    record (each length says where the next record is), the one loop in Python per record of a walk."""
    heads: List[int] = []
    add = heads.append
    unpack = _LENGTH.unpack_from
    pos, end = 0, len(buf)
    while end - pos >= HEADER:
        (length,) = unpack(buf, pos)
        after = pos + HEADER + length + FOOTER
        if after > end:
            return heads, pos, True
        add(pos)
        pos = after
    return heads, -1, pos < end


def _verify(buf: bytes, state: FileState, good: Optional[List[np.ndarray]] = None, known: int = 0) -> int:
    """Verify the whole records at the start of `buf` (read at `state.offset`); returns the bytes accepted.
    `good`: the int64 arrays of the start and the length in `buf` of each accepted record's payload are appended
    to it. `known`: the first bytes of `buf` verified before in this read (`checked_once`): the records within
    them are framed, not checked again."""
    heads, last_header, state.partial = _frame(buf)
    data = np.frombuffer(buf, np.uint8)
    at = np.asarray(heads, np.int64)
    lengths = data[at[:, None] + np.arange(8)].copy().view("<u8").reshape(-1).astype(np.int64)
    # The lengths' checksums, all at once (numpy: eight bytes each, one call for all): the first that does not
    # match is where the file's records end (the lengths after it, read from bytes that are no header, were
    # followed no further than the buffer).
    checked = np.append(at, last_header) if last_header >= 0 else at
    new = np.flatnonzero(checked + HEADER > known)  # the lengths not verified before
    if new.size:
        want = data[(checked[new] + 8)[:, None] + np.arange(4)].copy().view("<u4").reshape(-1)
        bad = new[np.flatnonzero(masked_crc32c_many(data, checked[new], 8) != want)]
        if bad.size:
            first = int(bad[0])
            state.stopped = (CORRUPT, state.offset + int(checked[first]), "its length's checksum does not match")
            state.partial = False
            at, lengths = at[:first], lengths[:first]
    starts = at + HEADER
    ok = _payloads_good(buf, starts, lengths, known)
    if ok < starts.size:
        state.stopped = (CORRUPT, state.offset + int(at[ok]), "its payload's checksum does not match")
        state.partial = False
    if not ok:
        return 0
    starts, lengths = starts[:ok], lengths[:ok]
    if good is not None:
        good.extend((starts, lengths))
    top = int(_steps(buf, starts, lengths).max())
    state.step = top if state.step is None else max(state.step, top)
    state.records += ok
    accepted = int(starts[-1] + lengths[-1]) + FOOTER
    state.offset += accepted
    return accepted


def _payloads_good(buf: bytes, starts: np.ndarray, lengths: np.ndarray, known: int = 0) -> int:
    """How many of the records, in order, have a payload whose checksum matches (stops at the first that does not);
    those ending within the first `known` bytes (verified before, `checked_once`) are not checked again."""
    if not starts.size:
        return 0
    data = np.frombuffer(buf, np.uint8)
    fresh = np.flatnonzero(starts + lengths + FOOTER > known)
    s, n = starts[fresh], lengths[fresh]
    want = data[(s + n)[:, None] + np.arange(4)[None, :]].copy().view("<u4").reshape(-1)
    bad = fresh[masked_crc32c_each(buf, s, n) != want]
    return int(bad[0]) if bad.size else int(starts.size)


class Watch:
    """A `Scanner` kept current in the background for a server: `said` answers at once with the last scan's
    damage and starts the next scan, on a thread of its own, when the last one is `interval_s` old. So no
    request waits for a file to be read, and the bytes a run appends are read once, however many ask."""

    def __init__(self, logdir: str, interval_s: float = 2.0) -> None:
        self.scanner = Scanner(logdir)
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._found: Dict[str, List[Damage]] = {}
        self._started = -float("inf")
        self._thread: Optional[threading.Thread] = None
        self._listed: set = set()

    def said(self, listed: Iterable[str]) -> Dict[str, List[Damage]]:
        """The damage `Scanner.said` found at the last scan (none before the first ends)."""
        if not self.scanner.checked:
            return {}
        with self._lock:
            self._listed |= set(listed)
            idle = self._thread is None or not self._thread.is_alive()
            if idle and time.monotonic() - self._started >= self._interval_s:
                self._started = time.monotonic()
                self._thread = threading.Thread(target=self._scan, name="layergrad-damage", daemon=True)
                self._thread.start()
            return self._found

    def _scan(self) -> None:
        with self._lock:
            listed = set(self._listed)
        try:
            found = self.scanner.said(listed)
        except Exception:  # noqa: BLE001 - a failing check must not stop serving; the next poll tries again
            logging.getLogger(__name__).exception("layergrad: checking the event files failed")
            return
        with self._lock:
            self._found = found
