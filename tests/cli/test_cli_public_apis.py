"""gpuscope uses its dependencies' public APIs only, read from its source files (``ast``).

Its pins are floors (``aiohttp>=3.9``, ``opentelemetry-sdk>=1.30``, ``uvicorn>=0.29``):
a private name that a minor release renames breaks an install that satisfies them, with
nothing to warn before. So the package's code (``core/``, ``exporter/``,
``middleware/``, ``worker/``) names no private module of a dependency, no private
attribute of another object, and none of the internals it once used: asyncio's
``sslproto``, aiohttp's site internals (``_server``, ``_runner``, ``_ssl_context``) and
``request.writer.output_size``, the SDK's ``provider._active_span_processor``, and
uvicorn's ``config.HTTP_PROTOCOLS`` and ``importer``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("core", "exporter", "middleware", "worker")
# Modules of dependencies that are internals, however they are reached.
PRIVATE_MODULES = ("asyncio.sslproto", "uvicorn.config", "uvicorn.importer", "uvicorn.protocols")
# Public-looking attributes that are internals of a dependency's object.
PRIVATE_ATTRIBUTES = frozenset(("output_size", "HTTP_PROTOCOLS", "http_protocols"))
# Underscored names that are not a dependency's internals, or are one kept on purpose,
# each with its reason (file, name): a new one needs a line here, and a reason.
KNOWN: dict[tuple[str, str], str] = {
    ("core/children.py", "<object>._exit"): "os._exit: public, documented",
    ("exporter/gpu/processes.py", "<object>._add"): "a method of gpuscope's own class",
    ("exporter/gpu/nvml/events.py", "<object>._nvmlGetFunctionPointer"): (
        "pynvml has no public wrapper of nvmlEventSetWait_v1; tests/exporter/gpu/"
        "test_gpu_nvml_faults.py names it against every pynvml version tested"
    ),
    ("middleware/ray_serve.py", "<object>._get"): (
        "Ray Serve gives no hook where its batcher takes a request; Ray is not a "
        "dependency (applying the wrapper imports it), make ray-check runs it on a real one"
    ),
    ("middleware/ray_serve.py", "<object>._get_max_batch_size"): "as above, Ray Serve's",
}


def sources() -> Iterator[tuple[Path, ast.Module]]:
    for part in PARTS:
        for path in sorted((ROOT / part).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def uses(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) for each private name of another object or module ``tree`` uses."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.lineno, node.module or ""
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Attribute):
            owner = node.value
            own = (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
                isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"
            )
            if (
                node.attr.startswith("_") and not node.attr.startswith("__") and not own
            ) or node.attr in PRIVATE_ATTRIBUTES:
                yield node.lineno, f"<object>.{node.attr}"


def inherited(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) for each underscored attribute a class reads from ``self`` that it
    never sets nor defines, where the class derives from a dependency's class: a private
    member of that base (aiohttp's ``BaseSite._runner``, say)."""
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update({(a.asname or a.name).split(".")[0]: a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom) and not node.level:
            imported.update({a.asname or a.name: node.module or "" for a in node.names})
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        roots = [base for base in cls.bases if not isinstance(base, ast.Subscript)]
        while any(isinstance(base, ast.Attribute) for base in roots):
            roots = [base.value if isinstance(base, ast.Attribute) else base for base in roots]
        modules = [imported.get(base.id, "") for base in roots if isinstance(base, ast.Name)]
        if not any(m and not m.startswith("gpuscope") for m in modules):
            continue
        defined = {
            n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        reads: list[tuple[int, str]] = []
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                if isinstance(node.ctx, ast.Store):
                    defined.add(node.attr)
                else:
                    reads.append((node.lineno, node.attr))
        for line, attr in reads:
            if attr not in defined:
                yield line, f"<base>.{attr}"


def is_private(name: str) -> bool:
    if name.startswith("<base>."):
        return True
    if name.startswith("<object>."):
        return True
    if any(name == m or name.startswith(m + ".") for m in PRIVATE_MODULES):
        return True
    top, *rest = name.split(".")
    # a private module or name of a third-party package (gpuscope's own are its business)
    return top != "gpuscope" and any(p.startswith("_") and not p.startswith("__") for p in rest)


SOURCES = list(sources())


def test_the_five_internals_once_used_are_found_by_the_walk() -> None:
    """The rule catches what it is for: each internal, as it was written."""
    written = {
        "from asyncio import sslproto": "asyncio.sslproto",
        "site._server.close()": "<object>._server",
        "server = site._runner.server": "<object>._runner",
        "tls = site._ssl_context": "<object>._ssl_context",
        "request.writer.output_size = 0": "<object>.output_size",
        "provider._active_span_processor.on_end(span)": "<object>._active_span_processor",
        "from uvicorn.config import HTTP_PROTOCOLS": "uvicorn.config",
        "from uvicorn.importer import import_from_string": "uvicorn.importer",
    }
    for code, name in written.items():
        found = {n for _, n in uses(ast.parse(code)) if is_private(n)}
        assert name in found, code
    site = """
from aiohttp import web
class GuardedSite(web.BaseSite):
    def __init__(self, runner, host):
        super().__init__(runner)
        self._host = host
    async def start(self):
        server = self._runner.server
        self._server = await make(server, self._host, ssl=self._ssl_context)
"""
    found = {name for _, name in inherited(ast.parse(site))}
    assert found == {"<base>._runner", "<base>._ssl_context"}


def test_the_walk_finds_the_package() -> None:
    assert len(SOURCES) > 100
    names = {path.relative_to(ROOT).as_posix() for path, _ in SOURCES}
    assert {"core/connections.py", "middleware/phase_spans.py", "worker/connections.py"} <= names


@pytest.mark.parametrize(
    ("path", "tree"), SOURCES, ids=[p.relative_to(ROOT).as_posix() for p, _ in SOURCES]
)
def test_no_private_api_of_a_dependency(path: Path, tree: ast.Module) -> None:
    where = path.relative_to(ROOT).as_posix()
    found = sorted(
        {
            f"line {line}: {name}"
            for line, name in (*uses(tree), *inherited(tree))
            if is_private(name) and (where, name) not in KNOWN
        }
    )
    assert not found, f"{path.relative_to(ROOT)} uses private APIs: {found}"
