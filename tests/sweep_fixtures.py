"""A sweep of RUNS runs for the compare view at scale (tests/tab/test_tab_sweep_e2e.py, scripts, bench).

Each run: STEPS steps of LAYERS' `stats` and `histogram` records (`long_fixtures.write_run`: framed as the summary ops write
them, fast), its own noise and size (`gain`: the runs' norms are spread over two decades, so that each line can
be told from the next), and its hyperparameters written with TensorBoard's HParams API (`hp.hparams`) in the
run's own folder:

- `learning_rate`: 1e-4 … 1e-1, growing with the run's number (positive, three decades: a log scale);
- `units`: 8 … 36 (less than a decade: a linear scale);
- `activation`: one of ACTIVATIONS (one holds HTML), absent from every run whose number ends in 5;
- the last NO_SESSION runs log no hyperparameters at all.

Two runs have hostile names (HTML, an attribute breakout), shown as text everywhere.
"""

from __future__ import annotations

import os
from typing import Dict, List

import long_fixtures as lf

RUNS = 100
STEPS = 1000
LAYERS = ["net/a", "net/b"]
ACTIVATIONS = ["relu", "tanh", "<b>gelu</b>"]
NO_SESSION = 3
HOSTILE = {10: "sweep/<img src=x onerror=alert(1)>", 20: 'sweep/" autofocus onfocus="alert(3)'}


def run_name(k: int) -> str:
    return HOSTILE.get(k, f"sweep/run_{k:03d}")


NAMES = [run_name(k) for k in range(RUNS)]


def gain(k: int) -> float:
    return 10.0 ** (k / 50)


def hparams_of(k: int) -> Dict[str, object]:
    """What run k logged ({} for none)."""
    if k >= RUNS - NO_SESSION:
        return {}
    hp: Dict[str, object] = {"learning_rate": 10.0 ** (-4 + 3 * k / (RUNS - 1)), "units": 8 + 4 * (k % 8)}
    if k % 10 != 5:
        hp["activation"] = ACTIVATIONS[k % len(ACTIVATIONS)]
    return hp


def write_sweep_logdir(logdir: str) -> Dict[str, Dict[str, object]]:
    """Write the sweep; returns {run: its hyperparameters}."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    out: Dict[str, Dict[str, object]] = {}
    for k, name in enumerate(NAMES):
        path = os.path.join(logdir, name)
        lf.write_run(path, LAYERS, STEPS, keep=False, seed=k + 1, gain=gain(k), histograms=True)
        values = hparams_of(k)
        if values:
            with tf.summary.create_file_writer(path, filename_suffix=".hparams").as_default():
                hp.hparams(values, trial_id=name)
        out[name] = values
    return out


def runs_sorted_by(values: Dict[str, Dict[str, object]], name: str) -> List[str]:
    """The runs that have hyperparameter `name`, by its value."""
    return sorted((r for r, hp in values.items() if name in hp), key=lambda r: values[r][name])
