"""The pack's builders read one table and one contract: the rule builder (``alerts``)
and the board builder (``dashboards``) import ``pack`` and gpuscope, never each other,
and ``pack`` imports neither (but for ``pack/build.py``, the one entry that runs them
all)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
# each builder, and what it must not import
FORBIDDEN = {
    "alerts": ("dashboards", "deploy"),
    "dashboards": ("alerts", "deploy"),
    "pack": ("alerts", "dashboards", "deploy"),
}


def imported(path: Path) -> set[str]:
    """The top-level packages ``path`` imports (absolute imports only: the builders use
    no relative ones)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            names.add((node.module or "").split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_the_builders_import_the_pack_not_each_other(package: str) -> None:
    modules = sorted(set((REPO / package).glob("*.py")) - {REPO / "pack" / "build.py"})
    assert modules
    found = {
        f"{module.relative_to(REPO)} imports {name}"
        for module in modules
        for name in imported(module) & set(FORBIDDEN[package])
    }
    assert not found, sorted(found)


def test_the_walk_sees_an_import_of_the_other_builder(tmp_path: Path) -> None:
    module = tmp_path / "board.py"
    module.write_text("from alerts.recording import VERDICT\nimport dashboards.panels\n")
    assert imported(module) == {"alerts", "dashboards"}
