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
import threading
from typing import Any, Iterator, List, Tuple

from tensorboard import compat

from tb_layergrad import metadata

# The modules of the multiplexer's reading path that bind `tensorboard.compat.tf` as `tf`.
_READING_MODULES = (
    "tensorboard.backend.event_processing.io_wrapper",
    "tensorboard.backend.event_processing.directory_watcher",
    "tensorboard.backend.event_processing.directory_loader",
    "tensorboard.backend.event_processing.event_file_loader",
    "tensorboard.backend.event_processing.plugin_asset_util",
)
_lock = threading.RLock()


def is_url(logdir: str) -> bool:
    return "://" in logdir


@contextlib.contextmanager
def tensorflow_free(logdir: str = "") -> Iterator[None]:
    """While inside, TensorBoard's readers use its pure-Python file access (local paths only)."""
    if is_url(logdir):
        yield
        return
    stub = importlib.import_module("tensorboard.compat.tensorflow_stub")
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


def open_provider(logdir: str) -> Any:
    """A TensorBoard data provider over `logdir` that keeps every layergrad step.

    Call it inside `tensorflow_free(logdir)` to read without TensorFlow."""
    # Imported when asked: the plugin, which imports the reader at TensorBoard's start, never reads this way.
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: 0})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    return data_provider.MultiplexerDataProvider(mux, logdir)
