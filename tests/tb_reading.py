"""Read layergrad records back through TensorBoard's own data provider."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
from tensorboard import context as tb_context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

from tb_layergrad import metadata


def read_all(logdir: str) -> Dict[str, Dict[str, Tuple[metadata.SeriesInfo, List]]]:
    """{run: {tag: (SeriesInfo, [TensorDatum...])}} for every layergrad series, all steps."""
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
    return out


def values_at(records, tag: str, step: int) -> np.ndarray:
    info, datums = records[tag]
    matches = [d.numpy for d in datums if d.step == step]
    assert len(matches) == 1, f"{tag} has {len(matches)} records at step {step}"
    return matches[0]
