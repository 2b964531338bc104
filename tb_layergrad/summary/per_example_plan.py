"""What a step writes of its per-example norms: a `PerExample` beside the plan's series (docs/FORMAT.md, kind `examples`).

Why beside the series, not as series: an `examples` record is one per
(target, source) group of `stats`, with the very same layer list, so the rows
are laid out at write time from the groups the step writes
(`per_example_write`); what the plan carries is only each path's [B] norms,
or why it has none. Built here from a `PerExampleNorms` (the capture's) or a
plain mapping path -> [B] norms.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

import tensorflow as tf

from tb_layergrad import metadata
from tb_layergrad.capturing import per_example_map
from tb_layergrad.capturing.gradient_map import GradientMap
from tb_layergrad.capturing.per_example_map import PerExampleNorms


@dataclasses.dataclass(frozen=True)
class PerExample:
    """One target's per-example norms for one step, as a plan carries them."""

    target: str
    norms: Tuple[Tuple[str, Any], ...]  # (path, [B] float tensor or a `Deferred`) for every path with numbers
    status: Tuple[Tuple[str, int], ...]  # (path, EXAMPLE_UNSUPPORTED or EXAMPLE_COUPLED) for paths without
    elements: Tuple[Tuple[str, int], ...] = ()  # (weight path, parameter count): the noise scale's coverage
    parameters: int = 0  # trainable parameters the target depends on (coverage's denominator); 0: the weights'

    def norm_of(self, path: str) -> Any:
        """The path's norms as held (a tensor or a `Deferred`: `per_example_map.squared` reads either), or None."""
        return dict(self.norms).get(path)

    def status_of(self, path: str) -> Optional[int]:
        return dict(self.status).get(path)

    def batch_size(self) -> Optional[tf.Tensor]:
        """The number of examples (int32 scalar), from the first path with numbers; None when none has."""
        for _, norm in self.norms:
            return per_example_map.batch_of(norm)
        return None

    # -- a flat dict of tensors and back: how it leaves a compiled step (with `Plan.tensors`) --------
    def tensors(self) -> Dict[str, Any]:
        """Every path's norms built now (they leave the step as they are)."""
        return {f"{self.target}|examples|{path}": per_example_map.materialized(norm) for path, norm in self.norms}

    def with_tensors(self, tensors: Mapping[str, Any]) -> "PerExample":
        norms = tuple((path, tensors.get(f"{self.target}|examples|{path}")) for path, _ in self.norms)
        return dataclasses.replace(self, norms=norms)


def from_norms(
    per_example: Any,
    target: str,
    gmap: Optional[GradientMap] = None,
    scale: Any = None,
    parameters: Optional[int] = None,
) -> Optional[PerExample]:
    """The plan's view of `per_example` (a `PerExampleNorms` or a mapping path -> [B] norms), or None.

    `gmap`: the gradients of the same pass, for the weights' parameter counts
    and the trainable parameters (`parameters`, when not given: the sizes of
    its `variable_gradients` that are not None). `scale`: a loss scale to
    divide the norms by (mixed precision: they carry it, as the gradients do).
    """
    if per_example is None or per_example is False:
        return None
    if not isinstance(per_example, PerExampleNorms):
        per_example = PerExampleNorms(dict(per_example))
    norms = []
    inverse = None if scale is None else 1.0 / tf.cast(scale, tf.float32)
    for path, entry in per_example.entries().items():  # deferred ones stay so: built where they are written
        if entry is None:
            continue
        norms.append((path, entry if inverse is None else per_example_map.scaled(entry, inverse)))
    status = tuple(
        (path, metadata.EXAMPLE_COUPLED if per_example.is_coupled(path) else metadata.EXAMPLE_UNSUPPORTED)
        for path in per_example.unsupported
    )
    elements: Tuple[Tuple[str, int], ...] = ()
    if gmap is not None:
        elements = tuple(
            (p, int(gmap.entry(p).elements))
            for p in gmap
            if gmap.entry(p).source == metadata.SOURCE_WEIGHT and gmap.entry(p).elements >= 0
        )
        if parameters is None:
            parameters = trainable_parameters(gmap)
    return PerExample(target, tuple(norms), status, elements, int(parameters or 0))


def trainable_parameters(gmap: GradientMap) -> int:
    """The parameters of the trainable variables the target depends on (0 when the map does not carry them)."""
    total = 0
    for g in gmap.variable_gradients:
        if g is None:
            continue
        shape = (
            g.dense_shape
            if isinstance(g, tf.IndexedSlices)
            else tf.shape(g)
            if g.shape.num_elements() is None
            else None
        )
        if shape is None:
            total += int(g.shape.num_elements())
        else:
            try:
                total += int(tf.get_static_value(tf.reduce_prod(shape)))
            except TypeError:  # not known while tracing: the coverage falls back to the weight entries' total
                return 0
    return total


__all__ = ["PerExample", "from_norms", "trainable_parameters"]
