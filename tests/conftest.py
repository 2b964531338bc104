"""Shared pytest set-up: deterministic seeds.

TensorFlow's log level is left as the user has it: the tests' subprocesses then see what a user sees
(tb-layergrad's commands must be quiet without TF_CPP_MIN_LOG_LEVEL).
"""

import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time
from unittest import mock

import pytest

CHECKOUT = pathlib.Path(__file__).resolve().parents[1]


def _is_checkout(entry: str) -> bool:
    return pathlib.Path(entry or os.getcwd()).resolve() == CHECKOUT


# The tests check the package a user installs, not this source tree: `python -m pytest`, started in the
# checkout, puts the checkout first on sys.path, where `import tb_layergrad` would find the sources instead.
# Nothing here has imported tb_layergrad yet (conftest.py loads first); test_packaging.py asserts where it came from.
sys.path[:] = [entry for entry in sys.path if not _is_checkout(entry)]

from console_script import CLI  # noqa: E402 - after the path above is set

# The session fixtures every room shares (logdirs written once): found by pytest, not imported by each test.
pytest_plugins = ["plugin_fixtures", "report_fixtures", "origin_fixtures"]

# The shared helper modules reach the tests as fixtures (below; a room's own in its conftest.py), never by `import`:
# a test names what it uses in its signature, `pytest --fixtures` lists them, and tests/test_layout.py keeps it so.


@pytest.fixture(autouse=True, scope="session")
def _outside_the_checkout(tmp_path_factory):
    """The tests, and the programs they start, run from a folder outside the checkout, as a user's code does: a
    `python -c` or `python -m tb_layergrad` started in the checkout would import its sources, not the package."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same random state (Keras initializers, tf.random)."""
    try:
        import keras
    except ImportError:  # plugin-only environments
        return
    keras.utils.set_random_seed(1234)


def pytest_collection_modifyitems(config, items):
    """A test marked `browser`, `kernel` or `installed` skips, with a one-line reason, where its requirement is
    missing.

    The reasons start with `kernel_cache.MISSING`, which .ci/run looks for: CI has every requirement (and
    installs the wheel, not an editable checkout), so such a skip there is a failure.
    """
    missing = {}
    for item in items:
        for marker in ("browser", "kernel", "installed"):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in missing:
                missing[marker] = requirement_missing(marker)
            if missing[marker]:
                item.add_marker(pytest.mark.skip(reason=missing[marker]))


def requirement_missing(marker: str):
    """`kernel_cache.MISSING + why` when this machine lacks what tests marked `marker` need, else None."""
    from tb_layergrad.kernel import cache as kernel_cache

    if marker == "installed":
        import tb_layergrad

        if CHECKOUT in pathlib.Path(tb_layergrad.__file__).resolve().parents:
            return (
                f"{kernel_cache.MISSING} a wheel install (tb_layergrad is imported from the checkout: pip install -e)"
            )
        return None
    if marker == "browser":
        from tab_fixtures import CHROMIUM

        if not os.path.exists(CHROMIUM):
            return f"{kernel_cache.MISSING} Chromium ({CHROMIUM}; Debian: apt-get install chromium)"
        return None
    why = kernel_cache.unavailable_reason()
    return f"{kernel_cache.MISSING} {why}" if why else None


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """`tb-layergrad demo --quick`, run once as a real subprocess, and its `tb-layergrad report --format json`."""
    logdir = str(tmp_path_factory.mktemp("demo") / "logs")
    started = time.monotonic()
    r = subprocess.run([CLI, "demo", "--quick", "--logdir", logdir], capture_output=True, text=True, timeout=400)
    elapsed = time.monotonic() - started
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    rep = subprocess.run([CLI, "report", logdir, "--format", "json"], capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    # `runs`: target loss, the demo's runs but one; `by_target`: every (run, target) reported (the gan's two)
    runs = {r["run"]: r for r in doc["runs"] if r["target"] == "loss"}
    by_target = {(r["run"], r["target"]): r for r in doc["runs"]}
    layers = {name: {l["layer"].split("/", 1)[1]: l for l in r["layers"]} for name, r in runs.items()}
    print(f"demo --quick: {elapsed:.0f} s")
    return {
        "logdir": logdir,
        "stdout": r.stdout,
        "elapsed": elapsed,
        "runs": runs,
        "by_target": by_target,
        "layers": layers,
    }


@pytest.fixture(scope="session")
def demo_plan():
    """What `tb-layergrad demo --quick` plants, as the demo defines it: the ground truth its report, routes and tab
    are checked against outside tests/cli/ (which checks the demo itself). `runs` / `tensorflow_only`: its runs, and
    those that train on TensorFlow only; `steps`: the quick plan's steps per kind of run; `nan_forward_step` /
    `nan_backward_step`: the batches where a NaN / Inf is born; `sweep_runs`, `sweep_run_name(lr, activation)`;
    the GAN's `d_target`, `g_target`, `g_output` and `gan_vanish` (where TensorFlow is installed: the GAN run
    needs it); `mislabelled_positions(steps)`; and
    `inputs_with_one_bad_batch(steps, bad_step, scale, seed)`, the data that makes the NaN runs break."""
    import types

    from tb_layergrad.cli import demo, demo_nan, demo_sweep

    gan = {}
    if importlib.util.find_spec("tensorflow") is not None:  # the GAN run is TensorFlow's own (not on the JAX leg)
        from tb_layergrad.cli import demo_gan

        gan = dict(
            d_target=demo_gan.D_TARGET,
            g_target=demo_gan.G_TARGET,
            g_output=demo_gan.G_OUTPUT,
            gan_vanish=demo_gan.GAN_VANISH,
        )
    return types.SimpleNamespace(
        runs=demo.RUN_NAMES,
        tensorflow_only=demo.TENSORFLOW_ONLY,
        steps=demo.Plan.for_mode(quick=True),
        nan_forward_step=demo_nan.NAN_FORWARD_STEP,
        nan_backward_step=demo_nan.NAN_BACKWARD_STEP,
        sweep_runs=demo_sweep.RUN_NAMES,
        sweep_run_name=demo_sweep.run_name,
        mislabelled_positions=demo.mislabelled_positions,
        inputs_with_one_bad_batch=demo_nan.inputs_with_one_bad_batch,
        **gan,
    )


@pytest.fixture(scope="session")
def verdicts():
    """A layer's verdict states as documented, not as coded (the tests' independent expectation): `states`, most
    serious first (docs/ANOMALIES.md, "One verdict"), and `severity`, the rank the `sweep` route gives a run's worst
    one (docs/HTTP_API.md)."""
    import types

    states = (
        "nan_origin",
        "nonfinite",
        "exploding",
        "dead",
        "vanishing",
        "vanishing_over_steps",
        "vanishing_through_time",
        "dominated",
        "ok",
    )
    severity = {"nan_origin": 4, "nonfinite": 4, "exploding": 3, "dead": 2, "ok": 0}
    severity.update({s: 1 for s in ("vanishing", "vanishing_over_steps", "vanishing_through_time", "dominated")})
    return types.SimpleNamespace(states=states, severity=severity)


# --- the helper modules every room may use, one namespace fixture each ---


@pytest.fixture(scope="session")
def charts_fixtures():
    """tests/charts_fixtures.py, as a namespace: the logdir of the tab's chart tests
    (tests/tab/test_tab_charts_e2e.py), written with the real summary ops."""
    return importlib.import_module("charts_fixtures")


@pytest.fixture(scope="session")
def console_script():
    """tests/console_script.py, as a namespace: the installed `tb-layergrad` console script, found beside this
    interpreter."""
    return importlib.import_module("console_script")


@pytest.fixture(scope="session")
def dominated_fixtures():
    """tests/dominated_fixtures.py, as a namespace: a run written by the real capture and summary ops with per-
    example records of the outputs AND the weights, one example planted to dominate one step (docs/ANOMALIES.md,
    "One example dominates"), and what the routes must say about it, computed independently
    (tests/per_example_reference.py: one tape per example, its own loss on a batch of one) and reduced with numpy."""
    return importlib.import_module("dominated_fixtures")


@pytest.fixture(scope="session")
def examples_fixtures():
    """tests/examples_fixtures.py, as a namespace: runs with per-example records (kind `examples`, docs/FORMAT.md)
    and noise-scale scalars, written by hand."""
    return importlib.import_module("examples_fixtures")


@pytest.fixture(scope="session")
def fit_helpers():
    """tests/fit_helpers.py, as a namespace: helpers for the fit()/GradientLogger tests (tests/test_fit_*.py,
    tests/test_timesteps*.py)."""
    return importlib.import_module("fit_helpers")


@pytest.fixture(scope="session")
def hparams_fixtures():
    """tests/hparams_fixtures.py, as a namespace: a logdir of small fits whose hyperparameters were logged with
    TensorBoard's HParams API."""
    return importlib.import_module("hparams_fixtures")


@pytest.fixture(scope="session")
def known_answer_fixtures():
    """tests/known_answer_fixtures.py, as a namespace: runs whose answer is set by construction, written by the real
    capture and summary ops, to measure the detectors (docs/ANOMALIES.md, "How well the rules find what they look
    for")."""
    return importlib.import_module("known_answer_fixtures")


@pytest.fixture(scope="session")
def long_fixtures():
    """tests/long_fixtures.py, as a namespace: a long run (100,000 steps) for the binned routes and the tab's zoom,
    written fast."""
    return importlib.import_module("long_fixtures")


@pytest.fixture(scope="session")
def model_zoo():
    """tests/model_zoo.py, as a namespace: small models of every kind the capture must handle, each with a by-hand
    forward."""
    return importlib.import_module("model_zoo")


@pytest.fixture(scope="session")
def numpy_reference():
    """tests/numpy_reference.py, as a namespace: the statistics of docs/FORMAT.md recomputed with plain numpy in
    float64, independently of the reductions."""
    return importlib.import_module("numpy_reference")


@pytest.fixture(scope="session")
def origin_fixtures():
    """tests/origin_fixtures.py, as a namespace: a logdir where a NaN is born in each pass, written with the real
    summary ops (docs/ANOMALIES.md, "Where it broke")."""
    return importlib.import_module("origin_fixtures")


@pytest.fixture(scope="session")
def per_example_reference():
    """tests/per_example_reference.py, as a namespace: independent per-example gradients for the per-example write
    tests: one tape per example, its own loss on a batch of one (no capture, no rule), and the numbers the
    `examples` records and the noise scale must hold, computed in numpy from docs/FORMAT.md ("Per-example records")
    as written there."""
    return importlib.import_module("per_example_reference")


@pytest.fixture(scope="session")
def plugin_fixtures():
    """tests/plugin_fixtures.py, as a namespace: test logdirs for the plugin tests, written with the real summary
    ops, and helpers."""
    return importlib.import_module("plugin_fixtures")


@pytest.fixture(scope="session")
def reference_checks():
    """tests/reference_checks.py, as a namespace: the reductions' numbers checked against an exact reference:
    float64, overflow-safe (scaled by a power of two) and exactly rounded sums (`math.fsum`), with bounds derived
    from the dtype and the reduction length (tests/tolerances.py)."""
    return importlib.import_module("reference_checks")


@pytest.fixture(scope="session")
def reliability_fixtures():
    """tests/reliability_fixtures.py, as a namespace: helpers of the reliability tests (test_reliability_*.py): fast
    event writing, hostile names, counts."""
    return importlib.import_module("reliability_fixtures")


@pytest.fixture(scope="session")
def report_fixtures():
    """tests/report_fixtures.py, as a namespace: planted logdirs for the anomaly route and report tests, and an
    independent numpy evaluation."""
    return importlib.import_module("report_fixtures")


@pytest.fixture(scope="session")
def tb_reading():
    """tests/tb_reading.py, as a namespace: read layergrad records back through TensorBoard's own data provider."""
    return importlib.import_module("tb_reading")


@pytest.fixture(scope="session")
def tensorboard_process():
    """tests/tensorboard_process.py, as a namespace: a real `tensorboard` process for the tests, the tab's browser
    tests, scripts/screenshots.py and bench/."""
    return importlib.import_module("tensorboard_process")


@pytest.fixture(scope="session")
def tolerances():
    """tests/tolerances.py, as a namespace: test tolerances derived from the dtype and the reduction length
    (docs/DESIGN.md, "Tolerances")."""
    return importlib.import_module("tolerances")


# --- the command, in this process ---


@pytest.fixture
def report_command():
    """`tb-layergrad report ARGS...` run in this process (`tb_layergrad.cli.main`, the command's entry point):
    `(exit status, stdout, stderr)`. Tests of the report go through the command, not the report's modules."""
    import contextlib
    import io

    from tb_layergrad import cli

    def run(*args: str):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["report", *map(str, args)])
        return code, out.getvalue(), err.getvalue()

    return run


@pytest.fixture
def report_json(report_command):
    """`tb-layergrad report LOGDIR ARGS... --format json`, read: the document (the command must succeed)."""

    def run(logdir, *args: str) -> dict:
        code, out, err = report_command(logdir, *args, "--format", "json")
        assert code == 0, err
        return json.loads(out)

    return run


# --- the fused kernel, on and off in one process ---


@pytest.fixture(scope="session")
def fused_kernel():
    """The fused kernel's switch in this process: `off()`, a context inside which a step is traced with TensorFlow's
    ops (what TB_LAYERGRAD_FUSED=0, a GPU, macOS or ARM get), `missing()` / `write_missing()`: why its op / its
    write op is not used here (None when it is), and `cannot_attempt()`: why no build can even be tried here
    (platform, no compiler; None where one can, and nothing is built). `off()` sets TB_LAYERGRAD_FUSED=0, the
    user's switch, read each time a step is traced; a session-wide fixture because `monkeypatch` is per test."""
    import types

    from tb_layergrad.kernel import cache, fused

    def missing():
        return None if fused.op() is not None else fused.unavailable_reason()

    def write_missing():
        if fused.write_op() is not None:
            return None
        return fused.unavailable_reason() or "the fused write op cannot write to TensorFlow's summary writers here"

    def off():
        return mock.patch.dict(os.environ, {cache.ENV_SWITCH: "0"})

    return types.SimpleNamespace(
        off=off, missing=missing, write_missing=write_missing, cannot_attempt=cache.unavailable_reason
    )


@pytest.fixture
def tensorflow_ops(fused_kernel):
    """The test runs (and traces its steps) with TensorFlow's ops instead of the fused kernel."""
    with fused_kernel.off():
        yield
