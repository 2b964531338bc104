"""What one trace of the train step saw: the chosen layers' outputs, their cotangents, the loss, by record key.

Why gathered at trace time: Keras' JAX step is one function of (state, data), differentiated by
`jax.value_and_grad` over the trainable variables only. Each observed value passes through an identity with a
custom VJP (`observe`): its forward rule sees the value, its backward rule the cotangent dL/d(value), both as
values of the step's own trace, so the step can reduce them all at once after the backward pass (where the
optimizer receives the weight gradients) and hand their records out as outputs of the step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import jax


@dataclasses.dataclass
class Seen:
    """One observed value: a layer output (`index` its layer's position) or the target (`index` -1)."""

    key: str
    index: int
    seq: int = 0  # how many values were observed before this one in the step (call order)
    value: Any = None  # the forward value, once the forward rule or the plain call ran
    cotangent: Any = None  # dL/d(value), once the backward rule ran


class StepTrace:
    """Opened by the train step's wrapper for the length of one trace (or eager call) of the step."""

    def __init__(self) -> None:
        self.seen: Dict[str, Seen] = {}
        self._calls: Dict[str, int] = {}
        self.target: Optional[Seen] = None
        self.applied = False  # has the optimizer applied this step's gradients (the records handed out)?
        self.handed: Any = None  # what the step hands out for its records: (`step_outputs.Layout`, arrays)
        self.inputs: Any = None  # (state, data) the train step received: what a target's own pass re-runs
        self.calls: List[Any] = []  # per-example: the calls of layers with a rule (`example_norms.Call`)
        self.coupled: List[Tuple[int, str]] = []  # per-example: (values observed when it returned, layer path)

    def call_number(self, path: str) -> int:
        """1 for a layer's first call in this step, 2 for its second (`path#2`), ..."""
        self._calls[path] = self._calls.get(path, 0) + 1
        return self._calls[path]

    def observe(self, key: str, index: int, x: Any) -> Any:
        """`x` unchanged, its value and cotangent kept under `key` (docs/FORMAT.md's record key)."""
        seen = self.seen.setdefault(key, Seen(key, index, len(self.seen)))
        return _identity(seen)(x)

    def keep(self, x: Any) -> Tuple[Any, Seen]:
        """`x` unchanged (to be used in its place) and a `Seen` whose `value` will be x's value in the step's
        own trace, not the differentiated function's: what a layer's input is after the backward pass."""
        seen = Seen("", -1, len(self.seen), value=x)  # where x is not differentiated, it is the step's own
        if not _inexact(x):
            return x, seen
        return _identity(seen, keep_in_primal=False)(x), seen

    def observe_target(self, name: str, loss: Any) -> Any:
        self.target = Seen(name, -1)
        return _identity(self.target)(loss)

    def outputs(self) -> List[Seen]:
        """The layer outputs seen, in model order (layer position, then key)."""
        return sorted(self.seen.values(), key=lambda s: (s.index, s.key))


def _inexact(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.inexact)


def _identity(seen: Seen, keep_in_primal: bool = True) -> Any:
    """`keep_in_primal=False`: only the forward rule keeps the value (run where x is differentiated); the
    primal function is traced on a value of its own trace, which must not leave it."""

    @jax.custom_vjp
    def identity(x: Any) -> Any:
        if keep_in_primal:
            seen.value = x
        return x

    def forward(x: Any) -> Any:
        seen.value = x
        return x, None

    def backward(_: Any, g: Any) -> Any:
        seen.cotangent = g
        return (g,)

    identity.defvjp(forward, backward)
    return identity
