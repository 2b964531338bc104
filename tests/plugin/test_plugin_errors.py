"""Bad input never gets a traceback or a 500: every route answers 4xx JSON.

Also the static route: the right content types, and nothing outside the
frontend folder, whatever the spelling of the traversal.
"""

from __future__ import annotations

import os
import re

import pytest

# Every route, in the order their tests run; `routes` gives each one's base query (a valid one).
ROUTE_NAMES = (
    "runs",
    "matrix",
    "stats",
    "histograms",
    "tensor",
    "timesteps",
    "compare",
    "depth",
    "histograms_at",
    "csv",
    "anomalies",
)


@pytest.fixture(scope="module")
def routes(plugin_fixtures):
    """route -> its base query on the small logdir: each answers 200 (test_the_base_queries_are_valid)."""
    return {
        "runs": {},
        "matrix": {"run": "train"},
        "stats": {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER},
        "histograms": {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER},
        "tensor": {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER},
        "timesteps": {"run": "train", "layer": plugin_fixtures.RNN_LAYER},
        "compare": {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER},
        "depth": {"run": "train", "step": "3"},
        "histograms_at": {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER, "step": "3"},
        "csv": {"run": "train"},
        "anomalies": {"run": "train"},
    }


USES = {
    "layer": {"stats", "histograms", "tensor", "timesteps", "compare", "histograms_at"},
    "target": set(ROUTE_NAMES) - {"runs"},
    "source": {"matrix", "stats", "histograms", "tensor", "compare", "depth", "histograms_at", "csv", "anomalies"},
    "stat": {"matrix", "compare", "depth"},
    "start": {"matrix", "stats", "histograms", "timesteps", "compare", "csv", "anomalies"},  # and "end"
    "max_steps": {"matrix", "stats", "histograms", "timesteps", "compare"},
    "step": {"tensor", "depth", "histograms_at"},
}
HOSTILE_NAMES = [
    "nope",
    "../train",
    "../../../../etc/passwd",
    "<script>alert(1)</script>",
    "train\x00",
    "%2e%2e%2ftrain",
    "train/..",
    "TRAIN",
    " train",
    "x" * 5000,
    "\u202etrain",
]
BAD_INTEGERS = [
    "abc",
    "-1",
    "1.5",
    "1e3",
    "0x10",
    " 5",
    "5 ",
    "+5",
    "",
    "NaN",
    "inf",
    "１２",
    "99999999999999999999999",
    "9" * 5000,
    "9223372036854775808",
]


def check_error(plugin_fixtures, response, status):
    text = response.get_data(as_text=True)
    assert response.status_code == status, text[:300]
    assert response.headers["Content-Type"].startswith("application/json"), text[:300]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    body = plugin_fixtures.strict_json(response.get_data())
    assert body["api_version"] == 1 and body["code"] == status
    assert isinstance(body["error"], str) and body["error"]
    assert "Traceback" not in text
    return body


def query(routes, route, **changes):
    q = dict(routes[route])
    for k, v in changes.items():
        if v is None:
            q.pop(k, None)
        else:
            q[k] = v
    return q


def test_the_base_queries_are_valid(tb, routes):
    assert tuple(routes) == ROUTE_NAMES  # every route tested below has its base query
    for route, q in routes.items():
        assert tb.get(route, q).status_code == 200, route


@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_unknown_and_hostile_names_are_404_json(tb, route, routes, plugin_fixtures):
    params = ["run"] + [p for p in ("layer", "target") if route in USES[p]]
    for param in params:
        for name in HOSTILE_NAMES:
            check_error(plugin_fixtures, tb.get(route, query(routes, route, **{param: name})), 404)


@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_missing_empty_and_repeated_names_are_400(tb, route, routes, plugin_fixtures):
    required = [p for p in ("run", "layer") if p in routes[route]]
    for param in required:
        check_error(plugin_fixtures, tb.get(route, query(routes, route, **{param: None})), 400)
    for param in required + [p for p in ("target",) if route in USES[p]] + (["run"] if route == "runs" else []):
        check_error(plugin_fixtures, tb.get(route, query(routes, route, **{param: ""})), 400)
    for param in [p for p in ("layer", "target", "source", "stat") if route in USES.get(p, ())]:
        value = routes[route].get(param, {"target": "loss", "source": "output", "stat": "norm"}.get(param))
        pairs = list(query(routes, route).items()) + [(param, value)]
        if param not in routes[route]:
            pairs.append((param, value))
        check_error(plugin_fixtures, tb.get(route, pairs), 400)
    if route not in ("compare", "depth", "histograms_at"):  # these take several runs on purpose
        pairs = list(query(routes, route).items()) + [("run", "train"), ("run", "eval")]
        check_error(plugin_fixtures, tb.get(route, pairs), 400)


@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_malformed_numbers_are_400(tb, route, routes, plugin_fixtures):
    for param in ("start", "end", "max_steps", "step"):
        if route not in USES["start" if param == "end" else param]:
            continue
        for bad in BAD_INTEGERS:
            check_error(plugin_fixtures, tb.get(route, query(routes, route, **{param: bad})), 400)
        check_error(
            plugin_fixtures, tb.get(route, list(query(routes, route, **{param: "1"}).items()) + [(param, "2")]), 400
        )
    if route in USES["start"]:
        check_error(plugin_fixtures, tb.get(route, query(routes, route, start="7", end="3")), 400)
    if route in USES["max_steps"]:
        check_error(plugin_fixtures, tb.get(route, query(routes, route, max_steps="0")), 400)
        check_error(plugin_fixtures, tb.get(route, query(routes, route, max_steps=str(10**7 + 1))), 400)


@pytest.mark.parametrize("route", ROUTE_NAMES)
def test_bad_enums_are_400(tb, route, routes, plugin_fixtures):
    for param, bad in [
        ("source", "bogus"),
        ("source", "OUTPUT"),
        ("stat", "bogus"),
        ("stat", "<b>norm</b>"),
        ("stat", "__class__"),
        ("source", "../weight"),
    ]:
        if route in USES[param]:
            body = check_error(plugin_fixtures, tb.get(route, query(routes, route, **{param: bad})), 400)
            assert param in body["error"]


def test_valid_but_absent_values_are_not_errors(tb, plugin_fixtures):
    # A step range with no data is an empty answer; the largest int64 is a valid step.
    body = plugin_fixtures.strict_json(tb.get("matrix", {"run": "train", "start": "9223372036854775807"}).get_data())
    assert body["steps"] == [] and all(row == [] for row in body["values"])
    check_error(
        plugin_fixtures,
        tb.get("tensor", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER, "step": "9223372036854775807"}),
        404,
    )
    check_error(
        plugin_fixtures, tb.get("tensor", {"run": "train", "layer": plugin_fixtures.TENSOR_LAYER, "step": "1000"}), 404
    )
    # unknown parameters are ignored (cache busters)
    assert tb.get("runs", {"_": "123", "foo": "<x>"}).status_code == 200


def test_compare_limits(tb, plugin_fixtures):
    LIMIT = 200  # docs/HTTP_API.md: a sweep's runs in one request
    check_error(plugin_fixtures, tb.get("compare", {"layer": plugin_fixtures.TENSOR_LAYER}), 400)
    too_many = [("run", f"r{i}") for i in range(LIMIT + 1)]
    body = check_error(plugin_fixtures, tb.get("compare", too_many + [("layer", plugin_fixtures.TENSOR_LAYER)]), 400)
    assert f"at most {LIMIT} runs" in body["error"] and f"got {LIMIT + 1}" in body["error"]
    check_error(plugin_fixtures, tb.get("noise_scale", too_many), 400)
    body = check_error(plugin_fixtures, tb.get("depth", too_many), 400)
    assert f"at most {LIMIT} runs" in body["error"]
    check_error(plugin_fixtures, tb.get("depth", {}), 400)
    check_error(plugin_fixtures, tb.get("depth", too_many[:-1]), 404)
    check_error(plugin_fixtures, tb.get("depth", [("run", "train"), ("run", "nope")]), 404)
    check_error(plugin_fixtures, tb.get("histograms_at", too_many + [("layer", plugin_fixtures.TENSOR_LAYER)]), 400)
    check_error(plugin_fixtures, tb.get("histograms_at", [("layer", plugin_fixtures.TENSOR_LAYER)]), 400)
    # `layer` once, or once per run: two layers for three runs is a 400 before any name is looked up.
    body = check_error(
        plugin_fixtures,
        tb.get("histograms_at", [("run", "a"), ("run", "b"), ("run", "c"), ("layer", "x"), ("layer", "y")]),
        400,
    )
    assert "once per run (3), got 2" in body["error"]
    check_error(
        plugin_fixtures,
        tb.get("histograms_at", [("run", "train"), ("run", "nope"), ("layer", plugin_fixtures.TENSOR_LAYER)]),
        404,
    )
    check_error(plugin_fixtures, tb.get("histograms_at", [("run", "train"), ("run", "eval"), ("layer", "nope")]), 404)
    # As many as allowed: checked for existence (404), not refused for their number.
    check_error(plugin_fixtures, tb.get("compare", too_many[:-1] + [("layer", plugin_fixtures.TENSOR_LAYER)]), 404)
    check_error(
        plugin_fixtures,
        tb.get("compare", [("run", "train"), ("run", "nope"), ("layer", plugin_fixtures.TENSOR_LAYER)]),
        404,
    )
    check_error(plugin_fixtures, tb.get("compare", [("run", "train"), ("run", "eval"), ("layer", "nope")]), 404)


def test_undecodable_query_bytes(tb, plugin_fixtures):
    check_error(plugin_fixtures, tb.get("stats", "run=%ff%fe&layer=%c0%af"), 404)
    check_error(plugin_fixtures, tb.get("matrix", "run=train&start=%ff"), 400)
    check_error(plugin_fixtures, tb.get("matrix", "run=train&stat=%00"), 400)


def test_html_in_names_is_only_json_data(tb, plugin_fixtures):
    r = tb.get("stats", {"run": "<img src=x onerror=alert(1)>", "layer": "x"})
    body = check_error(plugin_fixtures, r, 404)
    assert "<img" in body["error"]  # quoted back as data, in a JSON (not HTML) response


@pytest.mark.parametrize("route", [*ROUTE_NAMES, "index.js"])
def test_other_methods_are_405_json(tb, route, routes, plugin_fixtures):
    r = tb.client.post("/data/plugin/layergrad/" + route, query_string=routes.get(route, {}), data="x")
    check_error(plugin_fixtures, r, 405)


def test_unknown_route_is_404_json(tb, plugin_fixtures):
    check_error(plugin_fixtures, tb.get("nope"), 404)
    check_error(plugin_fixtures, tb.get("runs/extra"), 404)


# -- static files ---------------------------------------------------------------------------------


def test_index_js_is_served_as_javascript(tb):
    r = tb.get("index.js")
    assert r.status_code == 200
    assert r.headers["Content-Type"].split(";")[0] == "text/javascript"
    assert re.search(rb"export (async )?function render\(", r.get_data())


@pytest.fixture(scope="module")
def frontend_dir(tmp_path_factory, small_logdir):
    root = tmp_path_factory.mktemp("frontend")
    files = {
        "index.js": b"export function render() {}\n",
        "app.mjs": b"export const a = 1;\n",
        "style.css": b"body{}",
        "page.html": b"<!doctype html><p>x</p>",
        "icon.svg": b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        "pic.png": b"\x89PNG\r\n\x1a\n",
        "data.json": b"{}",
        "vendor/lib.js": b"export default 1;",
        "vendor/deep/x.js": b"export default 2;",
        "LICENSES/lib.txt": b"MIT",
        "secret.py": b"SECRET = 1",
        ".hidden.js": b"hidden",
    }
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    outside = root.parent / "outside.js"
    outside.write_bytes(b"OUTSIDE")
    os.symlink(outside, root / "link.js")
    os.symlink(root.parent, root / "up")
    return root


@pytest.fixture(scope="module")
def tb_static(small_logdir, frontend_dir, plugin_fixtures):
    return plugin_fixtures.InProcess(small_logdir.logdir, frontend_root=frontend_dir)


def test_static_content_types(tb_static, frontend_dir):
    expect = {
        "index.js": "text/javascript",
        "app.mjs": "text/javascript",
        "style.css": "text/css",
        "page.html": "text/html",
        "icon.svg": "image/svg+xml",
        "pic.png": "image/png",
        "data.json": "application/json",
        "vendor/lib.js": "text/javascript",
        "vendor/deep/x.js": "text/javascript",
        "LICENSES/lib.txt": "text/plain",
    }
    for name, ctype in expect.items():
        r = tb_static.get(name)
        assert r.status_code == 200, name
        assert r.headers["Content-Type"].split(";")[0] == ctype, name
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.get_data() == (frontend_dir / name).read_bytes()


TRAVERSALS = [
    "../setup.py",
    "../../setup.py",
    "..%2fsetup.py",
    "%2e%2e/setup.py",
    "%2e%2e%2fsetup.py",
    "%252e%252e%252fsetup.py",
    "..%5csetup.py",
    "..\\setup.py",
    "vendor/../../setup.py",
    "vendor/../index.js",
    "./index.js",
    "/etc/passwd",
    "//etc/passwd",
    "%2fetc%2fpasswd",
    "C:/Windows/win.ini",
    "C:%5cwin.ini",
    "index.js%00.png",
    "secret.py",
    ".hidden.js",
    "link.js",
    "up/outside.js",
    "vendor",
    "vendor/",
    "nope.js",
    "..",
    "...",
    "....//setup.py",
    "vendor//lib.js",
    "%c0%ae%c0%ae/setup.py",
    "index.js;.png",
    "index.js?x=../../setup.py&",
    "~/x.js",
    "$HOME/x.js",
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_static_traversal_is_404(tb_static, path, plugin_fixtures):
    r = tb_static.client.get("/data/plugin/layergrad/" + path)
    if path.startswith("index.js?"):  # the query string is not part of the path: index.js itself
        assert r.status_code == 200
        return
    check_error(plugin_fixtures, r, 404)
    assert b"OUTSIDE" not in r.get_data() and b"SECRET" not in r.get_data()


def test_static_traversal_with_raw_environ(tb_static):
    """Paths a client library would normalise, sent verbatim as WSGI PATH_INFO."""
    from werkzeug.test import EnvironBuilder, run_wsgi_app

    for raw in [
        "/data/plugin/layergrad/../../../setup.py",
        "/data/plugin/layergrad/..",
        "/data/plugin/layergrad/%2e%2e/x.js",
        "/data/plugin/layergrad/up/../link.js",
        "/data/plugin/layergrad/\x00index.js",
    ]:
        env = EnvironBuilder(path="/").get_environ()
        env["PATH_INFO"] = raw
        app_iter, status, headers = run_wsgi_app(tb_static.app, env)
        body = b"".join(app_iter)
        code = int(status.split()[0])
        assert code == 404, (raw, status, body[:200])
        assert b"OUTSIDE" not in body


def test_frontend_root_from_an_installed_package(tmp_path, monkeypatch):
    """As installed from a wheel: `tb_layergrad.frontend` is a package folder without __init__.py."""
    import sys

    from tb_layergrad.plugin import static

    pkg = tmp_path / "fakepkg" / "front"
    pkg.mkdir(parents=True)
    (tmp_path / "fakepkg" / "__init__.py").write_text("")
    (pkg / "index.js").write_bytes(b"export function render() {}")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(static, "FRONTEND_PACKAGE", "fakepkg.front")
    root = static.frontend_root()
    assert root.resolve() == pkg.resolve()
    assert static.StaticFiles().read("index.js") == (b"export function render() {}", "text/javascript")
    sys.modules.pop("fakepkg.front", None)
    sys.modules.pop("fakepkg", None)


def test_frontend_root_in_a_source_checkout(monkeypatch):
    """A legacy `pip install -e .` does not map the package: the checkout's frontend/ is used."""
    import pathlib

    import tb_layergrad
    from tb_layergrad.plugin import static

    monkeypatch.setattr(static, "FRONTEND_PACKAGE", "tb_layergrad_no_such_package.frontend")
    checkout = pathlib.Path(tb_layergrad.__file__).resolve().parent.parent
    assert static.frontend_root() == checkout / "frontend"
