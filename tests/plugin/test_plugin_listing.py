"""The plugin's listing under TensorBoard's Python loader (`listing.TensorLister`) equals `list_tensors`.

The lister keeps each series' max_step / max_wall_time and continues it over new
records only; these tests compare it, field by field, with TensorBoard's own
`MultiplexerDataProvider.list_tensors` over one real multiplexer, after each of
three loads of a logdir that changes in between: new records in a file and in a
new file, a restart writing lower steps with earlier wall times into a new file
(kept as is: TensorFlow 2 files are not purged on out-of-order steps), a
`SessionLog.START` restart (purged by TensorBoard), an old-format file with
out-of-order steps (purged by tag); with every record kept and with sampling.
The routes `runs` and `matrix` are compared too, with and without the multiplexer
in the plugin's context (what the Python and the Rust loader give the plugin), and the
listing of a provider whose multiplexer the lister cannot recognize (the public path).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List

import pytest
from tensorboard import context as tb_context
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.compat.proto import event_pb2
from tensorboard.data import provider as tb_provider
from tensorboard.plugins import base_plugin
from werkzeug import test as wtest

from tb_layergrad import metadata
from tb_layergrad.plugin import listing
from tb_layergrad.plugin.loader import LayerGradPlugin

LAYERS = ["net/a", "net/b", "net/c"]
API = "/data/plugin/layergrad/"
ctx = tb_context.RequestContext()


def put(reliability_fixtures, f, step: int, layers: List[str], wall: float) -> None:
    """One event of every layer's records at `step`, with wall time `wall`."""
    event = event_pb2.Event.FromString(f.event(step, layers))
    event.wall_time = wall
    f.append_raw(reliability_fixtures.frame(event.SerializeToString()))


def session_start(reliability_fixtures, f, step: int, wall: float) -> None:
    """A `SessionLog.START`: the second one in a run makes TensorBoard purge every record at >= `step`."""
    event = event_pb2.Event(
        step=step, wall_time=wall, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)
    )
    f.append_raw(reliability_fixtures.frame(event.SerializeToString()))


def old_format_file(reliability_fixtures, run_dir: str):
    """An event file of format version 1: TensorBoard purges a tag's records on an out-of-order step."""
    f = reliability_fixtures.EventFile(run_dir)
    with open(f.path, "wb"):
        pass
    f.offsets.clear()
    f.append_raw(
        reliability_fixtures.frame(event_pb2.Event(wall_time=1.0, file_version="brain.Event:1").SerializeToString())
    )
    return f


def phases(reliability_fixtures, logdir: str) -> List[Callable[[], None]]:
    """Writers of the logdir's three states; each is loaded and listed before the next one runs."""
    d = lambda run: os.path.join(logdir, run)  # noqa: E731
    files: Dict[str, reliability_fixtures.EventFile] = {}

    def first() -> None:
        reliability_fixtures.write_run(d("train"), LAYERS, range(10))
        reliability_fixtures.write_run(d("eval"), LAYERS[:1], range(0, 20, 2), target="aux")
        files["live"] = reliability_fixtures.write_run(d("live"), LAYERS, range(3))
        files["restarted"] = f = reliability_fixtures.EventFile(d("restarted"))
        for step in range(10):
            put(reliability_fixtures, f, step, LAYERS, wall=1000.0 + step)
        files["purged"] = f = reliability_fixtures.EventFile(d("purged"))
        session_start(reliability_fixtures, f, 0, wall=1.0)
        for step in range(10):
            put(reliability_fixtures, f, step, LAYERS, wall=100.0 + step)
        files["purged_v1"] = f = old_format_file(reliability_fixtures, d("purged_v1"))
        for step in range(10):
            put(reliability_fixtures, f, step, LAYERS[:2], wall=100.0 + step)

    def second() -> None:
        for step in range(3, 8):  # the same file grows
            files["live"].write(step, LAYERS)
        f = reliability_fixtures.EventFile(d("restarted"))  # restarted from step 4, on a machine whose clock is behind
        for step in range(4, 7):
            put(reliability_fixtures, f, step, LAYERS, wall=500.0 + step)
        f = files["purged"]  # restarted from step 5: TensorBoard drops steps 5..9, then 5..20 come
        session_start(reliability_fixtures, f, 5, wall=200.0)
        for step in range(5, 21):
            put(reliability_fixtures, f, step, LAYERS, wall=200.0 + step)
        f = files["purged_v1"]  # out-of-order step 3 in an old file: steps >= 3 of its tags dropped
        for step in range(3, 6):
            put(reliability_fixtures, f, step, LAYERS[:1], wall=300.0 + step)

    def third() -> None:
        reliability_fixtures.write_run(d("live"), LAYERS[1:], range(8, 12))  # a new file of the run, fewer layers

    return [first, second, third]


class Server:
    """One multiplexer and its provider; the plugin built as each loader builds it."""

    def __init__(self, logdir: str, keep: int) -> None:
        self.logdir = logdir
        self.mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: keep})
        self.provider = data_provider.MultiplexerDataProvider(self.mux, logdir)
        self.provider_lists = 0
        inner = self.provider.list_tensors

        def counting(*args, **kwargs):
            self.provider_lists += 1
            return inner(*args, **kwargs)

        self.provider.list_tensors = counting  # still a MultiplexerDataProvider
        self.python = self._client(
            base_plugin.TBContext(logdir=logdir, data_provider=self.provider, multiplexer=self.mux)
        )
        self.rust_like = self._client(base_plugin.TBContext(logdir=logdir, data_provider=self.provider))
        self.lister = listing.TensorLister(self.provider, self.mux)

    def _client(self, context: base_plugin.TBContext) -> wtest.Client:
        app = application.TensorBoardWSGI([LayerGradPlugin(context)], data_provider=self.provider)
        return wtest.Client(app)

    def reload(self) -> None:
        self.mux.AddRunsFromDirectory(self.logdir)
        self.mux.Reload()


FILTERS = [
    None,
    tb_provider.RunTagFilter(runs=["live"]),
    tb_provider.RunTagFilter(runs=["restarted", "purged"], tags=None),
    tb_provider.RunTagFilter(tags=["loss/output/net/a/stats"]),
    tb_provider.RunTagFilter(runs=["purged_v1"], tags=["loss/output/net/a/stats"]),  # TensorBoard's one-series path
    tb_provider.RunTagFilter(runs=["train", "live"], tags=["loss/output/net/b/stats", "loss/output/net/c/histogram"]),
    tb_provider.RunTagFilter(runs=["nope"], tags=["loss/output/net/a/stats"]),
    tb_provider.RunTagFilter(runs=["train"], tags=["no/such/tag"]),
]


def get(plugin_fixtures, client: wtest.Client, route: str, query=None):
    r = client.get(API + route, query_string=query)
    assert r.status_code == 200, r.get_data(as_text=True)
    return plugin_fixtures.strict_json(r.get_data())


@pytest.mark.parametrize("keep", [0, 4], ids=["keep_all", "sampled"])
def test_listing_equals_list_tensors_while_the_logdir_changes(tmp_path, keep, plugin_fixtures, reliability_fixtures):
    logdir = str(tmp_path)
    server = Server(logdir, keep)
    assert server.lister.incremental
    seen_max = {}
    for phase in phases(reliability_fixtures, logdir):
        phase()
        server.reload()
        for _ in range(2):  # the second time from the kept maxima
            for f in FILTERS:
                want = server.provider.list_tensors(
                    ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, run_tag_filter=f
                )
                got = server.lister.list_tensors(
                    ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, run_tag_filter=f
                )
                assert got == want, f
        full = server.provider.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
        seen_max.update({run: max(ts.max_step for ts in tags.values()) for run, tags in full.items()})
        before = server.provider_lists
        python_runs = get(plugin_fixtures, server.python, "runs")
        assert server.provider_lists == before  # the Python-loader plugin listed from the multiplexer
        assert python_runs == get(plugin_fixtures, server.rust_like, "runs")
        for run in full:
            for target in {metadata.parse_plugin_content(ts.plugin_content).target for ts in full[run].values()}:
                q = {"run": run, "target": target, "stat": "max"}
                assert get(plugin_fixtures, server.python, "matrix", q) == get(
                    plugin_fixtures, server.rust_like, "matrix", q
                )
    if keep:
        return
    # The cases are what they claim: the restart is not purged and its last record is not the maximum,
    # the purges happened (TensorBoard's steps went down), the live run grew.
    assert seen_max == {"train": 9, "eval": 18, "live": 11, "restarted": 9, "purged": 20, "purged_v1": 9}
    restarted = server.mux.Tensors("restarted", "loss/output/net/a/stats")
    assert restarted[-1].step < 9 and restarted[-1].wall_time < max(e.wall_time for e in restarted)
    assert [e.step for e in server.mux.Tensors("purged_v1", "loss/output/net/a/stats")][-3:] == [3, 4, 5]
    v1 = server.lister.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, run_tag_filter=FILTERS[4])
    assert v1["purged_v1"]["loss/output/net/a/stats"].max_step == 5


def test_an_unchanged_series_is_not_walked_again(tmp_path, monkeypatch, reliability_fixtures):
    logdir = str(tmp_path)
    f = reliability_fixtures.write_run(os.path.join(logdir, "long"), LAYERS, range(500))
    server = Server(logdir, keep=0)
    server.reload()
    folded: List[int] = []
    new_records = listing._new_records  # noqa: SLF001 - observed, not replaced

    def observed(*args):
        new, count, continued = new_records(*args)
        folded.append(len(new) if continued else -len(new))  # negative: folded from the first record
        return new, count, continued

    monkeypatch.setattr(listing, "_new_records", observed)

    def listed():
        folded.clear()
        got = server.lister.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
        assert got == server.provider.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
        return sorted(set(folded)), len(folded)

    series = 2 * len(LAYERS)
    assert listed() == ([-500], series)  # the first listing walks every record
    assert listed() == ([0], series)  # unchanged: nothing
    for step in range(500, 503):
        f.write(step, LAYERS)
    server.reload()
    assert listed() == ([3], series)  # three new records each


def test_other_providers_are_listed_by_list_tensors(tmp_path, plugin_fixtures):
    mux = plugin_event_multiplexer.EventMultiplexer()
    provider = data_provider.MultiplexerDataProvider(mux, str(tmp_path))
    assert listing.TensorLister(provider, mux).incremental
    assert not listing.TensorLister(provider, None).incremental  # the Rust loader: no multiplexer
    assert not listing.TensorLister(provider, plugin_event_multiplexer.EventMultiplexer()).incremental
    assert not listing.TensorLister(
        plugin_fixtures.RecordingProvider(provider), mux
    ).incremental  # a wrapper may change answers


class Delegating:
    """A multiplexer behind another object: what a TensorBoard release that wraps its multiplexer would hand
    its provider. TensorBoard's own provider reads through it unchanged; only the identity differs."""

    def __init__(self, mux: plugin_event_multiplexer.EventMultiplexer) -> None:
        self._mux = mux

    def __getattr__(self, name: str):
        return getattr(self._mux, name)


@pytest.mark.parametrize("keep", [0, 4], ids=["keep_all", "sampled"])
def test_a_provider_of_another_shape_is_listed_the_public_way_with_the_same_answer(
    tmp_path, keep, reliability_fixtures
):
    logdir = str(tmp_path)
    server = Server(logdir, keep)
    other = data_provider.MultiplexerDataProvider(Delegating(server.mux), logdir)
    public = listing.TensorLister(other, server.mux)
    assert server.lister.incremental and not public.incremental  # the one private read: it finds another object
    for phase in phases(reliability_fixtures, logdir):
        phase()
        server.reload()
        for f in FILTERS:
            kwargs = dict(experiment_id="", plugin_name=metadata.PLUGIN_NAME, run_tag_filter=f)
            got = public.list_tensors(ctx, **kwargs)
            assert got == server.lister.list_tensors(ctx, **kwargs) == server.provider.list_tensors(ctx, **kwargs), f
            if f is None:
                assert got  # the phases list something


@pytest.fixture(scope="module")
def rust_server(tmp_path_factory, reliability_fixtures):
    """TensorBoard's Rust data server on three layergrad runs and one run of plain scalars."""
    import tensorflow as tf
    from tensorboard.data import server_ingester
    from tensorboard.util import grpc_util

    logdir = str(tmp_path_factory.mktemp("rust_listing"))
    for i, run in enumerate(["a", "b", "c"]):
        reliability_fixtures.write_run(os.path.join(logdir, run), LAYERS[: i + 1], range(40 + 10 * i))
    with tf.summary.create_file_writer(os.path.join(logdir, "scalars_only")).as_default():
        tf.summary.scalar("loss", 1.0, step=0)
    ingester = server_ingester.SubprocessServerDataIngester(
        server_ingester.get_server_binary(),
        logdir,
        reload_interval=0,
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={metadata.PLUGIN_NAME: 0},
    )
    ingester.start()
    provider = ingester.data_provider

    def loaded() -> bool:
        got = provider.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
        return sorted(got) == ["a", "b", "c"] and all(
            ts.max_step == 39 + 10 * i for i, run in enumerate("abc") for ts in got[run].values()
        )

    deadline = time.time() + 60
    while not loaded():
        assert time.time() < deadline, "the data server did not load the logdir in 60 s"
        time.sleep(0.2)
    return provider


def test_a_rust_listing_is_asked_run_by_run_and_gives_the_same_answer(rust_server, monkeypatch):
    lister = listing.TensorLister(rust_server, None)
    asked = []
    plain = rust_server.list_tensors

    def recording(ctx_, *, experiment_id, plugin_name, run_tag_filter=None):
        f = run_tag_filter
        asked.append(None if f is None else tuple(None if x is None else sorted(x) for x in (f.runs, f.tags)))
        return plain(ctx_, experiment_id=experiment_id, plugin_name=plugin_name, run_tag_filter=run_tag_filter)

    def expected(run_tag_filter=None):
        return plain(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, run_tag_filter=run_tag_filter)

    monkeypatch.setattr(rust_server, "list_tensors", recording)
    got = lister.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
    assert got == expected() and sorted(got) == ["a", "b", "c"]
    assert {len(got[r]) for r in got} == {2, 4, 6}
    # One call per run of the logdir (the scalars-only run answers nothing), none unfiltered.
    assert sorted(asked) == [([run], None) for run in ["a", "b", "c", "scalars_only"]]

    asked.clear()
    two = tb_provider.RunTagFilter(runs=["c", "a"])
    assert lister.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, run_tag_filter=two) == expected(
        two
    )
    assert sorted(asked) == [(["a"], None), (["c"], None)]

    # More runs than calls: a few runs per call, every run asked once.
    monkeypatch.setattr(listing, "LISTING_CALLS", 2)
    asked.clear()
    assert lister.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME) == expected()
    assert sorted(asked) == [(["a", "c"], None), (["b", "scalars_only"], None)]

    # A tag filter is cheap for the server already: one call, as asked.
    for one_call in (
        tb_provider.RunTagFilter(runs=["b"]),
        tb_provider.RunTagFilter(
            tags=[metadata.make_tag(metadata.DEFAULT_TARGET, metadata.SOURCE_OUTPUT, LAYERS[0], "stats")]
        ),
        tb_provider.RunTagFilter(runs=["a", "b"], tags=["nope"]),
    ):
        asked.clear()
        assert lister.list_tensors(
            ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, run_tag_filter=one_call
        ) == expected(one_call)
        assert len(asked) == 1
