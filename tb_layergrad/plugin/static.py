"""Serving the tab's files from the `frontend/` folder, and nothing else.

Paths are checked by a whitelist (segments of `[A-Za-z0-9_][A-Za-z0-9._-]*`,
known extensions) rather than by trying to spot every traversal trick: `..`,
absolute paths, back-slashes, `%2e%2e` (decoded or double-encoded), NUL bytes,
drive letters and hidden files all fail the same simple test. A file that
passes is then resolved and must still lie inside the folder (a symlink
pointing out of it is refused).

The folder is the package `tb_layergrad.frontend` (setup.py maps it from the
top-level `frontend/`), found through importlib.resources or, where that
cannot open a namespace package (Python 3.9), through the import system. In a
legacy `pip install -e .` that mapping does not exist at import time, so the
source checkout's `frontend/` is used instead.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import pathlib
import re
from typing import Any, Optional, Tuple

from tensorboard import errors

import tb_layergrad

FRONTEND_PACKAGE = "tb_layergrad.frontend"

# Explicit types: `mimetypes` varies by platform (Windows may say text/plain
# for .js, which `X-Content-Type-Options: nosniff` then refuses to run).
CONTENT_TYPES = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".json": "application/json",
    ".map": "application/json",
    ".txt": "text/plain",
    ".woff2": "font/woff2",
    ".ico": "image/x-icon",
}

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_MAX_PATH = 512
_MAX_DEPTH = 8

# A pathlib.Path, or an importlib.resources Traversable (e.g. inside a zip).
Root = Any


def frontend_root() -> Root:
    """The folder holding index.js and the rest of the tab.

    A concrete directory (pathlib.Path) whenever there is one, so that the
    symlink check in `StaticFiles.read` applies; a Traversable otherwise
    (e.g. a zipped install).
    """
    try:
        root = importlib.resources.files(FRONTEND_PACKAGE)
        if isinstance(root, pathlib.Path):
            return root
        probe = root.joinpath("index.js")
        if isinstance(probe, pathlib.Path) and probe.is_file():
            return probe.parent
        if root.is_dir():
            return root
    except (ModuleNotFoundError, TypeError, FileNotFoundError, NotADirectoryError):
        pass
    # Python 3.9's importlib.resources cannot open a namespace package (the installed frontend folder has no
    # __init__.py): take the folder the import system finds for it.
    try:
        spec = importlib.util.find_spec(FRONTEND_PACKAGE)
    except ModuleNotFoundError:
        spec = None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if pathlib.Path(location, "index.js").is_file():
            return pathlib.Path(location)
    return pathlib.Path(tb_layergrad.__file__).resolve().parent.parent / "frontend"


def check_path(relative: str) -> Tuple[str, ...]:
    """The path's segments if it is a servable name, else a 404."""
    segments = tuple(relative.split("/"))
    ok = (
        0 < len(relative) <= _MAX_PATH
        and len(segments) <= _MAX_DEPTH
        and all(_SEGMENT.fullmatch(s) for s in segments)
        and content_type(segments[-1]) is not None
    )
    if not ok:
        raise errors.NotFoundError("no such file in the layergrad frontend")
    return segments


def content_type(name: str) -> Optional[str]:
    dot = name.rfind(".")
    return CONTENT_TYPES.get(name[dot:].lower()) if dot > 0 else None


class StaticFiles:
    """Reads files below one root; every failure is the same 404."""

    def __init__(self, root: Optional[Root] = None) -> None:
        self._root = root if root is not None else frontend_root()

    @property
    def root(self) -> Root:
        return self._root

    def read(self, relative: str) -> Tuple[bytes, str]:
        """(content, content type) of `relative`, or NotFoundError."""
        segments = check_path(relative)
        missing = errors.NotFoundError("no such file in the layergrad frontend")
        kind = content_type(segments[-1]) or ""
        root = self._root
        try:
            if isinstance(root, pathlib.Path):
                base = root.resolve()
                node = base.joinpath(*segments).resolve()
                if base not in node.parents:  # a symlink leading out of the folder
                    raise missing
            else:
                node = root
                for segment in segments:  # one at a time: older Traversables take one child
                    node = node.joinpath(segment)
            if not node.is_file():
                raise missing
            return node.read_bytes(), kind
        except OSError:
            raise missing from None
