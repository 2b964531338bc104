"""The `examples` rows and the gradient noise scale of one step, in numpy, from the squared per-example norms.

Why numpy on the host, beside `per_example_records` (TensorFlow's, in the step): a backend
without TensorFlow hands out each layer's [B] squared norms with the step's other numbers, and the rows are a
sort and a few sums of those, once per written step. The same columns, order, tie rule (the lower position
first among equal norms) and undefined values (NaN, positions -1) as the TensorFlow rows; a test holds the two
to each other.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tb_layergrad import metadata

K = metadata.EXAMPLE_TOP_K
WIDTH = len(metadata.EXAMPLE_FIELDS)


def exact_rows_from_squares(squares: np.ndarray) -> np.ndarray:
    """float64 [L, WIDTH]: the rows of L layers of one batch, from their [L, B] squared per-example norms."""
    sq = np.asarray(squares, dtype=np.float64)
    rows, count = sq.shape
    out = np.full((rows, WIDTH), np.nan)
    out[:, metadata.EXAMPLE_INDEX["examples"]] = count
    out[:, metadata.EXAMPLE_INDEX["status"]] = metadata.EXAMPLE_EXACT
    k = min(count, K)
    first_index = metadata.EXAMPLE_INDEX["top_index_1"]
    out[:, first_index : first_index + K] = -1.0
    sum_sq = sq.sum(axis=1)
    out[:, metadata.EXAMPLE_INDEX["sum_sq"]] = sum_sq
    if count == 0:
        return out
    order = np.argsort(-sq, axis=1, kind="stable")  # descending; equal values keep the lower position first
    ranked = np.take_along_axis(sq, order, axis=1)
    roots = np.sqrt(ranked)
    out[:, metadata.EXAMPLE_INDEX["min"]] = roots[:, count - 1]
    out[:, metadata.EXAMPLE_INDEX["median"]] = (roots[:, (count - 1) // 2] + roots[:, count // 2]) / 2.0
    out[:, metadata.EXAMPLE_INDEX["max"]] = roots[:, 0]
    positive = sum_sq > 0
    out[:, metadata.EXAMPLE_INDEX["top_share"]] = np.where(
        positive, ranked[:, 0] / np.where(positive, sum_sq, 1.0), np.nan
    )
    out[:, first_index : first_index + k] = order[:, :k]
    first_norm = metadata.EXAMPLE_INDEX["top_norm_1"]
    out[:, first_norm : first_norm + k] = roots[:, :k]
    return out


def status_row(examples: float, status: int) -> np.ndarray:
    """float64 [WIDTH]: a layer without numbers (EXAMPLE_UNSUPPORTED, EXAMPLE_COUPLED): NaN, positions -1."""
    if status == metadata.EXAMPLE_EXACT:
        raise ValueError("a row with status EXAMPLE_EXACT has numbers: use exact_rows_from_squares")
    row = np.full(WIDTH, np.nan)
    row[metadata.EXAMPLE_INDEX["examples"]] = examples
    row[metadata.EXAMPLE_INDEX["status"]] = status
    first_index = metadata.EXAMPLE_INDEX["top_index_1"]
    row[first_index : first_index + K] = -1.0
    return row


class NoiseScale(NamedTuple):
    trace: float  # tr(Σ) estimate
    signal: float  # |G|² estimate
    b_simple: float  # trace / signal (the writer checks signal > 0 and finiteness)


def noise_scale(per_example_sum_sq: np.ndarray, batch_sq: np.ndarray, examples: int) -> NoiseScale:
    """From Σ_i ‖g_{i,v}‖² and ‖G_B,v‖² of each covered variable v, and B (docs/FORMAT.md's estimates)."""
    b = float(examples)
    s = float(np.sum(np.asarray(per_example_sum_sq, np.float64))) / b
    g2 = float(np.sum(np.asarray(batch_sq, np.float64)))
    with np.errstate(divide="ignore", invalid="ignore"):
        signal = (b * g2 - s) / (b - 1.0) if b != 1 else float("nan")
        trace = (s - g2) * b / (b - 1.0) if b != 1 else float("nan")
        ratio = float(np.float64(trace) / np.float64(signal))
    return NoiseScale(trace, signal, ratio)


def noise_scale_scalars(estimate: NoiseScale, coverage: float, coupled: bool) -> dict:
    """{tag: value} written at a step (docs/FORMAT.md): coverage always; trace and signal when both are finite;
    B_simple also when the signal is positive, B_simple finite and no weight coupled."""
    out = {metadata.NOISE_SCALE_TAGS["coverage"]: coverage}
    if np.isfinite(estimate.trace) and np.isfinite(estimate.signal):
        out[metadata.NOISE_SCALE_TAGS["trace"]] = estimate.trace
        out[metadata.NOISE_SCALE_TAGS["signal"]] = estimate.signal
        if estimate.signal > 0 and np.isfinite(estimate.b_simple) and not coupled:
            out[metadata.NOISE_SCALE_TAGS["noise_scale"]] = estimate.b_simple
    return out
