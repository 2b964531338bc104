"""`tb_layergrad.load(logdir)`: every statistic of every series as a pandas DataFrame.

For notebooks and scripts; pandas is an optional extra (`pip install
'tb-layergrad[pandas]'`), imported only when `load` is called. It reads through
TensorBoard's own event multiplexer and data provider (`event_files`) and the
catalog and statistics code the plugin uses, so its numbers are the numbers the tab
shows (derived statistics such as `rms` and `zero_frac` included). Every step is
kept: no sampling. TensorFlow is not imported.

    df = tb_layergrad.load("logs")
    df[df.layer == "my_model/minimalrnn"].plot(x="step", y="norm", logy=True)
    df.attrs["nonfinite_origin"]["train"]["loss"]   # where run "train" first went NaN/Inf, or None
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
from tensorboard import context as tb_context

from tb_layergrad import metadata, nonfinite_origin
from tb_layergrad.reader import anomalies, catalog, damage, event_files, hparams, origin, run_anomalies, series
from tb_layergrad.reader.run_source import RunSource
from tb_layergrad.reader.stats_store import StatsStore

# The per-example columns (docs/FORMAT.md, kind `examples`): field of the record -> column; NaN where not written.
EXAMPLE_COLUMNS = {
    "min": "example_norm_min",
    "median": "example_norm_median",
    "max": "example_norm_max",
    "top_share": "example_norm_top_share",
}
COLUMNS = (
    ("run", "layer", "index", "target", "source", "step", "wall_time")
    + series.ALL_STATS
    + tuple(EXAMPLE_COLUMNS.values())
    + ("state",)
)


def load(
    logdir: str,
    runs: Optional[Iterable[str]] = None,
    *,
    layers: Optional[Iterable[str]] = None,
    steps: Optional[Tuple[Optional[int], Optional[int]]] = None,
    columns: Optional[Iterable[str]] = None,
) -> Any:
    """Returns a DataFrame: one row per (run, layer, target, source, step).

    Columns: run, layer, index (position in the model), target, source, step,
    wall_time, then every stored statistic of docs/FORMAT.md and the derived ones of
    docs/HTTP_API.md (NaN where undefined: a statistic of the finite elements of a
    tensor that has none, its `norm` included), then the per-example columns
    `example_norm_min`, `example_norm_median`, `example_norm_max`,
    `example_norm_top_share` (each example's own gradient norm over the batch,
    `GradientLogger(per_example=True)`; NaN where not written, and where the
    layer has no exact per-example number), then `state`: the verdict of the
    cell, as the tab and `tb-layergrad report` show it (docs/ANOMALIES.md, "One
    verdict"): `ok`, `nonfinite`, `exploding`, `dead`, `vanishing`,
    `vanishing_over_steps` (from the step a layer's gradient collapsed on) or
    `dominated` (a step where one example carried most of the layer's gradient) for a
    gradient, `ok` or `nonfinite` for an activation or a target value, and
    `nan_origin` on the one cell where the first NaN/Inf was born. Then one column `hp/<name>` per
    hyperparameter any run was trained with, sorted by name, as logged with TensorBoard's HParams API
    (`hp.hparams`, `hp.KerasCallback`; `tb_layergrad.reader.hparams`): the run's value on each of its
    rows, a `str`, `bool` or `float` (numbers are stored as doubles); where a run has none, pandas'
    missing value of the column's dtype (NaN in a numeric or string column, None in an object one). A run takes the hyperparameters of the nearest session at or above its folder:
    `GradientLogger(log_dir)` writes to `log_dir/train`, which gets `hp.KerasCallback(log_dir)`'s. Rows
    are ordered by run, model order, target, source, step; a run's target series come after its layers.

    `source` tells the four kinds of row apart (filter on it first): "output"
    (gradient w.r.t. the layer output), "weight" (w.r.t. a
    variable), "activation" (the layer output itself, the forward value: its
    `target` is "forward") or "target" (the differentiated scalar itself, e.g. the
    loss value: `layer` and `target` are both its name, `index` -1). So
    `df[(df.source == "activation") & (df.nonfinite > 0)]` lists the non-finite
    forward values and `df[df.source == "target"]` the loss over steps.

    Where it broke: `df.attrs["nonfinite_origin"]` is `{run: {target: origin}}`,
    for every run and target, with `origin` None for a run that never went
    non-finite, else the dict of `tb_layergrad.nonfinite_origin.Origin.to_json()`:
    `step` (the first step at which anything was non-finite), `pass` ("forward",
    "loss", "backward", "forward_or_loss" without activations, "unknown" without
    the target series), `origin` (a layer path, or the target's name e.g. "loss"),
    `target`, `layers` (every non-finite series of that pass) and `line` (one line
    for a person). The rules: docs/ANOMALIES.md, "Where it broke"; the same answer
    as the tab's banner and `tb-layergrad report`.

    Damaged event files: a record cut in the middle, bytes that are no record, a record failing its
    checksum, an empty or unreadable event file (`tb_layergrad.reader.damage`) — TensorBoard's loaders read
    such a file up to the damage and no further, so the frame holds the steps before it. Each is said by a
    `tb_layergrad.reader.damage.DamageWarning` naming the run, the file and the last step read, and
    listed in `df.attrs["damage"]`: one dict per damaged file (`run`, `file`, `kind` of "truncated",
    "corrupt", "empty", "unreadable", `offset` where reading stopped, `size`, `records` and `step` read
    before it, `line`); `[]` when none (a `gs://` logdir is not checked).

    Args:
      logdir: the directory TensorBoard would be given (`tensorboard --logdir`); every run below it is read.
      runs: only these runs (their names relative to `logdir`, as TensorBoard shows them); None for all. Only
        their folders' event files are read (and those of the folders above them, for the hyperparameters).
      layers: only the rows of these layers (a target's value: its name, e.g. "loss"); None for all.
      steps: `(start, end)`, only the rows of steps start <= step <= end (None: unbounded). The verdicts
        (`state`) are still those of the whole run, as the tab shows them.
      columns: only these columns, after `run`, `layer`, `target`, `source` and `step`, which are always there;
        what no asked column needs is not computed (`state`: the rules over the run; `example_norm_*`: the
        per-example records; `hp/<name>`: the hyperparameters). None for all.

    Returns:
      A pandas DataFrame as above, empty (with its columns) when nothing tb_layergrad wrote is found.
      Reading needs no TensorFlow.

    Raises:
      ImportError: pandas is not installed (`pip install 'tb-layergrad[pandas]'`).

    Example:

    ```python
    import tb_layergrad

    df = tb_layergrad.load("/tmp/layergrad_example")
    loss_grads = df[(df.source == "output") & (df.target == "loss")]
    print(loss_grads.groupby("layer").norm.last())  # each layer's last gradient norm
    ```
    """
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError(
            "tb_layergrad.load() returns a pandas DataFrame, and pandas is not installed. It is an optional "
            "extra: pip install 'tb-layergrad[pandas]' (or pip install pandas). Without pandas, "
            "`tb-layergrad report LOGDIR --format csv|json` gives the per-layer verdicts."
        ) from e
    with event_files.tensorflow_free(logdir), damage.checked_once():
        return _load(pd, logdir, runs, layers, steps, columns)


KEY_COLUMNS = ("run", "layer", "target", "source", "step")


def _load(
    pd: Any,
    logdir: str,
    runs: Optional[Iterable[str]],
    layers: Optional[Iterable[str]] = None,
    steps: Optional[Tuple[Optional[int], Optional[int]]] = None,
    columns: Optional[Iterable[str]] = None,
) -> Any:
    runs = None if runs is None else list(runs)
    layers = None if layers is None else set(layers)
    start, end = steps if steps is not None else (None, None)
    asked = None if columns is None else set(columns)
    out_columns = [c for c in COLUMNS if asked is None or c in KEY_COLUMNS or c in asked]
    want_state = "state" in out_columns
    want_examples = any(c in out_columns for c in EXAMPLE_COLUMNS.values())
    provider = event_files.open_provider(logdir, runs)
    ctx = tb_context.RequestContext()
    cat = catalog.load(provider, ctx, "", runs)
    parts: List[_Part] = []
    origins: Dict[str, Dict[str, Optional[nonfinite_origin.Origin]]] = {}
    for run_name, rc in cat.runs.items():
        stats_series = [s for s in rc.series if s.info.kind == metadata.KIND_STATS]
        store = StatsStore(provider)
        # The whole run's tables: the verdicts read them, and they are kept by the store for that read.
        tables = store.read(ctx, "", run_name, stats_series)
        src = RunSource(provider, ctx, "", rc, store=store)
        states = run_anomalies.read_states(src) if want_state else {}
        origins[run_name] = _run_origins(src)  # from the tables read once for this run
        example_series = [s for s in rc.series if s.info.kind == metadata.KIND_EXAMPLES]
        examples = _examples(provider, ctx, run_name, example_series) if want_examples else {}
        order = {layer: i for i, layer in enumerate(rc.layers())}

        def rank(s: catalog.Series) -> tuple:
            target_series = s.info.source == metadata.SOURCE_TARGET  # the loss value: after every layer
            return (
                target_series,
                order.get(s.info.layer, len(order)),
                s.info.target,
                metadata.SOURCES.index(s.info.source),
                s.info.layer,
            )

        for s in sorted(stats_series, key=rank):
            if layers is not None and s.info.layer not in layers:
                continue
            key = (s.info.layer, s.info.target, s.info.source)
            written = examples.get(key, {})
            parts.append(
                _Part(
                    labels={
                        "run": run_name,
                        "layer": s.info.layer,
                        "target": s.info.target,
                        "source": s.info.source,
                    },
                    index=-1 if s.info.source == metadata.SOURCE_TARGET else rc.layer_index(s.info.layer),
                    rows=tables[s.key].between(start, end),
                    examples={
                        column: {st: v.get(field) for st, v in written.items()}
                        for field, column in EXAMPLE_COLUMNS.items()
                    },
                    states=states.get(key, {}),
                )
            )
    df = _frame(pd, parts, out_columns) if parts else pd.DataFrame(columns=out_columns)
    values = hparams.by_run(provider, ctx, "", list(cat.runs))
    for name in hparams.names(values):
        if asked is None or hparams.column(name) in asked:
            # Each row's value, listed part by part (a run's rows are its parts'), for pandas to infer as before.
            by_row: List[Any] = []
            for p in parts:
                by_row += [values[p.labels["run"]].get(name)] * len(p.rows)
            df[hparams.column(name)] = pd.Series(by_row, index=df.index)
    said = damage.Scanner(logdir, known=event_files.walked(provider)).said(
        cat.runs, None if runs is None else set(runs)
    )
    found = [d for run in sorted(said) for d in said[run]]
    for d in found:
        warnings.warn(d.line(), damage.DamageWarning, stacklevel=3)
    df.attrs["damage"] = [d.to_json() for d in found]
    df.attrs["nonfinite_origin"] = {
        run: {t: (o.to_json() if o is not None else None) for t, o in by_target.items()}
        for run, by_target in origins.items()
    }
    return df


@dataclasses.dataclass
class _Part:
    """One series' rows of the frame: the labels of its every row, its table, its sparse columns by step."""

    labels: Dict[str, str]  # run, layer, target, source
    index: int
    rows: Any  # stats_store.StatsRows
    examples: Dict[str, Dict[int, Any]]  # column -> {step: value}
    states: Dict[int, str]  # the cells that are not `ok`


# The columns of the frame that hold numbers other than the key integers, each a float64 column.
_FLOAT_COLUMNS = frozenset(("wall_time",) + series.ALL_STATS + tuple(EXAMPLE_COLUMNS.values()))


def _frame(pd: Any, parts: List[_Part], out_columns: List[str]) -> Any:
    """The frame of `parts` in order, each column made once.

    Why not a frame per series joined by `pd.concat`: each was copied twice (its own block, then the join),
    most of `load()`'s time on a long run. The float columns are filled in place into one block that the
    frame takes as it is, and a string column is given its dtype, which pandas would otherwise infer from
    every row (what made one frame of joined columns slower than the join before). The dtypes are those
    pandas gives a series' frame: `str` (pandas 3) or `object` for strings, int64 for `index` and `step`,
    float64 for the rest."""
    lengths = np.asarray([len(p.rows) for p in parts], np.int64)
    n = int(lengths.sum())
    ends = np.cumsum(lengths)
    spans = list(zip((ends - lengths).tolist(), ends.tolist()))
    floats = [c for c in out_columns if c in _FLOAT_COLUMNS]
    block = np.empty([len(floats), n], np.float64)
    for i, c in enumerate(floats):
        for p, (a, b) in zip(parts, spans):
            if c == "wall_time":
                block[i, a:b] = p.rows.wall_times
            elif c in p.examples:
                block[i, a:b] = _at_steps(p.rows.steps, p.examples[c], np.nan)
            else:
                block[i, a:b] = p.rows.column(c)
    df = pd.DataFrame(block.T, columns=floats, copy=False)
    for at, c in enumerate(out_columns):
        if c in _FLOAT_COLUMNS:
            continue
        if c == "step":
            column = np.concatenate([p.rows.steps for p in parts]).astype(np.int64, copy=False)
        elif c == "index":
            column = np.repeat(np.asarray([p.index for p in parts], np.int64), lengths)
        elif c == "state":
            names = {anomalies.OK: 0}
            codes = np.concatenate([_state_codes(p.rows.steps, p.states, names) for p in parts])
            strings = np.asarray(list(names), dtype=object)[codes]
            # Of the dtype pandas infers from the rows' states: of none, an `object` column.
            column = _strings(pd, strings, list(names) if n else [])
        else:
            strings = np.empty([n], dtype=object)
            for p, (a, b) in zip(parts, spans):
                strings[a:b] = p.labels[c]
            column = _strings(pd, strings, [p.labels[c] for p in parts])
        df.insert(at, c, column)
    return df


def _strings(pd: Any, strings: np.ndarray, distinct: List[str]) -> Any:
    """A column of `strings` (an object array of the `distinct` strings) of the dtype pandas infers from those
    strings (`str` in pandas 3, else `object`), given rather than inferred from every row."""
    return pd.Series(strings, dtype=pd.Index(distinct).dtype, copy=False)


def _state_codes(steps: np.ndarray, by_step: Dict[int, str], names: Dict[str, int]) -> np.ndarray:
    """The code in `names` (extended with any new state) of each step's state: `ok` where `by_step` has none."""
    out = np.full(steps.shape, names[anomalies.OK], np.int64)
    if by_step and steps.size:
        keys = np.fromiter(by_step, np.int64, len(by_step))
        at = np.searchsorted(steps, keys)
        hit = (at < steps.size) & (steps[np.minimum(at, steps.size - 1)] == keys)
        codes = np.asarray([names.setdefault(v, len(names)) for v in by_step.values()], np.int64)
        out[at[hit]] = codes[hit]
    return out


def _at_steps(steps: Any, by_step: Dict[int, Any], missing: float) -> Any:
    """The values of `by_step` at each of `steps` (ascending int64), `missing` where a step has none (or None):
    one vectorized lookup (a long run is millions of rows, a few of them in `by_step`)."""
    out = np.full(steps.shape, missing, dtype=np.float64)
    if by_step and steps.size:
        keys = np.fromiter(by_step, np.int64, len(by_step))
        at = np.searchsorted(steps, keys)
        hit = (at < steps.size) & (steps[np.minimum(at, steps.size - 1)] == keys)
        vals = list(by_step.values())
        for i in np.flatnonzero(hit):
            v = vals[i]
            out[at[i]] = missing if v is None else v
    return out


def _examples(
    provider: Any, ctx: Any, run: str, examples: Iterable[catalog.Series]
) -> Dict[tuple, Dict[int, Dict[str, float]]]:
    """{(layer, target, source): {step: {field: value}}} of the `examples` records of one run.

    Columns are mapped by the record's own `fields` (a name this reader does not use is ignored); a record of
    another shape is skipped with a warning (`series.fits`); at a repeated step the later record wins.
    """
    examples = list(examples)
    parts = {p.tag: p for s in examples for p in s.parts if p.grouped}
    if not parts:
        return {}
    data = series.read(provider, ctx, "", run, list(parts), alone=list(parts))
    out: Dict[tuple, Dict[int, Dict[str, float]]] = {}
    for s in examples:
        by_step: Dict[int, Any] = {}
        for p in (p for p in s.parts if p.grouped):
            wanted = {f: j for j, f in enumerate(p.fields) if f in EXAMPLE_COLUMNS}
            for datum in data.get(p.tag, ()):
                if not series.fits(datum, p.tag, run, (p.rows, len(p.fields))):
                    continue
                step = int(datum.step)
                if step in by_step and by_step[step][0] > datum.wall_time:
                    continue
                row = datum.numpy[p.row]
                by_step[step] = (datum.wall_time, {f: float(row[j]) for f, j in wanted.items()})
        out[(s.info.layer, s.info.target, s.info.source)] = {step: values for step, (_, values) in by_step.items()}
    return out


def origins(
    logdir: str, runs: Optional[Iterable[str]] = None
) -> Dict[str, Dict[str, Optional[nonfinite_origin.Origin]]]:
    """Where each run first went non-finite: `{run: {target: Origin or None}}` (no pandas needed).

    The `Origin` of `tb_layergrad.nonfinite_origin` (`.step`, `.pass_`, `.origin`, `.line`,
    `.to_json()`); `load(logdir).attrs["nonfinite_origin"]` holds the same as dicts.
    """
    with event_files.tensorflow_free(logdir), damage.checked_once():
        provider = event_files.open_provider(logdir)
        ctx = tb_context.RequestContext()
        return _origins(provider, ctx, catalog.load(provider, ctx, "", runs))


def _origins(provider: Any, ctx: Any, cat: catalog.Catalog) -> Dict[str, Dict[str, Optional[nonfinite_origin.Origin]]]:
    return {run: _run_origins(RunSource(provider, ctx, "", rc)) for run, rc in cat.runs.items()}


def _run_origins(src: RunSource) -> Dict[str, Optional[nonfinite_origin.Origin]]:
    return {t: origin.locate_run(src, t) for t in src.rc.targets()}
