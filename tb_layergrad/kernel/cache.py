"""Where the C++ builds are made, with what, and which cached builds may be loaded.

Kept apart from `tb_layergrad.kernel`'s loader and free of TensorFlow so that the tests'
conftest and other tools can ask "can the kernel be built here?" cheaply, and
free of POSIX-only modules so that the package imports on every OS
TensorFlow ships for.

- Two builds use it: TensorFlow's fused kernel (`fused`) and the TensorFlow-free records of JAX's host
  callback (`host_records`); `build` compiles either once into the cache.
- The kernel is built and tested on Linux x86-64 only; elsewhere TensorFlow's
  ops compute the same records (`supported_platform`).
- A build that failed is remembered in a marker file keyed by the build (sources,
  TensorFlow, flags, compiler identity), so that each new process does not pay
  for the same failing compile again (`failure_marker`).
- A cached library is loaded only when it belongs to the current user and no
  one else can write it (`refusal`): a library is code that runs in-process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

log = logging.getLogger("tb_layergrad")

ENV_CACHE = "TB_LAYERGRAD_CACHE"
# Off ("0", "false", "no", "off"): neither build computes records; TensorFlow's ops or XLA do.
ENV_SWITCH = "TB_LAYERGRAD_FUSED"
# Named in the message of a remembered failure: it builds again, ignoring the marker.
RETRY_COMMAND = "python -m tb_layergrad.kernel"
BUILD_TIMEOUT_S = 600
# Where the missing-requirement reasons start (the tests' skip reasons; .ci/run looks for them).
MISSING = "missing here:"


def cache_dir() -> Path:
    """`TB_LAYERGRAD_CACHE`, else the OS's per-user cache folder (`~/.cache/tb_layergrad` on Linux)."""
    override = os.environ.get(ENV_CACHE)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("tb_layergrad", appauthor=False))


def supported_platform() -> Optional[str]:
    """None on Linux x86-64, where the kernel is built and tested; otherwise why it is not used."""
    machine = platform.machine().lower()
    if sys.platform.startswith("linux") and machine in ("x86_64", "amd64"):
        return None
    return f"the fused kernel is built only on Linux x86-64 (this is {sys.platform} {machine or 'unknown'})"


def find_compiler() -> Optional[str]:
    """`$CXX`, else the first of c++, g++, clang++ on PATH (absolute path), else None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def cpu_flags() -> str:
    """The CPU's feature flags: the build uses -march=native, so a cached library is per CPU kind."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


def switched_off() -> bool:
    """Whether the user turned the C++ builds off (`TB_LAYERGRAD_FUSED=0`).

    Why read on every call, not once: a step is traced when it first runs, so a user
    who sets the variable in a notebook after importing, or compares both paths in
    one process, gets what they set for every step traced from then on.
    """
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def arithmetic_flags(compiler: str) -> Tuple[str, ...]:
    """The flags both builds compute with: the host's instruction set, and no contraction of a product and a sum
    into one multiply-add, so that the histogram edges round twice, as every writer computes them."""
    return ("-O3", *target_flags(compiler), "-ffp-contract=off", "-fopenmp-simd")


@functools.lru_cache(maxsize=None)
def target_flags(compiler: str) -> Tuple[str, ...]:
    """-march=native, without the AVX512-FP16 extension where the compiler would turn it on.

    Why: on a CPU with AVX512-FP16 (e.g. Sapphire Rapids), -march=native makes
    TensorFlow's bundled Eigen include its half-precision AVX512 packet code,
    which GCC does not compile. Neither build does half-precision arithmetic (each
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


def compiler_or_raise(compiler: Optional[str] = None) -> str:
    """`compiler`, else `find_compiler()`; RuntimeError when there is none."""
    compiler = compiler or find_compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    return compiler


def library_path(name: str, inputs: Sequence[Union[bytes, str]], command: List[str], compiler: str) -> Path:
    """Where the build `name` of these `inputs` (its sources' bytes, what else it is built against) by `command`
    lives: keyed by them, the compiler's version and the CPU kind (`-march=native`), so a change of any of them
    is a build of its own."""
    key = hashlib.sha256()
    for part in (*inputs, " ".join(command), compiler_identity(compiler), cpu_flags(), sys.platform):
        key.update(part if isinstance(part, bytes) else part.encode())
        key.update(b"\0")
    return cache_dir() / f"{name}-{key.hexdigest()[:20]}.so"


def unavailable_reason() -> Optional[str]:
    """Why the kernel cannot even be attempted here (platform, no compiler), or None. No build is run."""
    reason = supported_platform()
    if reason is None and find_compiler() is None:
        reason = "no C++ compiler found (set CXX, or install g++)"
    return reason


@functools.lru_cache(maxsize=None)
def compiler_identity(compiler: str) -> str:
    """The first line of `compiler --version`: an upgraded compiler gets its own build and its own verdict."""
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{compiler} (--version failed: {type(e).__name__})"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else f"{compiler} (--version printed nothing, status {done.returncode})"


def failure_marker(library: Path) -> Path:
    """The file that records a failed build of `library` (holds the compiler's message)."""
    return library.with_suffix(".failed")


def retry_hint(library: Path) -> str:
    return f"to retry, delete {failure_marker(library)} or run `{RETRY_COMMAND}` (it shows the compiler's message)"


def remembered_failure(library: Path) -> Optional[str]:
    """Why an earlier build of `library` failed, with how to retry; None if none did (or it was forgotten)."""
    try:
        message = failure_marker(library).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    lines = message.splitlines() or ["(no message)"]
    what = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"an earlier build failed and is not retried in every process: {what[:400]}; {retry_hint(library)}"


def remember_failure(library: Path, message: str) -> None:
    try:
        failure_marker(library).write_text(message, encoding="utf-8")
    except OSError:
        pass  # an unwritable cache only costs the retry


def forget_failure(library: Path) -> None:
    with contextlib.suppress(OSError):
        failure_marker(library).unlink()


def refusal(library: Path, uid: Optional[int] = None) -> Optional[str]:
    """Why the cached `library` must not be loaded (None: it may): owned by another user, or writable by others.

    `uid`: the owner expected (default: this process's effective user).
    """
    try:
        st = library.stat()
    except OSError as e:
        return f"cannot stat it ({e})"
    if uid is None and hasattr(os, "geteuid"):
        uid = os.geteuid()
    if uid is not None and st.st_uid != uid:
        return f"it is owned by user id {st.st_uid}, not by this user ({uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {stat.filemode(st.st_mode)})"
    return None


def make_private(path: Path) -> None:
    """Drop group/other write bits (a umask of 002 would leave them, and `refusal` would refuse the build)."""
    mode = path.stat().st_mode
    path.chmod(stat.S_IMODE(mode) & ~(stat.S_IWGRP | stat.S_IWOTH))


@contextlib.contextmanager
def build_lock(path: Path, timeout: float) -> Iterator[None]:
    """One build at a time across processes (parallel test workers, several trainers), on any OS.

    Raises `filelock.Timeout` (an OSError) after `timeout` seconds of waiting.
    """
    import filelock

    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(path), timeout=timeout):
        yield


def loadable(target: Path, warn: bool = True) -> bool:
    """Whether a cached build exists and may be loaded (see `refusal`)."""
    if not target.exists():
        return False
    problem = refusal(target)
    if problem and warn:
        log.warning("tb_layergrad: not loading the cached kernel %s: %s; building it again", target, problem)
    return problem is None


def build(target: Path, command: Callable[[Path], List[str]], what: str, announce: str, retry: bool = False) -> Path:
    """`target`, compiled by `command(output)` unless it is cached; raises RuntimeError on failure.

    One build at a time across processes; the library appears at once (renamed into place), private to this
    user. A failed build is remembered (`failure_marker`) and raised again without compiling, unless `retry`.
    `what`: the sources and compiler, for the failure's message; `announce`: what is compiled, for the log.
    """
    if loadable(target):
        return target
    failed = None if retry else remembered_failure(target)
    if failed:
        raise RuntimeError(failed)
    with build_lock(target.with_suffix(".lock"), timeout=BUILD_TIMEOUT_S + 60):
        if loadable(target, warn=False):  # built by another process while this one waited
            return target
        failed = None if retry else remembered_failure(target)  # or failed there
        if failed:
            raise RuntimeError(failed)
        log.warning("tb_layergrad: compiling %s into %s", announce, target.parent)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            _compile(command(partial), what, target)
            make_private(partial)
            os.replace(partial, target)  # atomic: a reader sees no half-written library
        forget_failure(target)
        log.info("tb_layergrad: %s built in %.1f s", target.name, time.perf_counter() - started)
    return target


def _compile(command: List[str], what: str, target: Path) -> None:
    """Runs the compiler; on failure remembers it for `target` and raises RuntimeError."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        message = f"compiling {what} failed: no result after {BUILD_TIMEOUT_S} s"
    else:
        if done.returncode == 0:
            return
        message = f"compiling {what} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    remember_failure(target, message)
    raise RuntimeError(f"{message}\n(later processes do not compile again; {retry_hint(target)})")
