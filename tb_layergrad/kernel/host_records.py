"""The fused kernel's one-pass loops without TensorFlow: inside JAX's compiled step, and on host arrays.

Why: a written JAX step on the CPU must reduce its tensors to records, and XLA's compiled definitions
(`tb_layergrad.jax.reductions`) make several passes per tensor where the fused kernel makes one (docs/DESIGN.md,
"The cost of a written step on JAX"). `src/host_records.cc` runs the kernel's loops (`src/records_core.h`) over
the tensors, spread over the host's cores, behind a plain C interface (`records()`, on numpy arrays through
ctypes: what the tests hold to the reference and to TensorFlow's op); `src/jax_step_records.cc`, built with it
against jaxlib's FFI headers, is the XLA FFI handler the JAX step calls on its own buffers (`step_handler`).
Built like the kernel (`cache`: on first use, with the machine's compiler, once per compiler and CPU kind, and
per FFI headers), needing neither TensorFlow nor Python's headers, so a JAX install without TensorFlow builds
them. Where they cannot be built (no compiler, not Linux x86-64, `TB_LAYERGRAD_FUSED=0`), `records()` and
`step_handler()` return None and the caller computes the same records its own way.

The records: stats [T, NUM_STATS] float64 as the kernel's (the same bits on float16/bfloat16/float32 data),
histogram counts [T, buckets] against the float64 edges every writer computes (`metadata.histogram_edges`,
exactly, like `jax.reductions`). float64 data are reduced on x / 2**e like the reference's general path;
integers and booleans are widened to float64 and other floats (float8 kinds) to float32 first (exact).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from tb_layergrad import metadata
from tb_layergrad.kernel import cache

log = logging.getLogger("tb_layergrad")

SOURCE = Path(__file__).with_name("src") / "host_records.cc"
HEADERS = (SOURCE.with_name("records_core.h"),)
# The XLA FFI handler around the same loops, built with them into one library against jaxlib's headers.
STEP_SOURCE = SOURCE.with_name("jax_step_records.cc")
STEP_SYMBOL = "tb_layergrad_step_records"
# The element types the interface reads, by their code in host_records.cc (DType).
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
NUM_STATS = len(metadata.STAT_FIELDS)

_lock = threading.Lock()
_state: dict = {}  # "function": the loaded C function or None once decided; "error": why not


def _build_command(compiler: str, output: Path, ffi_include: Optional[Path] = None) -> List[str]:
    """The plain C library, or with `ffi_include` (jaxlib's headers) the same loops and the step's FFI handler."""
    sources = [str(SOURCE)] if ffi_include is None else ["-I", str(ffi_include), str(SOURCE), str(STEP_SOURCE)]
    return [
        compiler,
        "-shared",
        "-fPIC",
        "-std=c++17",
        *cache.arithmetic_flags(compiler),
        "-pthread",
        "-w",
        *sources,
        "-o",
        str(output),
    ]


def _ffi_headers(ffi_include: Path) -> List[Path]:
    return sorted((ffi_include / "xla" / "ffi" / "api").glob("*.h"))


def library_path(compiler: str, ffi_include: Optional[Path] = None) -> Path:
    """Where the build for these sources (and FFI headers), command, compiler version and CPU lives."""
    files = (SOURCE, *HEADERS) if ffi_include is None else (SOURCE, *HEADERS, STEP_SOURCE, *_ffi_headers(ffi_include))
    inputs = tuple(f.read_bytes() for f in files)
    name = "host_records" if ffi_include is None else "step_records"
    return cache.library_path(name, inputs, _build_command(compiler, Path("out"), ffi_include), compiler)


def build(compiler: Optional[str] = None, retry: bool = False, ffi_include: Optional[Path] = None) -> Path:
    """Compiles the library unless it is cached; returns it. Raises RuntimeError on failure (remembered).

    With `ffi_include` (`jax.ffi.include_dir()`), the library that also holds the step's FFI handler
    (`STEP_SYMBOL`): keyed by those headers too, so each jaxlib whose headers differ gets a build of its own."""
    compiler = cache.compiler_or_raise(compiler)
    return cache.build(
        library_path(compiler, ffi_include),
        lambda output: _build_command(compiler, output, ffi_include),
        what=f"{(STEP_SOURCE if ffi_include else SOURCE).name} with {compiler}",
        announce="its reduction loops for JAX's step (once, a few seconds)"
        if ffi_include
        else "its host reduction loops (once, a few seconds)",
        retry=retry,
    )


def _load() -> Tuple[Optional[ctypes._CFuncPtr], Optional[str]]:
    reason = cache.supported_platform()
    if reason:
        return None, reason
    try:
        library = ctypes.CDLL(str(build()))
    except (RuntimeError, OSError) as e:
        return None, str(e)
    if library.tb_layergrad_host_num_stats() != NUM_STATS:
        return None, f"the library's stats rows hold {library.tb_layergrad_host_num_stats()} values, not {NUM_STATS}"
    fn = library.tb_layergrad_host_records
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.c_int32),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    return fn, None


def _function() -> Optional[ctypes._CFuncPtr]:
    """The C function, or None where it cannot be used (built and loaded once per process; the switch is read
    each time). Why it is not used is logged once."""
    if cache.switched_off():
        return None
    with _lock:
        if "function" not in _state:
            _state["function"], _state["error"] = _load()
            if _state["error"]:
                # Not a warning on another platform: XLA's reductions are what it is meant to use (as the op's).
                say = log.info if cache.supported_platform() else log.warning
                say(
                    "tb_layergrad: the C++ host reductions are not available, XLA computes the records: %s",
                    _state["error"],
                )
    return _state["function"]


def available() -> bool:
    return _function() is not None


def unavailable_reason() -> Optional[str]:
    """Why `records` returns None (None when it does not, or has not been asked yet)."""
    return f"{cache.ENV_SWITCH}=0" if cache.switched_off() else _state.get("error")


_step_state: dict = {}  # "handler": the step's FFI handler or None once decided; "error": why not


def _load_step_handler(ffi_include: Path) -> Tuple[Optional[ctypes._CFuncPtr], Optional[str]]:
    reason = cache.supported_platform()
    if reason:
        return None, reason
    try:
        library = ctypes.CDLL(str(build(ffi_include=ffi_include)))
    except (RuntimeError, OSError) as e:
        return None, str(e)
    if library.tb_layergrad_host_num_stats() != NUM_STATS:
        return None, f"the library's stats rows hold {library.tb_layergrad_host_num_stats()} values, not {NUM_STATS}"
    return getattr(library, STEP_SYMBOL), None


def step_handler(ffi_include: Path) -> Optional[ctypes._CFuncPtr]:
    """The XLA FFI handler that computes a JAX step's records inside the step (`STEP_SYMBOL`, built with
    jaxlib's headers at `ffi_include`), or None where it cannot be used here (`step_handler_unavailable_reason`).
    Built and loaded once per process (the switch is read each time); why it is not used is logged once."""
    if cache.switched_off():
        return None
    with _lock:
        if "handler" not in _step_state:
            _step_state["handler"], _step_state["error"] = _load_step_handler(Path(ffi_include))
            if _step_state["error"]:
                say = log.info if cache.supported_platform() else log.warning
                say(
                    "tb_layergrad: the C++ reductions inside JAX's step are not available, XLA computes the "
                    "records: %s",
                    _step_state["error"],
                )
    return _step_state["handler"]


def step_handler_unavailable_reason() -> Optional[str]:
    """Why `step_handler` returns None (None when it does not, or has not been asked yet)."""
    return f"{cache.ENV_SWITCH}=0" if cache.switched_off() else _step_state.get("error")


def threads() -> int:
    """The cores this process may run on: what the loops spread a large step's tensors over."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _readable(x: np.ndarray) -> np.ndarray:
    """`x` flat and contiguous in a dtype the interface reads (a copy only where it must widen)."""
    x = np.asarray(x)
    if x.dtype.name not in DTYPES:
        if x.dtype.kind in "biu":
            x = x.astype(np.float64)
        elif x.dtype.kind in "fV":
            x = x.astype(np.float32)  # ml_dtypes' float8 kinds: exact in float32
        else:
            raise TypeError(f"cannot summarize a tensor of dtype {x.dtype.name}")
    return np.ascontiguousarray(x).reshape(-1)


def records(arrays: Sequence[np.ndarray], buckets: int) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(stats float64 [T, NUM_STATS], counts int64 [T, buckets]) of each array, or None where the library
    cannot be used here (`unavailable_reason`)."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    fn = _function()
    if fn is None:
        return None
    xs = [_readable(a) for a in arrays]
    num = len(xs)
    stats = np.empty((num, NUM_STATS), np.float64)
    counts = np.empty((num, buckets), np.int64)
    data = (ctypes.c_void_p * max(num, 1))(*[x.ctypes.data for x in xs])
    sizes = (ctypes.c_int64 * max(num, 1))(*[x.size for x in xs])
    dtypes = (ctypes.c_int32 * max(num, 1))(*[DTYPES[x.dtype.name] for x in xs])
    status = fn(num, data, sizes, dtypes, buckets, threads(), stats.ctypes.data, counts.ctypes.data)
    if status == -2:
        raise MemoryError("the host reductions ran out of memory")
    if status != 0:
        raise RuntimeError(f"the host reductions refused their input (status {status})")
    return stats, counts


def main(with_jax: bool = False) -> None:
    """Build now and print where (`python -m tb_layergrad.kernel`); retries a remembered failure, so that the
    compiler's message is shown again. `with_jax`: also the library with the JAX step's FFI handler."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(build(retry=True))
    if with_jax:
        import jax  # only here: the kernel's room needs no JAX to import

        print(build(retry=True, ffi_include=Path(jax.ffi.include_dir())))
