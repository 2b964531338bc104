"""The plugin's own TensorBoard flags: defined by `loader.LayerGradLoader`, read by `plugin.LayerGradPlugin`.

Standard library only: TensorBoard defines flags before any plugin loads, so an import that fails here
would stop TensorBoard itself, not just the tab.
"""

from __future__ import annotations

import argparse
from typing import Any

PREFETCH = "layergrad_prefetch"


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def define(parser: Any) -> None:
    """Adds the flags; a second loader of this plugin (a program that lists it besides the entry point) adds none."""
    try:
        _add(parser)
    except argparse.ArgumentError:
        pass  # defined by the first loader, with the same meaning


def _add(parser: Any) -> None:
    parser.add_argument(
        "--" + PREFETCH,
        metavar="BOOL",
        type=parse_bool,
        default=True,
        help="layergrad: read every run's statistics in the background, within the plugin's cache, so that the "
        "tab's first view of a long run does not wait for them (default: true).",
    )
