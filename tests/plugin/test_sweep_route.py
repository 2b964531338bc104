"""The `sweep` route in-process: one row per run, each number checked against the routes that show it run by run.

The logdirs are those of the other route tests (`plugin_fixtures`: a NaN, a second target, an evaluation run;
`examples_fixtures`: one example dominating a layer, the noise-scale scalars). Every health field of a row
must be what the `anomalies`, `matrix` and `noise_scale` routes say of the same run; the global norm's trend
and the smoothed noise scale are recomputed here with numpy from what those routes send.
"""

from __future__ import annotations

import numpy as np
import pytest

HEALTH_FIELDS = ("last_step", "layers", "severity", "verdict", "first_nonfinite", "latest", "dominated_steps")


@pytest.fixture(scope="module")
def ex(tmp_path_factory, examples_fixtures, plugin_fixtures):
    written = examples_fixtures.write_examples_logdir(str(tmp_path_factory.mktemp("sweep_examples")))
    return written, plugin_fixtures.InProcess(written.logdir)


def expected_norm_trend(plugin_fixtures, tb, run, target, window=20):
    """log10 of the global norm (every layer recorded and finite at the step), fitted over the last `window`
    such steps, times their span: from the `matrix` route's norms and NaN counts."""
    norm = plugin_fixtures.get_json(tb, "matrix", {"run": run, "stat": "norm", "target": target})
    bad = plugin_fixtures.get_json(tb, "matrix", {"run": run, "stat": "nonfinite", "target": target})
    n = np.array([[np.nan if v is None else v for v in row] for row in norm["values"]], dtype=np.float64)
    b = np.array([[np.nan if v is None else v for v in row] for row in bad["values"]], dtype=np.float64)
    steps = np.asarray(norm["steps"], np.float64)
    total = np.sqrt((n**2).sum(axis=0))
    ok = ~np.isnan(n).any(axis=0) & (np.nan_to_num(b, nan=1).sum(axis=0) == 0) & np.isfinite(total) & (total > 0)
    x, y = steps[ok][-window:], np.log10(total[ok][-window:])
    if x.size < 3:
        return None
    return float(np.polyfit(x, y, 1)[0] * (x[-1] - x[0]))


def expected_row(plugin_fixtures, verdicts, tb, run, target, source="output"):
    """The health fields of a run's row from its `anomalies` route (`verdicts`: the documented order and ranks)."""
    a = plugin_fixtures.get_json(tb, "anomalies", {"run": run, "target": target, "source": source})
    s = a["summary"]
    states = [layer["verdict"]["state"] for layer in a["layers"]]
    worst = min(states, key=verdicts.states.index)
    where = s["origin"] or s["first_nonfinite"]
    first = None if where is None else {"step": where["step"], "pass": where.get("pass"), "origin": where.get("origin")}
    dominated = a.get("dominated")
    return {
        "last_step": s["last_step"],
        "layers": s["layers"],
        "severity": verdicts.severity[worst],
        "verdict": worst,
        "first_nonfinite": first,
        "latest": s["latest"],
        "dominated_steps": None if dominated is None else sum(d["steps"] for d in dominated),
    }, s["findings"]


def health_of(row):
    out = {k: row[k] for k in HEALTH_FIELDS}
    if out["first_nonfinite"] is not None:
        out["first_nonfinite"] = {k: row["first_nonfinite"][k] for k in ("step", "pass", "origin")}
    return out


def test_each_row_is_what_the_anomalies_route_says_of_the_run(tb, plugin_fixtures, verdicts):
    body = plugin_fixtures.get_json(tb, "sweep", {})
    assert body["source"] == "output" and body["target"] is None
    by_run = {r["run"]: r for r in body["runs"]}
    assert set(by_run) == {"train", "eval"}  # the run of a newer format is skipped, as by every route
    assert any(plugin_fixtures.FUTURE_RUN in w for w in body["warnings"])
    for run, row in by_run.items():
        assert row["target"] == "loss"
        want, findings = expected_row(plugin_fixtures, verdicts, tb, run, "loss")
        assert health_of(row) == want
        assert row["line"] == findings[0]["line"] if findings else row["line"].startswith("no finding")
        assert row["norm_trend"] == pytest.approx(
            expected_norm_trend(plugin_fixtures, tb, run, "loss"), rel=1e-9, abs=1e-12
        )
        assert row["noise_scale_end"] is None and row["dominated_steps"] is None and row["hparams"] == {}
    train = by_run["train"]
    assert train["verdict"] == "nonfinite" and train["severity"] == 4 and train["first_nonfinite"]["step"] == 5
    findings = expected_row(plugin_fixtures, verdicts, tb, "train", "loss")[1]
    assert train["first_nonfinite"]["line"] == next(f["line"] for f in findings if f["kind"] == "nonfinite")


def test_a_target_asked_is_every_rows(tb, plugin_fixtures, verdicts):
    body = plugin_fixtures.get_json(tb, "sweep", {"target": plugin_fixtures.AUX_TARGET})
    by_run = {r["run"]: r for r in body["runs"]}
    for run, row in by_run.items():
        assert row["target"] == plugin_fixtures.AUX_TARGET
        runs = plugin_fixtures.get_json(tb, "runs", {"run": run})["runs"][0]
        if plugin_fixtures.AUX_TARGET in runs["targets"]:
            assert health_of(row) == expected_row(plugin_fixtures, verdicts, tb, run, plugin_fixtures.AUX_TARGET)[0]
        else:  # still listed, health unknown
            assert row["verdict"] is None and row["severity"] is None and row["layers"] == 0


def test_measures_name_numeric_fields_of_every_row(tb, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "sweep", {})
    keys = [m["key"] for m in body["measures"]]
    assert len(keys) == len(set(keys))
    for m in body["measures"]:
        assert m["label"] and m["kind"]
        for row in body["runs"]:
            value = row
            for part in m["key"].split("."):
                value = None if value is None else value[part]
            assert value is None or isinstance(value, (int, float)) and not isinstance(value, bool), m["key"]


def test_dominance_and_noise_scale_against_their_routes(ex, examples_fixtures, plugin_fixtures, verdicts):
    written, tb = ex
    by_run = {r["run"]: r for r in plugin_fixtures.get_json(tb, "sweep", {})["runs"]}
    for run, row in by_run.items():
        assert health_of(row) == expected_row(plugin_fixtures, verdicts, tb, run, "loss")[0]
    assert (
        by_run[examples_fixtures.RUN]["dominated_steps"] >= 1
        and by_run[examples_fixtures.PLAIN]["dominated_steps"] is None
    )
    noise = plugin_fixtures.get_json(tb, "noise_scale", {"run": examples_fixtures.RUN})["series"][0]
    w = 0.6  # TensorBoard's default smoothing, the tab's

    def ema(ys):
        out, last, n = [], 0.0, 0
        for y in ys:
            if y is None:
                out.append(None)
                continue
            last, n = last * w + (1 - w) * y, n + 1
            out.append(last / (1 - w**n))
        return out

    t, g = ema(noise["trace"]), ema(noise["signal"])
    ends = [a / b for a, b in zip(t, g) if a is not None and b is not None and b > 0]
    assert by_run[examples_fixtures.RUN]["noise_scale_end"] == pytest.approx(ends[-1], rel=1e-12)
    assert by_run[examples_fixtures.PLAIN]["noise_scale_end"] is None


def test_an_unchanged_sweep_recomputes_nothing(tmp_path, plugin_fixtures, long_fixtures):

    logdir = str(tmp_path)
    for name in ("a", "b"):  # two runs of steps 0..5
        long_fixtures.write_run(f"{logdir}/{name}", ["m/x", "m/y"], 6, keep=False, format_version=2)
    tb = plugin_fixtures.InProcess(logdir)
    health = tb.plugin._routes.reading.health  # noqa: SLF001 - what was computed
    first = plugin_fixtures.get_json(tb, "sweep", {})
    assert health.computed == 2
    assert plugin_fixtures.get_json(tb, "sweep", {}) == first and health.computed == 2
    longer = tmp_path / "longer"
    long_fixtures.write_run(str(longer), ["m/x", "m/y"], 9, keep=False, format_version=2)
    (longer / "events.out.tfevents.1.long.v2").rename(tmp_path / "b" / "events.out.tfevents.2.long.v2")
    tb.multiplexer.Reload()
    again = {r["run"]: r for r in plugin_fixtures.get_json(tb, "sweep", {})["runs"]}
    assert again["b"]["last_step"] == 8 and again["a"]["last_step"] == 5
    assert health.computed == 3  # b again, not a


@pytest.mark.parametrize(
    "query, message",
    [({"source": "gradient"}, "source"), ({"target": ""}, "target"), ({"target": ["a", "b"]}, "target")],
)
def test_bad_queries_are_400(tb, query, message, plugin_fixtures):
    body = plugin_fixtures.get_json(tb, "sweep", query, status=400)
    assert message in body["error"]


def test_the_read_ahead_computes_the_rows_a_first_request_needs(tmp_path, plugin_fixtures, long_fixtures):
    import functools

    from tb_layergrad.plugin import prefetch, sweep_impl

    logdir = str(tmp_path)
    for name in ("a", "b"):
        long_fixtures.write_run(f"{logdir}/{name}", ["m/x", "m/y", "m/z"], 30, keep=False, format_version=2)
    tb = plugin_fixtures.InProcess(logdir)
    reading = tb.plugin._routes.reading  # noqa: SLF001 - the plugin's own caches
    pre = prefetch.StatsPrefetcher(reading.stats, reading.lister, then=functools.partial(sweep_impl.warm, reading))

    def sweep_read():
        return {r["run"]: r["sweep_read"] for r in plugin_fixtures.get_json(tb, "runs", {})["runs"]}

    assert sweep_read() == {"a": False, "b": False}
    pre.warm_once()  # sees the runs; their last blocks may still be being written
    pre.warm_once()  # reads them, then computes their rows
    assert sweep_read() == {"a": True, "b": True} and reading.health.computed == 2
    body = plugin_fixtures.get_json(tb, "sweep", {})
    assert reading.health.computed == 2  # the first request computed nothing
    assert body == plugin_fixtures.get_json(
        plugin_fixtures.InProcess(logdir), "sweep", {}
    )  # and its rows are those a request computes
    other = plugin_fixtures.get_json(tb, "sweep", {"source": "weight"})  # another query: its own rows (none here)
    assert [r["layers"] for r in other["runs"]] == [0, 0]


def test_warnings_are_said_on_every_poll(tb, plugin_fixtures):
    first, again = plugin_fixtures.get_json(tb, "sweep", {}), plugin_fixtures.get_json(tb, "sweep", {})
    assert first["warnings"] and again["warnings"] == first["warnings"]


@pytest.mark.parametrize("source", ["output", "activation"])
def test_where_each_run_broke_as_the_fixture_states_it(
    origin_logdir, source, plugin_fixtures, origin_fixtures, verdicts
):

    tb = plugin_fixtures.InProcess(origin_logdir.logdir)
    by_run = {r["run"]: r for r in plugin_fixtures.get_json(tb, "sweep", {"source": source})["runs"]}
    assert set(by_run) == set(origin_fixtures.RUNS)
    for run, row in by_run.items():
        want = origin_fixtures.expected(run)
        a = plugin_fixtures.get_json(
            tb, "anomalies", {"run": run, "source": source}, status=200 if row["layers"] else 404
        )
        if not row["layers"]:  # a run without activations, asked for them: listed, its health unknown
            assert source == "activation" and run not in origin_fixtures.WITH_ACTIVATIONS and row["verdict"] is None
            continue
        assert health_of(row) == expected_row(plugin_fixtures, verdicts, tb, run, "loss", source)[0], run
        assert {k: row["first_nonfinite"][k] for k in ("step", "pass", "origin")} == {
            k: want[k] for k in ("step", "pass", "origin")
        }
        assert row["first_nonfinite"]["line"] == a["summary"]["origin"]["line"]
        if source == "output" and want["pass"] in ("forward", "backward"):  # born in one of the rows
            assert row["verdict"] == "nan_origin" and row["severity"] == 4


def test_a_run_a_request_read_gets_its_row_at_the_next_pass(tmp_path, plugin_fixtures, long_fixtures):
    import functools

    from tb_layergrad.plugin import prefetch, sweep_impl

    logdir = str(tmp_path)
    for name in ("a", "b"):
        long_fixtures.write_run(f"{logdir}/{name}", ["m/x", "m/y"], 20, keep=False, format_version=2)
    tb = plugin_fixtures.InProcess(logdir)
    reading = tb.plugin._routes.reading  # noqa: SLF001 - the plugin's own caches
    pre = prefetch.StatsPrefetcher(reading.stats, reading.lister, then=functools.partial(sweep_impl.warm, reading))
    plugin_fixtures.get_json(tb, "matrix", {"run": "a"})  # the request reads run a, not the read-ahead
    assert pre.warm_once() == []  # the first pass reads nothing (every tag is new)...
    runs = {r["run"]: r["sweep_read"] for r in plugin_fixtures.get_json(tb, "runs", {})["runs"]}
    assert runs == {"a": True, "b": False}  # ...but computes the row of the run held
    before = reading.health.computed
    pre.warm_once()
    assert reading.health.computed == before + 1  # b, once read; a is not computed again


def test_a_run_without_loss_is_rowed_on_its_worst_target(tmp_path, plugin_fixtures, known_answer_fixtures):
    """A custom step's run (targets `discriminator`, `generator`, no `loss`): the row is about the target in the
    worst state, as the anomalies route says of each, so a Runs view never calls a run "ok" whose generator's
    gradient collapses."""
    import os

    import tensorflow as tf

    import tb_layergrad

    model = known_answer_fixtures._model([tf.Variable(1.0), tf.Variable(1.0)])
    writer = tf.summary.create_file_writer(os.path.join(str(tmp_path), "gan_like"))
    rng = np.random.default_rng(3)
    with writer.as_default():
        for step in range(known_answer_fixtures.STEPS):
            f = (
                1e-4 if step >= known_answer_fixtures.K else 1.0
            )  # the generator's gradient collapses from step K, its loss as before
            x = tf.constant(rng.normal(size=(known_answer_fixtures.BATCH, 6)).astype(np.float32))
            y = tf.constant(rng.normal(size=(known_answer_fixtures.BATCH, 3)).astype(np.float32))
            with tf.GradientTape(persistent=True) as tape:
                with tb_layergrad.capture(model, tape=tape) as cap:
                    value = tf.reduce_mean(tf.square(model(x, training=True) - y))
                    collapsed = f * value + tf.stop_gradient((1.0 - f) * value)
            tb_layergrad.summary.gradients(cap.gradients(tape, value, name="discriminator"), step=step)
            tb_layergrad.summary.gradients(cap.gradients(tape, collapsed, name="generator"), step=step)
            del tape
    writer.close()
    tb = plugin_fixtures.InProcess(str(tmp_path))
    each = {t: plugin_fixtures.get_json(tb, "sweep", {"target": t})["runs"][0] for t in ("discriminator", "generator")}
    assert each["discriminator"]["verdict"] == "ok"
    assert each["generator"]["verdict"] == "vanishing_over_steps"
    row = plugin_fixtures.get_json(tb, "sweep", {})["runs"][0]
    assert row["target"] == "generator"
    assert {k: row[k] for k in HEALTH_FIELDS} == {k: each["generator"][k] for k in HEALTH_FIELDS}
