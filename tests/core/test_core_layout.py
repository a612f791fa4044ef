"""The layout: Python started at the repository root finds gpuscope only through the install.

The package root lives in ``core/``; no folder named ``gpuscope/`` sits at the
repository root to be imported in its place, so nothing else of the checkout
(tests, docs, build output) becomes part of the package. A module added to a mapped
folder is importable, and type-checked, without installing again.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuscope
from scripts import typecheck_tree

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


def python_at_root(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", ["tests", "docs", "build", "scripts", "core"])
def test_the_checkout_is_not_part_of_the_package(name: str) -> None:
    result = python_at_root(f"import gpuscope.{name}")
    assert result.returncode == 1
    assert f"No module named 'gpuscope.{name}'" in result.stderr


def test_the_package_from_the_root_is_the_installed_one() -> None:
    result = python_at_root("import gpuscope; print(*gpuscope.__path__, sep='\\n')")
    assert result.returncode == 0, result.stderr
    (path,) = result.stdout.splitlines()  # one folder: no path appended at import
    assert Path(path) == Path(gpuscope.__path__[0])
    assert not (ROOT / "gpuscope").exists()


def test_each_part_maps_to_its_folder() -> None:
    result = python_at_root(
        "import gpuscope.middleware, gpuscope.exporter.gpu.scenarios as s, gpuscope.flags as f;"
        "import os; print(os.path.realpath(f.__file__)); print(*s.__path__)"
    )
    assert result.returncode == 0, result.stderr
    flags_file, scenarios = result.stdout.splitlines()
    assert Path(flags_file) == ROOT / "core" / "flags.py"
    assert (Path(scenarios) / "demo.yaml").is_file()


# A mapped folder of each kind: the root package's, a folder of its own, one nested in
# another package's folder.
MAPPED = [
    ("core", "gpuscope"),
    ("middleware", "gpuscope.middleware"),
    ("exporter/http", "gpuscope.exporter.http"),
]


@contextlib.contextmanager
def new_module(folder: str, text: str) -> Iterator[str]:
    """A module written into ``folder`` of the checkout for the block, then removed: its
    name, unique to this run."""
    name = f"_layout_probe_{uuid.uuid4().hex[:12]}"
    path = ROOT / folder / f"{name}.py"
    try:
        path.write_text(text, encoding="utf-8")
        yield name
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize(("folder", "package"), MAPPED)
def test_a_new_module_imports_without_installing_again(
    tmp_path: Path, folder: str, package: str
) -> None:
    """The editable install maps the folders by setuptools' import hook (its lenient
    mode), not by links made at install time: any process of the venv finds a module
    added since. Run outside the checkout, without PYTHONPATH: only the install finds it."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with new_module(folder, "VALUE = 42\n") as name:
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import os, {package}.{name} as m; print(m.VALUE, os.path.realpath(m.__file__))",
            ],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["42", str(ROOT / folder / f"{name}.py")]


def test_the_typecheck_tree_maps_each_package_to_its_folder(tmp_path: Path) -> None:
    typecheck_tree.build(tmp_path)
    folders = typecheck_tree.package_dirs()
    assert folders["gpuscope"] == ROOT / "core"
    for package, folder in folders.items():
        at = tmp_path.joinpath(*package.split("."))
        entries = [e for e in folder.iterdir() if e.name != "__pycache__"]
        assert entries, package
        for entry in entries:
            assert (at / entry.name).resolve() == entry.resolve(), (package, entry.name)
    # what the install maps, the tree maps
    assert Path(gpuscope.__path__[0]).resolve() == folders["gpuscope"].resolve()


@pytest.mark.parametrize(("folder", "package"), MAPPED)
def test_mypy_checks_a_new_module_through_the_tree(
    tmp_path: Path, folder: str, package: str
) -> None:
    """``make typecheck`` rebuilds the tree of links and mypy reads gpuscope there: a
    module added since the install is found, and typed."""
    tree = tmp_path / "tree"
    with new_module(folder, "VALUE = 42\n") as name:
        typecheck_tree.build(tree)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--cache-dir",
                str(tmp_path / "cache"),
                "-c",
                f"from {package}.{name} import VALUE\nX: str = VALUE\n",
            ],
            cwd=ROOT,
            env={**os.environ, "MYPYPATH": str(tree)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'expression has type "int", variable has type "str"' in result.stdout, result.stdout


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    """The editable install imports any folder with an ``__init__.py`` under a mapped
    folder; the wheel ships only the packages pyproject.toml lists. One left out would
    work here and be missing from every install."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *relative)))
    assert found - listed == set(), "folders the wheel would leave out"
    assert found, "the walk found no package"
