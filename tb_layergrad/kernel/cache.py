"""Where the fused kernel is built, with what, and which cached builds may be loaded.

Kept apart from `tb_layergrad.kernel`'s loader and free of TensorFlow so that the tests'
conftest and other tools can ask "can the kernel be built here?" cheaply, and
free of POSIX-only modules so that the package imports on every OS
TensorFlow ships for.

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
import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

ENV_CACHE = "TB_LAYERGRAD_CACHE"
# Named in the message of a remembered failure: it builds again, ignoring the marker.
RETRY_COMMAND = "python -m tb_layergrad.kernel"
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
