"""The logdir of the tab's chart tests (tests/tab/test_tab_charts_e2e.py), written with the real summary ops.

Runs (steps 0 … STEPS-1, layers LAYERS):
- `steady`: gradients of two layers whose norms stay within 20% (a narrow colour bar), a quarter of
  `net/b`'s elements exactly 0 (zero fraction 0.25);
- `zero`: the same `net/a`, and `net/b`'s gradient all zeros (its norm is 0: nothing on a log axis);
- `act`: as `steady`, with the layers' forward values (source `activation`) too;
- `noisy`: per-example records and the noise-scale scalars (examples_fixtures' writers), its signal
  estimate below 0 over NEGATIVE_SIGNAL steps, so that the averaged signal is <= 0 for a while.

Also the helpers that read the page as a person does: printed numbers' significant digits, boxes that
overlap, a path's points, TensorBoard's smoothing (numpy, for the expected numbers).
"""

from __future__ import annotations

import dataclasses
import os
import re
import zlib
from typing import Dict, Tuple

import examples_fixtures as ef
import numpy as np

STEADY, ZERO, ACT, NOISY = "steady", "zero", "act", "noisy"
LAYERS = [("net/a", 1), ("net/b", 2)]
STEPS = 40
BUCKETS = 20
NEGATIVE_SIGNAL = range(14, 20)

Key = Tuple[str, str, str, str]  # run, target, source, layer


@dataclasses.dataclass
class Written:
    logdir: str
    arrays: Dict[Key, Dict[int, np.ndarray]]
    trace: np.ndarray
    signal: np.ndarray


def gradient(run: str, layer: str, step: int) -> np.ndarray:
    """The float32 'gradient' written for (run, layer, step)."""
    rng = np.random.default_rng(zlib.crc32(f"{run}|{layer}|{step}".encode()))
    x = rng.normal(scale=1.0 + 0.004 * step, size=(16, 8)).astype(np.float32)
    if layer == "net/b":
        x[:4] = 0.0
        if run == ZERO:
            x[:] = 0.0
    return x


def activation(layer: str, step: int) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"act|{layer}|{step}".encode()))
    return np.maximum(rng.normal(size=(16, 8)), 0).astype(np.float32)


def noise_inputs() -> Tuple[np.ndarray, np.ndarray]:
    """Made-up trace and signal: positive, the signal strongly negative over NEGATIVE_SIGNAL."""
    t = np.arange(ef.STEPS)
    trace = 4.0 + np.sin(t / 5.0)
    signal = 0.5 + 0.1 * np.cos(t / 3.0)
    signal[list(NEGATIVE_SIGNAL)] = -1.5
    return trace, signal


def write_charts_logdir(logdir: str) -> Written:
    import tensorflow as tf

    from tb_layergrad import summary

    w = Written(logdir, {}, *noise_inputs())
    for run in (STEADY, ZERO, ACT):
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        with writer.as_default():
            for step in range(STEPS):
                for layer, index in LAYERS:
                    if run == ACT:
                        a = activation(layer, step)
                        summary.ops.write_tensor(
                            layer,
                            tf.constant(a),
                            step=step,
                            buckets=BUCKETS,
                            source="activation",
                            target="forward",
                            index=index,
                        )
                        w.arrays.setdefault((run, "forward", "activation", layer), {})[step] = a
                    g = gradient(run, layer, step)
                    summary.ops.write_tensor(layer, tf.constant(g), step=step, buckets=BUCKETS, index=index)
                    w.arrays.setdefault((run, "loss", "output", layer), {})[step] = g
        writer.close()
    path = os.path.join(logdir, NOISY)
    ef.write_run(path, ef.make_norms(), True)
    ef.write_scalars(path, w.trace, w.signal, 1.0)
    return w


# -- reading the page ------------------------------------------------------------------------------

NUMBER = re.compile(r"[-−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def significant_digits(text: str) -> int:
    """Significant digits of a printed number; 0 for an integer without exponent (counts and steps are exact)."""
    m = re.fullmatch(r"[-−]?(\d+)(?:\.(\d+))?(?:e([-+]?\d+))?", text.strip())
    assert m, f"not a number: {text!r}"
    whole, frac, exp = m.groups()
    if frac is None and exp is None:
        return 0
    return len((whole + (frac or "")).lstrip("0").rstrip("0") or "0")


def assert_four_digits(texts):
    numbers = [n for t in texts for n in NUMBER.findall(t)]
    assert numbers
    too_long = [n for n in numbers if significant_digits(n) > 4]
    assert too_long == [], too_long


def texts(locator):
    """The text of each element (SVG text has no innerText)."""
    return locator.evaluate_all("es => es.map(e => e.textContent)")


def ema(ys: np.ndarray, w: float) -> np.ndarray:
    """TensorBoard's debiased exponential moving average."""
    out, last = [], 0.0
    for n, v in enumerate(ys, start=1):
        last = last * w + (1 - w) * v
        out.append(last / (1 - w**n))
    return np.asarray(out)


def boxes_overlap(a, b) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def path_points(d: str):
    return [(float(x), float(y)) for x, y in re.findall(r"[ML](-?[\d.]+),(-?[\d.]+)", d)]
