"""Read layergrad records back through TensorBoard's own data provider."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
from tensorboard import context as tb_context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

from tb_layergrad import metadata


def read_all(logdir: str, split_groups: bool = True) -> Dict[str, Dict[str, Tuple[metadata.Info, List]]]:
    """{run: {tag: (info, [TensorDatum...])}} for every layergrad series, all steps.

    `split_groups`: format-version-2 records (one per step for all layers of a
    (target, source)) are decoded here, independently of tb_layergrad's reader,
    into the version-1 series they hold — one per layer and kind, under the
    version-1 tag, with version-1 layouts (the histogram's edges rebuilt from
    the same step's stats) — so that a test asserts the numbers whatever
    version wrote them; False: the records as stored.
    """
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={metadata.PLUGIN_NAME: 0})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    ctx = tb_context.RequestContext()
    listing = provider.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
    data = provider.read_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, downsample=10**9)
    out: Dict[str, Dict[str, Tuple[metadata.SeriesInfo, List]]] = {}
    for run, tags in listing.items():
        for tag, series in tags.items():
            info = metadata.parse_plugin_content(series.plugin_content)
            out.setdefault(run, {})[tag] = (info, data[run][tag])
    if split_groups:
        out = {run: _split_groups(tags) for run, tags in out.items()}
    return out


def _split_groups(tags: Dict[str, Tuple[metadata.Info, List]]) -> Dict[str, Tuple[metadata.Info, List]]:
    out = {tag: found for tag, found in tags.items() if not isinstance(found[0], metadata.GroupInfo)}
    for group, datums in tags.values():
        if not isinstance(group, metadata.GroupInfo):
            continue
        stats_at = {}
        if group.kind == metadata.KIND_HISTOGRAM:
            stats_tag = group.with_kind(metadata.KIND_STATS).tag  # the stats of every block of the same digest
            stats_at = {
                int(d.step): np.asarray(d.numpy)
                for t, (info, found) in tags.items()
                if isinstance(info, metadata.GroupInfo) and info.tag == stats_tag
                for d in found
            }
        for row, member in enumerate(group.members()):
            rows = [_row(group, d, row, stats_at) for d in datums]
            if group.kind == metadata.KIND_FIRST_NONFINITE:  # -1: this layer clean so far (version 1: no record)
                rows = [d for d in rows if int(d.numpy[0]) >= 0]
                if not rows:
                    continue
            if member.tag in out:  # the layer is in several groups (its layer list changed): one series
                rows = sorted(out[member.tag][1] + rows, key=lambda d: (d.step, d.wall_time))
            out[member.tag] = (member, rows)
    return out


def examples(logdir: str) -> Dict[str, Dict[Tuple[str, str], Dict[int, Dict[str, np.ndarray]]]]:
    """{run: {(target, source): {step: {layer: row}}}} of every `examples` record, read as stored (version 2),
    each row a float64 [len(EXAMPLE_FIELDS)]; the metadata checked to carry the stats group's layer list."""
    out: Dict[str, Dict[Tuple[str, str], Dict[int, Dict[str, np.ndarray]]]] = {}
    for run, tags in read_all(logdir, split_groups=False).items():
        for tag, (info, datums) in tags.items():
            if not isinstance(info, metadata.GroupInfo) or info.kind != metadata.KIND_EXAMPLES:
                continue
            assert tuple(info.fields) == metadata.EXAMPLE_FIELDS
            stats = info.with_kind(metadata.KIND_STATS)
            assert any(isinstance(i, metadata.GroupInfo) and i.tag == stats.tag for i, _ in tags.values()), (
                f"{tag}: no stats group with the same layer list"
            )
            for d in datums:
                value = np.asarray(d.numpy)
                assert value.shape == (len(info.layers), len(metadata.EXAMPLE_FIELDS)), value.shape
                out.setdefault(run, {}).setdefault((info.target, info.source), {})[int(d.step)] = dict(
                    zip(info.layers, value)
                )
    return out


def scalars(logdir: str) -> Dict[str, Dict[str, Dict[int, float]]]:
    """{run: {tag: {step: value}}} of the standard TensorBoard scalars (plugin `scalars`), through its data provider."""
    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"scalars": 0})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    ctx = tb_context.RequestContext()
    data = provider.read_scalars(ctx, experiment_id="", plugin_name="scalars", downsample=10**9)
    return {
        run: {tag: {int(d.step): float(d.value) for d in points} for tag, points in tags.items()}
        for run, tags in data.items()
    }


def _row(group: metadata.GroupInfo, datum, row: int, stats_at) -> "provider.TensorDatum":  # noqa: F821 - imported in the body, where TensorBoard is needed
    from tensorboard.data import provider

    value = np.asarray(datum.numpy)
    assert value.shape[0] == len(group.layers), f"{group.kind}: {value.shape[0]} rows for {len(group.layers)} layers"
    if group.kind == metadata.KIND_STATS:
        assert tuple(group.fields) == metadata.STAT_FIELDS
        one = value[row].astype(np.float64)
    elif group.kind == metadata.KIND_FIRST_NONFINITE:
        one = value[row : row + 1].astype(np.int64)
    elif group.kind == metadata.KIND_EXAMPLES:  # version 2 only: the row as written, its columns named by `fields`
        assert tuple(group.fields) == metadata.EXAMPLE_FIELDS
        one = value[row].astype(np.float64)
    else:
        assert value.dtype.kind == "u", f"histogram counts are unsigned integers, got {value.dtype}"
        stats = stats_at[int(datum.step)][row]
        lo, hi = stats[metadata.STAT_INDEX["min"]], stats[metadata.STAT_INDEX["max"]]
        left, right = metadata.histogram_edges(lo, hi, value.shape[1])
        one = np.stack([np.asarray(left), np.asarray(right), value[row].astype(np.float64)], axis=1)
    return provider.TensorDatum(step=datum.step, wall_time=datum.wall_time, numpy=one)


def values_at(records, tag: str, step: int) -> np.ndarray:
    info, datums = records[tag]
    matches = [d.numpy for d in datums if d.step == step]
    assert len(matches) == 1, f"{tag} has {len(matches)} records at step {step}"
    return matches[0]
