"""The package as mypy reads it: a tree of links mapping the folders as the install does.

    python scripts/typecheck_tree.py [--into build/typecheck]

``make install`` installs gpuscope editable in setuptools' lenient mode, whose import
hook maps ``gpuscope`` to ``core/``, ``gpuscope.middleware`` to ``middleware/`` and so
on (``[tool.setuptools.package-dir]`` of pyproject.toml), so a new module imports at
once. mypy cannot follow that hook; it reads the package from this tree instead
(``mypy_path`` in pyproject.toml). A mapped folder whose sub-packages all sit inside it
is one link to the folder, so a module added there is seen without rebuilding the tree;
a package with a sub-package mapped elsewhere (``gpuscope`` itself) is a real folder
with one link per entry of its own folder beside the links of those sub-packages, and
``make typecheck`` rebuilds the tree on every run so that such entries stay current.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INTO = ROOT / "build" / "typecheck"


def package_dirs(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Path]:
    """Each package of the install and the folder it is read from, as setuptools maps it:
    its own ``package-dir`` entry, else its parent's folder and its last name."""
    setuptools = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapped = setuptools.get("package-dir", {})
    folders: dict[str, Path] = {}
    for package in sorted(setuptools["packages"], key=lambda name: name.count(".")):
        if package in mapped:
            folders[package] = ROOT / mapped[package]
        else:
            parent, _, last = package.rpartition(".")
            folders[package] = folders[parent] / last if parent else ROOT / package
    return folders


def _link(target: Path, at: Path) -> None:
    at.symlink_to(os.path.relpath(target, at.parent), target_is_directory=target.is_dir())


def _elsewhere(package: str, folders: dict[str, Path]) -> bool:
    """Whether ``package``'s folder is not its parent's folder's sub-folder of its name."""
    parent, _, last = package.rpartition(".")
    return bool(parent) and folders[package] != folders[parent] / last


def build(into: Path = DEFAULT_INTO) -> None:
    folders = package_dirs()
    # A package is a plain link to its folder unless a sub-package lives elsewhere.
    split = {package.rpartition(".")[0] for package in folders if _elsewhere(package, folders)}
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for package, folder in folders.items():
        parent = package.rpartition(".")[0]
        if parent and parent not in split:
            continue  # inside its parent's link
        at = into.joinpath(*package.split("."))
        if package not in split:
            _link(folder, at)
            continue
        at.mkdir()
        for entry in sorted(folder.iterdir()):
            if entry.name != "__pycache__" and f"{package}.{entry.name}" not in folders:
                _link(entry, at / entry.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", type=Path, default=DEFAULT_INTO)
    build(parser.parse_args().into)


if __name__ == "__main__":
    main()
