"""The fast tier (``pytest --fast``) refuses a process start from an unmarked test and
leaves the marked ones out, so that its selection cannot silently go stale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# runs pytest in a child process
pytestmark = pytest.mark.processes

TESTS = Path(__file__).parents[1]

CASES = """
import subprocess
import sys

import pytest


def test_starts_a_process_unmarked() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.processes
def test_starts_a_process_marked() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.slow
def test_slow() -> None:
    pass


def test_plain() -> None:
    pass
"""


def run_pytest(folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_cases.py").write_text(CASES)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "support.fast_tier",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(folder),
            "-o",
            "addopts=",
            "-o",
            "filterwarnings=",
            *flags,
            str(folder / "test_cases.py"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
        env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
    )


def test_the_fast_tier_fails_an_unmarked_process_start_and_leaves_out_the_marked(
    tmp_path: Path,
) -> None:
    fast = run_pytest(tmp_path, "--fast")
    assert "1 failed, 1 passed, 2 deselected" in fast.stdout, fast.stdout
    assert "pytestmark = pytest.mark.processes" in fast.stdout
    assert "test_starts_a_process_unmarked" in fast.stdout


def test_without_fast_every_test_runs_and_may_start_processes(tmp_path: Path) -> None:
    full = run_pytest(tmp_path)
    assert "4 passed" in full.stdout, full.stdout
