"""The fused reduction kernel: built on first use, cached, optional.

Why: on a small model, what logging every step costs is mostly the number of
TensorFlow kernels the records take (about ten per tensor plus their scalar
work), not the reading of the tensors. `src/` computes the histograms and
statistics of all of a step's tensors in one kernel, two reads of each, and
can write them to the summary writer in that same op (see
docs/PERFORMANCE.md for the figures). Whether a step uses it is decided in
one place, `tb_layergrad.summary.backend`.

TensorFlow has no stable binary interface for custom ops, so the kernel is
compiled here, against the installed TensorFlow, with the machine's C++
compiler, once per TensorFlow version, compiler and CPU kind, and cached
(`cache`: the user's cache folder or `TB_LAYERGRAD_CACHE`). It is built
and used on Linux x86-64 only, where it is tested. Elsewhere, without a
compiler, with a GPU visible (the kernel is CPU-only) or with
`TB_LAYERGRAD_FUSED=0`, `tb_layergrad.statistics.reductions` computes the
records with TensorFlow's ops: the same records, more kernels.
`python -m tb_layergrad.kernel` builds it ahead of time. A build failure is logged with the compiler's message and never
raised; it is remembered, so later processes do not compile again in vain.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import tensorflow as tf

from tb_layergrad.kernel import cache

log = logging.getLogger("tb_layergrad")

KERNELS = Path(__file__).with_name("src")
SOURCES = tuple(sorted(KERNELS.glob("*.cc")))
HEADERS = tuple(sorted(KERNELS.glob("*.h")))
OP_NAME = "TbLayergradHistogramsAndStats"
WRITE_OP_NAME = "TbLayergradWriteHistogramsAndStats"
# The dtypes the kernel reads (float16/bfloat16 are widened to float32 inside it).
DTYPES = (tf.float16, tf.bfloat16, tf.float32)
ENV_SWITCH = "TB_LAYERGRAD_FUSED"
ENV_CACHE = cache.ENV_CACHE
_BUILD_TIMEOUT_S = 600

_lock = threading.Lock()
_state: dict = {}  # "module": the loaded library or None once decided; "error": why not
_enabled = [True]


def _cpu_flags() -> str:
    """The CPU's feature flags: the build uses -march=native, so a cached library is per CPU kind."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    import platform

    return platform.processor()


@functools.lru_cache(maxsize=None)
def _target_flags(compiler: str) -> Tuple[str, ...]:
    """-march=native, without the AVX512-FP16 extension where the compiler would turn it on.

    Why: on a CPU with AVX512-FP16 (e.g. Sapphire Rapids), -march=native makes
    TensorFlow's bundled Eigen include its half-precision AVX512 packet code,
    which GCC does not compile. The kernel does no half-precision arithmetic (it
    widens 16-bit data to float32), so the extension is not needed. Asked of the
    compiler's own predefined macros, not of the CPU's name.
    """
    try:
        macros = subprocess.run(
            [compiler, "-march=native", "-dM", "-E", "-x", "c++", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        macros = ""
    return ("-march=native", "-mno-avx512fp16") if "__AVX512FP16__" in macros else ("-march=native",)


def _build_command(compiler: str, output: Path) -> List[str]:
    return [
        compiler,
        "-shared",
        "-fPIC",
        "-O3",
        *_target_flags(compiler),
        "-ffp-contract=off",
        "-fopenmp-simd",
        "-w",
        *map(str, SOURCES),
        "-o",
        str(output),
        *tf.sysconfig.get_compile_flags(),
        *tf.sysconfig.get_link_flags(),
    ]


def library_path(compiler: str) -> Path:
    """Where the build for this source, command (compiler, flags, TensorFlow), compiler version and CPU lives."""
    key = hashlib.sha256()
    parts = (
        *(f.read_bytes() for f in SOURCES + HEADERS),
        tf.__version__,
        " ".join(_build_command(compiler, Path("out"))),
        cache.compiler_identity(compiler),
        _cpu_flags(),
        sys.platform,
    )
    for part in parts:
        key.update(part if isinstance(part, bytes) else part.encode())
        key.update(b"\0")
    return cache.cache_dir() / f"histograms_and_stats-{key.hexdigest()[:20]}.so"


def _loadable(target: Path, warn: bool = True) -> bool:
    """Whether a cached build exists and may be loaded (see `cache.refusal`)."""
    if not target.exists():
        return False
    problem = cache.refusal(target)
    if problem and warn:
        log.warning("tb_layergrad: not loading the cached kernel %s: %s; building it again", target, problem)
    return problem is None


def build(compiler: Optional[str] = None, retry: bool = False) -> Path:
    """Compiles the kernel unless it is cached; returns the library. Raises RuntimeError on failure.

    A failed build is remembered (`cache.failure_marker`) and raised again
    without compiling, unless `retry`.
    """
    compiler = compiler or cache.find_compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    target = library_path(compiler)
    if _loadable(target):
        return target
    failed = None if retry else cache.remembered_failure(target)
    if failed:
        raise RuntimeError(failed)
    with cache.build_lock(target.with_suffix(".lock"), timeout=_BUILD_TIMEOUT_S + 60):
        if _loadable(target, warn=False):  # built by another process while this one waited
            return target
        failed = None if retry else cache.remembered_failure(target)  # or failed there
        if failed:
            raise RuntimeError(failed)
        log.warning(
            "tb_layergrad: compiling its fused reduction kernel for this TensorFlow (once, ~30 s) into %s",
            target.parent,
        )
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            _compile(compiler, partial, target)
            cache.make_private(partial)
            os.replace(partial, target)  # atomic: a reader sees no half-written library
        cache.forget_failure(target)
        log.info("tb_layergrad: fused kernel built in %.1f s", time.perf_counter() - started)
    return target


def _compile(compiler: str, output: Path, target: Path) -> None:
    """Runs the compiler; on failure remembers it for `target` and raises RuntimeError."""
    try:
        done = subprocess.run(
            _build_command(compiler, output), capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        message = f"compiling {KERNELS.name}/*.cc with {compiler} failed: no result after {_BUILD_TIMEOUT_S} s"
    else:
        if done.returncode == 0:
            return
        message = f"compiling {KERNELS.name}/*.cc with {compiler} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    cache.remember_failure(target, message)
    raise RuntimeError(f"{message}\n(later processes do not compile again; {cache.retry_hint(target)})")


def _load() -> Tuple[Optional[Any], Optional[str]]:
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None, f"{ENV_SWITCH}=0"
    unsupported = cache.supported_platform()
    if unsupported:  # not a warning: TensorFlow's ops are what this platform is meant to use
        log.info("tb_layergrad: %s; TensorFlow ops compute the records", unsupported)
        return None, unsupported
    if tf.config.list_logical_devices("GPU"):
        return None, "a GPU is visible (the fused kernel is CPU-only)"
    try:
        module = tf.load_op_library(str(build()))
    except (RuntimeError, OSError, subprocess.SubprocessError, tf.errors.OpError) as e:
        log.warning("tb_layergrad: the fused reduction kernel is not available, TensorFlow ops are used instead: %s", e)
        return None, str(e)
    tf.no_gradient(OP_NAME)
    tf.no_gradient(WRITE_OP_NAME)
    _state["write_error"] = _write_op_error(module)
    if _state["write_error"]:
        log.warning(
            "tb_layergrad: the fused write op cannot write to TensorFlow's summary writers here, "
            "tf.summary.write is used instead: %s",
            _state["write_error"],
        )
    return module, None


def _write_op_error(module: Any) -> Optional[str]:
    """Why the write op cannot write here (None: it can), found by writing one record to a scratch writer.

    Why: it looks the writer up as TensorFlow's own `SummaryWriterInterface` across
    shared libraries, which holds for TensorFlow's own builds (type names, not
    addresses, identify resource types) but is not promised by any interface. A
    build where it fails must cost the fallback, never a training step.
    """
    try:
        with tempfile.TemporaryDirectory() as scratch, tf.init_scope():
            writer = tf.summary.create_file_writer(scratch)
            from tb_layergrad.kernel import ops  # the op's one Python caller, which imports this module

            one = (("self_test", b""),)
            groups = ops.Groups(sizes=(1,), block_steps=(1,), histogram=one, stats=one, first_nonfinite=())
            condition = ops.Condition(record=tf.constant(True), step=tf.constant(0, tf.int64), flush=True)
            op = module.tb_layergrad_write_histograms_and_stats
            resource = writer._resource  # noqa: SLF001
            ops.write_histograms_and_stats(resource, [tf.constant([1.0, 2.0])], 2, groups, condition, op=op)
            writer.close()
            if not any(os.path.getsize(os.path.join(scratch, f)) > 0 for f in os.listdir(scratch)):
                return "the self-test wrote nothing"
    except (tf.errors.OpError, RuntimeError, TypeError, ValueError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _module() -> Optional[Any]:
    """The loaded library, or None when it cannot be used here (decided once per process)."""
    if not _enabled[0]:
        return None
    with _lock:
        if "module" not in _state:
            _state["module"], _state["error"] = _load()
    return _state["module"]


def op():
    """The kernel's op function, or None when it cannot be used here."""
    module = _module()
    return None if module is None else module.tb_layergrad_histograms_and_stats


def write_op():
    """The op function that also writes the records (`ops.write_histograms_and_stats`), or None where it cannot
    write here (`_write_op_error`)."""
    module = _module()
    if module is None or _state.get("write_error"):
        return None
    return module.tb_layergrad_write_histograms_and_stats


def unavailable_reason() -> Optional[str]:
    """Why `op()` is None (None when it is not, or has not been asked for yet)."""
    return _state.get("error") if _enabled[0] else "disabled by tb_layergrad.kernel.disabled()"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Use TensorFlow's ops instead of the kernel while tracing/running inside (tests, comparisons)."""
    before = _enabled[0]
    _enabled[0] = False
    try:
        yield
    finally:
        _enabled[0] = before


def main() -> None:
    """`python -m tb_layergrad.kernel`: build now (e.g. in a Docker image), print where.

    Retries a remembered failure, so that the compiler's message is shown again.
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(build(retry=True))
