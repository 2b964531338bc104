"""Reading event files with TensorBoard's own reader, without importing TensorFlow.

`open_provider(logdir)` is the data provider `tb-layergrad report` and
`tb_layergrad.load()` read through: TensorBoard's event multiplexer keeping every
layergrad step (no sampling), so their numbers are the tab's.

Why `tensorflow_free`: those two only read files, yet TensorBoard's
event-processing modules reach the file system through `tensorboard.compat.tf`,
which imports TensorFlow when it is installed (a slow start-up and its C++ log
lines on stderr). TensorBoard ships a pure-Python
stand-in, `tensorboard.compat.tensorflow_stub`, which it uses itself where
TensorFlow is absent. `tensorflow_free()` points those modules at the stand-in
for the duration of a read only: TensorBoard's process-wide switch
(`tensorboard.compat.notf`) would also make `tf.summary.histogram` fail later in
the same process (it resolves TensorFlow through the same lazy module).

Logdirs given as URLs (`gs://...`) keep TensorFlow's file systems. A TensorBoard
running in the same process during a read also reads through the stand-in,
which serves local files as TensorFlow does; the plugin itself never swaps.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import types
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from tensorboard import compat

from tb_layergrad import metadata
from tb_layergrad.reader import damage, record_index

# The modules of the multiplexer's reading path that bind `tensorboard.compat.tf` as `tf`.
_READING_MODULES = (
    "tensorboard.backend.event_processing.io_wrapper",
    "tensorboard.backend.event_processing.directory_watcher",
    "tensorboard.backend.event_processing.directory_loader",
    "tensorboard.backend.event_processing.event_file_loader",
    "tensorboard.backend.event_processing.plugin_asset_util",
)
_lock = threading.RLock()
_walking: Optional[record_index.RecordIndex] = None  # the index `open_provider` builds as the multiplexer loads


def is_url(logdir: str) -> bool:
    return "://" in logdir


class _Module(types.ModuleType):
    """A module that is `base` but for the attributes given."""

    def __init__(self, name: str, base: Any, **overrides: Any) -> None:
        super().__init__(name)
        self._base = base
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


class _RecordReader:
    """The stand-in's record reader (`PyRecordReader_New`: `GetNext`, `record`), its records checked many at
    once (`damage.read_records`): the stand-in checks each byte's checksum in Python, which made reading
    most of `report`'s and `load()`'s time."""

    def __init__(self, filename: Any, start_offset: int = 0, compression_type: Any = None, status: Any = None):
        stub = importlib.import_module("tensorboard.compat.tensorflow_stub")
        if start_offset or compression_type:
            raise stub.errors.UnimplementedError(None, None, "start offset and compression not supported")
        path = filename.decode() if isinstance(filename, bytes) else filename
        if not os.path.exists(path):
            raise stub.errors.NotFoundError(None, None, f"{path} does not point to valid Events file")
        self._errors = stub.errors
        index = _walking
        # Inside `open_provider`: the file is indexed in the same walk, and only the records that are not ours are
        # handed on (the multiplexer keeps none of ours; the index reads them).
        self._records = index.walk(path) if index is not None else damage.read_records(path)
        self._current: Optional[bytes] = None

    def GetNext(self) -> None:  # noqa: N802 - the stand-in's name
        self._current = next(self._records, None)
        if self._current is None:
            raise self._errors.OutOfRangeError(None, None, "No more events to read")

    def record(self) -> Optional[bytes]:
        return self._current


def _fast_stub() -> Any:
    stub = importlib.import_module("tensorboard.compat.tensorflow_stub")
    pywrap = _Module("tb_layergrad_pywrap", stub.pywrap_tensorflow, PyRecordReader_New=_RecordReader)
    return _Module("tb_layergrad_tensorflow_stub", stub, pywrap_tensorflow=pywrap)


@contextlib.contextmanager
def tensorflow_free(logdir: str = "") -> Iterator[None]:
    """While inside, TensorBoard's readers use its pure-Python file access (local paths only), reading records
    through `_RecordReader`."""
    if is_url(logdir):
        yield
        return
    stub = _fast_stub()
    with _lock:
        swapped: List[Tuple[object, object]] = []
        for name in _READING_MODULES:
            module = importlib.import_module(name)
            current = getattr(module, "tf", None)
            if current is compat.tf:  # not already swapped (re-entrant use) nor changed by someone else
                swapped.append((module, current))
                module.tf = stub
        try:
            yield
        finally:
            for module, original in swapped:
                module.tf = original


def open_provider(logdir: str, runs: Optional[Iterable[str]] = None) -> Any:
    """A TensorBoard data provider over `logdir` that keeps every layergrad step.

    `runs`: only these runs' folders are read (each with the folders above it, where the HParams API's session
    of a run may be, `reader.hparams`), not the whole logdir; None: every run.
    Call it inside `tensorflow_free(logdir)` to read without TensorFlow.

    A local logdir's layergrad series are read as the plugin reads them (`record_index.LocalProvider`: each
    record from its file when asked, the same answers), TensorBoard's multiplexer keeping one record of each:
    its copy of every record (a parsed proto each, then converted) was most of `load()`'s time and memory."""
    # Imported when asked: the plugin, which imports the reader at TensorBoard's start, never reads this way.
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    global _walking
    local = not is_url(logdir)
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: 1 if local else 0})
    if runs is None:
        mux.AddRunsFromDirectory(logdir)
    else:
        folders = set()
        for run in runs:
            parts = [] if run == "." else run.split("/")
            folders.update("/".join(parts[:i]) or "." for i in range(len(parts) + 1))
        for name in sorted(folders):
            if name == ".":
                path = logdir
            elif is_url(logdir):
                path = f"{logdir.rstrip('/')}/{name}"
            else:
                path = os.path.join(logdir, *name.split("/"))
            if is_url(logdir) or os.path.isdir(path):
                mux.AddRun(path, name)
    # `load()` and `report` read every series once but the histograms (read from the file if ever asked).
    index = (
        record_index.RecordIndex(logdir, keep_walked=True, unkept_kinds=(metadata.KIND_HISTOGRAM,)) if local else None
    )
    with _lock:  # one walk of each file: the multiplexer's reader indexes our records as it goes (`_RecordReader`)
        _walking = index if _swapped_in(_READING_MODULES[-2]) else None
        try:
            mux.Reload()
        finally:
            _walking = None
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    return record_index.LocalProvider(provider, logdir, index=index) if local else provider


def _swapped_in(name: str) -> bool:
    """Whether module `name` reads through `tensorflow_free`'s stand-in now (else TensorFlow's reader, which never
    calls `_RecordReader`)."""
    module = importlib.import_module(name)
    return getattr(getattr(module, "tf", None), "__name__", "") == "tb_layergrad_tensorflow_stub"


def walked(provider: Any) -> Dict[str, damage.FileState]:
    """What `open_provider`'s walk verified of each file (`damage.Scanner`'s `known`); {} for a `gs://` logdir."""
    index = getattr(provider, "index", None)
    return index.file_states() if index is not None else {}
