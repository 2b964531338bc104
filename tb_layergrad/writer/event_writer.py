"""An event file written by a thread of its own, with no TensorFlow: TensorBoard's `EventFileWriter`.

Why a thread: a step's records arrive from the device (read as the step finishes) while training goes on; building
their protos and framing them (TensorBoard's pure-Python CRC32C) must not hold up the step that handed them
out. Why TensorBoard's writer: it is the framing TensorBoard's own readers read (TFRecord, masked CRC32C,
an `Event` per record), with its file name and first `file_version` event, and it needs no TensorFlow.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, List, Mapping, Optional, Sequence

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tb_layergrad.writer.step_records import GroupStep, StepRecords

_FLUSH = object()
_CLOSE = object()


class EventWriter:
    """Writes steps of group records to a new event file in `run_dir`, in the order `write` is called.

    `write` only queues the numbers; `flush` returns once everything queued is on disk; `close` ends the
    thread. An error on the thread is raised by the next `write`, `flush` or `close`.
    """

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self._file = EventFileWriter(run_dir, max_queue_size=1 << 10, flush_secs=10**9)
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
                    self._file.add_event(event)
            except BaseException as error:  # kept for the caller's thread
                self._error = error
                if item[0] is _FLUSH:
                    item[1].set()
                elif item[0] is _CLOSE:
                    return
