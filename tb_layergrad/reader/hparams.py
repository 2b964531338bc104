"""The hyperparameters each run was trained with, as logged by TensorBoard's HParams API.

`hp.hparams(...)` and `hp.KerasCallback(log_dir, ...)` write one record per session, tag
`_hparams_/session_start_info`, in the run folder they write to. Its values are not in the tensor (an
empty placeholder) but in the series' summary metadata (`HParamsPluginData.session_start_info.hparams`,
a map of protobuf `Value`s), which every data provider hands over in `list_tensors(plugin_name="hparams")`
under both loaders. So this reads the listing only, never a tensor body.

Which session a run belongs to, as the HParams plugin groups runs: a session written in a run folder
applies to that run and to every run below it, and the nearest one wins. Keras' callback writes the
session in `log_dir` while `GradientLogger` writes to `log_dir/train`: `log_dir/train` gets `log_dir`'s
hyperparameters. The logdir's own folder (run ".") is above every run. Sessions are not merged across
depths: a run under two sessions has the nearer one's values only.

A provider that implements `list_hyperparameters` (TensorBoard's own providers return nothing there) adds
its session groups' values; where both name the same hyperparameter of the same run, the event file's wins.

Values keep their kind: `str`, `bool` or `float` (the format stores every number as a double, so an `int`
logged as 32 reads back as 32.0).
"""

from __future__ import annotations

import logging
import math
import posixpath
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

from tensorboard.data import provider as tb_provider

PLUGIN_NAME = "hparams"
SESSION_START_TAG = "_hparams_/session_start_info"
PLUGIN_DATA_VERSION = 0  # the HParams plugin's content version this reader understands
COLUMN_PREFIX = "hp/"

Value = Union[str, bool, float]
Values = Dict[str, Value]

logger = logging.getLogger(__name__)


def column(name: str) -> str:
    """The column of hyperparameter `name` in `load()` and `tb-layergrad report`: "hp/<name>"."""
    return COLUMN_PREFIX + name


def parse_session_start(content: bytes) -> Optional[Values]:
    """The hyperparameters of one `session_start_info` metadata content; None when it is not one.

    Args:
      content: `plugin_content` of a `_hparams_/session_start_info` series (`HParamsPluginData` bytes).

    Returns:
      `{name: value}`, each value a `str`, `bool` or `float`; a value of another kind (a list, a
      struct, null: the HParams API writes none) is left out. None for content of another version,
      another record (the experiment's configuration) or bytes that do not parse.

    Example:

        from tensorboard.plugins.hparams import summary_v2
        summary = summary_v2.hparams_pb({"lr": 0.1, "act": "relu"})
        parse_session_start(summary.value[0].metadata.plugin_data.content)  # {"act": "relu", "lr": 0.1}
    """
    # Imported when a run has hyperparameters: the reader's modules load with the plugin, at TensorBoard's start.
    from google.protobuf.message import DecodeError
    from tensorboard.plugins.hparams import plugin_data_pb2

    try:
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
    except DecodeError:
        return None
    if data.version != PLUGIN_DATA_VERSION or not data.HasField("session_start_info"):
        return None
    out: Values = {}
    for name, value in data.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        if kind == "string_value":
            out[name] = value.string_value
        elif kind == "bool_value":
            out[name] = value.bool_value
        elif kind == "number_value":
            out[name] = float(value.number_value)
    return dict(sorted(out.items()))


def sessions(provider: tb_provider.DataProvider, ctx: Any, experiment_id: str) -> Dict[str, Values]:
    """`{session run: {name: value}}`: every run folder where a session started, and its hyperparameters.

    Args:
      provider: a TensorBoard data provider (the plugin's, or `reader.event_files.open_provider`'s).
      ctx: the request's `tensorboard.context.RequestContext`.
      experiment_id: "" for the logdir TensorBoard was started on.

    Returns:
      The session runs by name as the provider names runs ("." for the logdir itself), from the event
      files' session records merged with the provider's `list_hyperparameters` session groups.

    Example:

        from tensorboard import context
        from tb_layergrad.reader import event_files, hparams
        sessions = hparams.sessions(event_files.open_provider("logs"), context.RequestContext(), "")
    """
    out: Dict[str, Values] = {}
    for run, values in _provider_sessions(provider, ctx, experiment_id).items():
        out[run] = dict(values)
    listing = provider.list_tensors(
        ctx,
        experiment_id=experiment_id,
        plugin_name=PLUGIN_NAME,
        run_tag_filter=tb_provider.RunTagFilter(tags=[SESSION_START_TAG]),
    )
    for run, tags in listing.items():
        series = tags.get(SESSION_START_TAG)
        if series is None:
            continue
        values = parse_session_start(series.plugin_content)
        if values is None:
            logger.warning("run %s: a hyperparameter record this version cannot read was skipped", run)
            continue
        out[run] = dict(sorted({**out.get(run, {}), **values}.items()))
    return out


def _provider_sessions(provider: Any, ctx: Any, experiment_id: str) -> Dict[str, Values]:
    """The session groups of `provider.list_hyperparameters`, by session run (empty where not implemented)."""
    lister = getattr(provider, "list_hyperparameters", None)
    if lister is None:
        return {}
    result = lister(ctx, experiment_ids=[experiment_id])
    out: Dict[str, Values] = {}
    for group in getattr(result, "session_groups", None) or ():
        values: Values = {}
        for v in group.hyperparameter_values:
            if isinstance(v.value, (str, bool)):
                values[v.hyperparameter_name] = v.value
            elif isinstance(v.value, (int, float)):
                values[v.hyperparameter_name] = float(v.value)
        for session in group.sessions:
            if session.experiment_id in ("", experiment_id):
                out[session.run or "."] = values
    return out


def session_of(run: str, session_runs: Iterable[str]) -> Optional[str]:
    """The nearest session run at or above `run` ("a/b" is below "a" and below "."), or None.

    Example:

        session_of("sweep/lr=0.1/train", ["sweep/lr=0.1", "."])  # "sweep/lr=0.1"
    """
    known = set(session_runs)
    path = run
    while path not in ("", "."):
        if path in known:
            return path
        path = posixpath.dirname(path)
    return "." if "." in known else None


def by_run(provider: tb_provider.DataProvider, ctx: Any, experiment_id: str, runs: Iterable[str]) -> Dict[str, Values]:
    """`{run: {name: value}}` for each of `runs`: its session's hyperparameters, `{}` for a run without.

    Args:
      provider, ctx, experiment_id: as for `sessions`.
      runs: run names as the provider names them (e.g. the catalog's runs).

    Returns:
      One entry per run, in the order given.

    Example:

        from tensorboard import context
        from tb_layergrad.reader import event_files, hparams
        values = hparams.by_run(event_files.open_provider("logs"), context.RequestContext(), "", ["a/train"])
    """
    found = sessions(provider, ctx, experiment_id)
    out: Dict[str, Values] = {}
    for run in runs:
        session = session_of(run, found)
        out[run] = dict(found[session]) if session is not None else {}
    return out


def json_values(values: Mapping[str, Value]) -> Dict[str, Optional[Value]]:
    """`values` for strict JSON: a NaN or infinite number becomes None (null)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}


def names(values_by_run: Mapping[str, Mapping[str, Value]]) -> List[str]:
    """Every hyperparameter name of any run, sorted: the order of the `hp/<name>` columns."""
    return sorted({name for values in values_by_run.values() for name in values})


KINDS = {str: "string", bool: "bool", float: "number"}
MIXED = "mixed"


def kinds(values_by_run: Mapping[str, Mapping[str, Value]]) -> Dict[str, str]:
    """`{name: kind}` of every hyperparameter, in `names` order: `number`, `string` or `bool` when every run
    that has it gives it that kind, `mixed` when runs differ (a number in one run, a string in another).

    Example:

        kinds({"a": {"lr": 0.1, "act": "relu"}, "b": {"lr": "auto"}})  # {"act": "string", "lr": "mixed"}
    """
    seen: Dict[str, set] = {}
    for values in values_by_run.values():
        for name, value in values.items():
            seen.setdefault(name, set()).add(KINDS[type(value)])
    return {name: (seen[name].pop() if len(seen[name]) == 1 else MIXED) for name in names(values_by_run)}
