"""An index of the layergrad records of a local logdir's event files, read by offset when asked.

Why: TensorBoard keeps every record it loads as an object of its own (~2.2 bytes per byte of event file
in the Rust data server, ~3.7 in the Python multiplexer), which alone is past what a long run logged
every step may cost. A record's place in its file costs ~30 bytes. So for a local logdir the plugin
reads its own series: each event file is walked once, as the damage check walks it (framing and
checksums, `damage.read_new_records`, from where the last walk stopped), and for each layergrad record the index
keeps its step, wall time and where its payload lies; `read_tensors` reads the payloads it is asked for
from the file. The answers are those of TensorBoard's `MultiplexerDataProvider` over the same bytes: the
same series (a tag's first metadata names its plugin and data class), the same records in file order,
the same downsampling, a file read no further than its first damaged record.

Only local paths: a `gs://` logdir is read by TensorBoard through TensorFlow's file systems, which the
reader does not import.
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import itertools
import os
import random
import threading
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub import dtypes
from tensorboard.data import provider as tb_provider
from tensorboard.util import tensor_util

from tb_layergrad import metadata
from tb_layergrad.reader import damage, series, tensor_events


@dataclasses.dataclass
class _Series:
    """Where one tag's records lie, in the order they were read."""

    meta: summary_pb2.SummaryMetadata
    steps: array.array = dataclasses.field(default_factory=lambda: array.array("q"))
    walls: array.array = dataclasses.field(default_factory=lambda: array.array("d"))
    files: array.array = dataclasses.field(default_factory=lambda: array.array("i"))
    offsets: array.array = dataclasses.field(default_factory=lambda: array.array("q"))
    lengths: array.array = dataclasses.field(default_factory=lambda: array.array("q"))
    values: array.array = dataclasses.field(default_factory=lambda: array.array("i"))  # index in the summary
    max_step: Optional[int] = None
    max_wall: Optional[float] = None
    # Each record's tensor as the walk parsed it (`_packed`), until the series is first read (`keep_walked`).
    arrays: Optional[list] = None


@dataclasses.dataclass
class _Run:
    """One run's files (in the order TensorBoard reads them) and the series found in them."""

    epoch: int = 0  # which reading of the run this is: a run read anew starts a new one (`Position`)
    files: List[str] = dataclasses.field(default_factory=list)
    states: Dict[str, damage.FileState] = dataclasses.field(default_factory=dict)
    meta: Dict[str, summary_pb2.SummaryMetadata] = dataclasses.field(default_factory=dict)  # every tag's first
    series: Dict[str, _Series] = dataclasses.field(default_factory=dict)  # the layergrad tensor tags


NOT_AN_EVENT = "a record that is not an Event"

# Where a reader of a series stopped: (the run's reading, records read). The records past it are the same as
# the end of a whole read of the series as long as the run was not read anew (a file removed or shrunk).
Position = Tuple[int, int]


def downsample(n: int, k: int) -> List[int]:
    """The indices TensorBoard's `MultiplexerDataProvider` keeps of `n` records asked for `k`: all when `k`
    exceeds `n`, else the last and `k - 1` others drawn by `random.Random(0)` (so the same ones)."""
    if k > n:
        return list(range(n))
    if k == 0:
        return []
    indices = random.Random(0).sample(range(n - 1), k - 1)
    indices.sort()
    return indices + [n - 1]


class RecordIndex:
    """The layergrad series of a local logdir, kept current from the event files; thread-safe.

    Args:
      logdir: a local folder (TensorBoard's `--logdir`).
    """

    def __init__(self, logdir: str, keep_walked: bool = False, unkept_kinds: Iterable[str] = ()) -> None:
        """`keep_walked`: the records `walk` reads are decoded as it parses them and kept until their series is
        first read (a reader of every record once, `load()` and `report`: each event parsed once, not again by
        offset), but those of series of `unkept_kinds` (a reader that never reads them: kept, they would be
        copied and held for nothing; read by offset if asked); the plugin's index keeps only where each
        record lies."""
        self.logdir = logdir
        self._keep_walked = keep_walked
        self._unkept = frozenset(unkept_kinds)
        self._runs: Dict[str, _Run] = {}
        self._lock = threading.RLock()
        self._epochs = 0
        self._tickets = itertools.count(1)  # taken as a refresh begins to list the runs' folders (`_list`)
        self._refreshed: Dict[str, int] = {}  # run -> the latest ticket of a listing a refresh of it read

    def _new_run(self) -> _Run:
        self._epochs += 1
        return _Run(epoch=self._epochs)

    def _folder(self, run: str) -> str:
        return os.path.join(self.logdir, *([] if run == "." else run.split("/")))

    def refresh(self, runs: Iterable[str]) -> None:
        """Reads what was appended to the event files of `runs` since the last refresh. A run one of whose files
        was removed or shrank is read anew: what it had cannot be read from its files any more, so it keeps
        none of it rather than a part.

        A run whose files another thread began to list after this call began, and then read, is not read again:
        that refresh, done once this one holds the lock, read every byte written before this call began. Why: every
        request refreshes its run, and 16 readers of a run being written queued on the lock, each then walking
        the few records appended while it waited: the new records are walked once per change, not once per
        request."""
        runs = list(runs)
        asked, seen = self._list(runs)
        with self._lock:
            self._refresh(runs, asked, seen)

    def _list(self, runs: Sequence[str]) -> Tuple[int, Dict[str, Optional[Dict[str, int]]]]:
        """(a ticket taken before the runs' folders are listed, each run's `_listing`), outside the index's lock: no
        file system call waits under it, where every other request would wait behind it."""
        asked = next(self._tickets)
        return asked, {run: _listing(self._folder(run)) for run in runs}

    def _refresh(self, runs: Sequence[str], asked: int, seen: Dict[str, Optional[Dict[str, int]]]) -> None:
        """`refresh` under the index's lock, with `_list`'s ticket and listings. A file is read when it is new or its
        size (as listed) goes past where the last read stopped, and then to its end as it is now: what was read
        covers every byte written before the listing began (`asked`), so a call that asked before that has
        nothing left to read (the ticket the run keeps). Where the listing disagrees with what is known (another
        refresh read past it meanwhile, or a file was removed or shrank) the run's files are listed again, now."""
        for run in runs:
            if self._refreshed.get(run, 0) > asked:
                continue
            sizes = seen.get(run)
            covered = asked
            state = self._runs.get(run)
            if sizes is not None and state is not None:
                if any(p not in sizes or sizes[p] < state.states[p].offset for p in state.files):
                    covered = next(self._tickets)
                    sizes = _listing(self._folder(run))  # other than known: looked at again, now
            self._refreshed[run] = max(self._refreshed.get(run, 0), covered)
            if sizes is None:
                self._runs.pop(run, None)
                continue
            state = self._runs.get(run) or self._runs.setdefault(run, self._new_run())
            if any(p not in sizes or sizes[p] < state.states[p].offset for p in state.files):
                state = self._runs[run] = self._new_run()
            for path, size in sizes.items():
                if path not in state.states:
                    state.states[path] = damage.FileState()
                    state.files.append(path)
                fs = state.states[path]
                if fs.stopped is None and size > fs.offset:
                    self._advance(state, state.files.index(path), path)

    def file_states(self) -> Dict[str, damage.FileState]:
        """{path (normalized): how far the index read the file} of every file walked, but those it stopped at a
        record that is no Event (framed well: the damage check reads past it): for `damage.Scanner`, which then
        reads only what the index did not."""
        with self._lock:
            return {
                os.path.normpath(p): fs
                for r in self._runs.values()
                for p, fs in r.states.items()
                if fs.stopped is None or fs.stopped[2] != NOT_AN_EVENT
            }

    def forget(self, run: str) -> None:
        """Drops what is known of `run`: the next refresh reads its files anew."""
        with self._lock:
            self._runs.pop(run, None)
            self._refreshed.pop(run, None)

    def _advance(self, run: _Run, file_no: int, path: str) -> None:
        """Reads the file's records past where the last read stopped, to its end as it is now."""
        fs = run.states[path]
        try:
            for start, buf, good in damage.read_new_chunks(path, fs):
                _, stop = self._add_chunk(run, file_no, start, buf, good)
                if stop is not None:
                    # A well-framed record that is no Event: TensorBoard's loaders read no further, nor do we.
                    fs.stopped = (damage.CORRUPT, stop, NOT_AN_EVENT)
                    break
        except OSError:
            return  # unreadable now (the damage check says so); read from where it stopped when readable

    def walk(self, path: str) -> Iterator[bytes]:
        """The records of the event file `path` that are not all layergrad tensors, while it is indexed: one walk of
        the file for the index and a reader of the rest (TensorBoard's multiplexer in `load()` and `report`,
        `event_files`), each record parsed once here. As `read_records`: up to the first damaged record, and no
        further than a record that is no Event (the index stops there too)."""
        folder, name = os.path.split(os.path.normpath(path))
        run_name = os.path.relpath(folder, os.path.normpath(self.logdir)).replace(os.sep, "/")
        path = os.path.join(self._folder(run_name), name)  # as `refresh` names it
        with self._lock:
            run = self._runs.get(run_name) or self._runs.setdefault(run_name, self._new_run())
            if path not in run.states:
                run.states[path] = damage.FileState()
                run.files.append(path)
            fs, file_no = run.states[path], run.files.index(path)
        if fs.offset or fs.stopped is not None:  # walked before: the multiplexer's share is read as it was
            yield from damage.read_records(path)
            return
        for start, buf, good in damage.read_new_chunks(path, fs):
            with self._lock:
                rest, stop = self._add_chunk(run, file_no, start, buf, good, self._keep_walked, hand_on=True)
            yield from rest
            if stop is not None:
                fs.stopped = (damage.CORRUPT, stop, NOT_AN_EVENT)
                return

    def _add_chunk(
        self,
        run: _Run,
        file_no: int,
        start: int,
        buf: bytes,
        good: Tuple[np.ndarray, np.ndarray],
        keep: bool = False,
        hand_on: bool = False,
    ) -> Tuple[List[bytes], Optional[int]]:
        """Indexes the records `good` ((starts, lengths) of their payloads in `buf`, read at `start` in the file) as
        `_add` does, those of one tensor summary in the layout every step's record is written in read for the chunk
        at once (`tensor_events`), the others parsed one by one. Returns (with `hand_on`: the payloads of the
        records that are not all layergrad tensors, in order; the offset of a record that is no Event, where
        indexing stopped, or None)."""
        rest: List[bytes] = []
        series = run.series
        at_in_buf, length_of = good[0].tolist(), good[1].tolist()
        read = tensor_events.decode(buf, good[0], good[1])
        places = (start + good[0], good[1])
        pending: Dict[str, List[int]] = {}  # tag -> the records of it read, not yet indexed
        for j, tag in enumerate(read.tags):
            if tag is None:  # any other record: parsed with protobuf, after the records before it
                _extend(run, file_no, buf, read, places, pending)
                pending = {}
                at, length = at_in_buf[j], length_of[j]
                payload = memoryview(buf)[at : at + length]
                ours = self._add(run, file_no, start + at, length, payload, keep, self._unkept)
                if ours is None:
                    return rest, start + at
                if not ours and hand_on:
                    rest.append(bytes(payload))
            elif tag in series:
                got = pending.get(tag)
                if got is None:
                    pending[tag] = [j]
                else:
                    got.append(j)
            elif hand_on:  # a tensor of another plugin (no metadata here: its tag's was read before, or none)
                rest.append(buf[at_in_buf[j] : at_in_buf[j] + length_of[j]])
        _extend(run, file_no, buf, read, places, pending)
        return rest, None

    @staticmethod
    def _add(
        run: _Run,
        file_no: int,
        offset: int,
        length: int,
        payload: memoryview,
        keep: bool = False,
        unkept: FrozenSet[str] = frozenset(),
    ) -> Optional[bool]:
        """Indexes the record's layergrad tensors; None when it is no Event, else whether every value of it is a
        layergrad tensor (an event without a summary is not)."""
        try:
            event = event_pb2.Event.FromString(bytes(payload))
        except DecodeError:
            return None
        if not event.HasField("summary") or not event.summary.value:
            return False
        ours = True
        for i, value in enumerate(event.summary.value):
            if value.HasField("metadata") and value.tag not in run.meta:
                run.meta[value.tag] = value.metadata
                md = value.metadata
                if (
                    md.plugin_data.plugin_name == metadata.PLUGIN_NAME
                    and md.data_class == summary_pb2.DATA_CLASS_TENSOR
                ):
                    kept = keep and _kind(md) not in unkept
                    run.series[value.tag] = _Series(meta=md, arrays=[] if kept else None)
            s = run.series.get(value.tag)
            if s is None or not value.HasField("tensor"):
                ours = False
                continue
            s.steps.append(event.step)
            s.walls.append(event.wall_time)
            s.files.append(file_no)
            s.offsets.append(offset)
            s.lengths.append(length)
            s.values.append(i)
            if s.arrays is not None:
                s.arrays.append(_packed(value.tensor))
            s.max_step = event.step if s.max_step is None else max(s.max_step, event.step)
            s.max_wall = event.wall_time if s.max_wall is None else max(s.max_wall, event.wall_time)
        return ours

    def _selected(self, runs: Sequence[str], run_tag_filter: Optional[tb_provider.RunTagFilter]):
        tags = None if run_tag_filter is None or run_tag_filter.tags is None else set(run_tag_filter.tags)
        wanted = runs if run_tag_filter is None or run_tag_filter.runs is None else set(runs) & set(run_tag_filter.runs)
        asked, seen = self._list(sorted(wanted))
        with self._lock:  # refreshed and selected in one hold of the lock: each request waits for it once
            self._refresh(sorted(wanted), asked, seen)
            for run in sorted(wanted):
                r = self._runs.get(run)
                if r is None:
                    continue
                if tags is None:
                    chosen = list(r.series.items())
                else:
                    chosen = [(t, r.series[t]) for t in sorted(tags) if t in r.series]
                if chosen:
                    yield run, r, chosen

    def list_tensors(
        self, runs: Sequence[str], run_tag_filter: Optional[tb_provider.RunTagFilter] = None
    ) -> Dict[str, Dict[str, tb_provider.TensorTimeSeries]]:
        """`DataProvider.list_tensors` of the layergrad series of `runs` (those TensorBoard lists)."""
        out: Dict[str, Dict[str, tb_provider.TensorTimeSeries]] = {}
        for run, _, chosen in self._selected(runs, run_tag_filter):
            out[run] = {
                tag: tb_provider.TensorTimeSeries(
                    max_step=s.max_step,
                    max_wall_time=s.max_wall,
                    plugin_content=s.meta.plugin_data.content,
                    description=s.meta.summary_description,
                    display_name=s.meta.display_name,
                )
                for tag, s in chosen
            }
        return out

    def read_tensors(
        self, runs: Sequence[str], run_tag_filter: Optional[tb_provider.RunTagFilter], downsample_to: int
    ) -> Dict[str, Dict[str, List[tb_provider.TensorDatum]]]:
        """`DataProvider.read_tensors` of the layergrad series of `runs`: each record read from its file."""
        plans: List[Tuple[str, str, List[str], List[Tuple[int, int, int, int]]]] = []
        walked: Dict[str, Dict[str, List[tb_provider.TensorDatum]]] = {}
        for run, r, chosen in self._selected(runs, run_tag_filter):
            for tag, s in chosen:
                n = len(s.steps)
                rows = downsample(n, downsample_to)
                if s.arrays is not None:
                    walked.setdefault(run, {})[tag] = self._walked(s, rows)
                    continue
                picks = [(s.files[i], s.offsets[i], s.lengths[i], s.values[i]) for i in rows]
                plans.append((run, tag, list(r.files), picks))
        out = self._read_plans(plans)
        for run, tags in walked.items():
            out.setdefault(run, {}).update(tags)
        return out

    def _walked(self, s: _Series, rows: Iterable[int]) -> Sequence[tb_provider.TensorDatum]:
        """The records `rows` of `s` from the arrays kept as the file was walked, which are then dropped (called
        under the index's lock: `_selected`): a `series.Batch` when every record's tensor is of one dtype and
        shape (`_joined`), else a list."""
        arrays, s.arrays = s.arrays, None
        rows = list(rows)
        values = _joined(arrays) if rows and arrays else None
        if values is not None:
            at = np.asarray(rows, np.int64)
            steps = np.frombuffer(s.steps, np.int64)[at]  # copies: the index's arrays grow later
            walls = np.frombuffer(s.walls, np.float64)[at]
            return series.Batch(steps, walls, values if len(rows) == values.shape[0] else values[at])
        arrays = [r for a in arrays or () for r in (a.records() if isinstance(a, _Piece) else (a,))]
        decoded = _unpacked_many([arrays[i] for i in rows])
        return [tb_provider.TensorDatum(step=s.steps[i], wall_time=s.walls[i], numpy=a) for i, a in zip(rows, decoded)]

    def read_since(
        self, run: str, since: Dict[str, Optional[Position]]
    ) -> Dict[str, Tuple[Position, bool, List[tb_provider.TensorDatum]]]:
        """The records of `run`'s tags past where a reader stopped: `{tag: (position now, whole, records)}`.

        `since[tag]`: the `Position` the reader's last read of the tag returned, or None. Why: a block of a
        run being written grows at every step; reading it whole at every change is work in proportion to
        the run, per request. `whole` is False when `records` are those past `since[tag]` (the tail of what
        `read_tensors` would answer, in its order), True when they are every record of the tag (nothing
        was given, or the run was read anew since). Tags the run does not have are absent."""
        f = tb_provider.RunTagFilter(runs=[run], tags=list(since))
        plans, where = [], {}
        walked: Dict[str, List[tb_provider.TensorDatum]] = {}
        for _, r, chosen in self._selected([run], f):
            for tag, s in chosen:
                n = len(s.steps)
                pos = since.get(tag)
                whole = pos is None or pos[0] != r.epoch or pos[1] > n
                first = 0 if whole else pos[1]
                where[tag] = ((r.epoch, n), whole)
                if s.arrays is not None:
                    walked[tag] = self._walked(s, range(first, n))
                    continue
                picks = [(s.files[i], s.offsets[i], s.lengths[i], s.values[i]) for i in range(first, n)]
                plans.append((run, tag, list(r.files), picks))
        read = self._read_plans(plans).get(run) if plans else {}
        if read is None:
            return {}
        read.update(walked)
        return {tag: (where[tag][0], where[tag][1], data) for tag, data in read.items()}

    def _read_plans(
        self, plans: List[Tuple[str, str, List[str], List[Tuple[int, int, int, int]]]]
    ) -> Dict[str, Dict[str, List[tb_provider.TensorDatum]]]:
        out: Dict[str, Dict[str, List[tb_provider.TensorDatum]]] = {}
        # Per run: an event holding many series (every layer's record of a step) is read and parsed once.
        by_run: Dict[str, List[Tuple[str, List[str], list]]] = {}
        for run, tag, files, picks in plans:
            by_run.setdefault(run, []).append((tag, files, picks))
        for run, series_of_run in by_run.items():
            files = series_of_run[0][1]
            try:
                data = _data(files, [p for _, _, picks in series_of_run for p in picks])
                ends = np.cumsum([len(picks) for _, _, picks in series_of_run]).tolist()
                out[run] = {tag: data[end - len(picks) : end] for (tag, _, picks), end in zip(series_of_run, ends)}
            except (OSError, DecodeError, IndexError, KeyError):
                # A file removed or rewritten since it was indexed: the run is read anew at the next refresh;
                # this answer has none of its series rather than a part of them.
                self.forget(run)
        return out

    def latest(self, run: str, tags: Sequence[str], step: Optional[int]) -> Dict[str, List[tb_provider.TensorDatum]]:
        """`{tag: [TensorDatum...]}`: the records of each tag at its latest step at or before `step` (None: its
        last), in file order (one, unless the step repeats); a tag with none that early is absent. The records
        `read_tensors` would return at that step, found in the index and read alone: the latest histogram of a run
        is one record to read, not its block of a thousand. `run` as listed (no call to TensorBoard here)."""
        self.refresh([run])
        picks: List[Tuple[str, Tuple[int, int, int, int]]] = []
        with self._lock:
            r = self._runs.get(run)
            if r is None:
                return {}
            files = list(r.files)
            for tag in tags:
                s = r.series.get(tag)
                if s is None:
                    continue
                picks += [
                    (tag, (s.files[i], s.offsets[i], s.lengths[i], s.values[i])) for i in _at_latest(s.steps, step)
                ]
        try:
            data = _data(files, [pick for _, pick in picks])
            out: Dict[str, List[tb_provider.TensorDatum]] = {}
            for (tag, _), datum in zip(picks, data):
                out.setdefault(tag, []).append(datum)
        except (OSError, DecodeError, IndexError, KeyError):
            self.forget(run)  # as `read_tensors`: read anew at the next refresh, and none of it answered now
            return {}
        return out


def _extend(
    run: _Run,
    file_no: int,
    buf: bytes,
    read: tensor_events.Records,
    places: Tuple[np.ndarray, np.ndarray],
    pending: Dict[str, List[int]],
) -> None:
    """Indexes the records `pending` ({tag: their positions in `read`, in order}) as `RecordIndex._add` would one by
    one: each series' columns extended at once."""
    for tag, js in pending.items():
        s = run.series[tag]
        idx = np.asarray(js, np.int64)
        steps, walls = read.steps[idx], read.walls[idx]
        s.steps.frombytes(steps.astype(np.longlong).tobytes())
        s.walls.frombytes(walls.astype(np.double).tobytes())
        s.files.frombytes(np.full(idx.size, file_no, np.intc).tobytes())
        s.offsets.frombytes(places[0][idx].astype(np.longlong).tobytes())
        s.lengths.frombytes(places[1][idx].astype(np.longlong).tobytes())
        s.values.frombytes(np.zeros(idx.size, np.intc).tobytes())  # the summary's one value
        if s.arrays is not None:
            at, length = read.content_at[idx], read.content_len[idx]
            dtype_enums, shapes = [read.dtypes[j] for j in js], [read.shapes[j] for j in js]
            piece = _piece(buf, at, length, dtype_enums, shapes)
            if piece is not None:
                s.arrays.append(piece)
            else:
                contents = [buf[a:e] for a, e in zip(at.tolist(), (at + length).tolist())]
                s.arrays.extend(zip(contents, dtype_enums, shapes))
        top = int(steps.max())
        if s.max_step is None or top > s.max_step:
            s.max_step = top
        if np.isnan(walls).any():  # max() in order, as `_add` takes it (a NaN first stays)
            for w in walls.tolist():
                if s.max_wall is None or w > s.max_wall:
                    s.max_wall = w
        else:
            top_wall = float(walls.max())
            if s.max_wall is None or top_wall > s.max_wall:
                s.max_wall = top_wall


@dataclasses.dataclass
class _Piece:
    """The tensors of consecutive records of one series read in one chunk, all of one dtype and shape: their
    packed bytes joined (one object for many records, not a tuple and a bytes each)."""

    blob: bytearray
    dtype: int  # the TensorProto dtype enum
    shape: Tuple[int, ...]
    count: int

    def records(self) -> List[tuple]:
        """What `_packed` keeps of each record."""
        n = len(self.blob) // self.count
        return [(bytes(self.blob[i * n : (i + 1) * n]), self.dtype, list(self.shape)) for i in range(self.count)]


def _piece(
    buf: bytes, at: np.ndarray, length: np.ndarray, dtype_enums: List[int], shapes: List[List[int]]
) -> Optional[_Piece]:
    """The `_Piece` of the tensor contents `buf[a : a + n]` (`at`, `length`) of one dtype and shape (of at least one
    dimension) whose bytes fill that shape; None when they are not (kept record by record, decoded as before)."""
    dtype_enum, shape = dtype_enums[0], shapes[0]
    if not shape or dtype_enums.count(dtype_enum) != len(dtype_enums) or shapes.count(shape) != len(shapes):
        return None
    n = int(length[0])
    if _filled(dtype_enum, shape, n) is None or bool((length != n).any()):
        return None
    starts = at.tolist()
    blob = bytearray().join(map(buf.__getitem__, map(slice, starts, (at + n).tolist())))
    return _Piece(blob, dtype_enum, tuple(shape), len(starts))


def _filled(dtype_enum: int, shape: Sequence[int], n: int) -> Optional[np.dtype]:
    """The numpy dtype of a tensor of `dtype_enum` and `shape` whose packed bytes, `n` of them, fill it; None where
    numpy does not read that dtype from bytes or they do not fill it (decoded record by record, raising as before)."""
    try:
        dtype = np.dtype(_numpy_dtype(dtype_enum))
    except (TypeError, ValueError, KeyError):
        return None
    return None if dtype.kind == "O" or n != dtype.itemsize * int(np.prod(shape)) else dtype


def _joined(arrays: list) -> Optional[np.ndarray]:
    """The tensors kept of a series' records (`_Piece`s and `_packed` records) as one array [records, ...shape],
    when all are packed bytes of one dtype and shape (of at least one dimension) that fill it; else None."""
    blobs, kinds = [], set()
    for a in arrays:
        if isinstance(a, _Piece):
            blobs.append(a.blob)
            kinds.add((a.dtype, a.shape, len(a.blob) // a.count))
        elif isinstance(a, tuple) and a[2]:
            blobs.append(a[0])
            kinds.add((a[1], tuple(a[2]), len(a[0])))
        else:
            return None
    if len(kinds) != 1:
        return None
    ((dtype_enum, shape, n),) = kinds
    dtype = _filled(dtype_enum, shape, n)
    if dtype is None:
        return None
    return np.frombuffer(bytearray().join(blobs), dtype=dtype).reshape((-1,) + shape)


def _kind(md: summary_pb2.SummaryMetadata) -> Optional[str]:
    """The kind of series a layergrad tag's metadata says (None where it cannot be read: the catalog says why)."""
    try:
        return metadata.parse_plugin_content(md.plugin_data.content).kind
    except (ValueError, TypeError):
        return None


def _at_latest(steps: array.array, step: Optional[int]) -> List[int]:
    """The positions in `steps` of its greatest value at or before `step` (None: its greatest), in order."""
    if not len(steps):
        return []
    at = np.frombuffer(steps, dtype=np.int64)
    within = at if step is None else at[at <= step]
    if not within.size:
        return []
    return [int(i) for i in np.flatnonzero(at == within.max())]


# Records closer than this in a file are read in one read (the bytes between them read too), up to a window's bytes.
_GAP_BYTES = 64 << 10
_WINDOW_BYTES = 4 << 20

Pick = Tuple[int, int, int, int]  # a record to read: (file, offset, length, index of the value in its summary)


def _data(files: List[str], picks: Sequence[Pick]) -> List[tb_provider.TensorDatum]:
    """The record at each of `picks`, each read and parsed once, in file order: what `_datum` makes of the event
    protobuf parses there. Why not protobuf for each: a block of a run logged every step is 65,536 records, and a
    seek, a read, a parse and the fields through protobuf's Python objects per record were most of a layer's first
    histograms. So records near each other are read in one read, those in the layout every step writes read for the
    window at once (`tensor_events`: the values protobuf parses) and their arrays made together (`_arrays`); any
    other record (a value after the first, a tag's first with its metadata, one cut short by the file's end, bytes
    no longer an Event) is parsed with protobuf as before, raising what it raised."""
    if not picks:
        return []
    at = np.asarray(picks, np.int64).reshape(-1, 4)
    order = np.lexsort(at.T[::-1])  # by file, offset, length, value
    at = at[order]
    first = np.ones(len(at), bool)
    first[1:] = np.any(at[1:] != at[:-1], axis=1)
    unique = at[first]
    which = np.empty(len(at), np.int64)
    which[order] = np.cumsum(first) - 1  # each pick's row in `unique`
    found: List[Optional[tb_provider.TensorDatum]] = [None] * len(unique)
    events: Dict[Tuple[int, int, int], event_pb2.Event] = {}
    for file_no in np.unique(unique[:, 0]).tolist():
        rows = np.flatnonzero(unique[:, 0] == file_no)
        offsets = unique[rows, 1]
        reach = np.maximum.accumulate(offsets + unique[rows, 2])  # the end of the farthest record so far
        gaps = (np.flatnonzero(offsets[1:] - reach[:-1] > _GAP_BYTES) + 1).tolist() + [len(rows)]
        with open(files[file_no], "rb") as fh:
            i = 0
            while i < len(rows):
                lo = int(offsets[i])
                j = min(gaps[bisect.bisect_right(gaps, i)], int(np.searchsorted(reach, lo + _WINDOW_BYTES, "right")))
                j = max(j, i + 1)  # a record larger than a window: read alone
                fh.seek(lo)
                buf = fh.read(int(reach[j - 1]) - lo)
                for row, datum in zip(rows[i:j].tolist(), _read_window(buf, lo, unique[rows[i:j]], events)):
                    found[row] = datum
                i = j
    for row, datum in enumerate(found):
        if datum is None:
            file_no, offset, length, value_index = unique[row].tolist()
            found[row] = _datum(events[(file_no, offset, length)], value_index)
    return [found[k] for k in which.tolist()]


def _read_window(
    buf: bytes, lo: int, picks: np.ndarray, events: Dict[Tuple[int, int, int], event_pb2.Event]
) -> List[Optional[tb_provider.TensorDatum]]:
    """The records `picks` ([n, 4] of `Pick`s) of `buf` (the file's bytes from `lo`), where `tensor_events` reads
    them and `_arrays` makes their arrays; None for each other one, its event parsed with protobuf into `events`."""
    starts, lengths = picks[:, 1] - lo, picks[:, 2]
    whole = np.flatnonzero((picks[:, 3] == 0) & (starts + lengths <= len(buf)))
    read = tensor_events.decode(buf, starts[whole].tolist(), lengths[whole].tolist())
    steps, walls = read.steps.tolist(), read.walls.tolist()
    out: List[Optional[tb_provider.TensorDatum]] = [None] * len(picks)
    at = whole.tolist()
    for j, a in _arrays(buf, read).items():
        out[at[j]] = tb_provider.TensorDatum(step=steps[j], wall_time=walls[j], numpy=a)
    for k, datum in enumerate(out):
        if datum is None:
            place = tuple(picks[k, :3].tolist())
            if place not in events:
                start, length = int(starts[k]), int(lengths[k])
                events[place] = event_pb2.Event.FromString(buf[start : start + length])
    return out


def _arrays(buf: bytes, read: tensor_events.Records) -> Dict[int, np.ndarray]:
    """{position in `read`: the array `_unpacked` makes of its tensor} of the records `read` read. Those of one dtype,
    shape (of at least one dimension) and length whose bytes fill the shape are joined into one array whose rows
    they are (one copy, not an array per record); any other one by one (as `_unpacked`, raising what it
    raised)."""
    out: Dict[int, np.ndarray] = {}
    groups: Dict[Tuple[int, Tuple[int, ...], int], List[int]] = {}
    lengths = read.content_len.tolist()
    for j, (tag, dtype_enum, shape) in enumerate(zip(read.tags, read.dtypes, read.shapes)):
        if tag is not None:
            groups.setdefault((dtype_enum, tuple(shape), lengths[j]), []).append(j)
    for (dtype_enum, shape, length), js in groups.items():
        dtype = np.dtype(_numpy_dtype(dtype_enum))
        fills = bool(shape) and not dtype.hasobject and length == dtype.itemsize * int(np.prod(shape))
        if not fills:
            for j in js:
                at = int(read.content_at[j])
                out[j] = _unpacked((buf[at : at + length], dtype_enum, list(shape)))
            continue
        joined = bytearray().join([buf[at : at + length] for at in read.content_at[js].tolist()])
        out.update(zip(js, np.frombuffer(joined, dtype).reshape((len(js),) + shape)))
    return out


def _datum(event: event_pb2.Event, value_index: int) -> tb_provider.TensorDatum:
    value = event.summary.value[value_index]
    return tb_provider.TensorDatum(step=event.step, wall_time=event.wall_time, numpy=_ndarray(value.tensor))


_NUMPY_DTYPES: Dict[int, object] = {}  # TensorProto dtype -> the numpy dtype `make_ndarray` gives it


def _ndarray(tensor) -> np.ndarray:
    """`tensor_util.make_ndarray`'s array, the same way for a tensor's packed bytes (what the writer writes)
    without its per-call dtype lookup and element count, which were most of reading a record."""
    return _unpacked(_packed(tensor))


def _packed(tensor) -> object:
    """What `_unpacked` makes a tensor's array of: its packed bytes, dtype and shape (not decoded: a walk keeps every
    record of every series, and a reader may ask for few of them), or the array itself for a tensor without them."""
    if not tensor.tensor_content:
        return tensor_util.make_ndarray(tensor)
    return tensor.tensor_content, tensor.dtype, [d.size for d in tensor.tensor_shape.dim]


def _numpy_dtype(dtype_enum: int) -> object:
    dtype = _NUMPY_DTYPES.get(dtype_enum)
    if dtype is None:
        dtype = _NUMPY_DTYPES[dtype_enum] = dtypes.as_dtype(dtype_enum).as_numpy_dtype
    return dtype


def _unpacked(packed: object) -> np.ndarray:
    if isinstance(packed, np.ndarray):
        return packed
    content, dtype_enum, shape = packed
    return np.frombuffer(content, dtype=_numpy_dtype(dtype_enum)).copy().reshape(shape)


def _unpacked_many(packed: List[object]) -> List[np.ndarray]:
    """`_unpacked` of each: those of one dtype, shape (of at least one dimension) and size decoded as one array
    whose rows they are (one copy for a series, not one per record); any other, or a group whose bytes do not
    fill its shape, one by one (as `_unpacked`, which raises what it raised)."""
    out: List[Optional[np.ndarray]] = [None] * len(packed)
    groups: Dict[Tuple[int, Tuple[int, ...], int], List[int]] = {}
    for j, p in enumerate(packed):
        if isinstance(p, np.ndarray) or not p[2]:
            out[j] = _unpacked(p)
        else:
            groups.setdefault((p[1], tuple(p[2]), len(p[0])), []).append(j)
    for (dtype_enum, shape, _), idx in groups.items():
        try:
            flat = np.frombuffer(bytearray().join([packed[j][0] for j in idx]), dtype=_numpy_dtype(dtype_enum))
            rows = list(flat.reshape((len(idx),) + shape))
        except ValueError:
            rows = [_unpacked(packed[j]) for j in idx]
        for j, a in zip(idx, rows):
            out[j] = a
    return out


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _listing(folder: str) -> Optional[Dict[str, int]]:
    """{path: size (-1: unreadable)} of the event files of a run's folder, in name order (the order TensorBoard reads
    them); None when the folder cannot be listed. One listing of the folder and one `stat` per file."""
    try:
        with os.scandir(folder) as found:
            entries = sorted((e for e in found if damage.is_event_file(e.name)), key=lambda e: e.name)
    except OSError:
        return None
    out: Dict[str, int] = {}
    for e in entries:
        try:
            if e.is_dir():
                continue
        except OSError:
            pass  # as `os.path.isdir`: not a folder
        out[os.path.join(folder, e.name)] = _size(e.path)
    return out


class LocalProvider:
    """TensorBoard's data provider, with the layergrad tensors of a local logdir read through a `RecordIndex`.

    Every other call (runs, scalars, other plugins' series, hparams) is TensorBoard's. The runs are those
    TensorBoard lists, so a run appears when TensorBoard finds it."""

    def __init__(self, data_provider: object, logdir: str, index: Optional[RecordIndex] = None) -> None:
        """`index`: the index of `logdir` to read through (one built as TensorBoard's loader walked the files,
        `RecordIndex.walk`); None: a new one."""
        self._provider = data_provider
        self.index = index if index is not None else RecordIndex(logdir)

    def __getattr__(self, name: str):
        return getattr(self._provider, name)

    def _runs(self, ctx: object, experiment_id: str) -> List[str]:
        return [r.run_name for r in self._provider.list_runs(ctx, experiment_id=experiment_id)]

    def list_tensors(self, ctx=None, *, experiment_id, plugin_name, run_tag_filter=None):
        if plugin_name != metadata.PLUGIN_NAME:
            return self._provider.list_tensors(
                ctx, experiment_id=experiment_id, plugin_name=plugin_name, run_tag_filter=run_tag_filter
            )
        return self.index.list_tensors(self._runs(ctx, experiment_id), run_tag_filter)

    def read_tensors(self, ctx=None, *, experiment_id, plugin_name, downsample=None, run_tag_filter=None):
        if plugin_name != metadata.PLUGIN_NAME:
            return self._provider.read_tensors(
                ctx,
                experiment_id=experiment_id,
                plugin_name=plugin_name,
                downsample=downsample,
                run_tag_filter=run_tag_filter,
            )
        return self.index.read_tensors(self._runs(ctx, experiment_id), run_tag_filter, downsample)

    def read_tensors_since(
        self, ctx: object, experiment_id: str, run: str, since: Dict[str, Optional[Position]]
    ) -> Dict[str, Tuple[Position, bool, List[tb_provider.TensorDatum]]]:
        """`RecordIndex.read_since` of a run TensorBoard lists (else nothing)."""
        if run not in self._runs(ctx, experiment_id):
            return {}
        return self.index.read_since(run, since)
