"""Route fuzzing: generated query strings and paths, in-process.

Every route of `LayerGradPlugin.get_plugin_apps` gets hypothesis-generated queries: valid names
(which are themselves hostile: HTML, unicode, `../`, quotes and newlines, see reliability_fixtures),
unknown/HTML/unicode/`../` names, huge and negative steps, wrong types, repeated and missing
parameters, unknown keys, raw undecodable query bytes, GET and HEAD. Every answer must be a 2xx or
4xx, JSON (the CSV route: CSV on 200), strict (no NaN literals), carry `api_version`, never hold a
traceback, and nothing may be logged as an internal error. A 200 must also be internally
consistent (aligned arrays, steps ascending and inside the asked range, at most `max_steps`) and,
where the logdir says what the number is, hold that number.

The static route (`index.js` and `/*`) gets generated paths, sent verbatim as PATH_INFO: it may
only ever answer 404 or the bytes of a file inside its folder.
"""

from __future__ import annotations

import collections
import csv
import io
import logging
import os
import re
from typing import Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.test import EnvironBuilder, run_wsgi_app

from tb_layergrad.plugin.loader import LayerGradPlugin

SCALE = int(os.environ.get("RELIABILITY_EXAMPLES_SCALE", "1"))
QUERY_EXAMPLES = 150 * SCALE  # per route
RAW_EXAMPLES = 150 * SCALE
STATIC_EXAMPLES = 300 * SCALE
API = "/data/plugin/layergrad/"

USES = {
    "runs": ["run"],
    "matrix": ["run", "stat", "target", "source", "start", "end", "max_steps"],
    "stats": ["run", "layer", "target", "source", "start", "end", "max_steps"],
    "histograms": ["run", "layer", "target", "source", "start", "end", "max_steps"],
    "tensor": ["run", "layer", "target", "source", "step"],
    "timesteps": ["run", "layer", "target", "start", "end", "max_steps"],
    "compare": ["run", "layer", "stat", "target", "source", "start", "end", "max_steps"],
    "csv": ["run", "layer", "target", "source", "start", "end"],
    "anomalies": ["run", "layer", "target", "source", "start", "end"],
    "examples": ["run", "layer", "target", "source", "start", "end", "points", "step"],
    "noise_scale": ["run", "start", "end", "smoothing"],
    "hparams": ["run"],
    "sweep": ["target", "source"],
    "depth": ["run", "stat", "target", "source", "step"],
    "histograms_at": ["run", "layer", "target", "source", "step"],
}
# Routes that read per-example records: fuzzed on tests/examples_fixtures.py's logdir, which has them;
# `anomalies` (its `dominated`) there too, besides the hostile logdir.
ON_EXAMPLES = {"examples", "noise_scale"}
ALSO_ON_EXAMPLES = {"anomalies", "sweep"}
HOSTILE = [
    "",
    "nope",
    "../train",
    "../../../../etc/passwd",
    "<script>alert(1)</script>",
    "train\x00",
    "%2e%2e%2f",
    "TRAIN",
    " train",
    "x" * 5000,
    "\u202etrain",
    "🚀",
    "\ud7ff",
    "null",
    "undefined",
    "__proto__",
    "constructor",
    "[]",
    "{}",
    "\\..\\",
    "a\r\nSet-Cookie: x=1",
    "\ufeff",
]
BAD_INTS = [
    "",
    "-1",
    "-0",
    "+5",
    " 5",
    "5 ",
    "1.5",
    "1e3",
    "0x10",
    "NaN",
    "inf",
    "１２",
    "٣",
    "9" * 5000,
    "9223372036854775808",
    "99999999999999999999999",
    "true",
    "[1]",
    "1,2",
    "0b1",
    "1_000",
]


def test_every_route_is_fuzzed():
    """The route table is what this file fuzzes: a new route must be added to USES."""
    from tensorboard.plugins import base_plugin

    routes = LayerGradPlugin(base_plugin.TBContext(data_provider=None)).get_plugin_apps()
    assert set(routes) == {"/" + r for r in USES} | {"/index.js", "/*"}


@pytest.fixture(scope="module")
def with_examples(tmp_path_factory, examples_fixtures, plugin_fixtures):
    logdir = str(tmp_path_factory.mktemp("with_examples"))
    examples_fixtures.write_examples_logdir(logdir)
    return plugin_fixtures.InProcess(logdir), {
        run: list(examples_fixtures.LAYERS)
        for run in (
            examples_fixtures.RUN,
            examples_fixtures.RENAMED,
            examples_fixtures.PLAIN,
            examples_fixtures.PLAIN_V1,
        )
    }


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, plugin_fixtures, reliability_fixtures):
    logdir = str(tmp_path_factory.mktemp("hostile"))
    written = reliability_fixtures.write_hostile_logdir(logdir)
    return plugin_fixtures.InProcess(logdir), written


# -- strategies -----------------------------------------------------------------------------------


def _names(written):
    runs = sorted(written)
    layers = sorted({layer for ls in written.values() for layer in ls})
    return st.one_of(st.sampled_from(runs), st.sampled_from(layers), st.sampled_from(HOSTILE), st.text(max_size=30))


_INTS = st.one_of(
    st.integers(0, 12).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(BAD_INTS),
    st.text(alphabet="0123456789+-.eExX_ ", max_size=25),
)


@st.composite
def queries(
    draw, reliability_fixtures, plugin_fixtures, route: str, written: Dict[str, List[str]]
) -> List[Tuple[str, str]]:
    names = _names(written)
    values = {
        "run": names,
        "layer": names,
        "target": st.one_of(st.sampled_from(["loss", reliability_fixtures.HOSTILE_TARGET]), names),
        "source": st.one_of(st.sampled_from(["output", "weight"]), names),
        "stat": st.one_of(st.sampled_from(plugin_fixtures.HTTP_STATS + plugin_fixtures.EXAMPLE_STATS), names),
        "start": _INTS,
        "end": _INTS,
        "step": _INTS,
        "max_steps": _INTS,
        "points": _INTS,
        "smoothing": st.one_of(
            st.sampled_from(["0", "0.6", ".999", "1", "0.9999", "-0", "1e-3", "0.6 ", "nan"]), _INTS
        ),
    }
    pairs: List[Tuple[str, str]] = []
    if draw(st.integers(0, 3)):  # mostly: a valid run (and layer) to mutate
        run = draw(st.sampled_from(sorted(written)))
        pairs.append(("run", run))
        if "layer" in USES[route]:
            pairs.append(("layer", draw(st.sampled_from(written[run]))))
    keys = st.one_of(
        st.sampled_from(USES[route]), st.sampled_from(["_", "RUN", "run[]", "", "foo", "layer "]), st.text(max_size=6)
    )
    for _ in range(draw(st.integers(0, 5))):
        key = draw(keys)
        pairs.append((key, draw(values.get(key, names))))
    if pairs and draw(st.booleans()):  # drop one
        pairs.pop(draw(st.integers(0, len(pairs) - 1)))
    return draw(st.permutations(pairs))


_RAW_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789%&=+;._-~:/?[]@!$'()*,<>\" "
RAW_QUERIES = st.lists(
    st.one_of(
        st.text(alphabet=_RAW_ALPHABET, max_size=12),
        st.sampled_from(
            [
                "%ff",
                "%00",
                "%c0%af",
                "%",
                "%%",
                "%zz",
                "%e2%82",
                "run=",
                "=train",
                "&&",
                "run=train",
                "layer=m%2fdense",
                "start=1",
                "step=%31",
                "+",
            ]
        ),
    ),
    max_size=8,
).map("".join)


# -- checks ---------------------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.requests = 0
        self.status = collections.Counter()


def _ints(pairs, key):
    values = [v for k, v in pairs if k == key]
    if len(values) == 1 and re.fullmatch(r"[0-9]{1,19}", values[0]):
        return int(values[0])
    return None


def check_ok_json(plugin_fixtures, reliability_fixtures, route: str, pairs, body: dict) -> None:
    """A 200 is consistent with itself, with the query and with what the logdir holds."""
    steps = body.get("steps")
    if steps is not None:
        assert all(isinstance(s, int) for s in steps)
        assert steps == sorted(set(steps))
        start, end, most = _ints(pairs, "start"), _ints(pairs, "end"), _ints(pairs, "max_steps")
        if route != "tensor":
            assert start is None or all(s >= start for s in steps)
            assert end is None or all(s <= end for s in steps)
            assert most is None or len(steps) <= most
    if route == "runs":
        assert isinstance(body["runs"], list) and isinstance(body["warnings"], list)
    elif route == "matrix":
        assert len(body["values"]) == len(body["layers"]) and all(len(r) == len(steps) for r in body["values"])
    elif route == "stats":
        assert set(body["stats"]) == set(plugin_fixtures.HTTP_STATS)
        assert all(len(col) == len(steps) for col in body["stats"].values()) and len(body["wall_times"]) == len(steps)
        assert body["stats"]["norm"] == [reliability_fixtures.norm(body["index"], s) for s in steps]
    elif route == "histograms":
        assert len(body["histograms"]) == len(steps)
        assert all(h == reliability_fixtures.histogram(s).tolist() for h, s in zip(body["histograms"], steps))
    elif route == "tensor":
        assert body["step"] in steps and len(body["values"]) == body["shape"][0]
        assert body["nonfinite"] == [[0, 1, "nan"], [0, 2, "+inf"], [1, 0, "-inf"]]
    elif route == "timesteps":
        assert len(body["norms"]) == len(steps)
    elif route == "compare":
        assert len(body["values"]) == len(body["runs"]) and all(len(r) == len(steps) for r in body["values"])
        assert set(body["missing"]) <= set(body["runs"])
    elif route == "examples":
        per_step = ["min", "max", "top_share", "examples", "status"] + (
            ["last_steps", "counts"] if body.get("binned") else ["median"]
        )
        assert all(len(body[name]) == len(steps) for name in per_step)
        step = _ints(pairs, "step")
        assert step is None or body["at"]["step"] == step
    elif route == "anomalies":
        assert len(body["layers"]) and all(len(entry["flags"]) == len(steps) for entry in body["layers"])
        start, end = _ints(pairs, "start"), _ints(pairs, "end")
        for d in body.get("dominated", ()):  # within the range, a layer of the answer, more than half
            assert (start is None or d["first_step"] >= start) and (end is None or d["worst_step"] <= end)
            assert d["layer"] in [entry["layer"] for entry in body["layers"]] and d["worst_share"] > 0.5
    elif route == "noise_scale":
        assert set(body["missing"]) <= set(body["runs"]) and len(body["series"]) + len(body["missing"]) == len(
            body["runs"]
        )
        start, end = _ints(pairs, "start"), _ints(pairs, "end")
        for r in body["series"]:
            assert r["steps"] == sorted(set(r["steps"])) and all(
                len(r[k]) == len(r["steps"]) for k in ("trace", "signal")
            )
            assert (start is None or all(x >= start for x in r["steps"])) and (
                end is None or all(x <= end for x in r["steps"])
            )


def check_response(
    plugin_fixtures,
    reliability_fixtures,
    route: str,
    pairs,
    method: str,
    response,
    errors_logged,
    tally: Tally,
    written,
) -> None:
    tally.requests += 1
    code = response.status_code
    tally.status[f"{code // 100}xx"] += 1
    text = response.get_data(as_text=True)
    where = f"{method} {route} {pairs!r} -> {code} {text[:300]!r}"
    assert 200 <= code < 300 or 400 <= code < 500, where
    assert not errors_logged(), f"an error was logged: {where}"
    assert "Traceback" not in text, where
    assert response.headers["X-Content-Type-Options"] == "nosniff", where
    ctype = response.headers["Content-Type"]
    if method == "HEAD":
        return
    if route == "csv" and code == 200:
        assert ctype == "text/csv; charset=utf-8", where
        disposition = response.headers["Content-Disposition"]
        assert re.fullmatch(r'attachment; filename="layergrad-[A-Za-z0-9._-]+\.csv"', disposition), where
        rows = list(csv.reader(io.StringIO(text)))
        assert rows[0][:7] == ["run", "target", "source", "layer", "index", "step", "wall_time"], where
        assert all(len(row) == len(rows[0]) for row in rows), where  # names with , " and newlines stay quoted
        run = dict(pairs)["run"]
        assert all(row[0] == run and row[3] in written.get(run, ()) for row in rows[1:]), where
        return
    assert ctype.startswith("application/json"), where
    body = plugin_fixtures.strict_json(response.get_data())
    assert body["api_version"] == 1, where
    if code >= 400:
        assert body["code"] == code and isinstance(body["error"], str) and body["error"], where
    else:
        check_ok_json(plugin_fixtures, reliability_fixtures, route, pairs, body)


@pytest.fixture
def errors_logged(caplog):
    caplog.set_level(logging.ERROR)

    def logged() -> bool:
        found = [r for r in caplog.records if r.levelno >= logging.ERROR]
        caplog.clear()
        return bool(found)

    return logged


_SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize(
    "route,logdir",
    [(r, "examples" if r in ON_EXAMPLES else "hostile") for r in USES]
    + [(r, "examples") for r in sorted(ALSO_ON_EXAMPLES)],
)
@pytest.mark.slow
def test_generated_queries(hostile, with_examples, errors_logged, route, logdir, plugin_fixtures, reliability_fixtures):
    tb, written = with_examples if logdir == "examples" else hostile
    tally = Tally()

    @settings(max_examples=QUERY_EXAMPLES, **_SETTINGS)
    @given(pairs=queries(reliability_fixtures, plugin_fixtures, route, written), head=st.integers(0, 9))
    def prop(pairs, head):
        method = "HEAD" if head == 0 else "GET"
        response = tb.client.open(API + route, method=method, query_string=pairs)
        check_response(
            plugin_fixtures, reliability_fixtures, route, pairs, method, response, errors_logged, tally, written
        )

    prop()
    reliability_fixtures.record("routes", f"generated queries: {route}", tally.requests, **tally.status)
    assert tally.status["2xx"] > 0 and tally.status["4xx"] > 0, tally.status  # both sides were reached


def test_raw_query_strings(hostile, errors_logged, plugin_fixtures, reliability_fixtures):
    """Undecodable percent-escapes, stray `%`, `;` and `&&`: sent as the raw QUERY_STRING."""
    tb, _ = hostile
    tally = Tally()

    @settings(max_examples=RAW_EXAMPLES, **_SETTINGS)
    @given(route=st.sampled_from(list(USES)), raw=RAW_QUERIES)
    def prop(route, raw):
        env = EnvironBuilder(path=API + route).get_environ()
        env["QUERY_STRING"] = raw
        app_iter, status, headers = run_wsgi_app(tb.app, env)
        body = b"".join(app_iter)
        code = int(status.split()[0])
        tally.requests += 1
        tally.status[f"{code // 100}xx"] += 1
        where = f"{route}?{raw!r} -> {status} {body[:300]!r}"
        assert 200 <= code < 300 or 400 <= code < 500, where
        assert not errors_logged() and b"Traceback" not in body, where
        if dict(headers)["Content-Type"].startswith("application/json"):
            assert plugin_fixtures.strict_json(body)["api_version"] == 1, where
        else:
            assert route == "csv" and code == 200, where

    prop()
    reliability_fixtures.record("routes", "raw query strings", tally.requests, **tally.status)


# -- static files ---------------------------------------------------------------------------------


def reaches_plugin(env) -> bool:
    """Whether TensorBoard routes this request to the plugin at all.

    TensorBoard parses the path as a URL (a `;` starts URL parameters) and strips one trailing
    slash: `.../layergrad/` or `.../layergrad/;x` get TensorBoard's own text 404, not the plugin's.
    """
    from urllib.parse import urlparse

    from tensorboard.backend.application import _clean_path
    from werkzeug.wrappers import Request

    return _clean_path(urlparse(Request(env).path).path).startswith(API)


SEGMENTS = [
    "index.js",
    "app.js",
    "style.css",
    "lib.js",
    "x.js",
    "vendor",
    "deep",
    "..",
    ".",
    "",
    "...",
    "%2e%2e",
    "%2E%2e",
    "%252e%252e",
    "..%2f",
    "%2f",
    "%5c",
    "\\",
    "..\\..",
    "%00",
    "index.js%00.png",
    "\x00",
    "secret.py",
    ".hidden.js",
    "link.js",
    "up",
    "outside.js",
    "~",
    "C:",
    "ü.js",
    "a" * 300,
    ";",
    "index.js;.png",
    "%c0%ae",
    "runs",
    "data",
    "plugin",
    "layergrad",
    "..;",
    "%",
    "//",
]


@pytest.fixture(scope="module")
def frontend(tmp_path_factory, hostile, plugin_fixtures):
    """A frontend folder with files, a secret outside it, symlinks out of it."""
    base = tmp_path_factory.mktemp("static_fuzz")
    root = base / "frontend"
    files = {
        "index.js": b"export function render() {}\n",
        "app.js": b"export const app = 1;\n",
        "style.css": b"body{}",
        "vendor/lib.js": b"export default 1;",
        "vendor/deep/x.js": b"export default 2;",
        "secret.py": b"SECRET = 1",
        ".hidden.js": b"HIDDEN",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (base / "outside.js").write_bytes(b"OUTSIDE")
    os.symlink(base / "outside.js", root / "link.js")
    os.symlink(base, root / "up")
    servable = {data for name, data in files.items() if name.endswith((".js", ".css")) and not name.startswith(".")}
    return plugin_fixtures.InProcess(hostile[0].logdir, frontend_root=root), servable


def test_generated_static_paths(frontend, errors_logged, plugin_fixtures, reliability_fixtures):
    tb, servable = frontend
    tally = Tally()

    @settings(max_examples=STATIC_EXAMPLES, **_SETTINGS)
    @given(segments=st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=10), lead=st.sampled_from(["", "/", "//"]))
    def prop(segments, lead):
        raw = API + lead + "/".join(segments)
        env = EnvironBuilder(path="/").get_environ()
        env["PATH_INFO"] = raw.encode("utf-8").decode("latin-1")  # verbatim, as a server passes it
        app_iter, status, headers = run_wsgi_app(tb.app, env)
        body = b"".join(app_iter)
        code = int(status.split()[0])
        tally.requests += 1
        tally.status[f"{code // 100}xx"] += 1
        where = f"{raw!r} -> {status} {body[:200]!r}"
        assert not errors_logged(), where
        assert b"OUTSIDE" not in body and b"SECRET" not in body and b"HIDDEN" not in body, where
        if code == 200:
            assert body in servable or plugin_fixtures.strict_json(body)["api_version"] == 1, (
                where
            )  # a file, or an API route
        elif not reaches_plugin(env):
            assert code == 404 and body == b"Not found", where  # TensorBoard's own answer
        else:
            assert 400 <= code < 500 and plugin_fixtures.strict_json(body)["code"] == code, where

    prop()
    reliability_fixtures.record("routes", "generated static paths", tally.requests, **tally.status)
    assert tally.status["2xx"] > 0, tally.status


def test_real_frontend_serves_only_its_files(hostile, errors_logged, plugin_fixtures, reliability_fixtures):
    """The installed frontend: whatever path, a 200 is the content of a file under frontend/."""
    from tb_layergrad.plugin import static

    tb = hostile[0]
    root = static.frontend_root()
    inside = {p.read_bytes() for p in root.rglob("*") if p.is_file()}
    tally = Tally()

    @settings(max_examples=100 * SCALE, **_SETTINGS)
    @given(
        segments=st.lists(
            st.sampled_from(
                SEGMENTS + ["frontend", "setup.py", "README.md", "tb_layergrad", "__init__.py", "charts", "views"]
            ),
            min_size=1,
            max_size=6,
        )
    )
    def prop(segments):
        raw = API + "/".join(segments)
        env = EnvironBuilder(path="/").get_environ()
        env["PATH_INFO"] = raw.encode("utf-8").decode("latin-1")
        app_iter, status, _ = run_wsgi_app(tb.app, env)
        body = b"".join(app_iter)
        code = int(status.split()[0])
        tally.requests += 1
        tally.status[f"{code // 100}xx"] += 1
        assert not errors_logged()
        assert code == 404 or (
            code == 200 and (body in inside or plugin_fixtures.strict_json(body)["api_version"] == 1)
        ), raw

    prop()
    reliability_fixtures.record("routes", "generated paths, real frontend", tally.requests, **tally.status)
