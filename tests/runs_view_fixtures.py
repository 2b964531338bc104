"""A logdir for the Runs view's browser tests: hyperparameters as users log them, and as an attacker would.

`write_runs_view_logdir(d)` writes, under `d`:
- `hparams_fixtures.write_hparams_logdir`'s four runs: `hp.KerasCallback` in fit(), `hp.hparams` at two depths,
  a run without any session (`bare/train`), a hyperparameter that is a number in one run and a string in
  another (`mixed`), an HTML value (`<b>tanh</b>`);
- `tab_fixtures.HOSTILE_RUNS` (names that are HTML, attribute breakouts, a `javascript:` URL), their gradients
  written with the real summary ops, each with `hp.hparams` of hostile names and values: HTML, a 10,000-character
  string, NaN, a number in one run where another holds a string, and a number that is 0 in one run (`wd`).
"""

from __future__ import annotations

import math
import os
from typing import Dict

import tab_fixtures as tf_

LONG = "L" * 10_000 + "<script>alert(31)</script>"
HOSTILE_HP_NAME = "<svg onload=alert(32)>"
HOSTILE_HPARAMS: Dict[str, dict] = {
    tf_.HOSTILE_RUN: {"act": "<img src=x onerror=alert(33)>", "lr": 0.1, "long": LONG, "wd": 0.0},
    tf_.HOSTILE_ATTR_RUN: {"act": '" onmouseover="alert(34)', "lr": math.nan, HOSTILE_HP_NAME: "<i>v</i>"},
    tf_.HOSTILE_JS_RUN: {"lr": "javascript:alert(35)", "long": 3.0, "wd": 1e-4},
}
HOSTILE_STEPS = list(range(6))


def write_runs_view_logdir(logdir: str) -> None:
    """The runs of the module docstring, written as a user (or an attacker) would."""
    import tensorflow as tf
    from hparams_fixtures import write_hparams_logdir
    from tensorboard.plugins.hparams import api as hp

    write_hparams_logdir(logdir)
    tf_.write_tab_logdir(logdir, runs=tf_.HOSTILE_RUNS, steps=HOSTILE_STEPS)
    for run, values in HOSTILE_HPARAMS.items():
        with tf.summary.create_file_writer(os.path.join(logdir, run), filename_suffix=".hparams").as_default():
            hp.hparams(values)


def expected_hparams(run: str) -> dict:
    """What the route reads back for `run` of this logdir: NaN as None (strict JSON), numbers as floats."""
    from hparams_fixtures import EXPECTED

    if run in EXPECTED:
        return EXPECTED[run]
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in HOSTILE_HPARAMS[run].items()}
