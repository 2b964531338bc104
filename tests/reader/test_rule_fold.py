"""The rules extended by a run's new steps (`reader.rule_fold`) give what `anomalies.evaluate` gives over the whole run.

Why: the plugin evaluates a run being written by folding in its new steps only; nothing may tell that answer from a
fresh evaluation. The tables grow as the plugin's store grows them (new rows written after the others in the same
memory); after each of many generated appends (NaN and Inf steps, exploding and dead episodes, a layer whose first
positive values come late, a collapse over steps while the target's value stalls) the folded run equals a full
evaluation field by field; a step written again, a table read anew or shrunk is evaluated whole.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from tb_layergrad import metadata
from tb_layergrad.reader import anomalies, rule_fold, run_health, series
from tb_layergrad.reader.rule_fold import RuleFold
from tb_layergrad.reader.stats_store import StatsRows, column_major

LAYERS = ("m/a", "m/b", "m/c", "m/d")
S = metadata.STAT_INDEX


def _rows(rng: np.random.Generator, steps: np.ndarray) -> np.ndarray:
    """[steps, layers, fields]: a norm shrinking with depth, with episodes drawn at random per step."""
    out = np.zeros((steps.size, len(LAYERS), len(series.STORED_STATS)))
    for j, step in enumerate(steps):
        for i in range(len(LAYERS)):
            scale = 1e-2 * 0.5**i * np.exp(rng.normal(0, 0.3))
            if i == 3:  # collapses over the run: 10^-3 after step 300
                scale *= 1.0 if step < 300 else 1e-3
            if i == 2 and step < 40:  # no positive value at first: its baseline comes late
                scale = 0.0
            r = out[j, i]
            r[S["elements"]] = 256
            r[S["std"]], r[S["min"]], r[S["max"]] = scale, -3 * scale, 3 * scale
            r[S["mean_abs"]], r[S["norm"]] = 0.8 * scale, 16 * scale
            u = rng.random()
            if u < 0.02:
                r[S["nan"] if rng.random() < 0.5 else S["pos_inf"]] = 3
                r[S["norm"]] = np.nan if rng.random() < 0.5 else 0.0
            elif u < 0.05:
                r[[S["std"], S["norm"], S["max"]]] *= 1e5  # exploding
            elif u < 0.08 or scale == 0.0:
                r[[S["std"], S["norm"], S["mean_abs"], S["min"], S["max"]]] = 0  # dead
                r[S["zeros"]] = 256
            elif u < 0.09:
                r[:] = np.nan  # no record of the layer at this step
    return out


class _Store:
    """Tables as the plugin's store keeps them: one memory with room, new rows written after the others."""

    def __init__(self, rows: int, room: int = 4096) -> None:
        self.table = column_major(room, rows)
        self.steps = np.zeros(0, np.int64)
        self.target = column_major(room, 1)

    def append(self, steps: np.ndarray, rows: np.ndarray, loss: np.ndarray) -> None:
        n = self.steps.size
        self.table[n : n + steps.size] = rows
        self.target[n : n + steps.size, 0, :] = 0
        self.target[n : n + steps.size, 0, S["mean"]] = loss
        self.steps = np.concatenate([self.steps, steps])

    def anew(self) -> None:
        """Read again into new memory (a block read whole, a file read anew)."""
        n = self.steps.size
        table, target = column_major(self.table.shape[0], self.table.shape[1]), column_major(self.table.shape[0], 1)
        table[:n], target[:n] = self.table[:n], self.target[:n]
        self.table, self.target = table, target

    def layer_rows(self):
        n = self.steps.size
        walls = self.steps.astype(np.float64)
        return [StatsRows(self.steps, walls, self.table[:n, i, :]) for i in range(len(LAYERS))], StatsRows(
            self.steps, walls, self.target[:n, 0, :]
        )


def _whole(tables, target_rows, running) -> anomalies.RunAnomalies:
    """`anomalies.evaluate` as `run_anomalies.read_run` calls it: every step, every layer."""
    steps = tables[0].steps
    stats = {
        name: np.stack([series.align(t.steps, series.stat_column(t.table, name), steps) for t in tables])
        for name in anomalies.REQUIRED_STATS
    }
    return anomalies.evaluate(
        list(LAYERS),
        steps,
        stats,
        run="r",
        indices=range(len(LAYERS)),
        running_first_steps=running,
        target_values=series.align(target_rows.steps, target_rows.column("mean"), steps),
    )


def _same(got: anomalies.RunAnomalies, want: anomalies.RunAnomalies) -> None:
    for field in ("steps", "flags", "recorded", "max_rms", "vanish_reference"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    assert got.target_edges == want.target_edges
    assert [dataclasses.asdict(s) for s in got.summaries] == [dataclasses.asdict(s) for s in want.summaries]
    for i, s in enumerate(want.summaries):  # the first step of each kind, against a scan of the layer's flags
        recorded = want.flags[i][want.recorded[i]]
        scanned = {
            k: want.steps[want.recorded[i]][np.flatnonzero(recorded & bit)] for k, bit in anomalies.FLAG_BITS.items()
        }
        assert s.firsts == {k: int(hits[0]) for k, hits in scanned.items() if hits.size}
    assert [v.to_json() for v in got.verdicts()] == [v.to_json() for v in want.verdicts()]
    assert got.summary_json() == want.summary_json()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_run_folded_step_by_step_equals_its_whole_evaluation(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    began = []  # the first row each evaluation read: 0 when whole, else where the last one stopped
    real = rule_fold._columns  # noqa: SLF001 - counted, not replaced
    monkeypatch.setattr(rule_fold, "_columns", lambda tables, a: began.append(a) or real(tables, a))
    store, fold = _Store(len(LAYERS)), RuleFold()
    step, seen_states = 0, set()
    running = [None, 7, None, None]  # a running record naming an earlier first NaN/Inf than the flags
    for i in range(60):
        k = int(rng.integers(1, 25))
        steps = np.arange(step, step + k, dtype=np.int64)
        loss = 2.0 - 1e-3 * steps + (np.where(rng.random(k) < 0.1, np.nan, 0.0))  # stalls: no convergence
        store.append(steps, _rows(rng, steps), loss)
        step += k
        if i in (20, 45):
            store.anew()
        if i == 30:  # a step written again: its row changes where the fold had already been
            store.table[store.steps.size - 3, 1, S["norm"]] = np.nan
            store.table[store.steps.size - 3, 1, S["nan"]] = 5
            store.anew()
        tables, target = store.layer_rows()
        got = fold.evaluate(
            "k",
            LAYERS,
            tables,
            run="r",
            target="loss",
            source="output",
            indices=range(len(LAYERS)),
            running_first_steps=running,
            timesteps=None,
            target_rows=target,
        )
        want = _whole(tables, target, running)
        _same(got, want)
        for j, t in enumerate(tables):  # each layer's first NaN/Inf step (`origin`), scanned from the new rows
            bad = np.flatnonzero(t.column("nonfinite") > 0)
            assert fold.first_nonfinite(("k", j), t) == (int(t.steps[bad[0]]) if bad.size else None)
        seen_states.update(s for v in want.verdicts() for s in (v.state, *(a["state"] for a in v.also)))
        seen_states.update(anomalies.flag_names(int(np.bitwise_or.reduce(want.flags, axis=None))))
    assert {"nonfinite", "exploding", "dead", "vanishing", "vanishing_over_steps"} <= seen_states  # all reached
    assert [i for i, a in enumerate(began) if a == 0] == [0, 20, 30, 45]  # whole: the first, read anew, rewritten


def test_a_shrunk_table_or_layers_at_other_steps_are_evaluated_whole():
    rng = np.random.default_rng(5)
    store, fold = _Store(len(LAYERS)), RuleFold()
    steps = np.arange(200, dtype=np.int64)
    store.append(steps, _rows(rng, steps), np.linspace(2, 1, 200))
    tables, target = store.layer_rows()
    args = dict(run="r", target="loss", source="output", indices=range(4), running_first_steps=None, timesteps=None)
    fold.evaluate("k", LAYERS, tables, target_rows=target, **args)
    short = [StatsRows(t.steps[:150], t.wall_times[:150], t.table[:150].copy()) for t in tables]
    short_target = StatsRows(target.steps[:150], target.wall_times[:150], target.table[:150].copy())
    _same(fold.evaluate("k", LAYERS, short, target_rows=short_target, **args), _whole(short, short_target, None))
    other = [*tables[:3], StatsRows(tables[3].steps[::2], tables[3].wall_times[::2], tables[3].table[::2])]
    assert fold.evaluate("k", LAYERS, other, target_rows=target, **args) is None  # the caller takes the union


class _Tables:
    """What `run_health.global_norm_trend` reads of a run: its `stats` tables by series key."""

    def __init__(self, rows) -> None:
        self._rows = rows

    def stats(self, chosen, start=None, end=None):
        return {s.key: self._rows[s.key] for s in chosen}


@pytest.mark.parametrize("bad_tail", [0, 30, 200])
def test_the_global_norm_trend_from_the_last_rows_equals_the_whole_runs(bad_tail):
    """The sweep's global-norm trend is read from the layers' last rows (grown until they hold a window of usable
    steps): the same number as over every step, with NaN/Inf steps at the end pushing the window back."""
    rng = np.random.default_rng(bad_tail)
    steps = np.arange(1000, dtype=np.int64)
    store = _Store(len(LAYERS), room=1000)
    store.append(steps, _rows(rng, steps), np.ones(steps.size))
    if bad_tail:
        store.table[-bad_tail:, 1, S["nan"]] = 1
    tables, _ = store.layer_rows()
    src = _Tables(dict(zip(LAYERS, tables)))
    got = run_health.global_norm_trend(src, [types.SimpleNamespace(key=layer) for layer in LAYERS])
    want, _ = run_health._norm_trend([(t.steps, t.table) for t in tables])  # noqa: SLF001 - the whole run's
    assert got == want and got is not None
