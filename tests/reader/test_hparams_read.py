"""Hyperparameters logged with TensorBoard's HParams API, read back beside the gradients.

The logdir is written by real fits (`hparams_fixtures`): `hp.KerasCallback` and `hp.hparams` beside
`GradientLogger`. Read through the Python multiplexer's provider and TensorBoard's Rust data server, then
through `tb_layergrad.load()` and `tb-layergrad report`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time

import numpy as np
import pytest
from tensorboard import context

import tb_layergrad
from tb_layergrad.cli import main as cli_main
from tb_layergrad.reader import event_files, hparams

ctx = context.RequestContext()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, hparams_fixtures):
    d = str(tmp_path_factory.mktemp("hparams_logdir"))
    hparams_fixtures.write_hparams_logdir(d)
    return d


@pytest.fixture(scope="module")
def rust_provider(logdir):
    from tensorboard.data import server_ingester
    from tensorboard.util import grpc_util

    try:
        binary = server_ingester.get_server_binary()
    except server_ingester.NoDataServerError:
        pytest.skip("TensorBoard's Rust data server is not installed")
    ingester = server_ingester.SubprocessServerDataIngester(
        binary, logdir, reload_interval=0, channel_creds_type=grpc_util.ChannelCredsType.LOCAL
    )
    ingester.start()
    provider = ingester.data_provider
    deadline = time.time() + 60
    while {r.run_name for r in provider.list_runs(ctx, experiment_id="")} != {r.run_name for r in _python_runs(logdir)}:
        assert time.time() < deadline, "the data server did not load the logdir in 60 s"
        time.sleep(0.2)
    return provider


def _python_runs(logdir):
    with event_files.tensorflow_free(logdir):
        return event_files.open_provider(logdir).list_runs(ctx, experiment_id="")


def _provider(which, logdir, request):
    if which == "rust":
        return request.getfixturevalue("rust_provider")
    return event_files.open_provider(logdir)


@pytest.mark.parametrize("which", ["python", "rust"])
@pytest.mark.slow
def test_each_run_gets_its_nearest_session(logdir, request, which, hparams_fixtures):
    provider = _provider(which, logdir, request)
    with event_files.tensorflow_free(logdir):
        found = hparams.sessions(provider, ctx, "")
        got = hparams.by_run(provider, ctx, "", list(hparams_fixtures.EXPECTED) + ["top/deep", "nowhere/below"])
    assert sorted(found) == ["kc", "top", "top/deep"]
    assert {run: got[run] for run in hparams_fixtures.EXPECTED} == hparams_fixtures.EXPECTED
    assert got["top/deep"] == hparams_fixtures.EXPECTED["top/deep/train"] and got["nowhere/below"] == {}
    kinds = {k: type(v) for k, v in got["kc/train"].items()}
    assert kinds == {"learning_rate": float, "activation": str, "batch_norm": bool, "units": float, "mixed": float}


def test_a_session_at_the_logdir_applies_to_every_run():
    assert hparams.session_of("a/b/train", [".", "a/b/c"]) == "."
    assert hparams.session_of("a/b/train", [".", "a/b"]) == "a/b"
    assert hparams.session_of("a/bc", ["a/b"]) is None
    assert hparams.session_of(".", ["."]) == "."


def test_load_has_one_column_per_hyperparameter(logdir, hparams_fixtures):
    df = tb_layergrad.load(logdir)
    assert sorted(set(df.run)) == sorted(hparams_fixtures.EXPECTED)
    hp_columns = [c for c in df.columns if c.startswith("hp/")]
    assert hp_columns == [f"hp/{n}" for n in hparams_fixtures.NAMES]
    assert list(df.columns[: -len(hp_columns)]) == list(tb_layergrad.reader.dataframe.COLUMNS)
    for run, values in hparams_fixtures.EXPECTED.items():
        rows = df[df.run == run]
        assert len(rows) > 0
        for name in hparams_fixtures.NAMES:
            column = rows[f"hp/{name}"].tolist()
            if name in values:
                assert column == [values[name]] * len(rows), (run, name)
            else:
                assert all(v is None or (isinstance(v, float) and math.isnan(v)) for v in column), (run, name)
    assert df["hp/learning_rate"].dtype == np.float64
    assert set(df[df.run == "kc/train"]["hp/mixed"]) == {3.5} and set(df[df.run == "top/train"]["hp/mixed"]) == {
        "three"
    }


def _report(argv, capsys):
    code = cli_main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_json_has_each_runs_hyperparameters(logdir, capsys, hparams_fixtures):
    code, out, _ = _report([logdir, "--format", "json"], capsys)
    assert code == 0
    body = json.loads(out)
    assert {r["run"]: r["hparams"] for r in body["runs"]} == hparams_fixtures.EXPECTED
    assert body["sort"] is None


def test_report_csv_appends_sorted_hp_columns(logdir, capsys, hparams_fixtures, small_logdir, report_command):
    code, out, _ = report_command(small_logdir.logdir, "--format", "csv")  # a logdir without hyperparameters
    assert code == 0
    plain = next(csv.reader(io.StringIO(out)))
    code, out, _ = _report([logdir, "--format", "csv"], capsys)
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == plain + [f"hp/{n}" for n in hparams_fixtures.NAMES]
    assert len(rows) - 1 == 2 * len(hparams_fixtures.EXPECTED)  # two layers a run
    for row in rows[1:]:
        values = hparams_fixtures.EXPECTED[row[0]]
        for j, name in enumerate(hparams_fixtures.NAMES):
            cell = row[len(plain) + j]
            v = values.get(name)
            assert cell == ("" if v is None else repr(v) if isinstance(v, float) else str(v)), (row[0], name)


def _csv(out):
    rows = list(csv.DictReader(io.StringIO(out)))
    return rows


def test_report_sort_by_a_hyperparameter_and_by_a_layer_column(logdir, capsys):
    code, out, _ = _report([logdir, "--format", "csv", "--sort", "hp/learning_rate"], capsys)
    assert code == 0
    runs = [r["run"] for r in _csv(out)]
    # Ascending learning rate, the run without one last; a run's layers stay together in model order.
    assert runs == ["top/deep/train"] * 2 + ["kc/train"] * 2 + ["top/train"] * 2 + ["bare/train"] * 2

    code, out, _ = _report([logdir, "--format", "csv", "--sort=-last_norm"], capsys)
    assert code == 0
    norms = [float(r["last_norm"]) for r in _csv(out)]
    assert norms == sorted(norms, reverse=True) and len(set(norms)) == len(norms)

    code, out, _ = _report([logdir, "--format", "json", "--sort=-last_norm"], capsys)
    body = json.loads(out)
    assert body["sort"] == "-last_norm"
    firsts = [r["layers"][0]["last_norm"] for r in body["runs"]]
    assert firsts == sorted(firsts, reverse=True)
    for r in body["runs"]:
        layer_norms = [layer["last_norm"] for layer in r["layers"]]
        assert layer_norms == sorted(layer_norms, reverse=True)

    code, out, _ = _report([logdir, "--sort=-hp/learning_rate"], capsys)
    heads = [line.split()[1] for line in out.splitlines() if line.startswith("run ")]
    assert heads == ["top/train", "kc/train", "top/deep/train", "bare/train"]


def test_report_sort_by_an_unknown_column_says_which_exist(logdir, capsys):
    code, out, err = _report([logdir, "--sort", "hp/momentum"], capsys)
    assert code == 2 and out == ""
    assert "unknown --sort column 'hp/momentum'" in err
    assert "hp/learning_rate" in err and "last_norm" in err


@pytest.mark.slow
def test_the_hparams_route_under_both_loaders(logdir, tmp_path, hparams_fixtures, tensorboard_process):

    with tensorboard_process.tensorboards(logdir, [("true", []), ("false", [])], str(tmp_path)) as procs:
        for p in procs:
            p.wait_for_runs({run: hparams_fixtures.STEPS for run in hparams_fixtures.EXPECTED})
            body = p.get_json(tensorboard_process.PLUGIN_API + "hparams")
            assert body["names"] == hparams_fixtures.NAMES
            assert {r["run"]: r["hparams"] for r in body["runs"]} == hparams_fixtures.EXPECTED
            one = p.get_json(tensorboard_process.PLUGIN_API + "hparams?run=top/deep/train")
            assert one["runs"] == [{"run": "top/deep/train", "hparams": hparams_fixtures.EXPECTED["top/deep/train"]}]
            code, body, _ = p.get(
                tensorboard_process.PLUGIN_API + "hparams?run=top"
            )  # a session's own folder holds no gradients
            assert code == 404 and b"top" in body


def test_a_session_in_the_logdir_itself_reaches_every_run(tmp_path, hparams_fixtures):
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    logdir = str(tmp_path)
    with tf.summary.create_file_writer(logdir).as_default():
        hp.hparams({"seed": 7, "optimizer": "sgd"})
    hparams_fixtures.fit_with_logger(logdir, "x/y", [], seed=5)
    df = tb_layergrad.load(logdir)
    assert set(df.run) == {"x/y/train"}
    assert set(df["hp/seed"]) == {7.0} and set(df["hp/optimizer"]) == {"sgd"}
