"""The gradient noise scale B_simple as the tab draws it, and its value at the end of a run.

The writer logs two unbiased but noisy estimates per step, the trace tr(Σ) and the signal |G|², as
TensorBoard scalars (docs/FORMAT.md). B_simple is EMA(trace) / EMA(signal), each a debiased EMA as
TensorBoard's Scalars dashboard smooths: the ratio of two averages, not an average of per-step ratios (a
step's signal estimate is often <= 0, and the ratio of two noisy numbers is biased). This module is the one
place that computes it: the `noise_scale` route sends it for the weight the tab's slider asks
(`estimate`), and a run's "noise scale at the end" (the `sweep` route) is the last value of that line, so a
sweep's column is the number the chart ends on. No TensorFlow.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from tensorboard.data import provider as tb_provider

from tb_layergrad import metadata
from tb_layergrad.reader import series

# TensorBoard's Scalars dashboard's default smoothing, the tab's slider's default (frontend/smoothing.js).
DEFAULT_SMOOTHING = 0.6
SCALARS_PLUGIN = "scalars"
TRACE_TAG = metadata.NOISE_SCALE_TAGS["trace"]
SIGNAL_TAG = metadata.NOISE_SCALE_TAGS["signal"]

Version = Tuple[Tuple[Optional[int], Optional[float]], ...]


def ema(values: Sequence[Optional[float]], weight: float = DEFAULT_SMOOTHING) -> list:
    """TensorBoard's smoothing: a debiased EMA; a missing or non-finite value is skipped (None there).

    Example:

        ema([1.0, None, 3.0], 0.5)  # [1.0, None, 2.333...]
    """
    out: list = [None] * len(values)
    last, n = 0.0, 0
    for k, v in enumerate(values):
        if v is None or not math.isfinite(v):
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out[k] = last / (1 - weight**n) if weight != 1 else last
    return out


def estimate(
    trace: Sequence[Optional[float]], signal: Sequence[Optional[float]], weight: float = DEFAULT_SMOOTHING
) -> List[Optional[float]]:
    """EMA(trace) / EMA(signal) at each step; None where either has no value at that step, or the averaged
    signal is <= 0 (B_simple has no positive value there).

    Example:

        estimate([4.0, 4.0], [2.0, 1.0], 0.0)  # [2.0, 4.0]
    """
    t = ema(trace, weight)
    g = ema(signal, weight)
    out: List[Optional[float]] = []
    for a, b in zip(t, g):
        value = a / b if a is not None and b is not None and b > 0 else None
        out.append(value if value is not None and math.isfinite(value) else None)
    return out


def smoothed_end(
    trace: Dict[int, float], signal: Dict[int, float], weight: float = DEFAULT_SMOOTHING
) -> Optional[float]:
    """The last defined value of EMA(trace) / EMA(signal) on the union of their steps.

    Args:
      trace, signal: `{step: value}` of the two scalars.
      weight: the smoothing weight in [0, 1).

    Returns:
      The smoothed noise scale at the last step where it is defined (the averaged signal > 0), or None.

    Example:

        smoothed_end({0: 4.0, 1: 4.0}, {0: 2.0, 1: 1.0}, 0.0)  # 4.0
    """
    steps = sorted(set(trace) | set(signal))
    line = estimate([trace.get(s) for s in steps], [signal.get(s) for s in steps], weight)
    return next((v for v in reversed(line) if v is not None), None)


class EndCache:
    """`{(experiment, run): (version, smoothed end)}`, valid while `list_scalars` reports the two tags unchanged."""

    def __init__(self) -> None:
        self._ends: Dict[Tuple[str, str], Tuple[Version, Optional[float]]] = {}

    def read(
        self,
        provider: tb_provider.DataProvider,
        ctx: Any,
        experiment_id: str,
        runs: Iterable[str],
        lister: Any = None,
    ) -> Dict[str, Optional[float]]:
        """`{run: smoothed end or None}` of `runs`; reads the scalars of only the runs whose tags changed.

        Args:
          provider, ctx, experiment_id: as for `reader.hparams.sessions`.
          runs: the runs asked (one without the scalars: None).
          lister: anything with the provider's `list_scalars` (the plugin's, which folds each record once).

        Returns:
          One entry per run, in the order given.

        Example:

            from tensorboard import context
            from tb_layergrad.reader import event_files, noise_scale
            ends = noise_scale.EndCache().read(event_files.open_provider("logs"), context.RequestContext(), "", ["a"])
        """
        runs = list(runs)
        tags = [TRACE_TAG, SIGNAL_TAG]
        listed = (lister or provider).list_scalars(
            ctx,
            experiment_id=experiment_id,
            plugin_name=SCALARS_PLUGIN,
            run_tag_filter=tb_provider.RunTagFilter(runs=runs, tags=tags),
        )
        versions: Dict[str, Version] = {}
        for run in runs:
            found = listed.get(run, {})
            if all(t in found for t in tags):
                versions[run] = tuple((found[t].max_step, found[t].max_wall_time) for t in tags)
        stale = [r for r in versions if self._ends.get((experiment_id, r), (None,))[0] != versions[r]]
        if stale:
            answer = provider.read_scalars(
                ctx,
                experiment_id=experiment_id,
                plugin_name=SCALARS_PLUGIN,
                downsample=series.READ_ALL,
                run_tag_filter=tb_provider.RunTagFilter(runs=stale, tags=tags),
            )
            for run in stale:
                data = answer.get(run, {})
                # A repeated step: the later record wins, as for the layergrad records.
                trace = {int(d.step): float(d.value) for d in data.get(TRACE_TAG, ())}
                signal = {int(d.step): float(d.value) for d in data.get(SIGNAL_TAG, ())}
                self._ends[(experiment_id, run)] = (versions[run], smoothed_end(trace, signal))
        return {r: self._ends[(experiment_id, r)][1] if r in versions else None for r in runs}
