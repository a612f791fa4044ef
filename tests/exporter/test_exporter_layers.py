"""The exporter's layers, read from its source files (``ast``, nothing imported).

``http/`` is transport: it serves parts it is handed and imports neither the
composition root (``app``, ``service``) nor the command; the parts are built outside
it. ``ingest/`` and ``state`` know nothing of HTTP. The GPU device list reaches the
aggregator from the poller, never from a request handler.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

EXPORTER = Path(__file__).resolve().parents[2] / "exporter"
PACKAGE = "gpuscope.exporter"
HTTP = f"{PACKAGE}.http"
ROOT_MODULES = (f"{PACKAGE}.app", f"{PACKAGE}.service", f"{PACKAGE}.cli")
# The parts the composition root builds; a call of one of these is wiring, not transport.
PARTS = ("SpanAggregator", "Ingest", "GpuPoller", "OtlpForwarder", "ProcessGpuMap")


def module_name(path: Path) -> str:
    parts = path.relative_to(EXPORTER).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def sources() -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(EXPORTER.rglob("*.py")):
        yield module_name(path), path, ast.parse(path.read_text(), str(path))


def imported(module: str, path: Path, tree: ast.Module) -> set[str]:
    """Every module ``tree`` imports, anywhere in it (functions included), absolute;
    ``from a import b`` counts as ``a`` and ``a.b`` (``b`` may be a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


SOURCES = list(sources())


def test_the_walk_sees_the_exporter() -> None:
    """The rules below hold for real files: the walk finds the modules they name."""
    names = {name for name, _, _ in SOURCES}
    assert {HTTP, f"{HTTP}.handlers", f"{PACKAGE}.state", f"{PACKAGE}.ingest.pipeline"} <= names
    handlers = next(t for n, p, t in SOURCES if n == f"{HTTP}.handlers")
    assert f"{PACKAGE}.state" in imported(
        f"{HTTP}.handlers", EXPORTER / "http/handlers.py", handlers
    )


@pytest.mark.parametrize(
    ("name", "path", "tree"),
    [s for s in SOURCES if under(s[0], f"{PACKAGE}.ingest") or s[0] == f"{PACKAGE}.state"],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_ingest_and_state_do_not_import_http(name: str, path: Path, tree: ast.Module) -> None:
    wrong = sorted(m for m in imported(name, path, tree) if under(m, HTTP))
    assert not wrong, f"{name} imports the transport: {wrong}"


@pytest.mark.parametrize(
    ("name", "path", "tree"),
    [s for s in SOURCES if under(s[0], HTTP)],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_http_is_transport_only(name: str, path: Path, tree: ast.Module) -> None:
    wrong = sorted(
        m for m in imported(name, path, tree) if any(under(m, root) for root in ROOT_MODULES)
    )
    assert not wrong, f"{name} imports the composition root: {wrong}"
    built = sorted(
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PARTS
    )
    assert not built, f"{name} builds parts of the exporter ({built}): the composition root's job"
    pulled = sorted(
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("set_gpu_devices", "refresh_gpu_devices", "devices")
    )
    assert not pulled, f"{name} pulls the GPU device list ({pulled}): the poller pushes it"


def test_the_composition_root_builds_the_parts() -> None:
    """What ``http/`` must not do is done in ``app``: each part is built there."""
    tree = next(t for n, _, t in SOURCES if n == f"{PACKAGE}.app")
    built = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert set(PARTS) <= built
