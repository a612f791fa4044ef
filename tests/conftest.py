"""Shared test setup. Fixtures of each area live in ``tests/support/*.py`` (loaded here
as plugins) so that there is only one ``conftest.py`` for mypy and pytest to agree on."""

from __future__ import annotations

from pathlib import Path

import pytest

# Support modules import each other; marking the package first lets pytest rewrite
# their asserts whichever of them is imported first.
pytest.register_assert_rewrite("support")

pytest_plugins = sorted(
    f"support.{path.stem}"
    for path in (Path(__file__).parent / "support").glob("*.py")
    if path.stem != "__init__"
)
