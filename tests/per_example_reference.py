"""Independent per-example gradients for the per-example write tests: one tape per example, its own loss on a
batch of one (no capture, no rule), and the numbers the `examples` records and the noise scale must hold,
computed in numpy from docs/FORMAT.md ("Per-example records") as written there.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np
import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.layer_tree import LayerTree

K = metadata.EXAMPLE_TOP_K
F = metadata.EXAMPLE_INDEX


def _dense(g) -> np.ndarray:
    if isinstance(g, tf.IndexedSlices):
        g = tf.convert_to_tensor(g)
    return np.asarray(tf.cast(g, tf.float64))


def per_example_gradients(model, loss_fn: Callable, x, y) -> Dict[str, List[np.ndarray]]:
    """variable path -> [one gradient per example] of each example's own loss (a batch of one)."""
    owners = LayerTree(model).variable_paths()
    out: Dict[str, List[np.ndarray]] = {}
    for i in range(int(x.shape[0])):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[i : i + 1], model(x[i : i + 1], training=True))
        for var, g in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
            out.setdefault(owners[id(var)][0], []).append(_dense(g))
    return out


def output_norms(model, loss_fn: Callable, x, y) -> Dict[str, np.ndarray]:
    """layer path -> [B] ‖∇_{y_i} ℓ_i‖ of each captured layer output, from `capture()` on a batch of one
    (per_example off: the path tests/capturing/test_capture.py checks against by-hand forwards)."""
    import tb_layergrad

    out: Dict[str, List[float]] = {}
    for i in range(int(x.shape[0])):
        with tf.GradientTape() as tape:
            with tb_layergrad.capture(model, tape=tape) as cap:
                loss = loss_fn(y[i : i + 1], model(x[i : i + 1], training=True))
        for path, g in cap.gradients(tape, loss).outputs.items():
            out.setdefault(path, []).append(float(np.linalg.norm(_dense(g).ravel())))
    return {p: np.array(v) for p, v in out.items()}


def batch_gradients(model, loss_fn: Callable, x, y) -> Dict[str, np.ndarray]:
    """variable path -> the batch-mean loss's gradient (one tape on the whole batch)."""
    owners = LayerTree(model).variable_paths()
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return {
        owners[id(v)][0]: _dense(g)
        for v, g in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables))
    }


def norms(grads: Dict[str, List[np.ndarray]]) -> Dict[str, np.ndarray]:
    return {p: np.array([np.linalg.norm(g.ravel()) for g in gs]) for p, gs in grads.items()}


def expected_row(n: np.ndarray) -> Dict[str, float]:
    """The contract's row for per-example norms `n` (docs/FORMAT.md), by field name."""
    n = np.asarray(n, dtype=np.float64)
    order = sorted(range(len(n)), key=lambda i: (-n[i], i))  # largest first, ties: lower position first
    top = order[:K]
    sum_sq = float(np.sum(n.astype(np.float64) ** 2))
    row = {
        "examples": float(len(n)),
        "status": 0.0,
        "min": float(n.min()),
        "median": float(np.median(n)),
        "max": float(n.max()),
        "sum_sq": sum_sq,
        "top_share": float(n.max() ** 2 / sum_sq) if sum_sq > 0 else np.nan,
    }
    for j in range(K):
        row[f"top_index_{j + 1}"] = float(top[j]) if j < len(top) else -1.0
        row[f"top_norm_{j + 1}"] = float(n[top[j]]) if j < len(top) else np.nan
    return row


def noise_scale(per_example: Dict[str, List[np.ndarray]], batch: Dict[str, np.ndarray]) -> Dict[str, float]:
    """trace, signal, B_simple from the formula of docs/FORMAT.md over the given variables, in float64."""
    b = len(next(iter(per_example.values())))
    s = np.mean([sum(float(np.sum(per_example[p][i] ** 2)) for p in per_example) for i in range(b)])
    g2 = sum(float(np.sum(batch[p] ** 2)) for p in per_example)
    signal = (b * g2 - s) / (b - 1)
    trace = (s - g2) * b / (b - 1)
    return {"trace": trace, "signal": signal, "b_simple": trace / signal, "S": s, "G2": g2, "B": b}


def noise_scale_tolerance(ref: Dict[str, float], rtol: float) -> Dict[str, float]:
    """Absolute tolerances of trace and signal when every per-example and batch norm is within `rtol`.

    A squared norm is then within 2·rtol (to first order), so S within 2·rtol·S and |G_B|² within
    2·rtol·|G_B|²; the formula's two terms add their errors: signal within 2·rtol·(B·G2 + S)/(B − 1),
    trace within 2·rtol·(S + G2)·B/(B − 1); B_simple's relative error is the sum of theirs (relative), plus
    the float32 rounding of the written scalar.
    """
    b, s, g2 = ref["B"], ref["S"], ref["G2"]
    signal = 2 * rtol * (b * g2 + s) / (b - 1)
    trace = 2 * rtol * (s + g2) * b / (b - 1)
    f32 = 2.0**-24
    rel = trace / abs(ref["trace"]) + signal / abs(ref["signal"]) + f32
    return {"trace": trace + f32 * abs(ref["trace"]), "signal": signal + f32 * abs(ref["signal"]), "b_simple": rel}


def assert_row(got: np.ndarray, n: np.ndarray, rtol: float, label: str = "") -> None:
    """`got` (a written row) holds the contract's row for norms `n`: counts and positions exact, norms at `rtol`."""
    want = expected_row(n)
    for name, value in want.items():
        g = float(got[F[name]])
        if name in ("examples", "status") or name.startswith("top_index"):
            assert g == value, f"{label} {name}: {g} != {value}"
        elif name in ("sum_sq", "top_share"):
            np.testing.assert_allclose(g, value, rtol=2 * rtol + 2 * rtol, err_msg=f"{label} {name}")
        else:
            np.testing.assert_allclose(g, value, rtol=rtol, err_msg=f"{label} {name}")
