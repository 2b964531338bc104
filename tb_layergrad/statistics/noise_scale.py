"""The gradient noise scale (McCandlish et al. 2018) from per-example and batch gradient norms: the one formula.

Why a module of its own: the custom loop and the `fit()` step write it
(`summary.per_example_write`), and docs/FORMAT.md ("the gradient noise scale")
states it; it is computed here only. With B examples, S = mean_i Σ_v ‖g_{i,v}‖²
over the covered trainable variables v (those with an exact per-example rule)
and |G_B|² the batch gradient's squared norm over the same variables:

    signal |G|² ≈ (B |G_B|² − S) / (B − 1)
    trace tr(Σ) ≈ (S − |G_B|²) · B / (B − 1)
    B_simple    = tr(Σ) / |G|²

Both estimates are unbiased for a batch-mean loss whose examples are drawn
independently; B_simple is only meaningful where the signal estimate is
positive (the caller writes nothing otherwise). float64 throughout: S and
B·|G_B|² are close when the noise dominates, and their difference is the point.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf


class NoiseScale(NamedTuple):
    trace: tf.Tensor  # tr(Σ) estimate, float64 scalar
    signal: tf.Tensor  # |G|² estimate, float64 scalar
    b_simple: tf.Tensor  # trace / signal (any value; the writer checks signal > 0 and finiteness)


def estimate(per_example_sum_sq: Any, batch_sq: Any, examples: Any) -> NoiseScale:
    """The estimates from Σ_i ‖g_{i,v}‖² per variable ([k]), ‖G_B,v‖² per variable ([k]) and B (a scalar)."""
    b = tf.cast(examples, tf.float64)
    s = tf.reduce_sum(tf.cast(per_example_sum_sq, tf.float64)) / b
    g2 = tf.reduce_sum(tf.cast(batch_sq, tf.float64))
    signal = (b * g2 - s) / (b - 1.0)
    trace = (s - g2) * b / (b - 1.0)
    return NoiseScale(trace, signal, trace / signal)


__all__ = ["NoiseScale", "estimate"]
