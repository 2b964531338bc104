"""`tb-layergrad demo --quick`, run once as a real subprocess, then `tb-layergrad report` on what it wrote.

Each planted behaviour must show in the report on the right run; the first NaN step and layers are
checked against the event files read directly (TFRecord + Event protos, not TensorBoard's reader).
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import os
import re
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from tb_layergrad import metadata
from tb_layergrad.cli import demo as demo_module
from tb_layergrad.cli import demo_nan, demo_sweep

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


# The report's default target is "loss"; the GAN's custom step has two named targets, reported each (see below).
LOSS_RUNS = sorted(set(demo_module.RUN_NAMES) - {"gan"} | set(demo_sweep.RUN_NAMES))


def test_every_run_trained_with_a_progress_bar(demo):
    assert sorted(demo["runs"]) == LOSS_RUNS
    plan = demo_module.Plan.for_mode(quick=True)
    for name in demo_module.RUN_NAMES:
        line = next(l for l in demo["stdout"].splitlines() if l.strip().startswith(name + " "))
        assert re.search(r"\[#{24}\]\s+(\d+)/\1 steps", line), line
    assert demo["runs"]["mlp_sigmoid"]["summary"]["last_step"] == plan.mlp  # GradientLogger: step = updates so far
    assert "tb-layergrad report" in demo["stdout"]


def test_vanishing_in_the_sigmoid_mlp_not_in_its_relu_twin(demo):
    sig, relu = demo["layers"]["mlp_sigmoid"], demo["layers"]["mlp_relu_he"]
    vanishing_now = [name for name, l in sig.items() if "vanishing" in l["now"]]
    assert "dense_0" in vanishing_now and len(vanishing_now) >= 2, vanishing_now
    assert "logits" not in vanishing_now
    assert all(l["counts"]["vanishing"] == 0 for l in relu.values()), relu
    # Toward the input the sigmoid stack's gradient shrinks by orders of magnitude; the ReLU one's does not.
    assert sig["dense_0"]["last_norm"] < 1e-3 * sig["logits"]["last_norm"]
    assert relu["dense_0"]["last_norm"] > 0.1 * relu["logits"]["last_norm"]


def test_timestep_gradients_decay_more_in_the_simplernn_than_in_the_lstm(demo):
    simple = demo["layers"]["rnn_simplernn"]["rnn"]["timestep_decay"]
    lstm = demo["layers"]["rnn_lstm"]["rnn"]["timestep_decay"]
    assert simple < -2.0, simple  # more than 100x smaller at the first timestep than at the last
    assert simple < lstm - 2.0, (simple, lstm)


def test_the_dead_layer(demo):
    dead = demo["layers"]["dead_relu"]
    assert dead["dense_0"]["now"] == ["dead"] and dead["dense_0"]["counts"]["dead"] == dead["dense_0"]["recorded"]
    assert dead["dense_0"]["last_norm"] == 0.0
    assert [name for name, l in dead.items() if l["counts"]["dead"]] == ["dense_0"]


def read_event_files(run_dir: str, source: str = "output"):
    """{(layer, kind, index): {step: array}} of one source straight from the TFRecord files, without TensorBoard.

    A format-version-2 record (docs/FORMAT.md: one per step for all layers, the layer list in the tag's
    first record's metadata) is split into its rows: a layer's stats row, histogram counts or first step."""
    import tensorflow as tf
    from tensorboard.compat.proto import event_pb2

    infos, out = {}, {}
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    assert files
    for raw in tf.data.TFRecordDataset(files):
        event = event_pb2.Event.FromString(raw.numpy())
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME:
                infos[v.tag] = json.loads(v.metadata.plugin_data.content)
            info = infos.get(v.tag)
            if info is None or info["source"] != source:
                continue
            value = tf.make_ndarray(v.tensor)
            if info["version"] == 1:
                out.setdefault((info["layer"], info["kind"], info["index"]), {})[event.step] = value
                continue
            assert value.shape[0] == len(info["layers"])
            for layer, index, row in zip(info["layers"], info["indexes"], value):
                out.setdefault((layer, info["kind"], index), {})[event.step] = row
    return out


def test_first_nan_step_and_layers_match_the_event_files(demo):
    records = read_event_files(os.path.join(demo["logdir"], "nan_log0"))
    first = {}
    for (layer, kind, index), by_step in records.items():
        if kind != "stats":
            continue
        bad = sorted(s for s, a in by_step.items() if a[1] + a[2] + a[3] > 0)
        first[layer] = (bad[0] if bad else None, index)
    step = min(s for s, _ in first.values() if s is not None)
    at_step = [layer for layer, (s, i) in sorted(first.items(), key=lambda kv: kv[1][1]) if s == step]
    run = demo["runs"]["nan_log0"]
    first_nan = run["summary"]["first_nonfinite"]
    assert {k: first_nan[k] for k in ("step", "layers")} == {"step": step, "layers": at_step}
    # Every layer output finite, the loss not: born in the loss (the run records activations).
    assert (first_nan["pass"], first_nan["origin"]) == ("loss", "loss")
    for entry in run["layers"]:
        assert entry["first_nonfinite"] == first[entry["layer"]][0]
    assert 1 < step < demo_module.Plan.for_mode(True).nan  # finite at first: log(0) comes with saturation
    # The running first-NaN record is not written by GradientLogger (yet): the stats alone decide here.
    assert run["summary"]["latest"]["nonfinite"] == len(run["layers"])


# The run, the step and where it was born, as the demo plants them (tb_layergrad/cli/demo.py).
PLANTED = {
    "nan_forward": (demo_nan.NAN_FORWARD_STEP, "forward", "nan_forward/log_features"),
    "nan_backward": (demo_nan.NAN_BACKWARD_STEP, "backward", "nan_backward/sqrt_features"),
}


@pytest.mark.parametrize("run", sorted(PLANTED))
def test_the_report_says_where_the_nan_was_born(demo, run, console_script):
    step, pass_, origin = PLANTED[run]
    assert step % demo_nan.NAN_EVERY  # not a logged step: written because it is the first non-finite one
    first = demo["runs"][run]["summary"]["first_nonfinite"]
    assert (first["step"], first["pass"], first["origin"]) == (step, pass_, origin)
    for source in ("output", "activation", "target"):
        records = read_event_files(os.path.join(demo["logdir"], run), source)
        stats = [by_step for (_, kind, _), by_step in records.items() if kind == "stats"]
        assert stats and all(step in by_step for by_step in stats)  # written in full at that step
    text = subprocess.run(
        [console_script.CLI, "report", demo["logdir"], "--run", run], capture_output=True, text=True, timeout=120
    ).stdout
    assert f"step {step}" in text and pass_ in text and origin in text


def test_exploding_without_clipping_and_not_with_it(demo):
    noclip, clip = demo["layers"]["explode_noclip"], demo["layers"]["explode_clipnorm"]
    assert all("exploding" in l["now"] for l in noclip.values()), noclip
    assert all(l["trend"] > 1 for l in noclip.values())  # > 10x over the last 20 steps
    assert all(l["counts"]["exploding"] == 0 and l["counts"]["nonfinite"] == 0 for l in clip.values()), clip
    assert clip["head"]["last_norm"] < 1e-3 * noclip["head"]["last_norm"]


def test_fail_on_nan_exit_status(demo, console_script):
    def report(*argv):
        return subprocess.run(
            [console_script.CLI, "report", demo["logdir"], *argv], capture_output=True, text=True, timeout=120
        )

    bad = report("--run", "nan_log0", "--fail-on", "nan")  # the installed command, as CI calls it
    assert bad.returncode == 3, bad.stderr
    assert "FAIL nan: run nan_log0" in bad.stdout
    assert not re.search(r"^[IW]\d{4} ", bad.stderr, re.M)  # no TensorFlow start-up chatter
    # The same entry point in process (a second interpreter would only cost start-up time).
    from tb_layergrad import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(
            [
                "report",
                demo["logdir"],
                "--run",
                "mlp_relu_he",
                "--run",
                "explode_clipnorm",
                "--fail-on",
                "nan,exploding,vanishing,dead",
            ]
        )
    assert code == 0, out.getvalue()
    assert "OK: none of nan, exploding, vanishing, dead holds" in out.getvalue()
    assert max(len(line) for line in out.getvalue().splitlines()) <= 100


def test_report_on_the_demo_is_silent_on_stderr_and_imports_no_tensorflow(demo):
    """What a user runs after the demo, in the environment a user has (no TF_CPP_MIN_LOG_LEVEL)."""
    code = (
        "import sys\nfrom tb_layergrad import cli\n"
        f"status = cli.main(['report', {demo['logdir']!r}])\n"
        "assert 'tensorflow' not in sys.modules, 'the report imported TensorFlow'\nsys.exit(status)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPP_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert (done.returncode, done.stderr) == (0, "")
    assert all(f"run {name} " in done.stdout for name in LOSS_RUNS)
    # A run without a `loss` target (the GAN's two tapes): each of its targets, under its name.
    for target in ("discriminator", "generator"):
        assert f"run gan (target {target})  ·  " in done.stdout
    assert "skipped" not in done.stdout


def test_load_gives_the_reports_numbers(demo):
    import tb_layergrad

    df = tb_layergrad.load(demo["logdir"])
    for name, run in demo["runs"].items():
        for entry in run["layers"]:
            rows = df[(df.run == name) & (df.layer == entry["layer"]) & (df.target == "loss") & (df.source == "output")]
            assert len(rows) == entry["recorded"]
            last = rows[rows.step == entry["last_step"]].iloc[0]
            assert last["norm"] == entry["last_norm"] or (np.isnan(last["norm"]) and entry["last_norm"] is None)


def test_seed_model_is_the_subclassed_minimalrnn(demo):
    assert set(demo["layers"]["seed_minimalrnn"]) == {"minimalrnn", "out"}
    assert demo["runs"]["seed_minimalrnn"]["layers"][0]["layer"] == "my_model/minimalrnn"


def test_serve_prints_the_tabs_url(demo):
    code = f"from tb_layergrad.cli import demo; demo.serve({demo['logdir']!r}, port=0)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://\S+/)#layergrad", line).group(1)
        with urllib.request.urlopen(url + "data/plugin/layergrad/runs", timeout=30) as r:
            runs = json.loads(r.read())["runs"]
        assert sorted(r["run"] for r in runs) == sorted(demo_module.RUN_NAMES + demo_sweep.RUN_NAMES)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_flipped_labels_carry_their_steps_gradient(demo, tb_reading):
    """`mislabelled`: once the classifier has learnt (from step 16 on), each batch holding a flipped label shows
    it as the largest per-example norm of every weight, with most of the gradient energy (docs/FORMAT.md)."""

    found = tb_reading.examples(demo["logdir"])["mislabelled"][("loss", "weight")]
    F = metadata.EXAMPLE_INDEX
    planted = demo_module.mislabelled_positions(demo_module.Plan.for_mode(True).mlp)
    assert sorted(found) == list(range(1, demo_module.Plan.for_mode(True).mlp + 1))
    late = {step: position for step, position in planted.items() if step >= 16}
    assert late
    for step, position in late.items():
        row = found[step]["mislabelled/logits/kernel"]
        assert row[F["top_index_1"]] == position, step
        assert row[F["top_share"]] > 0.9, (step, row[F["top_share"]])


def test_the_gan_discriminator_wins_and_the_generators_gradient_vanishes(demo):
    """`gan`: two targets, one per tape of the guide's step, every step; the discriminator's loss falls toward 0
    and the generator's gradients (its output's, and every layer's under its target) by GAN_VANISH."""
    import tb_layergrad
    from tb_layergrad.cli import demo_gan

    steps = demo_module.Plan.for_mode(quick=True).gan
    df = tb_layergrad.load(demo["logdir"])
    gan = df[df.run == "gan"]
    assert set(gan.target) == {demo_gan.D_TARGET, demo_gan.G_TARGET}
    for target in (demo_gan.D_TARGET, demo_gan.G_TARGET):
        assert sorted(gan[gan.target == target].step.unique()) == list(range(1, steps + 1)), target
    d_loss = gan[(gan.target == demo_gan.D_TARGET) & (gan.source == "target")].set_index("step")["mean"]
    assert d_loss[steps] < 0.01 * d_loss[1], d_loss  # the discriminator wins
    out = gan[(gan.target == demo_gan.G_TARGET) & (gan.source == "output")]
    assert demo_gan.G_OUTPUT in set(out.layer)
    generator = out[out.layer.str.startswith(demo_gan.G_OUTPUT)]
    for layer, rows in generator.groupby("layer"):
        norm = rows.set_index("step")["norm"]
        assert norm[steps] < norm.loc[1:10].max() / demo_gan.GAN_VANISH, (layer, norm.to_dict())


def test_the_sweep_logs_its_hyperparameters_and_the_activation_explains_the_vanishing(demo, console_script):
    sweep = {name: demo["runs"][name] for name in demo_sweep.RUN_NAMES}
    assert len(sweep) == len(demo_sweep.LEARNING_RATES) * len(demo_sweep.ACTIVATIONS) == 6
    for activation, lr in demo_sweep.TRIALS:
        run = sweep[demo_sweep.run_name(lr, activation)]
        assert run["hparams"] == {"activation": activation, "learning_rate": lr}  # hp.KerasCallback's, read back
        assert run["summary"]["last_step"] == demo_sweep.STEPS[True]
        vanishing = [name for name, layer in demo["layers"][run["run"]].items() if "vanishing" in layer["now"]]
        if activation == "sigmoid":
            assert "dense_0" in vanishing, (run["run"], vanishing)
        else:
            assert vanishing == [], (run["run"], vanishing)
    # Sorted by the first layer's norm, the sweep's sigmoid runs come first whatever their learning rate.
    r = subprocess.run(
        [
            console_script.CLI,
            "report",
            demo["logdir"],
            *sum((["--run", n] for n in demo_sweep.RUN_NAMES), []),
            "--format",
            "csv",
            "--sort",
            "last_norm",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rows = [row for row in csv.DictReader(io.StringIO(r.stdout)) if row["layer"].endswith("/dense_0")]
    assert [row["hp/activation"] for row in rows] == ["sigmoid"] * 3 + ["relu"] * 3
    assert sorted(float(row["hp/learning_rate"]) for row in rows[:3]) == list(demo_sweep.LEARNING_RATES)


def test_sorting_keeps_each_run_and_target_whole(demo, console_script):
    # The GAN is reported once per target: --sort orders (run, target) results, each with all its layers.
    r = subprocess.run(
        [console_script.CLI, "report", demo["logdir"], "--format", "json", "--sort=-last_norm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    unsorted = demo["by_target"]
    got = {(run["run"], run["target"]): run for run in body["runs"]}
    assert got.keys() == unsorted.keys() and len(body["runs"]) == len(unsorted)
    assert ("gan", "generator") in got and ("gan", "discriminator") in got
    for key, run in got.items():
        assert sorted(l["layer"] for l in run["layers"]) == sorted(l["layer"] for l in unsorted[key]["layers"])
        norms = [l["last_norm"] for l in run["layers"] if l["last_norm"] is not None]
        assert norms == sorted(norms, reverse=True), key
    firsts = [run["layers"][0]["last_norm"] for run in body["runs"] if run["layers"][0]["last_norm"] is not None]
    assert firsts == sorted(firsts, reverse=True)
