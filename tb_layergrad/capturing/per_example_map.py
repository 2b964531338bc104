"""The result of per-example capture: path -> [batch] norms, and why some paths have none.

Why a class of its own: a missing number must say *why* it is missing. A path maps to None when the
target does not depend on it (as in `GradientMap`) and ALSO when no exact per-example value exists
(a layer without a rule, a BatchNormalization in training mode that couples the examples); the
latter are listed in `unsupported` with the reason, so a reader never takes an absent number for a
zero or a wrong one for a right one. Like `GradientMap`, it can be returned from a `tf.function`.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Tuple

# How the reason of a path whose examples a BatchNormalization coupled begins (`PerExamplePass` writes it,
# `is_coupled` and the writers read it): a coupled path gets status EXAMPLE_COUPLED on disk, not "unsupported".
COUPLED_REASON = "examples are coupled by"


class PerExampleNorms:
    """path -> [batch] float tensor: ‖∇ℓ_i‖ for each example i (None where there is no number).

    `unsupported`: path -> reason, for every path that has no number although the target depends on
    it. `coupled_by`: the layers whose call mixed the examples (BatchNormalization in training mode);
    when it is not empty the affected paths are in `unsupported`.
    """

    def __init__(self, norms: Dict[str, Any], unsupported: Optional[Dict[str, str]] = None,
                 coupled_by: Tuple[str, ...] = ()):
        self._norms = dict(norms)
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
        return self._norms[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._norms)

    def __len__(self) -> int:
        return len(self._norms)

    def __contains__(self, path: object) -> bool:
        return path in self._norms

    def keys(self):
        return self._norms.keys()

    def values(self):
        return self._norms.values()

    def items(self):
        return self._norms.items()

    def get(self, path: str, default: Any = None) -> Any:
        return self._norms.get(path, default)

    def as_dict(self) -> Dict[str, Any]:
        return dict(self._norms)

    # tf.nest protocol: lets it be returned from a tf.function (the reasons are static Python).
    def __tf_flatten__(self):
        meta = (tuple(self._norms), tuple(sorted(self.unsupported.items())), self.coupled_by)
        return meta, tuple(self._norms.values())

    @classmethod
    def __tf_unflatten__(cls, meta, components):
        keys, unsupported, coupled_by = meta
        return cls(dict(zip(keys, components)), dict(unsupported), coupled_by)

    def __repr__(self) -> str:
        return f"PerExampleNorms(paths={list(self._norms)!r}, unsupported={sorted(self.unsupported)!r})"
