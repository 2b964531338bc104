"""The artifact users install: the suite runs against the installed package, and a release build (sdist, then
the wheel built from it) holds every module, the tab and the kernel's sources, with metadata that renders."""

from __future__ import annotations

import email
import importlib.metadata
import pathlib
import subprocess
import sys
import sysconfig
import zipfile

import pytest
from packaging.requirements import Requirement

import tb_layergrad

CHECKOUT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = CHECKOUT / "tb_layergrad"
FRONTEND = CHECKOUT / "frontend"


def _package_files(root: pathlib.Path) -> set:
    """Every file of a source folder, relative to it, as the package ships it (no bytecode)."""
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def _expected_wheel_files() -> set:
    """What the wheel must hold: every module and kernel source of tb_layergrad/, and frontend/ as the
    package `tb_layergrad.frontend` (the tab's static files)."""
    expected = {f"tb_layergrad/{name}" for name in _package_files(SOURCES)}
    expected |= {f"tb_layergrad/frontend/{name}" for name in _package_files(FRONTEND)}
    return expected


@pytest.mark.installed
def test_the_tests_import_the_installed_package_not_the_checkout():
    where = pathlib.Path(tb_layergrad.__file__).resolve()
    installed = {pathlib.Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    assert CHECKOUT not in where.parents, (
        f"tb_layergrad was imported from the checkout ({where}): install it as users do, "
        "`pip install '.[cpu,test]'` (not -e), so that the tests check the package users get"
    )
    assert any(root in where.parents for root in installed), (where, installed)


@pytest.mark.installed
def test_the_installed_package_holds_every_module_the_tab_and_the_kernel_sources():
    installed = {f.as_posix() for f in importlib.metadata.distribution("tb-layergrad").files or []}
    missing = sorted(_expected_wheel_files() - installed)
    assert not missing, f"left out of the installed package: {missing[:10]}"
    # Every folder of modules is a package (find_packages leaves out a folder without __init__.py).
    for folder in {p.parent for p in SOURCES.rglob("*.py")}:
        assert (folder / "__init__.py").is_file(), folder


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> pathlib.Path:
    """`python -m build`: the sdist, then the wheel built from that sdist, each in an isolated environment with
    pyproject.toml's build requirements, as a release is built."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(CHECKOUT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _one(folder: pathlib.Path, pattern: str) -> pathlib.Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.slow
def test_the_wheel_built_from_the_sdist_holds_the_package(release):
    wheel = _one(release, "tb_layergrad-*-py3-none-any.whl")
    assert wheel.name == f"tb_layergrad-{tb_layergrad.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(f"tb_layergrad-{tb_layergrad.__version__}.dist-info/entry_points.txt").decode()
    missing = sorted(_expected_wheel_files() - names)
    assert not missing, f"left out of the wheel: {missing[:10]}"
    assert not any(n.startswith(("tests/", "docs/", "bench/")) for n in names), "the wheel holds the package only"
    assert "layergrad = tb_layergrad.plugin.loader:LayerGradLoader" in entry_points
    assert "tb-layergrad = tb_layergrad.cli:main" in entry_points


@pytest.mark.slow
def test_the_release_metadata_declares_the_supported_ranges_and_renders(release):
    wheel = _one(release, "*.whl")
    with zipfile.ZipFile(wheel) as zf:
        meta = email.message_from_bytes(zf.read(f"tb_layergrad-{tb_layergrad.__version__}.dist-info/METADATA"))
    assert meta["Name"] == "tb-layergrad" and meta["Version"] == tb_layergrad.__version__
    assert meta["Requires-Python"] == ">=3.9"
    specs = {}
    for line in meta.get_all("Requires-Dist"):
        req = Requirement(line)
        specs.setdefault(req.name, str(req.specifier))
    # Each dependency a range with both ends: the oldest tested release and the next major.
    for name, lower, upper in (("tensorboard", "2.16", "3"), ("tensorflow-cpu", "2.16", "3"), ("keras", "3.3", "4")):
        assert set(specs[name].split(",")) == {f">={lower}", f"<{upper}"}, (name, specs[name])
    assert "Development Status :: 5 - Production/Stable" in meta.get_all("Classifier")
    assert meta["Description-Content-Type"] == "text/markdown"
    sdist = _one(release, "tb_layergrad-*.tar.gz")
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0 and checked.stdout.count("PASSED") == 2, checked.stdout + checked.stderr


@pytest.mark.installed
def test_the_tab_is_served_from_the_installed_package():
    """The tab's files come from the installed package on every Python (3.9's importlib.resources cannot open
    the frontend folder, a namespace package), never from the checkout."""
    from tb_layergrad.plugin import static

    root = pathlib.Path(str(static.frontend_root()))
    assert CHECKOUT not in root.resolve().parents
    for name in ("index.js", "views/layer.js", "style.css"):
        body, _ = static.StaticFiles().read(name)
        assert body == (FRONTEND / name).read_bytes(), name
