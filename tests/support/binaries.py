"""Finding the real binaries tests drive (promtool, prometheus, alertmanager, amtool).

Locally a missing binary skips the test with the command that installs it; in CI
(``CI`` set) it fails, so a broken install step cannot hide behind skips.
"""

from __future__ import annotations

import os
import shutil

import pytest


def require_binary(name: str) -> str:
    """The path of ``name`` on PATH; skip (locally) or fail (CI) when it is missing."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} not found: run 'make system-deps' (the Debian packages tests drive)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
