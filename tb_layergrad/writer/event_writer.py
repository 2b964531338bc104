"""An event file written by a thread of its own, with no TensorFlow: `Event` protos framed as TFRecords.

Why a thread: a step's records arrive from the device (read as the step finishes) while training goes on; building
their protos and framing them must not hold up the step that handed them out. Why not TensorBoard's
`EventFileWriter`: it checksums each record with a pure-Python CRC-32C, on a second thread of its own, which made
it the larger part of a written step's work on the host; here the framing is `metadata.tf_record`'s, the
checksums in C. What is written is what TensorBoard's readers read (docs/FORMAT.md, its opening): a
`file_version` event first, then an `Event` per step, in a file whose name holds `tfevents`.
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import threading
import time
from typing import Any, List, Mapping, Optional, Sequence

from tensorboard.compat import tf
from tensorboard.compat.proto import event_pb2, summary_pb2

from tb_layergrad.metadata import tf_record
from tb_layergrad.writer.step_records import GroupStep, StepRecords

# Files this process made, numbered so that two made in one second have different names; the suffix keeps them
# apart from files of TensorBoard's writer in the same directory (numbered by a counter of its own).
_FILE_NUMBERS = itertools.count()
FILE_SUFFIX = ".layergrad"


def new_event_file(run_dir: str) -> Any:
    """A new event file in `run_dir` (made if missing), opened for writing, its `file_version` event written."""
    tf.io.gfile.makedirs(run_dir)
    name = "events.out.tfevents.%010d.%s.%s.%s%s" % (
        time.time(), socket.gethostname(), os.getpid(), next(_FILE_NUMBERS), FILE_SUFFIX
    )  # fmt: skip
    file = tf.io.gfile.GFile(os.path.join(run_dir, name), "wb")
    first = event_pb2.Event(
        wall_time=time.time(),
        file_version="brain.Event:2",
        source_metadata=event_pb2.SourceMetadata(writer="tb_layergrad"),
    )
    file.write(tf_record.frame(first.SerializeToString()))
    file.flush()
    return file


_FLUSH = object()
_CLOSE = object()


class EventWriter:
    """Writes steps of group records to a new event file in `run_dir`, in the order `write` is called.

    `write` only queues the numbers; `flush` returns once everything queued is on disk; `close` ends the
    thread. An error on the thread is raised by the next `write`, `flush` or `close`.
    """

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self._file = new_event_file(run_dir)
        self._records = StepRecords()
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="tb_layergrad-event-writer", daemon=True)
        self._thread.start()
        self.closed = False

    def write(
        self,
        step: int,
        groups: Sequence[GroupStep],
        wall_time: Optional[float] = None,
        scalars: Optional[Mapping[str, float]] = None,
    ) -> None:
        """Queue one step's group records and `scalars` ({tag: value}, TensorBoard scalars)."""
        if self.closed:
            raise RuntimeError(f"the event writer of {self.run_dir} is closed")
        self._raise_error()
        when = time.time() if wall_time is None else float(wall_time)
        self._queue.put((int(step), list(groups), when, dict(scalars or {})))

    def flush(self) -> None:
        if self.closed:
            return
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        done.wait()
        self._raise_error()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._queue.put((_CLOSE, None))
        self._thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"tb_layergrad could not write to {self.run_dir}") from error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item[0] is _FLUSH:
                    self._file.flush()
                    item[1].set()
                    continue
                if item[0] is _CLOSE:
                    self._file.close()
                    return
                step, groups, wall_time, scalars = item
                values: List[summary_pb2.Summary.Value] = self._records.values(step, groups, scalars)
                if values:
                    event = event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values))
                    self._file.write(tf_record.frame(event.SerializeToString()))
            except BaseException as error:  # kept for the caller's thread
                self._error = error
                if item[0] is _FLUSH:
                    item[1].set()
                elif item[0] is _CLOSE:
                    return
