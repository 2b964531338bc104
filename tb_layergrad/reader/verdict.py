"""One verdict per layer and one line per finding: what the overview, its banners, the layer view,
`tb-layergrad report` and `tb_layergrad.load()` all show, decided here once.

Why one place: the rules (`anomalies`) flag cells and `origin` says where a NaN was born, but each
reader used to pick its own words from them, and they disagreed (the origin of a NaN unmarked while
the layers it reached were red; a layer tagged two ways). Pure numpy, no TensorFlow.

A layer's state is the first of these that holds; STATES is that order (most serious first), for readers that
count or sort verdicts (docs/ANOMALIES.md, "One verdict"):

    nan_origin              the run's first NaN/Inf was born in this layer (`RunAnomalies.origin`)
    nonfinite               a NaN/Inf reached the layer's gradient at some logged step
    exploding, dead, vanishing   the layer's cell state at its last logged step (`now`); else the most
                            serious one of an earlier step (`now` False), in this order
    vanishing_over_steps    its gradient fell STEP_DECAY_DECADES over the run while the target's value did not
                            fall by TARGET_FALL (`trends.collapsed`)
    vanishing_through_time  its per-timestep gradients shrink by at least TIME_DECAY_DECADES
    dominated               one example dominated the layer's gradient at some steps (`anomalies.Dominance`)
    ok

Findings of the layer below its state are not dropped: they are the verdict's `also` and follow its text
("vanishing · one example dominated 3 steps"), and a state that no longer holds at the last step says so
("ok now · one example dominated 14 steps").

    from tb_layergrad.cli import report
    run = report.build("logs").runs[0]
    [v.state for v in run.verdicts()], [f["line"] for f in run.summary_json()["findings"]]
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tb_layergrad import nonfinite_origin
from tb_layergrad.reader import trends
from tb_layergrad.reader.anomalies import DEAD, EXPLODING, NONFINITE, TIME_DECAY_DECADES, VANISHING

if TYPE_CHECKING:
    from tb_layergrad.reader.anomalies import RunAnomalies


NAN_ORIGIN, NONFINITE_STATE, OK = "nan_origin", "nonfinite", "ok"
VANISHING_OVER_STEPS, VANISHING_THROUGH_TIME = "vanishing_over_steps", "vanishing_through_time"
DOMINATED = "dominated"
# Cell states after non-finite, most serious first (a cell holds at most one: `anomalies.detect`).
CELL_STATES = (("exploding", EXPLODING), ("dead", DEAD), ("vanishing", VANISHING))
STATES = (
    NAN_ORIGIN,
    NONFINITE_STATE,
    *(k for k, _ in CELL_STATES),
    VANISHING_OVER_STEPS,
    VANISHING_THROUGH_TIME,
    DOMINATED,
    OK,
)
LABELS = {
    NAN_ORIGIN: "NaN/Inf born here",
    NONFINITE_STATE: "NaN/Inf",
    "exploding": "exploding",
    "dead": "dead",
    "vanishing": "vanishing",
    VANISHING_OVER_STEPS: "vanishing over steps",
    VANISHING_THROUGH_TIME: "vanishing through time",
    DOMINATED: "one example dominates",
    OK: "ok",
}
SEPARATOR = " · "  # between a verdict's text and the findings it also carries
MAX_NAMED = 3  # layers a finding names before "and N more"
# How serious a state is, for ordering runs (the sweep's `severity`): a NaN/Inf first, wherever it was born,
# then a gradient out of range, one that is gone, one that fades; 0 for a healthy layer.
SEVERITY = {
    NAN_ORIGIN: 4,
    NONFINITE_STATE: 4,
    "exploding": 3,
    "dead": 2,
    "vanishing": 1,
    VANISHING_OVER_STEPS: 1,
    VANISHING_THROUGH_TIME: 1,
    DOMINATED: 1,
    OK: 0,
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One layer's state.

    `now`: it holds at the layer's last logged step (the NaN states: from their step on). `step`: where to
    look (the origin's step, the first non-finite step, the first step flagged so, the worst dominated step, or
    the last step). `text`: the words of the overview's chip and the report's `verdict` column, the findings of
    `also` included. `also`: the layer's other findings, states below `state` that hold too (`state`, `step`,
    `text` each), in the order of STATES.
    """

    state: str
    now: bool
    step: Optional[int]
    text: str
    also: Tuple[dict, ...] = ()

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "also": [dict(a) for a in self.also]}


def origin_layer(run: RunAnomalies) -> Optional[str]:
    """The row where the run's first NaN/Inf was born.

    Args:
      run: an evaluated run whose `origin` the reader set (`run_anomalies.read_run`).

    Returns:
      The layer path, or None: nothing broke, the pass was the loss or cannot be told, or the layer is not
      one of the run's rows (e.g. asked for weights).
    """
    o = run.origin
    if o is None or o.pass_ not in (nonfinite_origin.PASS_FORWARD, nonfinite_origin.PASS_BACKWARD):
        return None
    return o.origin if o.origin in run.layers else None


def layer_verdicts(run: RunAnomalies) -> List[Verdict]:
    """Each layer's state, decided once (the precedence of the module docstring).

    Args:
      run: an evaluated run (`anomalies.evaluate`), its `origin` set by the reader when known.

    Returns:
      A `Verdict` per layer, in model order (`run.layers`).

    Example:

        import numpy as np
        from tb_layergrad.reader import anomalies
        one = np.ones((2, 6))
        run = anomalies.evaluate(["m/a", "m/b"], range(6), {"rms": one * [[1e-6], [1.0]], "norm": one,
                                 "nonfinite": 0 * one, "zero_frac": 0 * one})
        [v.state for v in layer_verdicts(run)]  # ['vanishing', 'ok']
    """
    born = origin_layer(run)
    fall = trends.target_fall(run.target_edges)
    dominance = {d.layer: d for d in run.dominated or ()}
    out = []
    for i, s in enumerate(run.summaries):
        row = run.flags[i][run.recorded[i]]
        steps = run.steps[run.recorded[i]]
        found: List[Verdict] = []  # every state of the layer, most serious first
        if s.layer == born:
            found.append(Verdict(NAN_ORIGIN, True, run.origin.step, f"{LABELS[NAN_ORIGIN]} @{run.origin.step}"))
        elif s.first_nonfinite_step is not None:
            step = s.first_nonfinite_step
            found.append(Verdict(NONFINITE_STATE, True, step, f"{LABELS[NONFINITE_STATE]} @{step}"))
        else:
            cell = None
            for kind, bit in CELL_STATES:
                if s.now & bit:
                    cell = Verdict(kind, True, int(steps[np.flatnonzero(row & bit)[0]]), kind)
                    break
            for kind, bit in CELL_STATES if cell is None else ():
                hits = np.flatnonzero(row & bit)
                if hits.size:
                    cell = Verdict(kind, False, int(steps[hits[0]]), f"{kind} {hits.size}/{s.recorded}")
                    break
            if cell is not None:
                found.append(cell)
        if trends.collapsed(s.step_decay, fall):
            step = s.decay_step if s.decay_step is not None else s.last_step
            found.append(Verdict(VANISHING_OVER_STEPS, True, step, f"{LABELS[VANISHING_OVER_STEPS]} @{step}"))
        if s.timestep_decay is not None and s.timestep_decay <= -TIME_DECAY_DECADES:
            found.append(Verdict(VANISHING_THROUGH_TIME, True, s.last_step, LABELS[VANISHING_THROUGH_TIME]))
        d = dominance.get(s.layer)
        if d is not None:
            found.append(_dominated_verdict(d, s.last_step))
        if not found:
            out.append(Verdict(OK, True, s.last_step, OK))
            continue
        head, rest = found[0], found[1:]
        also = tuple({"state": v.state, "step": v.step, "text": v.text} for v in rest)
        text = head.text if head.now else f"{OK} now{SEPARATOR}{head.text}" if head.state == DOMINATED else head.text
        out.append(Verdict(head.state, head.now, head.step, SEPARATOR.join([text, *(v.text for v in rest)]), also))
    return out


def _dominated_verdict(d, last_step: Optional[int]) -> Verdict:
    """A layer's dominated steps as a verdict: "now" when its last logged step is one of them."""
    now = last_step is not None and last_step in d.at
    return Verdict(DOMINATED, now, d.worst_step, _dominated_text(d.at, last_step))


def worst(verdicts: Sequence[Verdict]) -> Optional[Verdict]:
    """The run's worst layer verdict: the first state of STATES any layer holds (None without layers).

    Args:
      verdicts: the layers' verdicts (`layer_verdicts`).

    Returns:
      That layer's `Verdict` (the first layer in model order among equals), or None.

    Example:

        worst([Verdict("dead", True, 3, "dead"), Verdict("nonfinite", True, 5, "NaN/Inf @5")]).state  # 'nonfinite'
    """
    rank = {state: i for i, state in enumerate(STATES)}
    return min(verdicts, key=lambda v: rank[v.state], default=None)


def run_text(run: RunAnomalies) -> Optional[str]:
    """The run's verdict in words: its worst layer's text, then every other kind of finding of the run
    (`findings`), so that one example dominating 14 steps of a run that is otherwise fine reads
    "ok now · one example dominated 14 steps", not "ok". None without layers.

    Args:
      run: an evaluated run, its `origin` and `dominated` as the reader set them.
    """
    head = worst(run.verdicts())
    if head is None:
        return None
    found = findings(run)
    union = sorted({s for d in run.dominated or () for s in d.at})
    dominated = _dominated_text(union, run.last_step) if union else None
    if head.state == DOMINATED:
        return dominated if run.last_step in union else f"{OK} now{SEPARATOR}{dominated}"
    parts = [head.text.split(SEPARATOR)[0]]
    for f in found:
        kind = f["kind"]
        if kind == head.state or (kind == NONFINITE_STATE and head.state == NAN_ORIGIN):
            continue
        parts.append(dominated if kind == DOMINATED else LABELS.get(kind, kind))
    return SEPARATOR.join(dict.fromkeys(parts))


def _dominated_text(steps: Sequence[int], last_step: Optional[int]) -> str:
    """ "one example dominates: 14 steps" when the last step is one of them, else "... dominated 14 steps"."""
    n = len(steps)
    many = f"{n} step{'' if n == 1 else 's'}"
    return f"one example dominates: {many}" if last_step in steps else f"one example dominated {many}"


def _names(layers: Sequence[str], source: str = "output") -> str:
    """At most MAX_NAMED names, then "and N more layers" ("weights" when the rows are weights: a kernel, a bias)."""
    shown = ", ".join(layers[:MAX_NAMED])
    more = len(layers) - MAX_NAMED
    noun = "weight" if source == "weight" else "layer"
    return shown + (f" and {more} more {noun}{'s' if more > 1 else ''}" if more > 0 else "")


def _finding(kind: str, layers: Sequence[str], layer: Optional[str], step: Optional[int], line: str) -> dict:
    return {"kind": kind, "layers": list(layers), "layer": layer, "step": step, "line": line}


def findings(run: RunAnomalies) -> List[dict]:
    """One line per finding, however many layers it spans (the overview's banners, the report's lines).

    Args:
      run: an evaluated run; its `origin` and `dominated` as the reader set them.

    Returns:
      A list of dicts: `kind` (a state, or `dominated`), `layers` (model order), `layer` and `step` (where
      to look first) and `line`, in the order of STATES, `dominated` last; empty for a healthy run.
    """
    verdicts = run.verdicts()
    out: List[dict] = []
    first = run.earliest_nonfinite
    if run.origin is not None:
        o = run.origin
        layers = [o.origin] if origin_layer(run) else list(first["layers"] if first else o.layers)
        out.append(_finding(NONFINITE_STATE, layers, layers[0] if layers else None, o.step, o.line))
    elif first is not None:
        layers = first["layers"]
        line = f"first non-finite gradient: step {first['step']} in {_names(layers, run.source)}"
        out.append(_finding(NONFINITE_STATE, layers, layers[0], first["step"], line))
    by_state: Dict[str, List[int]] = {}
    for i, v in enumerate(verdicts):
        for state, now in ((v.state, v.now), *((a["state"], True) for a in v.also)):
            if now and state != DOMINATED:  # one example dominating: its own finding below, from `run.dominated`
                by_state.setdefault(state, []).append(i)
    for kind, _ in CELL_STATES:
        rows = by_state.get(kind, [])
        if rows:
            names = [run.layers[i] for i in rows]
            line = f"{kind} at the latest step ({run.last_step}): {_names(names, run.source)}"
            # Opens the first layer at the step the line names (its last logged step), not where it began.
            out.append(_finding(kind, names, names[0], run.summaries[rows[0]].last_step, line))
    rows = by_state.get(VANISHING_OVER_STEPS, [])
    if rows:
        out.append(_over_steps(run, rows))
    rows = by_state.get(VANISHING_THROUGH_TIME, [])
    if rows:
        names = [run.layers[i] for i in rows]
        worst = min(run.summaries[i].timestep_decay for i in rows)
        line = (
            f"vanishing through time in {_names(names, run.source)}: the gradient reaching the first timestep is "
            f"10^{-worst:.1f} times smaller than at the last (threshold 10^{TIME_DECAY_DECADES:g})"
        )
        out.append(_finding(VANISHING_THROUGH_TIME, names, names[0], run.last_step, line))
    if run.dominated:
        out.append(dominated_finding(run.dominated))
    return out


def _over_steps(run: RunAnomalies, rows: List[int]) -> dict:
    """The layers vanishing over steps as one finding: how far the worst fell, and what the target's value did."""
    names = [run.layers[i] for i in rows]
    first = run.summaries[rows[0]]
    worst = min(run.summaries[i].step_decay for i in rows)
    line = (
        f"vanishing over steps in {_names(names, run.source)}: the gradient fell 10^{-worst:.1f} times from the first logged "
        f"steps to the last (threshold 10^{trends.STEP_DECAY_DECADES:g}) while {target_moved(run.target, run.target_edges)}"
    )
    return _finding(
        VANISHING_OVER_STEPS,
        names,
        names[0],
        first.decay_step if first.decay_step is not None else first.last_step,
        line,
    )


ARROW = "\u00a0→\u00a0"  # between two values: non-breaking spaces, so that a wrapped line never splits the pair


def target_moved(target: str, edges: Tuple[float, float]) -> str:
    """What the target's value did over the run, in words that match its numbers (`trends.target_fall`).

    The target is what training minimizes: "fell" is a decrease of the signed value, measured against its early
    size. A value that went up, however close to 0 it ends (a minimax generator's loss, -0.45 to -3e-6: its size
    shrank 10^5-fold, the value rose), rose; a fall by less than TARGET_FALL is said with its share.

    Example:

        target_moved("g", (-0.4504, -3.026e-06))  # 'the value of g rose (-0.4504 → -3.026e-06), where a converging run's falls by 50% or more'
    """
    early, late = edges
    fall = trends.target_fall(edges)
    if fall is None or fall == 0:
        moved = "did not move"
    elif fall < 0:
        moved = "rose"
    else:
        moved = f"fell by only {fall:.0%}"
    return (
        f"the value of {target} {moved} ({early:.4g}{ARROW}{late:.4g}), where a converging run's falls by "
        f"{trends.TARGET_FALL:.0%} or more"
    )


def dominated_finding(found: Sequence) -> dict:
    """The layers where one example dominates (`anomalies.Dominance`, model order) as one finding: a
    layer's own sentence when it is alone, else the union of their steps and the worst of them."""
    names = [d.layer for d in found]
    worst = max(found, key=lambda d: d.worst_share)
    if len(found) == 1:
        line = worst.line
    else:
        steps = sorted({s for d in found for s in d.at})
        n = len(steps)
        where = f" from batch position {worst.worst_position}" if worst.worst_position is not None else ""
        batch = f" of {worst.examples}" if worst.examples is not None else ""
        line = (
            f"one example dominates {_names(names)} at {n} step{'' if n == 1 else 's'}: first step {steps[0]}; "
            f"worst step {worst.worst_step} in {worst.layer}, {worst.worst_share:.0%} of its gradient{where}{batch}"
        )
    return _finding("dominated", names, worst.layer, worst.worst_step, line)


def cell_states(run: RunAnomalies) -> np.ndarray:
    """Each cell's state, for `tb_layergrad.load()`'s `state` column.

    Args:
      run: an evaluated run, its `origin` set by the reader when known.

    Returns:
      str [layers, steps]: `ok`, `nonfinite`, `exploding`, `dead` or `vanishing` (a cell has at most one
      flag), `vanishing_over_steps` on the cells that would be `ok` from the step a layer vanishing over steps
      collapsed, `dominated` on the cells that would be `ok` at the steps where one example dominated the layer
      (`run.dominated`), "" where unrecorded, `nan_origin` at the origin's own cell (`origin_layer`, the
      origin's step).
    """
    out = np.full(run.flags.shape, OK, dtype=object)
    for d in run.dominated or ():
        out[run.layers.index(d.layer), np.isin(run.steps, d.at)] = DOMINATED
    for i, v in enumerate(run.verdicts()):
        also = (a["step"] for a in v.also if a["state"] == VANISHING_OVER_STEPS)
        step = v.step if v.state == VANISHING_OVER_STEPS else next(also, None)
        if step is not None:
            out[i, run.steps >= step] = VANISHING_OVER_STEPS
    out[(run.flags & NONFINITE) > 0] = NONFINITE_STATE
    for kind, bit in CELL_STATES:
        out[(run.flags & bit) > 0] = kind
    out[~run.recorded] = ""
    born = origin_layer(run)
    if born is not None:
        col = np.flatnonzero(run.steps == run.origin.step)
        if col.size:
            out[run.layers.index(born), col[0]] = NAN_ORIGIN
    return out
