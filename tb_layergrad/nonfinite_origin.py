"""Where a NaN/Inf was born: the forward pass, the loss, or the backward pass. The one rule set.

Why one module, free of TensorFlow and numpy: the same answer is given by the
reader (the tab's banner, the `anomalies` route, `tb-layergrad report`,
`tb_layergrad.load()`), by `GradientLogger(on_nonfinite=...)` in the middle of
`fit()` and by a custom loop's `GradientMap.nonfinite_origin()`; each hands in
what it saw at ONE step (which series held a NaN/Inf) and gets the same
`Origin`. The rules are written down in docs/ANOMALIES.md ("Where it broke").

At the first step at which anything is non-finite:
- `forward`: some layer's output (activation) is non-finite. The origin is the
  first such layer in forward order (a nested model's own output counts after
  its inner layers: the innermost non-finite layer with the lowest index).
- `loss`: every recorded output finite, the target (loss) non-finite.
- `backward`: the target finite (or not recorded), some gradient non-finite. The
  origin is the layer whose backward pass turned a finite gradient (w.r.t. its
  output) into a non-finite one (w.r.t. the output of the layer feeding it):
  the recorded layer just after the last one, in forward order, whose output
  gradient is non-finite; the target itself when that is the model's last
  layer (the loss's own gradient, e.g. `sqrt` at 0 in a custom loss); a
  weight's layer when only weight gradients are non-finite.
- Without activations, a non-finite target cannot be placed in the forward
  pass or the loss: the pass is `forward_or_loss`, no origin.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

PASS_FORWARD = "forward"
PASS_LOSS = "loss"
PASS_BACKWARD = "backward"
PASS_FORWARD_OR_LOSS = "forward_or_loss"  # the target is non-finite, activations were not recorded
PASS_UNKNOWN = "unknown"  # only gradients were recorded and the target was not (files of older writers)
PASSES = (PASS_FORWARD, PASS_LOSS, PASS_BACKWARD, PASS_FORWARD_OR_LOSS, PASS_UNKNOWN)


@dataclasses.dataclass(frozen=True)
class Seen:
    """One series at the step looked at: whether it held a NaN/Inf."""

    path: str  # layer path (a weight's variable path for a weight)
    index: int  # the layer's position in the model (pre-order), -1 if unknown
    nonfinite: bool


@dataclasses.dataclass(frozen=True)
class Origin:
    """The answer: at `step`, in which pass, from where (a layer path, or the target's name)."""

    step: Optional[int]
    pass_: str  # one of PASSES
    origin: Optional[str]  # a layer path, the target's name (pass "loss", or "backward" from the loss), or None
    target: str = "loss"
    layers: Sequence[str] = ()  # every non-finite series of that pass, in model order

    @property
    def line(self) -> str:
        """One line for a person: what happened, where, and which fix to look for."""
        at = f"step {self.step}" if self.step is not None else "this step"
        if self.pass_ == PASS_FORWARD:
            return f"first non-finite value at {at}: forward pass, output of {self.origin}"
        if self.pass_ == PASS_LOSS:
            return f"first non-finite value at {at}: in the {self.origin} (every layer output finite)"
        if self.pass_ == PASS_BACKWARD:
            where = (
                f"the {self.origin}'s own gradient"
                if self.origin == self.target
                else f"the backward pass of {self.origin}"
            )
            return f"first non-finite value at {at}: backward pass, born in {where} ({self.target} finite)"
        if self.pass_ == PASS_FORWARD_OR_LOSS:
            return (
                f"first non-finite value at {at}: the {self.target} is non-finite; the forward pass or the loss "
                "(record activations to tell them apart)"
            )
        names = ", ".join(self.layers) or "?"
        return f"first non-finite gradient at {at}: {names} (the {self.target} was not recorded: pass unknown)"

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "pass": self.pass_,
            "origin": self.origin,
            "target": self.target,
            "layers": list(self.layers),
            "line": self.line,
        }


def _ordered(seen: Sequence[Seen]) -> List[Seen]:
    return sorted(seen, key=lambda s: (s.index, s.path))


def _innermost_first(bad: List[Seen]) -> Seen:
    """The first non-finite layer in forward order: a nested model's output comes after its inner layers'."""
    for s in bad:
        if not any(o.path.startswith(s.path + "/") for o in bad):
            return s
    return bad[0]


def locate(
    step: Optional[int],
    *,
    target: str = "loss",
    target_nonfinite: Optional[bool] = None,
    activations: Optional[Sequence[Seen]] = None,
    outputs: Sequence[Seen] = (),
    weights: Sequence[Seen] = (),
) -> Optional[Origin]:
    """The origin of what is non-finite at `step`, or None when nothing is.

    Args:
      step: the step looked at (the first with anything non-finite), or None.
      target: the differentiated scalar's name.
      target_nonfinite: whether it was non-finite; None if it was not recorded.
      activations: the layer outputs' forward values; None if they were not recorded.
      outputs: gradients w.r.t. the layer outputs.
      weights: gradients w.r.t. the weights (their `index` is the owning layer's).
    """
    acts = _ordered(activations or [])
    bad_acts = [s for s in acts if s.nonfinite]
    if bad_acts:
        first = _innermost_first(bad_acts)
        return Origin(step, PASS_FORWARD, first.path, target, [s.path for s in bad_acts])
    if target_nonfinite:
        if activations is None:
            return Origin(step, PASS_FORWARD_OR_LOSS, None, target)
        return Origin(step, PASS_LOSS, target, target)
    outs = _ordered(outputs)
    bad_outs = [s for s in outs if s.nonfinite]
    bad_weights = [s for s in _ordered(weights) if s.nonfinite]
    if not bad_outs and not bad_weights:
        return None
    bad = [s.path for s in bad_outs + bad_weights]
    if target_nonfinite is None:
        return Origin(step, PASS_UNKNOWN, None, target, bad)
    if not bad_outs:  # a weight's gradient only: born in its layer's backward pass
        last = bad_weights[-1]
        owner = next((s.path for s in reversed(outs) if s.index == last.index), last.path.rsplit("/", 1)[0])
        return Origin(step, PASS_BACKWARD, owner, target, bad)
    last_bad = max(outs.index(s) for s in bad_outs)
    later = [s for s in outs[last_bad + 1 :] if not s.nonfinite and not s.path.startswith(outs[last_bad].path + "/")]
    origin = later[0].path if later else target
    return Origin(step, PASS_BACKWARD, origin, target, bad)


class NonFiniteError(FloatingPointError):
    """Raised by `GradientLogger(on_nonfinite="raise")` after the step at which a NaN/Inf first appeared.

    A `FloatingPointError` whose message is one line saying where the NaN/Inf was born (forward pass, loss or
    backward pass, and the layer); that step's records are written before it is raised, and the model is
    restored.

    Args:
      origin: where it was born (`.step`, `.pass_`, `.origin`, `.layers`, `.line`), kept as `self.origin`.

    Example:

    ```python
    import numpy as np, keras, tb_layergrad

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 2), "float32"), np.ones((8, 1), "float32")
    x[5] = np.nan  # the second batch of 4 holds a NaN
    try:
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0,
                  callbacks=[tb_layergrad.GradientLogger("/tmp/layergrad_example/nan", on_nonfinite="raise")])
    except tb_layergrad.NonFiniteError as e:
        print(e.origin.step, e.origin.pass_)  # 2 forward_or_loss (with activations=True: forward)
    ```
    """

    def __init__(self, origin: Origin):
        super().__init__(origin.line)
        self.origin = origin
