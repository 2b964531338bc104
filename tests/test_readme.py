"""The README's quickstart runs as written and writes what it promises; CI runs the README's test command."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def quickstart_code() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quickstart") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quickstart_is_short_and_runs(tmp_path, monkeypatch, tb_reading, tolerances):
    code = quickstart_code()
    assert len([line for line in code.splitlines() if line.strip()]) <= 16
    monkeypatch.chdir(tmp_path)
    code = code.replace("range(100)", "range(3)")
    scope: dict = {}
    exec(compile(code, "README quickstart", "exec"), scope)
    recs = tb_reading.read_all(str(tmp_path / "logs"))["seed"]
    info, datums = recs["loss/output/my_model/minimalrnn/stats"]
    assert [d.step for d in datums] == [0, 1, 2]
    # The last logged step holds the norm of the gradient the script computed.
    grads = scope["grads"]
    g = grads["my_model/minimalrnn"].numpy()
    norm = np.linalg.norm(g)
    # Both sides: n squares (1 rounding each) summed in any order in float32 at worst (numpy here,
    # TensorFlow's path where the kernel is not built), a sqrt halving that and rounding once more.
    rtol = tolerances.TWO_SIDES * (tolerances.gamma(g.size, np.float32) / 2 + tolerances.gamma(1, np.float32))
    np.testing.assert_allclose(datums[-1].numpy[9], norm, rtol=rtol)


# -- the README's commands and .ci/run -------------------------------------------------------------

CI_RUN = README.parent / ".ci" / "run"
TEST_COMMAND = "pip install '.[cpu,test]' && python -m pytest -q"


def readme_test_commands() -> list:
    """The README's lines that install and run the tests (its first screen)."""
    text = README.read_text(encoding="utf-8")
    return [
        line.split(" #")[0].strip()
        for line in text.splitlines()
        if "python -m pytest" in line and "pip install" in line
    ]


def test_the_readme_names_one_test_command_with_tensorflow_from_the_cpu_extra():
    assert readme_test_commands() == [TEST_COMMAND]


def test_ci_runs_the_readmes_test_command_exactly_in_a_fresh_venv_and_sets_no_variable():
    script = CI_RUN.read_text(encoding="utf-8")
    lines = [line.strip() for line in script.splitlines()]
    assert any(line.startswith("{ " + TEST_COMMAND + "; }") for line in lines), "the README's command, verbatim"
    main_body = script[script.index("main() {") :]
    assert main_body.index("fresh_venv main") < main_body.index(TEST_COMMAND)
    assert '"${2:-python3}" -m venv' in script, "every venv is new"
    assert not [line for line in lines if line.startswith("export ")]
    assert "TF_CPP_MIN_LOG_LEVEL" not in script and "PIP_" not in script


def test_every_test_file_ci_names_exists():
    """.ci/run names test files and globs for its older legs: each names at least one file of the checkout (a
    moved or renamed test file is renamed there too)."""
    script = CI_RUN.read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w/])tests/[\w/*.\-]+\.py", script))
    assert named, "the older legs name their tests"
    assert not [name for name in sorted(named) if not list(README.parent.glob(name))]


def ci_helper(call: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """Runs one of .ci/run's shell functions (the script, sourced, runs nothing of its own)."""
    return subprocess.run(
        ["bash", "-c", f'source "{CI_RUN}" && {call}'], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def pytest_output(tmp_path: pathlib.Path, env: dict) -> pathlib.Path:
    """The real output of one test marked `kernel`, run as CI runs the suite (pytest.ini's options)."""
    node = "tests/kernel/test_fused_kernel.py::test_build_is_cached_per_source_and_tensorflow"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", node],
        cwd=README.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = tmp_path / f"pytest-{done.returncode}.log"
    log.write_text(done.stdout + done.stderr)
    return log


@pytest.mark.slow
def test_ci_fails_when_a_test_skipped_for_a_missing_compiler(tmp_path, fused_kernel):
    no_compiler = {k: v for k, v in os.environ.items() if k != "CXX"}
    no_compiler["PATH"] = str(tmp_path / "empty")  # no c++, g++ or clang++
    skipped = pytest_output(tmp_path, no_compiler)
    text = skipped.read_text()
    assert re.search(r"^SKIPPED \[1\] tests/kernel/test_fused_kernel\.py(:\d+)?: missing here: ", text, re.M), text
    done = ci_helper(f'check_pytest 0 "{skipped}"', tmp_path)
    assert done.returncode == 1 and "skipped for a missing requirement" in done.stderr

    if fused_kernel.cannot_attempt() is None:  # here the compiler is found: the same test runs and passes
        ran = pytest_output(tmp_path, dict(os.environ))
        assert "1 passed" in ran.read_text()
        assert ci_helper(f'check_pytest 0 "{ran}"', tmp_path).returncode == 0


def test_ci_fails_when_pytest_ran_no_test_or_failed(tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("no tests ran in 0.01s\n")
    done = ci_helper(f'check_pytest 5 "{log}"', tmp_path)
    assert done.returncode != 0 and "ran no test" in done.stderr
    assert ci_helper(f'check_pytest 1 "{log}"', tmp_path).returncode == 1
