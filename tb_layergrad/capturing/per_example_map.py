"""The result of per-example capture: path -> [batch] norms, and why some paths have none.

Why a class of its own: a missing number must say *why* it is missing. A path maps to None when the
target does not depend on it (as in `GradientMap`) and ALSO when no exact per-example value exists
(a layer without a rule, a BatchNormalization in training mode that couples the examples); the
latter are listed in `unsupported` with the reason, so a reader never takes an absent number for a
zero or a wrong one for a right one. Like `GradientMap`, it can be returned from a `tf.function`.

Why deferred norms: the capture knows at the end of the backward pass everything a norm needs (the
layers' inputs and δ), but the writers log most steps unwritten. A norm is kept as a `Deferred` until
someone reads it, and is built in the graph that reads it: inside the writers' recording condition it
is computed on written steps only; read anywhere else (`norms[path]`, returned from a `tf.function`)
it is computed there, as before. The writers read squared norms (`squared`), which is what their
statistics need, one square root per example fewer.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

from tb_layergrad.capturing.read_only_map import ReadOnlyMap

# How the reason of a path whose examples a BatchNormalization coupled begins (`PerExamplePass` writes it,
# `is_coupled` and the writers read it): a coupled path gets status EXAMPLE_COUPLED on disk, not "unsupported".
COUPLED_REASON = "examples are coupled by"


@dataclasses.dataclass(frozen=True)
class Deferred:
    """One path's norms, not computed yet: ‖∇ℓ_i‖² = `scale`² · `build()` (float32 or float64 [B]).

    `build` makes the ops of the unscaled squared norms in the current graph; `scale` is a scalar
    tensor (the batch size that undoes a batch-mean loss, divided by a loss scale where one applies);
    `batch` the example count (int32 scalar).
    """

    build: Callable[[], Any]
    scale: Any
    batch: Any

    def scaled(self, factor: Any) -> "Deferred":
        """The same norms multiplied by `factor` (a scalar)."""
        return dataclasses.replace(self, scale=self.scale * tf.cast(factor, self.scale.dtype))


class PerGraph:
    """Values made once per graph (eagerly: once), keyed by the caller's key.

    Why: a deferred norm, and a layer's factors, are built in whichever graph reads them (the step's own, a
    recording condition's branch); a tensor of one graph cannot be used in another, and a graph that is gone
    may leave its id to a new one, hence the weak reference checked on every hit.
    """

    def __init__(self) -> None:
        self._held: Dict[Tuple[Any, int], Tuple[Any, Any]] = {}

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        held = self._held.get((key, id(graph)))
        if held is None or (graph is not None and held[0]() is not graph):
            held = (None if graph is None else weakref.ref(graph), make())
            self._held[(key, id(graph))] = held
        return held[1]


def squared(entry: Any) -> Tuple[Any, Any]:
    """(s, c): ‖∇ℓ_i‖² = c² · s, s [B] built in the current graph, c a scalar (a norms tensor: its squares, 1).

    Why apart: a squared batch size times a float32 sum of squares can overflow where the norm does not;
    the writers multiply the two in float64.
    """
    if isinstance(entry, Deferred):
        return entry.build(), entry.scale
    entry = tf.convert_to_tensor(entry)
    entry = entry if entry.dtype.is_floating else tf.cast(entry, tf.float32)
    return tf.square(tf.cast(entry, tf.float64)), tf.constant(1.0, tf.float64)


def materialized(entry: Any) -> Any:
    """The [B] norms of an entry, built in the current graph (a tensor entry as it is)."""
    if isinstance(entry, Deferred):
        sq = entry.build()
        return tf.cast(entry.scale, sq.dtype) * tf.sqrt(sq)
    return tf.convert_to_tensor(entry)


def batch_of(entry: Any) -> Any:
    """The example count (int32 scalar) of an entry."""
    return entry.batch if isinstance(entry, Deferred) else tf.size(entry)


def scaled(entry: Any, factor: Any) -> Any:
    """An entry's norms multiplied by `factor`, a deferred entry staying deferred."""
    if entry is None:
        return None
    if isinstance(entry, Deferred):
        return entry.scaled(factor)
    entry = tf.convert_to_tensor(entry)
    entry = entry if entry.dtype.is_floating else tf.cast(entry, tf.float32)
    return entry * tf.cast(factor, entry.dtype)


class PerExampleNorms(ReadOnlyMap):
    """path -> [batch] float tensor: ‖∇ℓ_i‖ for each example i (None where there is no number).

    `unsupported`: path -> reason, for every path that has no number although the target depends on
    it. `coupled_by`: the layers whose call mixed the examples (BatchNormalization in training mode);
    when it is not empty the affected paths are in `unsupported`.
    """

    def __init__(
        self, norms: Dict[str, Any], unsupported: Optional[Dict[str, str]] = None, coupled_by: Tuple[str, ...] = ()
    ):
        self._norms = dict(norms)  # path -> None, a [B] tensor or a `Deferred`
        self._built = PerGraph()  # path -> its deferred norms, built
        self.unsupported: Dict[str, str] = dict(unsupported or {})
        self.coupled_by: Tuple[str, ...] = tuple(coupled_by)

    @property
    def complete(self) -> bool:
        """True when every path the target depends on has its per-example norms."""
        return not self.unsupported

    def is_coupled(self, path: str) -> bool:
        """Is `path` without numbers because the examples were coupled (not for want of a rule)?"""
        return self.unsupported.get(path, "").startswith(COUPLED_REASON)

    def __getitem__(self, path: str) -> Any:
        return self._tensor(path, self._norms[path])

    def entry(self, path: str) -> Any:
        """The path's norms as held: None, a tensor, or a `Deferred` (the writers build it where they write)."""
        return self._norms[path]

    def entries(self) -> Dict[str, Any]:
        return dict(self._norms)

    def _tensor(self, path: str, entry: Any) -> Any:
        """A deferred entry built once per graph (eagerly: once)."""
        if not isinstance(entry, Deferred):
            return entry
        return self._built.get(path, lambda: materialized(entry))

    def _paths(self) -> Dict[str, Any]:
        return self._norms

    # tf.nest protocol: lets it be returned from a tf.function (the reasons are static Python).
    def __tf_flatten__(self):
        meta = (tuple(self._norms), tuple(sorted(self.unsupported.items())), self.coupled_by)
        return meta, tuple(self.values())

    @classmethod
    def __tf_unflatten__(cls, meta, components):
        keys, unsupported, coupled_by = meta
        return cls(dict(zip(keys, components)), dict(unsupported), coupled_by)

    def __repr__(self) -> str:
        return f"PerExampleNorms(paths={list(self._norms)!r}, unsupported={sorted(self.unsupported)!r})"
