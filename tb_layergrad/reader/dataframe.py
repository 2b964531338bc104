"""`tb_layergrad.load(logdir)`: every statistic of every series as a pandas DataFrame.

For notebooks and scripts; pandas is an optional extra (`pip install
'tb_layergrad[pandas]'`), imported only when `load` is called. It reads through
TensorBoard's own event multiplexer and data provider (`event_files`) and the
catalog and statistics code the plugin uses, so its numbers are the numbers the tab
shows (derived statistics such as `rms` and `zero_frac` included). Every step is
kept: no sampling. TensorFlow is not imported.

    df = tb_layergrad.load("logs")
    df[df.layer == "my_model/minimalrnn"].plot(x="step", y="norm", logy=True)
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from tb_layergrad import metadata
from tb_layergrad.reader import catalog, event_files, series

COLUMNS = ("run", "layer", "index", "target", "source", "step", "wall_time") + series.ALL_STATS


def load(logdir: str, runs: Optional[Iterable[str]] = None) -> Any:
    """Returns a DataFrame: one row per (run, layer, target, source, step).

    Columns: run, layer, index (position in the model), target, source
    ("output" or "weight"), step, wall_time, then every stored statistic of
    docs/FORMAT.md and the derived ones of docs/HTTP_API.md (NaN where undefined).
    Rows are ordered by run, model order, target, source, step.
    """
    try:
        import pandas as pd
    except ImportError as e:
        raise ImportError(
            "tb_layergrad.load() returns a pandas DataFrame, and pandas is not installed. It is an optional "
            "extra: pip install 'tb_layergrad[pandas]' (or pip install pandas). Without pandas, "
            "`tb-layergrad report LOGDIR --format csv|json` gives the per-layer verdicts."
        ) from e
    with event_files.tensorflow_free(logdir):
        return _load(pd, logdir, runs)


def _load(pd: Any, logdir: str, runs: Optional[Iterable[str]]) -> Any:
    from tensorboard import context as tb_context

    provider = event_files.open_provider(logdir)
    ctx = tb_context.RequestContext()
    cat = catalog.load(provider, ctx, "", runs)
    frames = []
    for run_name, rc in cat.runs.items():
        stats_series = [s for s in rc.series if s.info.kind == metadata.KIND_STATS]
        data = series.read(provider, ctx, "", run_name, [s.tag for s in stats_series])
        order = {layer: i for i, layer in enumerate(rc.layers())}
        for s in sorted(stats_series, key=lambda s: (order[s.info.layer], s.info.target, s.info.source)):
            points = series.select(data.get(s.tag, []))
            table = series.stats_table(points.values)
            frame = {
                "run": run_name,
                "layer": s.info.layer,
                "index": rc.layer_index(s.info.layer),
                "target": s.info.target,
                "source": s.info.source,
                "step": points.steps,
                "wall_time": points.wall_times,
            }
            for name in series.ALL_STATS:
                frame[name] = series.stat_column(table, name)
            frames.append(pd.DataFrame(frame, columns=list(COLUMNS)))
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.concat(frames, ignore_index=True)
