"""The tests' own habits: a sleep is a poll's back-off or a time under test, never a guess
at how long something else takes.

A test that needs another thread or process to have done something (a request queued, a
scrape taken, a batch retried) waits for it to be visible: ``support.waiting``'s
``wait_until``/``await_until``, an event, or a loop on a condition. So a ``time.sleep`` or
``asyncio.sleep`` outside a loop must say, after ``# timed:`` on its line, why the time
itself is what the test needs (a slow handler, a device held past a timeout, a window in
which nothing more may happen). ``asyncio.sleep(0)``, a yield to the loop, is no wait.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ALLOW = "# timed:"
SLEEPERS = {"time", "asyncio"}
LOOPS = (ast.For, ast.AsyncFor, ast.While)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)


def _sleep_calls(tree: ast.AST) -> list[tuple[ast.Call, list[ast.AST]]]:
    """Each ``time.sleep``/``asyncio.sleep`` call with its ancestors, nearest first."""
    found: list[tuple[ast.Call, list[ast.AST]]] = []

    def visit(node: ast.AST, ancestors: list[ast.AST]) -> None:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "sleep"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in SLEEPERS
        ):
            found.append((node, ancestors))
        for child in ast.iter_child_nodes(node):
            visit(child, [node, *ancestors])

    visit(tree, [])
    return found


def _in_a_loop(ancestors: list[ast.AST]) -> bool:
    """Inside a loop of its own function: a poll's back-off, or pacing."""
    for node in ancestors:
        if isinstance(node, LOOPS):
            return True
        if isinstance(node, SCOPES):
            return False
    return False


def _yields(call: ast.Call) -> bool:
    return len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and not call.args[0].value


def bare_sleeps(source: str) -> list[int]:
    """Lines of the sleeps in ``source`` that are neither in a loop nor marked ``# timed:``."""
    lines = source.splitlines()
    bare = []
    for call, ancestors in _sleep_calls(ast.parse(source)):
        if _in_a_loop(ancestors) or _yields(call):
            continue
        statement_lines = lines[call.lineno - 1 : (call.end_lineno or call.lineno)]
        if not any(ALLOW in line for line in statement_lines):
            bare.append(call.lineno)
    return bare


def imported_sleeps(source: str) -> list[int]:
    """Lines that import ``sleep`` by name (which ``bare_sleeps`` would not see)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        and node.module in SLEEPERS
        and any(alias.name == "sleep" for alias in node.names)
    ]


def test_no_test_sleeps_to_wait_for_something_else() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        source = path.read_text()
        where = path.relative_to(TESTS)
        found += [f"{where}:{line}" for line in bare_sleeps(source)]
        found += [f"{where}:{line} (imports sleep)" for line in imported_sleeps(source)]
    assert not found, (
        "a sleep outside a loop: wait for what it waits for (support/waiting.py's "
        f"wait_until/await_until, an event), or say why after {ALLOW!r} on its line:\n  "
        + "\n  ".join(found)
    )


def test_the_rule_tells_a_wait_from_a_poll_and_a_time_under_test() -> None:
    source = """
import asyncio, time

async def guess():
    await asyncio.sleep(0.2)  # let them reach the queue

def poll(ready):
    while not ready():
        time.sleep(0.1)

async def bounded(ready):
    for _ in range(100):
        if ready():
            break
        await asyncio.sleep(0.01)

async def handler():
    await asyncio.sleep(0.05)  # timed: the handler's known compute

async def yielding():
    await asyncio.sleep(0)

def inner_function_in_a_loop():
    for _ in range(3):
        def later():
            time.sleep(1)
"""
    assert bare_sleeps(source) == [5, 26]
    assert imported_sleeps("from time import sleep\nfrom asyncio import gather\n") == [1]
