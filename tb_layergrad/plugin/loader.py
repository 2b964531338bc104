"""What TensorBoard loads (`tensorboard_plugins` in setup.py): the `layergrad` plugin's loader, flags and TBPlugin.

The loader exists for one reason besides creating the plugin: TensorBoard
samples third-party tensor series at ingest (10 points per series with the
Python loader, 100 with the Rust data server), so a user logging 5,000 steps
would silently see 10, and the step with the NaN could be the one dropped.
`fix_flags` runs after argument parsing and before data loading starts, so
setting `samples_per_plugin[layergrad] = 0` ("keep all") there reaches both
loaders. A value the user gave for `layergrad` is left alone: that is how to
bound memory on very long runs (`--samples_per_plugin=layergrad=2000`).

TensorBoard imports this module while it starts, and an ImportError here stops TensorBoard: so it imports
only the standard library, TensorBoard and `metadata`; the routes (numpy, the reader) are imported when the
plugin is built, where a broken install costs the tab, not TensorBoard. The plugin reads through
`context.data_provider`, so the same code serves `--load_fast=true`, `false` and `auto`; under the Python
loader it also lists series from `context.multiplexer` (None under the Rust loader), see `listing`.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Callable, Dict, Optional

from tensorboard.plugins import base_plugin

from tb_layergrad import metadata

logger = logging.getLogger(__name__)

TAB_NAME = "Layer gradients"
ES_MODULE_PATH = "/index.js"
# 0 means "keep every point" to both the Python multiplexer and (translated to
# "all" by TensorBoard's server_ingester) the Rust data server.
KEEP_ALL = 0
# The plugin's own flag: read the runs' statistics ahead of the tab (`prefetch`).
PREFETCH = "layergrad_prefetch"


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


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
        """Adds the flags; a second loader of this plugin (a program that lists it besides the entry point) adds
        none."""
        try:
            parser.add_argument(
                "--" + PREFETCH,
                metavar="BOOL",
                type=parse_bool,
                default=True,
                help="layergrad: read every run's statistics in the background, within the plugin's cache, so that "
                "the tab's first view of a long run does not wait for them (default: true).",
            )
        except argparse.ArgumentError:
            pass  # defined by the first loader, with the same meaning

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
        if metadata.PLUGIN_NAME not in samples:
            samples[metadata.PLUGIN_NAME] = KEEP_ALL
        flags.samples_per_plugin = samples

    def load(self, context: base_plugin.TBContext) -> Optional[base_plugin.TBPlugin]:
        try:
            return LayerGradPlugin(context)
        except ImportError:
            logger.exception("layergrad: the plugin could not be imported; its tab is disabled")
            return None


class LayerGradPlugin(base_plugin.TBPlugin):
    """Serves the `layergrad` tab and its JSON API (docs/HTTP_API.md): the handlers are in `routes`."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(
        self, context: base_plugin.TBContext, *, frontend_root: Optional[Any] = None, read_ahead: Optional[bool] = None
    ) -> None:
        """`frontend_root`: the folder of static files (`static.Root`; default: the installed `frontend/`).
        `read_ahead`: read the runs' statistics in the background (`prefetch`); None: as `--layergrad_prefetch`
        says, off without flags."""
        # Here, not at the top: a broken install costs the tab, not TensorBoard (see the module's docstring).
        from tb_layergrad.plugin.routes import Routes
        from tb_layergrad.plugin.static import StaticFiles

        if read_ahead is None:
            read_ahead = bool(getattr(getattr(context, "flags", None), PREFETCH, False))
        self._routes = Routes(
            context.data_provider,
            StaticFiles(frontend_root),
            multiplexer=getattr(context, "multiplexer", None),
            read_ahead=read_ahead,
            logdir=getattr(context, "logdir", None) or "",
        )

    def get_plugin_apps(self) -> Dict[str, Callable]:
        r = self._routes
        # The routes of docs/HTTP_API.md; every other path below the plugin: a file of frontend/ (or a JSON 404).
        return {ES_MODULE_PATH: r.static_file, **r.apps(), "/*": r.static_file}

    def is_active(self) -> bool:
        # Only asked when no `layergrad` series exists (TensorBoard enables the
        # tab by itself as soon as `list_plugins` reports data): nothing to show.
        return False

    def data_plugin_names(self):
        return (metadata.PLUGIN_NAME,)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path=ES_MODULE_PATH, tab_name=TAB_NAME)
