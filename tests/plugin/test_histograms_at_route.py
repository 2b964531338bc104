"""`histograms_at`: one layer's histogram in many runs at one step, through a real `tensorboard` under both loaders.

RUNS runs x LAYERS layers with histograms (`long_fixtures.write_run`: the records the summary ops write, framed
fast), run k `k % 5` steps shorter than the longest; every tenth in format version 1 without histograms (stats
only: `missing`). Each run's histogram is checked against the records written (counts, and edges from the same
step's min and max, docs/FORMAT.md) and against what `histograms` answers for that run at that step. Run GAPS has
histograms every third step in blocks of 4 steps (most steps asked are not recorded, and the one before may be in
the block before). Two more TensorBoards keep every record (`--samples_per_plugin=layergrad=0`, both loaders): the plugin
reads through TensorBoard's data provider (the Python loader: its multiplexer), as for a gs:// logdir, and answers
as through the record index; the small logdir (version 1) likewise in process. Its speed (the compare view's
histograms of 100 runs) is measured in bench/tab_sweep.py.
"""

from __future__ import annotations

import urllib.parse

import numpy as np
import pytest

from tb_layergrad import metadata

RUNS = 30
LAYERS = [f"net/l{i}" for i in range(4)]
STEPS = 24
LAYER = LAYERS[2]
GAPS = "gaps/every_3"
GAP_STEPS = list(range(2, STEPS, 3))
GAP_SEED = 99


def run_name(k: int) -> str:
    return f"sweep/run_{k:03d}"


def last_step(k: int) -> int:
    return STEPS - 1 - k % 5


def stats_only(k: int) -> bool:
    return k % 10 == 3


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, long_fixtures, tensorboard_process):
    logdir = tmp_path_factory.mktemp("hists_at")
    tables = {}
    for k in range(RUNS):
        v1 = stats_only(k)
        tables[run_name(k)] = long_fixtures.write_run(
            str(logdir / run_name(k)),
            LAYERS,
            last_step(k) + 1,
            format_version=1 if v1 else 2,
            seed=k + 1,
            histograms=not v1,
        )
    tables[GAPS] = long_fixtures.write_run(
        str(logdir / GAPS), LAYERS, STEPS, seed=GAP_SEED, histograms=True, block_steps=4, only=GAP_STEPS
    )
    lasts = {run_name(k): last_step(k) for k in range(RUNS)}
    lasts[GAPS] = GAP_STEPS[-1]
    keep_all = [f"--samples_per_plugin={metadata.PLUGIN_NAME}=0"]
    configs = [("true", []), ("false", []), ("true", keep_all), ("false", keep_all)]
    with tensorboard_process.tensorboards(str(logdir), configs, str(tmp_path_factory.mktemp("logs"))) as procs:
        for p in procs:
            p.wait_for_runs(lasts, timeout=300)
        yield procs, tables


def path(tensorboard_process, runs, layers=(LAYER,), **more) -> str:
    pairs = [("run", r) for r in runs] + [("layer", x) for x in layers] + list(more.items())
    return tensorboard_process.PLUGIN_API + "histograms_at?" + urllib.parse.urlencode(pairs)


def want_buckets(long_fixtures, tables, k: int, layer: str, step: int, run: str = "", seed: int = 0) -> np.ndarray:
    """[HIST_BUCKETS, 3]: the counts written, on edges from that step's stats min and max (of run k, or of `run`
    written with `seed`)."""
    counts = long_fixtures.histogram_counts(len(LAYERS), seed=seed or k + 1)[LAYERS.index(layer)]
    row = tables[run or run_name(k)][layer][step]
    left, right = metadata.histogram_edges(
        float(row[long_fixtures.S["min"]]), float(row[long_fixtures.S["max"]]), counts.size
    )
    return np.stack([left, right, counts.astype(np.float64)], axis=1)


@pytest.mark.slow  # real TensorBoards
@pytest.mark.parametrize("loader", [0, 1], ids=["load_fast=true", "load_fast=false"])
def test_each_runs_histogram_at_the_step_or_the_latest_before(sweep, loader, long_fixtures, tensorboard_process):
    procs, tables = sweep
    tb = procs[loader]
    runs = [run_name(k) for k in reversed(range(RUNS))]  # the order asked is the order answered
    asked = STEPS - 1
    body = tb.get_json(path(tensorboard_process, runs, step=asked), timeout=60)
    assert body["runs"] == runs and (body["step"], body["target"], body["source"]) == (asked, "loss", "output")
    assert body["missing"] == [r for r in runs if stats_only(int(r[-3:]))]
    assert [h["run"] for h in body["histograms"]] == runs and {h["layer"] for h in body["histograms"]} == {LAYER}
    for h in body["histograms"]:
        k = int(h["run"][-3:])
        if stats_only(k):
            assert (h["step"], h["buckets"]) == (None, [])
            continue
        assert h["step"] == last_step(k)  # the nearest recorded step at or before the one asked
        np.testing.assert_array_equal(np.array(h["buckets"]), want_buckets(long_fixtures, tables, k, LAYER, h["step"]))
        one = tb.get_json(
            tensorboard_process.PLUGIN_API
            + "histograms?"
            + urllib.parse.urlencode({"run": h["run"], "layer": LAYER, "start": h["step"], "end": h["step"]})
        )
        assert one["steps"] == [h["step"]] and one["histograms"] == [h["buckets"]]
    assert tb.get_json(path(tensorboard_process, runs, step=asked), timeout=60) == body  # warm: the same answer


@pytest.mark.slow  # real TensorBoards
@pytest.mark.parametrize("loader", [0, 1], ids=["load_fast=true", "load_fast=false"])
def test_a_layer_per_run_an_earlier_step_and_no_step(sweep, loader, long_fixtures, tensorboard_process):
    procs, tables = sweep
    tb = procs[loader]
    ks = [k for k in range(RUNS) if not stats_only(k)][:8]
    runs = [run_name(k) for k in ks]
    layers = [LAYERS[k % len(LAYERS)] for k in ks]
    body = tb.get_json(path(tensorboard_process, runs, layers, step=5))
    assert body["missing"] == [] and [h["layer"] for h in body["histograms"]] == layers
    for k, layer, h in zip(ks, layers, body["histograms"]):
        assert h["step"] == 5
        np.testing.assert_array_equal(np.array(h["buckets"]), want_buckets(long_fixtures, tables, k, layer, 5))
    body = tb.get_json(path(tensorboard_process, runs))  # no step: each run's last
    assert body["step"] is None and [h["step"] for h in body["histograms"]] == [last_step(k) for k in ks]


@pytest.mark.slow
def test_histograms_at_names_what_is_missing_or_unknown(sweep, tensorboard_process):
    tb = sweep[0][0]
    status, body, _ = tb.get(path(tensorboard_process, [run_name(3), run_name(13)]), timeout=30)
    assert status == 404 and b"no 'output' histograms of layer 'net/l2' for target 'loss' in any of the runs" in body
    status, body, _ = tb.get(path(tensorboard_process, [run_name(0), "sweep/nope"]), timeout=30)
    assert status == 404 and b"sweep/nope" in body
    status, body, _ = tb.get(
        path(tensorboard_process, [run_name(0), run_name(1)], ["net/l0", "net/l1", "net/l2"]), timeout=30
    )
    assert status == 400 and b"once per run (2), got 3" in body
    body = tb.get_json(path(tensorboard_process, [run_name(0), run_name(1)], ["net/nope", LAYER]))
    assert body["missing"] == [run_name(0)]


@pytest.mark.slow
def test_every_step_asked_answers_each_runs_latest_histogram_at_or_before_it(sweep, long_fixtures, tensorboard_process):
    """Steps 0 to past the last, and none: each run's histogram is the latest of its whole series (the `histograms`
    route) at or before the step, or none before its first; the same answers under both loaders through the record
    index and through TensorBoard's data provider keeping every record."""
    procs, tables = sweep
    runs = [GAPS, run_name(0), run_name(3), run_name(4)]  # gaps across blocks, the longest, stats only, shorter
    asked = list(range(STEPS + 2)) + [None]
    api = tensorboard_process.PLUGIN_API
    answers = []
    for tb in procs:
        # First: GAPS's blocks are not in the plugin's cache yet (the `histograms` route puts them there).
        bodies = [tb.get_json(path(tensorboard_process, runs, **({} if s is None else {"step": s}))) for s in asked]
        whole = {
            r: tb.get_json(api + "histograms?" + urllib.parse.urlencode({"run": r, "layer": LAYER}))
            for r in runs
            if r != run_name(3)
        }
        assert whole[GAPS]["steps"] == GAP_STEPS
        for step, body in zip(asked, bodies):
            assert body["missing"] == [run_name(3)]
            for h in body["histograms"]:
                w = whole.get(h["run"], {"steps": [], "histograms": []})
                before = [j for j, s in enumerate(w["steps"]) if step is None or s <= step]
                want = (w["steps"][before[-1]], w["histograms"][before[-1]]) if before else (None, [])
                assert (h["step"], h["buckets"]) == want, (h["run"], step)
        gap = bodies[asked.index(7)]["histograms"][0]  # step 5, in the block before the one holding step 7
        assert gap["step"] == 5
        want = want_buckets(long_fixtures, tables, 0, LAYER, 5, GAPS, GAP_SEED)
        np.testing.assert_array_equal(np.array(gap["buckets"]), want)
        assert bodies[0]["histograms"][0] == {"run": GAPS, "layer": LAYER, "step": None, "buckets": []}
        answers.append(bodies)
    assert all(a == answers[0] for a in answers[1:])


def test_in_process_through_the_index_as_through_tensorboards_provider(small_logdir, plugin_fixtures):
    """The small logdir (version 1, `eval` every other step): through the record index as through TensorBoard's
    provider keeping every record, each run's histogram the one written at its latest step at or before the one
    asked, as the `histograms` route answers it."""
    ours = plugin_fixtures.InProcess(small_logdir.logdir)
    kept = plugin_fixtures.InProcess(small_logdir.logdir, keep=10**6)
    get_json = plugin_fixtures.get_json
    runs, layer = ["train", "eval"], "model/dense"
    written = {r: sorted(small_logdir.hist[(r, metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, layer)]) for r in runs}
    for step in list(range(max(written["eval"]) + 2)) + [None]:
        q = [("run", r) for r in runs] + [("layer", layer)] + ([] if step is None else [("step", step)])
        body = get_json(ours, "histograms_at", urllib.parse.urlencode(q))
        assert get_json(kept, "histograms_at", urllib.parse.urlencode(q)) == body
        for h in body["histograms"]:
            before = [s for s in written[h["run"]] if step is None or s <= step]
            assert h["step"] == (before[-1] if before else None)
            if before:
                one = get_json(
                    ours, "histograms", {"run": h["run"], "layer": layer, "start": h["step"], "end": h["step"]}
                )
                assert one["histograms"] == [h["buckets"]] and len(h["buckets"]) > 0
