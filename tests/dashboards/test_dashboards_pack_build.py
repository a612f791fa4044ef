"""``make pack`` (``pack/build.py``): one entry writes every generated file of the pack,
the rules, the boards and the manifests, and ``--check`` finds them all fresh."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

# runs the entry, whose Kubernetes builder runs alerts/build.py: not part of the fast
# tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

REPO = Path(__file__).parents[2]
ENTRY = REPO / "pack" / "build.py"


def test_the_entry_builds_the_rules_the_boards_and_the_manifests() -> None:
    with warnings.catch_warnings():
        # the board builder imports the SDK's v1 model, which warns (test_dashboards_build)
        warnings.simplefilter("ignore", DeprecationWarning)
        from pack import build
    assert [(name, folder) for name, folder, _ in build.BUILDERS] == [
        ("rules", "alerts/rules/"),
        ("dashboards", "dashboards/json/"),
        ("kubernetes", "deploy/kubernetes/"),
    ]
    assert all((REPO / folder).is_dir() for _, folder, _ in build.BUILDERS)


def test_the_committed_pack_is_what_the_entry_writes() -> None:
    check = subprocess.run(
        [sys.executable, str(ENTRY), "--check"], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stderr
