"""The command line starts fast and quiet: `report`, `load()` and `--version` import no TensorFlow.

Each runs in a fresh interpreter with the environment a user has (no TF_CPP_MIN_LOG_LEVEL), and
TensorFlow is installed there: what is checked is that nothing imports it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import tb_layergrad


def user_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP_")}


def python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=user_env()
    )


def test_tensorflow_is_installed_here():
    """Without it the checks below would pass for the wrong reason."""
    assert python("import importlib.util; assert importlib.util.find_spec('tensorflow')").returncode == 0


@pytest.mark.parametrize("fmt", ["text", "json", "csv"])
def test_report_writes_nothing_to_stderr_and_imports_no_tensorflow(planted, fmt, report_fixtures):
    done = python(f"""
        import sys
        from tb_layergrad import cli
        status = cli.main(["report", {planted.logdir!r}, "--format", {fmt!r}])
        assert "tensorflow" not in sys.modules, sorted(m for m in sys.modules if m.startswith("tensorflow"))[:5]
        sys.exit(status)
    """)
    assert (done.returncode, done.stderr) == (0, "")
    assert report_fixtures.RUN in done.stdout


def test_report_failing_condition_reports_only_its_failures_on_stderr(planted, report_fixtures):
    done = python(f"""
        import sys
        from tb_layergrad import cli
        status = cli.main(["report", {planted.logdir!r}, "--run", {report_fixtures.RUN!r}, "--format", "json", "--fail-on", "nan"])
        assert "tensorflow" not in sys.modules
        sys.exit(status)
    """)
    assert done.returncode == 3
    assert done.stderr.splitlines() and all(line.startswith("FAIL nan: ") for line in done.stderr.splitlines())


@pytest.mark.slow
def test_load_imports_no_tensorflow_and_tensorflow_summaries_work_after_it(planted, tmp_path, report_fixtures):
    """The reader's TensorFlow-free file access is scoped to the read: TensorFlow's own summaries (which
    TensorBoard resolves through the same lazy module) still work when TensorFlow is imported later."""
    done = python(f"""
        import sys
        import tb_layergrad
        df = tb_layergrad.load({planted.logdir!r})
        assert "tensorflow" not in sys.modules
        print(len(df), sorted(df.run.unique()))
        import tensorflow as tf
        writer = tf.summary.create_file_writer({str(tmp_path)!r})
        with writer.as_default(step=0):
            assert tf.summary.histogram("h", [1.0, 2.0]) and tf.summary.scalar("s", 1.0)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"'{report_fixtures.RUN}'" in done.stdout


def scripts_command() -> str:
    found = shutil.which("tb-layergrad", path=sysconfig.get_path("scripts"))
    assert found, "the console script is not installed beside this interpreter"
    return found


def test_version_from_the_console_script_and_python_dash_m():
    for argv in ([scripts_command(), "--version"], [sys.executable, "-m", "tb_layergrad", "--version"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=user_env())
        assert (done.returncode, done.stderr) == (0, ""), argv
        assert done.stdout.strip() == f"tb-layergrad {tb_layergrad.__version__}", argv


def test_python_dash_m_runs_the_report(planted, report_fixtures):
    done = subprocess.run(
        [sys.executable, "-m", "tb_layergrad", "report", planted.logdir, "--run", report_fixtures.RUN],
        capture_output=True,
        text=True,
        timeout=120,
        env=user_env(),
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("tb-layergrad report")


def test_version_imports_no_tensorflow():
    done = python("""
        import sys
        from tb_layergrad import cli
        try:
            cli.main(["--version"])
        except SystemExit as e:
            assert e.code == 0
        assert "tensorflow" not in sys.modules
    """)
    assert done.returncode == 0, done.stderr
