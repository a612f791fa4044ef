"""The layout: Python started at the repository root finds gpuscope only through the install.

The package root lives in ``core/``; no folder named ``gpuscope/`` sits at the
repository root to be imported in its place, so nothing else of the checkout
(tests, docs, build output) becomes part of the package.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gpuscope

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
