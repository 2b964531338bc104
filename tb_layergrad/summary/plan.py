"""What one step writes: a plan of series, built once from a `GradientMap`, written by `write.write_step`.

Why a plan: the custom loop (`summary.gradients`), the `fit()` step and the
distributed paths all write the same records (docs/FORMAT.md). They differ
only in where the tensors are when the writing happens: still raw gradients,
already reduced (before they crossed replicas in `fit()`), or handed out of a
compiled step as a flat dict. A plan says what is written, with the metadata
of each series, independent of where; `write_step` is the one place that
decides how.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing.gradient_map import GradientMap
from tb_layergrad.capturing.rnn_probe import timestep_norms
from tb_layergrad.statistics import special_records

# Suffix of the layer path for the bounded [T, units] per-timestep tensor (kind "tensor").
TIMESTEP_TENSOR_SUFFIX = "[h_t]"


@dataclasses.dataclass(frozen=True)
class Series:
    """One tensor's records: its histogram and stats (and, if asked, its bounded raw values).

    `data` is the gradient (None: "no gradient", the target does not depend on
    it); `reduced` its (histogram, stats) when already computed (e.g. before
    crossing replicas; the histogram [k, 3], or its counts [k] alone); `raw`
    its bounded raw tensor when already cut.
    """

    info: metadata.SeriesInfo  # kind "stats"; the other kinds differ only in kind
    data: Any = None
    elements: int = -1  # element count, for a "no gradient" record (-1: unknown)
    max_elements: int = 0  # > 0: also the raw tensor, bounded (`special_records.bounded_tensor`)
    reduced: Optional[Tuple[Any, Any]] = None
    raw: Any = None

    def of_kind(self, kind: str) -> metadata.SeriesInfo:
        return dataclasses.replace(self.info, kind=kind)

    @property
    def present(self) -> bool:
        return self.data is not None or self.reduced is not None

    @property
    def wants_raw(self) -> bool:
        return self.max_elements > 0 and self.present and not self.stats_only

    @property
    def stats_only(self) -> bool:
        """A target's value (one scalar): its stats say whether it was finite; a histogram would say nothing."""
        return self.info.source == metadata.SOURCE_TARGET


@dataclasses.dataclass(frozen=True)
class Timesteps:
    """An RNN layer's per-timestep gradient norms [T] (kind "timesteps"), from dL/dh [batch, T, ...]."""

    info: metadata.SeriesInfo  # kind "timesteps"
    gradient: Any = None  # dL/dh_t, time on axis 1; or None once `norms` are known
    norms: Any = None
    max_elements: int = 0  # > 0: also example 0's [T, units] gradient (layer path + TIMESTEP_TENSOR_SUFFIX)
    raw: Any = None
    dtype: str = ""  # the gradient's dtype, for the raw record's metadata (kept once the gradient is reduced)

    @property
    def raw_info(self) -> metadata.SeriesInfo:
        return dataclasses.replace(
            self.info, layer=self.info.layer + TIMESTEP_TENSOR_SUFFIX, kind=metadata.KIND_TENSOR, dtype=self.dtype
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one step writes, in order."""

    series: Tuple[Series, ...] = ()
    timesteps: Tuple[Timesteps, ...] = ()
    buckets: int = 30
    description: str = ""
    track_nonfinite: bool = True  # keep the `first_nonfinite` records (docs/FORMAT.md, `writer_state`)
    # Each example's own gradient norms of one target (`per_example_write.PerExample`), or a tuple of them (one per
    # target): its `examples` records and, for the loss, the noise scale, written with the groups of that target
    # (`per_example_write`).
    per_example: Any = None

    def __add__(self, other: "Plan") -> "Plan":
        return dataclasses.replace(
            self,
            series=self.series + other.series,
            timesteps=self.timesteps + other.timesteps,
            per_example=_joined(self.examples() + other.examples()),
        )

    def examples(self) -> Tuple[Any, ...]:
        """The `PerExample` of each target that has some, in order (none: ())."""
        if self.per_example is None:
            return ()
        return tuple(self.per_example) if isinstance(self.per_example, tuple) else (self.per_example,)

    # -- a flat dict of tensors and back: how a plan leaves a compiled step --------
    def tensors(self) -> Dict[str, Any]:
        """Every tensor the plan holds, keyed by "<tag>|<part>" (no None values)."""
        out: Dict[str, Any] = {}
        for s in self.series:
            for part, value in (("data", s.data), ("raw", s.raw)):
                if value is not None:
                    out[f"{s.info.tag}|{part}"] = value
            if s.reduced is not None:
                out[f"{s.info.tag}|histogram"], out[f"{s.info.tag}|stats"] = s.reduced
        for t in self.timesteps:
            for part, value in (("gradient", t.gradient), ("norms", t.norms), ("raw", t.raw)):
                if value is not None:
                    out[f"{t.info.tag}|{part}"] = value
        for spec in self.examples():
            out.update(spec.tensors())
        return out

    def with_tensors(self, tensors: Dict[str, Any]) -> "Plan":
        """This plan's structure holding `tensors` (as `tensors()` keyed them)."""

        def get(tag: str, part: str) -> Any:
            return tensors.get(f"{tag}|{part}")

        series = []
        for s in self.series:
            hist, stats = get(s.info.tag, "histogram"), get(s.info.tag, "stats")
            reduced = (hist, stats) if stats is not None else None
            series.append(
                dataclasses.replace(s, data=get(s.info.tag, "data"), reduced=reduced, raw=get(s.info.tag, "raw"))
            )
        steps = [
            dataclasses.replace(
                t, gradient=get(t.info.tag, "gradient"), norms=get(t.info.tag, "norms"), raw=get(t.info.tag, "raw")
            )
            for t in self.timesteps
        ]
        per_example = _joined(tuple(spec.with_tensors(tensors) for spec in self.examples()))
        return dataclasses.replace(self, series=tuple(series), timesteps=tuple(steps), per_example=per_example)

    def prepared(self) -> "Plan":
        """The small records computed now (per-timestep norms, bounded raw tensors); the reductions not.

        Why: where the gradients leave a compiled step to be reduced elsewhere
        (XLA, eager), what is small is better computed where the big tensors are.
        """
        series = tuple(
            dataclasses.replace(s, raw=special_records.bounded_tensor(s.data, s.max_elements))
            if s.wants_raw and s.raw is None and s.data is not None
            else s
            for s in self.series
        )
        steps = tuple(_timestep_records(t) for t in self.timesteps)
        return dataclasses.replace(self, series=series, timesteps=steps)


def _timestep_records(t: Timesteps) -> Timesteps:
    if t.norms is not None:
        return t
    raw = special_records.bounded_tensor(t.gradient[0], t.max_elements) if t.max_elements > 0 else None
    return dataclasses.replace(t, gradient=None, norms=timestep_norms(t.gradient), raw=raw)


def groups(
    items: Sequence[Any], info_of: Callable[[Any], metadata.SeriesInfo] = lambda s: s.info
) -> Tuple[Tuple[Any, ...], ...]:
    """The series (or what `info_of` finds their info in) by (target, source), in the order each first appears:
    one record per kind each (docs/FORMAT.md)."""
    by_key: Dict[Tuple[str, str], list] = {}
    for item in items:
        info = info_of(item)
        by_key.setdefault((info.target, info.source), []).append(item)
    return tuple(tuple(members) for members in by_key.values())


# -- building plans ------------------------------------------------------------------
def check_buckets(buckets: int) -> int:
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"buckets must be an integer >= 1, got {buckets!r}")
    return buckets


def series(
    path: str,
    data: Any,
    *,
    target: str,
    source: str = metadata.SOURCE_OUTPUT,
    index: int = -1,
    elements: int = -1,
    max_elements: int = 0,
    dtype: Optional[str] = None,
) -> Series:
    """One series, its arguments checked where the op is traced."""
    if not isinstance(path, str) or not path:
        raise ValueError("name must be a non-empty string")
    if max_elements < 0:
        raise ValueError(f"max_elements must be >= 0, got {max_elements}")
    if dtype is None:
        dtype = "" if data is None else tf.as_dtype(getattr(data, "dtype", tf.float32)).name
    info = metadata.SeriesInfo(
        layer=path, kind=metadata.KIND_STATS, target=target, source=source, index=int(index), dtype=dtype
    )
    return Series(info, data, elements, max_elements)


def from_gradients(
    gmap: GradientMap,
    target: Optional[str] = None,
    max_elements: int = 0,
    buckets: int = 30,
    captured_dtypes: bool = False,
) -> Plan:
    """The plan of every entry of a `GradientMap`, in its order.

    `captured_dtypes`: each series' dtype is the captured tensor's (what the
    model computes in, e.g. float16 under mixed precision), not the gradient's.
    """
    name = target or gmap.target
    gradients = tuple(
        series(
            p,
            e.value,
            target=name,
            source=e.source,
            index=e.index,
            elements=e.elements,
            max_elements=max_elements,
            dtype=e.dtype if captured_dtypes else None,
        )
        for p, e in ((p, gmap.entry(p)) for p in gmap)
    )
    return Plan(gradients + forward_series(gmap, name, max_elements), buckets=check_buckets(buckets))


def forward_series(gmap: GradientMap, target: Optional[str] = None, max_elements: int = 0) -> Tuple[Series, ...]:
    """The forward side of the pass a `GradientMap` comes from: its activations (if captured) and its target's value.

    Why beside the gradients: where a NaN was born (forward, loss, backward) is
    told by comparing them at one step (`tb_layergrad.nonfinite_origin`).
    """
    name = target or gmap.target
    acts = tuple(
        activation_series(p, e.value, index=e.index, max_elements=max_elements, dtype=e.dtype)
        for p, e in ((p, gmap.activation_entry(p)) for p in gmap.activations)
    )
    if gmap.target_value is None:
        return acts
    return acts + (target_series(name, gmap.target_value),)


def activation_series(
    path: str, value: Any, *, index: int = -1, max_elements: int = 0, dtype: Optional[str] = None
) -> Series:
    """A layer output's forward value (source "activation", docs/FORMAT.md)."""
    return series(
        path,
        value,
        target=metadata.ACTIVATION_TARGET,
        source=metadata.SOURCE_ACTIVATION,
        index=index,
        max_elements=max_elements,
        dtype=dtype,
    )


def target_series(name: str, value: Any) -> Series:
    """The differentiated scalar's own value (source "target", stats only, docs/FORMAT.md)."""
    return series(name, value, target=name, source=metadata.SOURCE_TARGET, index=-1, elements=1)


def timesteps(
    path: str,
    *,
    target: str,
    index: int = -1,
    gradient: Any = None,
    norms: Any = None,
    max_elements: int = 0,
    dtype: Optional[str] = None,
) -> Timesteps:
    """An RNN layer's per-timestep series; `dtype`: the probed state's (default: the gradient's)."""
    info = metadata.SeriesInfo(
        layer=path,
        kind=metadata.KIND_TIMESTEPS,
        target=target,
        source=metadata.SOURCE_OUTPUT,
        index=int(index),
        dtype="float64",
    )
    norms = None if norms is None else tf.cast(tf.reshape(norms, [-1]), tf.float64)
    if dtype is None:
        dtype = "" if gradient is None else tf.as_dtype(gradient.dtype).name
    return Timesteps(info, gradient, norms, max_elements, dtype=dtype)


def _joined(specs: Tuple[Any, ...]) -> Any:
    """`Plan.per_example` of these specs: the first of each target (a plan and its auxiliary part may both carry
    it), None, one, or a tuple."""
    kept: Dict[str, Any] = {}
    for spec in specs:
        kept.setdefault(spec.target, spec)
    values = tuple(kept.values())
    return None if not values else values[0] if len(values) == 1 else values
