"""The result of `Capture.gradients`: gradients keyed by stable path.

It is a read-only mapping (path -> tensor or None) that also remembers what
the summary ops need to tag each entry (whether it is a layer output or a
weight, the layer's position in the model, the target's name), and the
gradients of `model.trainable_variables` in order, so a training loop can
apply them without a second backward pass.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, ItemsView, Iterator, KeysView, List, Optional, ValuesView

from tb_layergrad import metadata


@dataclasses.dataclass(frozen=True)
class Entry:
    gradient: Any  # tf.Tensor, or None when the target does not depend on it
    source: str  # metadata.SOURCE_OUTPUT or metadata.SOURCE_WEIGHT
    index: int  # position in the model (pre-order), -1 if unknown
    elements: int = -1  # static element count when known (for "no gradient" records)
    dtype: str = ""


class GradientMap:
    """path -> d target / d tensor (None where the target does not depend on it).

    It behaves as a read-only dict but is deliberately not a
    `collections.abc.Mapping`: tf.nest would then rebuild it as a plain dict
    and lose the metadata; instead it implements tf.nest's
    `__tf_flatten__`/`__tf_unflatten__`, so it can be returned from a
    `tf.function`.
    """

    def __init__(self, entries: Dict[str, Entry], target: str, variable_gradients: Optional[List[Any]] = None,
                 replicas: int = 1):
        self._entries = dict(entries)
        self.target = target
        #: How many replicas' gradients this map covers (>1 after `tb_layergrad.distribute.merge`).
        self.replicas = int(replicas)
        #: Gradients of `model.trainable_variables`, in that order (None where unconnected).
        self.variable_gradients: List[Any] = list(variable_gradients or [])

    def __getitem__(self, path: str) -> Any:
        return self._entries[path].gradient

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, path: object) -> bool:
        return path in self._entries

    def keys(self) -> KeysView[str]:
        return self.as_dict().keys()

    def values(self) -> ValuesView[Any]:
        return self.as_dict().values()

    def items(self) -> ItemsView[str, Any]:
        return self.as_dict().items()

    def get(self, path: str, default: Any = None) -> Any:
        return self._entries[path].gradient if path in self._entries else default

    def as_dict(self) -> Dict[str, Any]:
        return {p: e.gradient for p, e in self._entries.items()}

    def entry(self, path: str) -> Entry:
        return self._entries[path]

    @property
    def outputs(self) -> Dict[str, Any]:
        """Only the layer-output gradients."""
        return {p: e.gradient for p, e in self._entries.items() if e.source == metadata.SOURCE_OUTPUT}

    @property
    def weights(self) -> Dict[str, Any]:
        """Only the weight gradients (present when capture(..., weights=True))."""
        return {p: e.gradient for p, e in self._entries.items() if e.source == metadata.SOURCE_WEIGHT}

    # tf.nest protocol: lets a GradientMap be returned from a tf.function.
    def __tf_flatten__(self):
        keys = tuple((path, dataclasses.replace(e, gradient=None)) for path, e in self._entries.items())
        meta = (self.target, keys, len(self.variable_gradients), self.replicas)
        return meta, tuple(e.gradient for e in self._entries.values()) + tuple(self.variable_gradients)

    @classmethod
    def __tf_unflatten__(cls, meta, components):
        target, keys, n_vars, replicas = meta
        n = len(keys)
        entries = {path: dataclasses.replace(e, gradient=g) for (path, e), g in zip(keys, components[:n])}
        return cls(entries, target, list(components[n : n + n_vars]), replicas)

    def __repr__(self) -> str:
        return f"GradientMap(target={self.target!r}, paths={list(self._entries)!r})"
