"""The package's rooms (docs/DESIGN.md, "The rooms"): data flows one way, and the code says nothing of timings.

Read from the sources (ast), not by importing them: the rule is about what each room imports.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tb_layergrad"

# room -> the rooms it may import (its own always). In the order data flows:
# capture -> summary -> event files -> reader -> plugin -> tab; cli uses them all.
ALLOWED: Dict[str, Set[str]] = {
    "metadata": set(),
    "nonfinite_origin": set(),  # the rule of where a NaN was born: pure Python, asked by writers and readers alike
    "capturing": {"metadata", "nonfinite_origin"},
    "statistics": {"metadata"},
    "kernel": set(),
    "distribute": {"metadata", "capturing", "statistics"},
    "summary": {"metadata", "capturing", "statistics", "kernel", "distribute"},
    "keras": {"metadata", "nonfinite_origin", "capturing", "statistics", "kernel", "distribute", "summary"},
    "reader": {"metadata", "nonfinite_origin"},
    "plugin": {"metadata", "nonfinite_origin", "reader"},
    "cli": {
        "__init__",
        "metadata",
        "nonfinite_origin",
        "capturing",
        "summary",
        "keras",
        "distribute",
        "reader",
        "kernel",
    },
    "__init__": {"metadata"},
    "__main__": {"cli"},
}


def _modules() -> Iterator[Tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).parts[0].removesuffix(".py"), path


def _imported_rooms(path: Path) -> Set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "tb_layergrad" else [f"tb_layergrad.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("tb_layergrad."):
                room = name.split(".")[1]
                is_module = (PACKAGE / room).is_dir() or (PACKAGE / f"{room}.py").is_file()
                rooms.add(room if is_module else "__init__")  # `from tb_layergrad import __version__`
    return rooms


def test_every_module_is_in_a_room():
    assert {room for room, _ in _modules()} <= set(ALLOWED), "a module outside the rooms of docs/DESIGN.md"


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_a_room_imports_only_the_rooms_before_it(room):
    for module_room, path in _modules():
        if module_room != room:
            continue
        wrong = _imported_rooms(path) - ALLOWED[room] - {room}
        assert not wrong, f"{path.relative_to(PACKAGE)} imports {sorted(wrong)}"


TIMING = re.compile(r"\d(\.\d+)?\s?(ms|us|µs|ns)\b|\d\.\d+x\b")


def _comments_and_docstrings(path: Path) -> Iterator[Tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":  # C++: every // comment
        for number, line in enumerate(source.splitlines(), 1):
            if "//" in line:
                yield number, line.split("//", 1)[1]
        return
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "lineno", 1), doc


def test_no_comment_or_docstring_carries_a_timing():
    """Measurements go to docs/DESIGN.md and docs/PERFORMANCE.md (dated); the code says why in words."""
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {TIMING.search(text).group(0)}"
        for path in sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cc"), *PACKAGE.rglob("*.h")])
        for line, text in _comments_and_docstrings(path)
        if TIMING.search(text)
    ]
    assert not found, found
