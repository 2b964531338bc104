"""One example dominates a layer (docs/ANOMALIES.md, "One example dominates"): the rule, and a layer's finding.

Read from the per-example records (kind `examples`), not from the statistics: not a flag bit of the
matrix, a finding of its own. `anomalies` offers these names too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import numpy as np

DOMINANT_SHARE = 0.5  # the largest example carries more than half of the layer's per-example gradient energy
DOMINANT_MIN_EXAMPLES = 8  # ... in a batch of at least 8, where an even share would be at most 1/8
DOMINANT_OUTLIER = 4.0  # ... and its own norm is over 4x the layer's usual largest norm (median over the steps)
EXAMPLE_THRESHOLDS = {
    "DOMINANT_SHARE": DOMINANT_SHARE,
    "DOMINANT_MIN_EXAMPLES": DOMINANT_MIN_EXAMPLES,
    "DOMINANT_OUTLIER": DOMINANT_OUTLIER,
}


def usual_top_norm(top_norm, examples, status) -> float:
    """The layer's usual largest per-example norm: the median of `top_norm` over the steps with exact numbers
    (`status` 0) in batches of at least DOMINANT_MIN_EXAMPLES; NaN without such a step."""
    norm = np.asarray(top_norm, np.float64)
    with np.errstate(invalid="ignore"):
        ok = (np.asarray(status, np.float64) == 0) & (np.asarray(examples, np.float64) >= DOMINANT_MIN_EXAMPLES)
        ok &= np.isfinite(norm) & (norm > 0)
    return float(np.median(norm[ok])) if ok.any() else float("nan")


def dominated(top_share, examples, status, top_norm) -> np.ndarray:
    """bool, per step of one layer (ascending steps): one example carries most of the layer's gradient there.

    `top_share` > DOMINANT_SHARE with `examples` >= DOMINANT_MIN_EXAMPLES and `status` 0 (exact
    numbers), and that example stands out from the run too: `top_norm` (its own gradient norm,
    `example_norm_max`) > DOMINANT_OUTLIER x `usual_top_norm`. A missing or NaN value is never dominated.

    Example:

        dominated([0.9, 0.9, 0.2, 0.3], [32] * 4, [0] * 4, [9.0, 1.0, 1.0, 1.0]).tolist()  # [True, False, False, False]
    """
    share = np.asarray(top_share, np.float64)
    count = np.asarray(examples, np.float64)
    code = np.asarray(status, np.float64)
    norm = np.asarray(top_norm, np.float64)
    usual = usual_top_norm(norm, count, code)
    with np.errstate(invalid="ignore"):
        return (
            (share > DOMINANT_SHARE)
            & (count >= DOMINANT_MIN_EXAMPLES)
            & (code == 0)
            & (norm > DOMINANT_OUTLIER * usual)
        )


@dataclasses.dataclass
class Dominance:
    """One layer's dominated steps: how many, the first, and the worst (largest share) with its example."""

    layer: str
    steps: int  # how many recorded steps are dominated
    first_step: int
    worst_step: int
    worst_share: float
    worst_position: Optional[int]  # batch position of the largest example at the worst step
    examples: Optional[int]  # batch size at the worst step
    at: Tuple[int, ...] = ()  # every dominated step (not in the JSON: `steps` counts them)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "at"}

    @property
    def line(self) -> str:
        where = f" from batch position {self.worst_position}" if self.worst_position is not None else ""
        batch = f" of {self.examples}" if self.examples is not None else ""
        return (
            f"one example dominates {self.layer} at {self.steps} step{'' if self.steps == 1 else 's'}: first "
            f"step {self.first_step}; worst step {self.worst_step}, {self.worst_share:.0%} of its gradient{where}{batch}"
        )


def dominance(layer: str, steps, top_share, examples, status, top_position, top_norm) -> Optional[Dominance]:
    """The `Dominance` of one layer from its per-step columns (ascending steps), None if no step is dominated."""
    steps = np.asarray(steps, np.int64)
    hit = np.flatnonzero(dominated(top_share, examples, status, top_norm))
    if not hit.size:
        return None
    share = np.asarray(top_share, np.float64)
    worst = int(hit[np.argmax(share[hit])])
    pos = float(np.asarray(top_position, np.float64)[worst])
    count = float(np.asarray(examples, np.float64)[worst])
    return Dominance(
        layer,
        int(hit.size),
        int(steps[hit[0]]),
        int(steps[worst]),
        float(share[worst]),
        int(pos) if math.isfinite(pos) and pos >= 0 else None,
        int(count) if math.isfinite(count) else None,
        tuple(int(x) for x in steps[hit]),
    )
