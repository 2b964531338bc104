"""The plugin inside a real `tensorboard` process, with the Rust and the Python loader.

1,000 steps are written with no sampling flag: without the loader's flag fix
TensorBoard would keep 10 (Python) or 100 (Rust) of them. Four servers start at
once on the same logdir (both loaders, with and without a user sampling flag)
so their start-up times overlap.
"""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

from tb_layergrad import metadata
from tb_layergrad.plugin.loader import KEEP_LAST, LayerGradLoader

USER_SAMPLES = 50
CONFIGS = {
    "rust": ("true", []),
    "python": ("false", []),
    "rust_user": ("true", ["--samples_per_plugin", f"layergrad={USER_SAMPLES}"]),
    # ... and with the plugin's own flag: no reading ahead (`plugin.prefetch`), the routes read on request.
    "python_user": (
        "false",
        ["--samples_per_plugin", f"images=3,layergrad={USER_SAMPLES}", "--layergrad_prefetch=false"],
    ),
}
API = "/data/plugin/layergrad/"


pytestmark = pytest.mark.slow  # real processes: several workers, or TensorBoard servers


@pytest.fixture(scope="module")
def servers(tmp_path_factory, plugin_fixtures, tensorboard_process):
    logdir = tmp_path_factory.mktemp("layergrad_big")
    plugin_fixtures.write_big_logdir(str(logdir))
    logs = tmp_path_factory.mktemp("tensorboard_logs")
    names = list(CONFIGS)
    with tensorboard_process.tensorboards(str(logdir), [CONFIGS[n] for n in names], str(logs)) as procs:
        by_name = dict(zip(names, procs))

        def fully_loaded(p):
            # The last step is the last record of the file and is always kept by sampling:
            # once it is visible, the whole file has been read.
            status, body, _ = p.get(API + "runs")
            runs = json.loads(body)["runs"] if status == 200 else []
            return bool(runs) and runs[0]["max_step"] == plugin_fixtures.BIG_STEPS - 1

        for p in procs:
            p.wait_until(fully_loaded, "the last step", timeout=120)
        yield by_name


def get_json(plugin_fixtures, p, path, status=200):
    code, body, ctype = p.get(path)
    assert code == status, body[:300]
    assert ctype.startswith("application/json")
    return plugin_fixtures.strict_json(body)


@pytest.mark.parametrize("name", ["rust", "python"])
def test_all_steps_without_any_flag(servers, name, plugin_fixtures, tolerances):
    body = get_json(plugin_fixtures, servers[name], API + "matrix?run=long&stat=norm")
    assert body["layers"] == list(plugin_fixtures.BIG_LAYERS)
    assert body["steps"] == list(range(plugin_fixtures.BIG_STEPS))
    for i, row in enumerate(body["values"]):
        want = [plugin_fixtures.big_expected_norm(i, s) for s in range(plugin_fixtures.BIG_STEPS)]
        if i == 0:
            want[plugin_fixtures.BIG_NAN_STEP] = (
                None  # an all-NaN tensor: no finite element, no value (docs/FORMAT.md, "Reading stats")
            )
        # 12 equal float32 values: squares and a 12-term sum in float32 at worst (TensorFlow's path),
        # a sqrt halving that and rounding once; the reference's sqrt(12) * v rounds twice in float64.
        if i == 0:
            assert row[plugin_fixtures.BIG_NAN_STEP] is None
            row, want = (
                row[: plugin_fixtures.BIG_NAN_STEP] + row[plugin_fixtures.BIG_NAN_STEP + 1 :],
                want[: plugin_fixtures.BIG_NAN_STEP] + want[plugin_fixtures.BIG_NAN_STEP + 1 :],
            )
        assert row == pytest.approx(
            want,
            rel=tolerances.gamma(12, np.float32) / 2
            + tolerances.gamma(1, np.float32)
            + tolerances.gamma(2, np.float64),
        )
    nonfinite = get_json(plugin_fixtures, servers[name], API + "matrix?run=long&stat=nonfinite")
    assert [s for s, v in zip(nonfinite["steps"], nonfinite["values"][0]) if v] == [plugin_fixtures.BIG_NAN_STEP]
    assert nonfinite["values"][0][plugin_fixtures.BIG_NAN_STEP] == 12
    hist = get_json(plugin_fixtures, servers[name], API + f"histograms?run=long&layer={plugin_fixtures.BIG_LAYERS[1]}")
    assert hist["steps"] == list(range(plugin_fixtures.BIG_STEPS))


@pytest.mark.parametrize("name", ["rust_user", "python_user"])
def test_a_user_sampling_flag_is_respected(servers, name, plugin_fixtures):
    steps = get_json(plugin_fixtures, servers[name], API + "matrix?run=long")["steps"]
    assert len(steps) == USER_SAMPLES
    assert steps[-1] == plugin_fixtures.BIG_STEPS - 1


def test_both_loaders_give_the_same_answers(servers, plugin_fixtures):
    paths = [
        "runs",
        "matrix?run=long&stat=mean",
        "matrix?run=long&stat=nonfinite&start=700&end=800&max_steps=17",
        f"stats?run=long&layer={plugin_fixtures.BIG_LAYERS[0]}",
        f"histograms?run=long&layer={plugin_fixtures.BIG_LAYERS[0]}&start=770&end=780",
        f"compare?run=long&layer={plugin_fixtures.BIG_LAYERS[1]}&stat=max",
        "stats?run=long&layer=nope",
        "matrix?run=long&start=x",
    ]

    def same_part(path, body):
        """The body without what says how far each process's read-ahead has got (its own background work)."""
        doc = plugin_fixtures.strict_json(body)
        for run in doc.get("runs", []) if path == "runs" else []:
            run.pop("statistics_read")
            run.pop("sweep_read")
        return doc

    for path in paths:
        rust = servers["rust"].get(API + path)
        python = servers["python"].get(API + path)
        assert rust[0] == python[0], path
        assert same_part(path, rust[1]) == same_part(path, python[1]), path
    rust_csv, python_csv = servers["rust"].get(API + "csv?run=long"), servers["python"].get(API + "csv?run=long")
    assert rust_csv[0] == 200 and rust_csv[1] == python_csv[1]
    assert rust_csv[1].count(b"\n") == 1 + plugin_fixtures.BIG_STEPS * len(plugin_fixtures.BIG_LAYERS)


@pytest.mark.parametrize("name", ["rust", "python"])
def test_tab_enabled_and_served(servers, name, plugin_fixtures):
    p = servers[name]
    listing = get_json(plugin_fixtures, p, "/data/plugins_listing")["layergrad"]
    assert listing["enabled"] is True
    assert listing["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/layergrad/index.js"}
    code, body, ctype = p.get(API + "index.js")
    assert code == 200 and ctype.split(";")[0] == "text/javascript"
    assert b"function render(" in body and b"export" in body
    assert get_json(plugin_fixtures, p, API + "runs?run=%3Cb%3E", status=404)["error"]
    assert get_json(plugin_fixtures, p, API + "tensor?run=long&layer=net/first&step=-1", status=400)["error"]


@pytest.mark.parametrize(
    "raw",
    [
        "/data/plugin/layergrad/../../../setup.py",
        "/data/plugin/layergrad/%2e%2e/%2e%2e/setup.py",
        "/data/plugin/layergrad/..%2f..%2fsetup.py",
    ],
)
def test_real_server_never_serves_outside_the_frontend(servers, raw):
    p = servers["python"]
    conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=10)
    try:
        conn.request("GET", raw)  # sent verbatim, not normalised by a client library
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 404
    assert b"setup(" not in body


# -- the loader's flag fix, without starting a server ----------------------------------------------


def configured_flags(argv=(), logdir=("--logdir", "/nonexistent"), **kwargs):
    from tensorboard import default, program

    tb = program.TensorBoard(plugins=default.get_plugins() + [LayerGradLoader()])
    tb.configure(argv=["", *logdir, *argv], **kwargs)
    return tb.flags


def test_fix_flags_keeps_the_last_record_of_a_local_logdir_every_record_elsewhere_unless_the_user_says():
    # A local logdir: TensorBoard keeps each series' last record, the plugin reads the event files itself.
    assert configured_flags().samples_per_plugin == {metadata.PLUGIN_NAME: KEEP_LAST}
    assert configured_flags(["--samples_per_plugin", "images=3"]).samples_per_plugin == {
        "images": 3,
        metadata.PLUGIN_NAME: KEEP_LAST,
    }
    assert configured_flags(["--samples_per_plugin", "layergrad=7,images=3"]).samples_per_plugin == {
        "images": 3,
        metadata.PLUGIN_NAME: 7,
    }
    assert configured_flags(samples_per_plugin="scalars=9").samples_per_plugin == {
        "scalars": 9,
        metadata.PLUGIN_NAME: KEEP_LAST,
    }
    # Read by TensorBoard alone (a URL, several logdirs): every record kept, as the user may still say otherwise.
    for logdir in (("--logdir", "gs://bucket/logs"), ("--logdir_spec", "a:/tmp/a,b:/tmp/b")):
        assert configured_flags(logdir=logdir).samples_per_plugin == {metadata.PLUGIN_NAME: 0}
        assert configured_flags(["--samples_per_plugin", "layergrad=7"], logdir=logdir).samples_per_plugin == {
            metadata.PLUGIN_NAME: 7
        }


def test_the_entry_point_is_the_loader():
    from importlib.metadata import distribution

    # The installed distribution's own entry points: `entry_points(group=...)` needs Python 3.10.
    points = distribution("tb-layergrad").entry_points
    found = [ep for ep in points if ep.group == "tensorboard_plugins" and ep.name == metadata.PLUGIN_NAME]
    assert len(found) == 1 and found[0].load() is LayerGradLoader
