"""The pack's builders read one table and one contract: the rule builder (``alerts``), the
board builder (``dashboards``) and the Kubernetes builder (``deploy/kubernetes``) import
the pack (``pack``), the contract (``gpuscope.contract``, ``gpuscope.spans``), the
standard library and their own third-party packages, never each other nor any other
part of gpuscope; ``pack`` imports none of them (but for ``pack/build.py``, the one
entry that runs them all)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
# What every builder may import besides the standard library: the pack, the contract.
SHARED = ("pack", "gpuscope.contract", "gpuscope.spans")
# each builder's folder -> (its own package, the third-party packages it may import)
BUILDERS = {
    "alerts": ("alerts", ("yaml",)),
    "dashboards": ("dashboards", ("grafana_foundation_sdk",)),
    "deploy/kubernetes": ("deploy.kubernetes", ("yaml",)),
    "pack": ("pack", ("yaml",)),
}
# the entry that runs every builder, and so imports them all
ENTRY = REPO / "pack" / "build.py"


def imported(path: Path) -> set[str]:
    """The modules ``path`` imports, by full name; ``from package import module`` names
    ``package.module`` (absolute imports only: the builders use no relative ones)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            module = node.module or ""
            if module == "__future__":
                continue
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def allowed(name: str, own: str, third_party: tuple[str, ...]) -> bool:
    def within(prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    top = name.split(".")[0]
    return (
        top in sys.stdlib_module_names
        or within(own)
        or any(within(prefix) for prefix in (*SHARED, *third_party))
    )


@pytest.mark.parametrize("folder", sorted(BUILDERS))
def test_each_builder_imports_the_pack_and_the_contract_only(folder: str) -> None:
    own, third_party = BUILDERS[folder]
    # every module under the folder: the pack has a package of its own (pack/engines/)
    modules = sorted(set((REPO / folder).rglob("*.py")) - {ENTRY})
    assert modules
    found = {
        f"{module.relative_to(REPO)} imports {name}"
        for module in modules
        for name in imported(module)
        if not allowed(name, own, third_party)
    }
    assert not found, sorted(found)


def test_the_walk_sees_an_import_of_another_builder_or_of_gpuscope(tmp_path: Path) -> None:
    module = tmp_path / "board.py"
    module.write_text(
        "from alerts.recording import VERDICT\n"
        "import dashboards.panels\n"
        "from gpuscope.exporter.gpu import clock_reasons\n"
        "from gpuscope import spans, flags\n"
        "from gpuscope.contract import gpu\n"
    )
    own, third_party = BUILDERS["dashboards"]
    refused = {name for name in imported(module) if not allowed(name, own, third_party)}
    assert refused == {
        "alerts.recording.VERDICT",
        "gpuscope.exporter.gpu.clock_reasons",
        "gpuscope.flags",
    }


def test_the_entry_runs_every_builder() -> None:
    """``pack/build.py`` (``make pack``) is the one place that imports all of them."""
    assert {name.rsplit(".", 1)[0] for name in imported(ENTRY)} >= {
        "alerts",
        "dashboards",
        "deploy.kubernetes",
    }
