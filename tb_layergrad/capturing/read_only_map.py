"""The read side of a dict, for the capture's results (`GradientMap`, `PerExampleNorms`).

Why not `collections.abc.Mapping`: tf.nest would then rebuild them as plain dicts and lose what they carry
beside the values; they implement tf.nest's `__tf_flatten__`/`__tf_unflatten__` instead.
"""

from __future__ import annotations

from typing import Any, Dict, ItemsView, Iterator, KeysView, ValuesView


class ReadOnlyMap:
    """path -> value over `_paths()` (a dict keyed by path, in order) and the subclass's `__getitem__`."""

    def _paths(self) -> Dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, path: str) -> Any:
        raise NotImplementedError

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths())

    def __len__(self) -> int:
        return len(self._paths())

    def __contains__(self, path: object) -> bool:
        return path in self._paths()

    def keys(self) -> KeysView[str]:
        return self.as_dict().keys()

    def values(self) -> ValuesView[Any]:
        return self.as_dict().values()

    def items(self) -> ItemsView[str, Any]:
        return self.as_dict().items()

    def get(self, path: str, default: Any = None) -> Any:
        return self[path] if path in self._paths() else default

    def as_dict(self) -> Dict[str, Any]:
        return {p: self[p] for p in self._paths()}
