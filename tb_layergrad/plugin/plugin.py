"""The TBPlugin: its name, its tab, and the table of routes.

Deliberately thin: the handlers are in `routes`, file serving in `static`.
The plugin reads through `context.data_provider`, so the same code serves
`--load_fast=true`, `false` and `auto`; under the Python loader it also lists
series from `context.multiplexer` (None under the Rust loader), see `listing`.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

from tensorboard.plugins import base_plugin

from tb_layergrad import metadata
from tb_layergrad.plugin import flags as plugin_flags
from tb_layergrad.plugin.routes import Routes
from tb_layergrad.plugin.static import Root, StaticFiles

TAB_NAME = "Layer gradients"
ES_MODULE_PATH = "/index.js"


class LayerGradPlugin(base_plugin.TBPlugin):
    """Serves the `layergrad` tab and its JSON API (docs/HTTP_API.md)."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(
        self, context: base_plugin.TBContext, *, frontend_root: Optional[Root] = None, read_ahead: Optional[bool] = None
    ) -> None:
        """`frontend_root` overrides the folder of static files (tests). `read_ahead`: read the runs'
        statistics in the background (`prefetch`); None: as `--layergrad_prefetch` says, off without flags."""
        if read_ahead is None:
            read_ahead = bool(getattr(getattr(context, "flags", None), plugin_flags.PREFETCH, False))
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
