"""The fused kernel's cache on any OS: no POSIX-only import, failed builds remembered, unsafe libraries refused.

The compilers here are small shell scripts that count their runs in a file, so that no test pays for a
real build; the real build is tests/kernel/test_fused_kernel.py's.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tb_layergrad
from tb_layergrad import metadata
from tb_layergrad.kernel import cache as kernel_cache

LINUX_X86_64 = pytest.mark.skipif(
    kernel_cache.supported_platform() is not None, reason="the fused kernel is attempted on Linux x86-64 only"
)


def fake_compiler(path: Path, version: str, succeed: bool) -> Path:
    """A `c++` that answers --version and the predefined-macros query (`-dM -E`, asked before a build, see
    `loader._target_flags`), appends a line to `<path>.runs` per compile, then fails or writes `-o`."""
    runs = path.with_suffix(".runs")
    result = (
        'umask 002\nwhile [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then echo built > "$2"; chmod 775 "$2"; fi; shift; done\nexit 0'
        if succeed
        else 'echo "fakecxx: error: this compiler always fails" >&2\nexit 1'
    )
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "fakecxx {version}"; exit 0; fi\n'
        'case " $* " in *" -dM "*) echo "#define __x86_64__ 1"; exit 0;; esac\n'
        f'echo run >> "{runs}"\n{result}\n'
    )
    path.chmod(0o755)
    return path


def runs_of(compiler: Path) -> int:
    runs = compiler.with_suffix(".runs")
    return len(runs.read_text().splitlines()) if runs.exists() else 0


@pytest.mark.slow
def test_imports_and_writes_summaries_where_fcntl_does_not_exist(tmp_path, tb_reading):
    """As on Windows: `import fcntl` fails. Every module imports (a backend's room where that backend is
    installed: JAX's imports jax), the build lock works, summaries are written."""
    code = textwrap.dedent(f"""
        import sys
        sys.modules["fcntl"] = None  # `import fcntl` now raises ImportError
        import importlib, importlib.util, pkgutil
        from pathlib import Path
        import tensorflow as tf
        import tb_layergrad
        for m in pkgutil.walk_packages(tb_layergrad.__path__, "tb_layergrad."):
            if m.name.startswith("tb_layergrad.jax") and importlib.util.find_spec("jax") is None:
                continue
            importlib.import_module(m.name)
        from tb_layergrad.kernel import cache as kernel_cache
        with kernel_cache.build_lock(Path({str(tmp_path / "x.lock")!r}), timeout=30):
            pass
        writer = tf.summary.create_file_writer({str(tmp_path / "logs" / "run")!r})
        with writer.as_default(step=3):
            tb_layergrad.summary.gradients({{"net/dense": tf.constant([[1.0, -2.0], [0.5, 4.0]])}})
        writer.close()
        print("imported", len(list(pkgutil.walk_packages(tb_layergrad.__path__))), "modules")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported" in done.stdout
    records = tb_reading.read_all(str(tmp_path / "logs"))["run"]
    info, datums = records["loss/output/net/dense/stats"]
    assert info.layer == "net/dense" and [d.step for d in datums] == [3]
    stats = datums[0].numpy
    S = metadata.STAT_INDEX
    assert stats[S["elements"]] == 4 and stats[S["max"]] == 4.0 and stats[S["min"]] == -2.0
    np.testing.assert_allclose(stats[S["norm"]], np.sqrt(1 + 4 + 0.25 + 16), rtol=1e-6)


def test_no_module_of_the_package_imports_a_posix_only_module():
    """The subprocess test above covers fcntl at run time; this names the module that would break Windows."""
    root = Path(tb_layergrad.__file__).parent
    posix_only = ("fcntl", "termios", "pwd", "grp", "resource", "posix")
    offenders = []
    for m in pkgutil.walk_packages([str(root)], "tb_layergrad."):
        source = root.joinpath(*m.name.split(".")[1:])
        source = source / "__init__.py" if m.ispkg else source.with_suffix(".py")
        for line in source.read_text(encoding="utf-8").splitlines():
            words = line.replace(",", " ").split()
            if words[:1] in (["import"], ["from"]) and any(w in posix_only for w in words[1:2]):
                offenders.append(f"{m.name}: {line.strip()}")
    assert not offenders


@LINUX_X86_64
@pytest.mark.slow
def test_a_failing_compiler_is_tried_once_across_processes(tmp_path):
    cxx = fake_compiler(tmp_path / "c++", "1.0", succeed=False)
    env = dict(os.environ, CXX=str(cxx), **{kernel_cache.ENV_CACHE: str(tmp_path / "cache")})
    env.pop("TB_LAYERGRAD_FUSED", None)
    code = (
        "from tb_layergrad.kernel import fused as fused_kernel\n"
        "print(fused_kernel.op() is None)\nprint(fused_kernel.unavailable_reason())\n"
    )

    def process():
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.splitlines()[0] == "True"  # TensorFlow's ops are used
        return done

    first = process()
    assert runs_of(cxx) == 1
    assert "this compiler always fails" in first.stderr and "TensorFlow ops are used instead" in first.stderr
    markers = list((tmp_path / "cache").glob("*.failed"))
    assert len(markers) == 1 and "always fails" in markers[0].read_text()
    assert str(markers[0]) in first.stderr  # the log line says how to retry

    second = process()
    assert runs_of(cxx) == 1  # not compiled again
    assert "not retried" in second.stderr and str(markers[0]) in second.stderr and "always fails" in second.stderr
    assert kernel_cache.RETRY_COMMAND in second.stderr

    # Another compiler version is another build: it is tried (once).
    fake_compiler(cxx, "2.0", succeed=False)
    process()
    process()
    assert runs_of(cxx) == 2


@LINUX_X86_64
def test_retry_and_deleting_the_marker_compile_again(tmp_path, monkeypatch):
    from tb_layergrad.kernel import fused as fused_kernel

    monkeypatch.setenv(kernel_cache.ENV_CACHE, str(tmp_path / "cache"))
    cxx = fake_compiler(tmp_path / "c++", "1.0", succeed=False)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            fused_kernel.build(str(cxx))
    assert runs_of(cxx) == 1
    with pytest.raises(RuntimeError, match="always fails"):
        fused_kernel.build(str(cxx), retry=True)
    assert runs_of(cxx) == 2
    kernel_cache.failure_marker(fused_kernel.library_path(str(cxx))).unlink()
    with pytest.raises(RuntimeError, match="always fails"):
        fused_kernel.build(str(cxx))
    assert runs_of(cxx) == 3


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="file ownership is POSIX's")
def test_refusal_names_the_owner_and_writable_modes(tmp_path):
    lib = tmp_path / "k.so"
    lib.write_bytes(b"x")
    lib.chmod(0o755)
    assert kernel_cache.refusal(lib) is None
    assert "owned by user id" in kernel_cache.refusal(lib, uid=os.geteuid() + 1)
    lib.chmod(0o775)
    assert "writable by its group" in kernel_cache.refusal(lib)
    lib.chmod(0o757)
    assert "writable by others" in kernel_cache.refusal(lib)
    assert "cannot stat" in kernel_cache.refusal(tmp_path / "missing.so")


@LINUX_X86_64
@pytest.mark.parametrize("mode", [0o775, 0o777], ids=["group-writable", "world-writable"])
def test_a_cached_library_writable_by_others_is_rebuilt_not_loaded(tmp_path, monkeypatch, caplog, mode):
    from tb_layergrad.kernel import fused as fused_kernel

    monkeypatch.setenv(kernel_cache.ENV_CACHE, str(tmp_path / "cache"))
    cxx = fake_compiler(tmp_path / "c++", "1.0", succeed=True)
    target = fused_kernel.library_path(str(cxx))
    target.parent.mkdir(parents=True)
    target.write_text("planted")
    target.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="tb_layergrad"):
        assert fused_kernel.build(str(cxx)) == target
    assert runs_of(cxx) == 1 and target.read_text() == "built\n"
    assert "not loading the cached kernel" in caplog.text and "writable by" in caplog.text
    # The compiler left its output group-writable (umask 002): the cache stores it private.
    assert not stat.S_IMODE(target.stat().st_mode) & (stat.S_IWGRP | stat.S_IWOTH)
    assert fused_kernel.build(str(cxx)) == target and runs_of(cxx) == 1  # now loadable: no new build


def test_cache_folder_is_the_users_unless_overridden(monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.delenv(kernel_cache.ENV_CACHE, raising=False)
    assert kernel_cache.cache_dir() == Path(platformdirs.user_cache_dir("tb_layergrad", appauthor=False))
    monkeypatch.setenv(kernel_cache.ENV_CACHE, str(tmp_path))
    assert kernel_cache.cache_dir() == tmp_path
