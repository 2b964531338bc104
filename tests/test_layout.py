"""The package's rooms (docs/DESIGN.md, "The rooms"): data flows one way, no two modules import each other, no
module hands on another's names, every module the docs name exists, and the code says nothing of timings.

Read from the sources (ast), not by importing them: the rules are about what each module imports.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tb_layergrad"

# room -> the rooms it may import (its own always). In the order data flows:
# capture -> summary -> event files -> reader -> plugin -> tab; cli uses them all.
ALLOWED: Dict[str, Set[str]] = {
    "metadata": set(),
    "nonfinite_origin": set(),  # the rule of where a NaN was born: pure Python, asked by writers and readers alike
    "capturing": {"metadata", "nonfinite_origin"},
    "statistics": {"metadata"},
    "kernel": {"metadata"},  # host_records' rows are metadata.STAT_FIELDS
    "distribute": {"metadata", "capturing", "statistics"},
    "summary": {"metadata", "capturing", "statistics", "kernel", "distribute"},
    "keras": {
        "metadata",
        "nonfinite_origin",
        "logger_arguments",
        "capturing",
        "statistics",
        "kernel",
        "distribute",
        "summary",
    },
    "reader": {"metadata", "nonfinite_origin"},
    "plugin": {"metadata", "nonfinite_origin", "reader"},
    "backend": set(),  # names each backend's room as a string: imported when `GradientLogger` is first read
    "writer": {"metadata"},
    "logger_arguments": set(),
    # kernel: host_records only (the fused loops without TensorFlow, for JAX's step)
    "jax": {"metadata", "nonfinite_origin", "logger_arguments", "capturing", "statistics", "kernel", "writer"},
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
        "backend",  # the demo leaves out what needs TensorFlow when Keras runs on JAX
    },
    "__init__": {"metadata", "backend"},
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


def _module_name(path: Path) -> str:
    parts = ("tb_layergrad",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> Dict[str, Set[str]]:
    """module -> the package's modules it imports, anywhere in it (functions and TYPE_CHECKING blocks too), a
    package's `__init__` counted only where a name is taken from it."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = {name for name, p in paths.items() if p.name != "__init__.py"}
    out: Dict[str, Set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    found |= {c for c in (f"{base}.{alias.name}", base) if c in modules}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in modules}
        out[name] = found - {name}
    return out


def _circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    circles: List[List[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other():
    """Two modules that import each other, directly or round a loop, are one concept cut in two (or a helper in
    the wrong module): merge them, or move what both need to where it belongs."""
    assert not _circles(_imports())


def test_no_module_hands_on_another_modules_names():
    """A name is imported from where it lives: no re-export ("noqa: F401" outside a package's `__init__`) and no
    module-level `__getattr__` that forwards to other modules (but the top-level package's lazy public API)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if path.name != "__init__.py" and "noqa: F401" in source:
            found.append(f"{path.relative_to(PACKAGE)}: noqa: F401")
        tree = ast.parse(source)
        if path != PACKAGE / "__init__.py" and any(
            isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body
        ):
            found.append(f"{path.relative_to(PACKAGE)}: module-level __getattr__")
    assert not found, found


def test_every_module_the_docs_and_comments_name_exists():
    """The docs, the README and the sources' comments name modules (and test files) by path or dotted name: each
    must exist (a renamed module leaves no stale copy of its old name behind). Read as text: a dotted name's first part that
    is not a folder must be a module of it, or a name its `__init__` holds."""
    checkout = PACKAGE.parent
    texts = [*checkout.glob("docs/*.md"), checkout / "README.md", *PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.cc")]
    texts += [*PACKAGE.rglob("*.h"), *_tab_sources()]
    missing = set()
    for text in texts:
        source = text.read_text(encoding="utf-8")
        for match in re.finditer(r"tb_layergrad/([\w/]+)\.py", source):
            if not (PACKAGE / f"{match.group(1)}.py").exists():
                missing.add(f"{text.relative_to(checkout)}: {match.group(0)}")
        for match in re.finditer(r"(?<![\w/.])tests/[\w/]+\.py", source):  # a test file, by its path
            if not (checkout / match.group(0)).exists():
                missing.add(f"{text.relative_to(checkout)}: {match.group(0)}")
        for match in re.finditer(r"\btb_layergrad((?:\.[a-z]\w*)+)", source):
            folder = PACKAGE
            for part in match.group(1).strip(".").split("."):
                if (folder / part).is_dir():
                    folder = folder / part
                    continue
                init = folder / "__init__.py"
                shipped = folder == PACKAGE and (checkout / part).is_dir()  # `tb_layergrad.frontend` (setup.py)
                named = (
                    shipped
                    or (folder / f"{part}.py").exists()
                    or (init.exists() and re.search(rf"\b{part}\b", init.read_text(encoding="utf-8")))
                )
                if not named:
                    missing.add(f"{text.relative_to(checkout)}: {match.group(0)}")
                break
    assert not missing, sorted(missing)


def test_every_module_is_named_in_the_rooms_of_the_design():
    """docs/DESIGN.md, "The modules of each room", is the one written copy of the rooms: a module added, moved
    or renamed is named there, in its room's line."""
    design = (PACKAGE.parent / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    section = design.split("### The modules of each room", 1)[1].split("\n### ", 1)[0]
    lines = {m.group(1): m.group(0) for m in re.finditer(r"^- `(\w+)/`:.*(?:\n  .*)*", section, re.M)}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        room = path.relative_to(PACKAGE).parts[0]
        text = lines.get(room, section)  # a top-level module (`nonfinite_origin.py`): anywhere in the section
        if f"`{path.stem}`" not in text and f"`{path.name}`" not in text:
            missing.append(str(path.relative_to(PACKAGE)))
    assert not missing, f"not named in docs/DESIGN.md's rooms: {missing}"


# One name shared on purpose: the same concept in each backend's room (TensorFlow's `keras/` and `statistics/`,
# JAX's `jax/`), and Python's own package files.
SAME_CONCEPT_PER_BACKEND = {"__init__.py", "__main__.py", "gradient_logger.py", "reductions.py"}


def test_one_file_name_one_meaning():
    """A module's file name says its concept: two modules of one name are one concept (a backend's copy of it) or
    a name to change."""
    rooms_of: Dict[str, List[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rooms_of.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in rooms_of.items() if len(paths) > 1}
    assert set(shared) <= SAME_CONCEPT_PER_BACKEND, {
        n: p for n, p in shared.items() if n not in SAME_CONCEPT_PER_BACKEND
    }


def _tab_sources() -> List[Path]:
    """The tab's own ES modules (not the vendored libraries)."""
    frontend = PACKAGE.parent / "frontend"
    return [p for p in sorted(frontend.rglob("*.js")) if "vendor" not in p.relative_to(frontend).parts]


def test_the_tab_holds_no_copy_of_the_rules_numbers():
    """The anomaly and example thresholds are the server's, sent with the `anomalies` answer (docs/HTTP_API.md):
    the tab holds no value of its own for one, neither as a key of an object literal nor as a fallback."""
    from tb_layergrad.reader import anomalies, dominance

    names = [*anomalies.THRESHOLDS, *dominance.EXAMPLE_THRESHOLDS]
    copy = re.compile(rf"\b({'|'.join(names)})\s*:|\.({'|'.join(names)})\s*(\?\?|\|\|)")
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()[:80]}"
        for path in _tab_sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if copy.search(line)
    ]
    assert not found, found


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


TESTS = PACKAGE.parent / "tests"


def _helpers_imported_by_name(path: Path) -> Set[str]:
    """The modules of tests/ (helpers, conftest.py, other test files) that `path` imports by name."""
    helpers = {p.stem for p in TESTS.rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & helpers


def test_no_test_file_imports_a_helper_module_by_name():
    """A test takes the shared helpers as fixtures (tests/conftest.py, its room's conftest.py), never by `import`
    (nor a conftest.py or another test file): its signature says what it uses, `pytest --fixtures` lists them, and
    no test depends on what was collected before it. conftest.py files and the helpers may import helpers."""
    importing = {
        str(path.relative_to(TESTS)): sorted(_helpers_imported_by_name(path))
        for path in sorted(TESTS.rglob("test_*.py"))
        if _helpers_imported_by_name(path)
    }
    assert not importing, f"import helper modules by name (take their fixtures): {importing}"


# -- the tests' private imports across rooms (docs/DESIGN.md, "How the tests are built") -----------------------------
# The public surface a test may import anywhere: the API, the command's entry (`cli.main`), and the on-disk contract.
PUBLIC_MODULES = {
    "tb_layergrad",
    "tb_layergrad.summary",
    "tb_layergrad.distribute",
    "tb_layergrad.cli",
    "tb_layergrad.metadata",
}
TEST_ROOMS = {"jax_backend": "jax"}  # tests/<folder> -> the room of tb_layergrad it tests, where the names differ


def _package_module(name: str) -> str:
    """`tb_layergrad.cli.report.build` -> `tb_layergrad.cli.report`: the module an imported name lives in."""
    parts = name.split(".")
    while len(parts) > 1 and not (
        PACKAGE.joinpath(*parts[1:]).with_suffix(".py").is_file() or PACKAGE.joinpath(*parts[1:]).is_dir()
    ):
        parts.pop()
    return ".".join(parts)


def _private_imports_across_rooms(path: Path) -> Set[str]:
    """The private modules of tb_layergrad that the test file `path` imports from another room than its own (a
    file at the top of tests/ tests the whole: it has no room)."""
    where = path.relative_to(TESTS).parts
    room = TEST_ROOMS.get(where[0], where[0]) if len(where) > 1 else None
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            module = _package_module(name) if name.startswith("tb_layergrad.") else None
            if module and module not in PUBLIC_MODULES and module.split(".")[1] != room:
                found.add(module)
    return found


# The (test file, private module) pairs across rooms left, each with why no public surface can say what it checks
# (the API, the command, the plugin's HTTP routes, a fixture of tests/conftest.py): this set only shrinks (the test
# below fails on a pair that has left it as on one that joins it).
CROSS_ROOM_PRIVATE_IMPORTS: Set[str] = {
    # The TensorFlow-free writer is JAX's: the JAX leg runs it where no TensorFlow is installed.
    "jax_backend/test_jax_writer.py: tb_layergrad.writer.event_writer",
    "jax_backend/test_jax_writer.py: tb_layergrad.writer.step_records",
    # A unit test of keras.step_observation.target_name, whose input is the capturing room's LayerTree.
    "keras/test_fit_calls.py: tb_layergrad.capturing.layer_tree",
    # A module-level skip (before any fixture) with `MISSING`, the prefix .ci/run fails a skip on.
    "keras/test_tuner.py: tb_layergrad.kernel.cache",
    # The kernel against the TensorFlow ops it replaces, and summary.write's choice of it (one op in the graph).
    "kernel/test_fused_kernel.py: tb_layergrad.statistics.reductions",
    "kernel/test_fused_kernel.py: tb_layergrad.summary.write",
    # The loops as JAX's compiled step calls them (its FFI call), held to their C interface on the kernel's cases.
    "kernel/test_host_records.py: tb_layergrad.jax.step_outputs",
    # Counts the records the reader decodes (no route says how many it read).
    "plugin/test_live_equality.py: tb_layergrad.reader.record_index",
    # The read-ahead against the reader's store it fills: its byte budget, what it loaded, when.
    "plugin/test_prefetch.py: tb_layergrad.reader.catalog",
    "plugin/test_prefetch.py: tb_layergrad.reader.stats_store",
    # The report of evaluations built by hand (a dominated layer without statistics: no logdir writes one) and the
    # CSV's column list against docs/ANOMALIES.md.
    "reader/test_examples_report.py: tb_layergrad.cli.report",
    # The reader's input and output type (`Origin`, its `line`): the rule of where a NaN was born is its own room.
    "reader/test_origin_read.py: tb_layergrad.nonfinite_origin",
    "reader/test_verdict_rules.py: tb_layergrad.nonfinite_origin",
    # Special numbers in 300 generated evaluations through the `anomalies` route's body: strict JSON.
    "reader/test_report_rules.py: tb_layergrad.plugin.bodies",
    # A GradientMap of weight and output entries at given model indexes, as the format-1 writer had them.
    "summary/test_format_v2.py: tb_layergrad.capturing.gradient_map",
    # That the capture hands its per-example norms on deferred, to be built inside the write's condition.
    "summary/test_per_example_write.py: tb_layergrad.capturing.per_example_map",
    # The fused write op's own contract: its op in the graph, mismatched groups refused, the fallback on a build
    # whose op cannot write.
    "summary/test_record_writes.py: tb_layergrad.kernel.fused",
    # Where the tab's files are served from (the installed package, never the checkout), not what they are.
    "test_artifact.py: tb_layergrad.plugin.static",
    # The layout: the names of the rules' thresholds, looked for as copies in the tab's sources.
    "test_layout.py: tb_layergrad.reader.anomalies",
    "test_layout.py: tb_layergrad.reader.dominance",
}


def test_no_test_imports_a_private_module_of_another_room():
    """A test goes through the public surface (the API, `tb_layergrad.summary`, `tb_layergrad.distribute`, the
    `tb-layergrad` command, the plugin's HTTP routes) and imports a private module only to unit-test it, in its
    room, or to name the on-disk contract (`tb_layergrad.metadata`)."""
    found = {
        f"{path.relative_to(TESTS)}: {module}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for module in _private_imports_across_rooms(path)
    }
    assert not found - CROSS_ROOM_PRIVATE_IMPORTS, (
        f"private imports across rooms: {sorted(found - CROSS_ROOM_PRIVATE_IMPORTS)}"
    )
    assert not CROSS_ROOM_PRIVATE_IMPORTS - found, (
        f"moved onto the public surface, drop from the list: {sorted(CROSS_ROOM_PRIVATE_IMPORTS - found)}"
    )


def test_a_private_import_across_rooms_is_found():
    """The finder above sees `from tb_layergrad.cli import report` in a reader test, and not the public names."""
    assert _package_module("tb_layergrad.cli.report.build_rows") == "tb_layergrad.cli.report"
    assert _package_module("tb_layergrad.GradientLogger") == "tb_layergrad"
    assert "tb_layergrad.cli.report" in _private_imports_across_rooms(TESTS / "reader" / "test_examples_report.py")
    assert not _private_imports_across_rooms(TESTS / "test_public_api.py")
