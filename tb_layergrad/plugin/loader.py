"""Entry point of the `layergrad` plugin (`tensorboard_plugins` in setup.py).

The loader exists for one reason besides creating the plugin: TensorBoard
samples third-party tensor series at ingest (10 points per series with the
Python loader, 100 with the Rust data server), so a user logging 5,000 steps
would silently see 10, and the step with the NaN could be the one dropped.
`fix_flags` runs after argument parsing and before data loading starts, so
setting `samples_per_plugin[layergrad] = 0` ("keep all") there reaches both
loaders. A value the user gave for `layergrad` is left alone: that is how to
bound memory on very long runs (`--samples_per_plugin=layergrad=2000`).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from tensorboard.plugins import base_plugin

from tb_layergrad.metadata import PLUGIN_NAME
from tb_layergrad.plugin import flags

logger = logging.getLogger(__name__)

# 0 means "keep every point" to both the Python multiplexer and (translated to
# "all" by TensorBoard's server_ingester) the Rust data server.
KEEP_ALL = 0


def _parse_samples(value: str) -> Dict[str, int]:
    """Parse the `name=count,name=count` form, as `--samples_per_plugin` does."""
    result: Dict[str, int] = {}
    for token in value.split(","):
        token = token.strip()
        if token:
            name, _, count = token.partition("=")
            result[name.strip()] = int(count)
    return result


class LayerGradLoader(base_plugin.TBLoader):
    """Keeps every `layergrad` step by default, then builds the plugin."""

    def define_flags(self, parser: Any) -> None:
        flags.define(parser)

    def fix_flags(self, flags: Any) -> None:
        samples = getattr(flags, "samples_per_plugin", None)
        if samples is None:
            samples = {}
        elif isinstance(samples, str):
            # `program.TensorBoard.configure(samples_per_plugin="...")` passes the raw string.
            try:
                samples = _parse_samples(samples)
            except ValueError as e:
                raise base_plugin.FlagsError(f"--samples_per_plugin: {e}") from None
        else:
            samples = dict(samples)
        if PLUGIN_NAME not in samples:
            samples[PLUGIN_NAME] = KEEP_ALL
        flags.samples_per_plugin = samples

    def load(self, context: base_plugin.TBContext) -> Optional[base_plugin.TBPlugin]:
        # Imported here so that a broken install costs the tab, not TensorBoard.
        try:
            from tb_layergrad.plugin.plugin import LayerGradPlugin
        except ImportError:
            logger.exception("layergrad: the plugin could not be imported; its tab is disabled")
            return None
        return LayerGradPlugin(context)
