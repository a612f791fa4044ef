"""The fast tier, ``pytest --fast`` (``make test-fast``): every test that starts no child
process and is not marked slow, for the edit-test loop; ``make test`` still runs all.

A module whose tests start a process (Prometheus, promtool, gcc for the C fake NVML, a
worker or an engine) says so with ``pytestmark = pytest.mark.processes``. The tier
holds that true by itself: under ``--fast`` an audit hook refuses every process start,
so a test that starts one without the mark fails and names the mark, instead of
quietly making the tier slow."""

from __future__ import annotations

import sys
from typing import Any

import pytest

# The audit events (https://docs.python.org/3/library/audit_events.html) raised before a
# child process exists: subprocess and asyncio's subprocesses go through Popen,
# multiprocessing's fork start method through os.fork.
PROCESS_START_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
    }
)


class ProcessStartInFastTier(RuntimeError):
    """A test of the fast tier tried to start a child process."""


class _Guard:
    """Refuses process starts while a test runs (its fixtures included)."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if self.armed and event in PROCESS_START_EVENTS:
            raise ProcessStartInFastTier(
                f"{event}{args[:2]!r} in the fast tier: a module whose tests start "
                "processes carries `pytestmark = pytest.mark.processes`"
            )


_GUARD = _Guard()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="only tests that start no child process and are not marked slow (make test-fast)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "processes: starts child processes; left out of the fast tier (--fast)"
    )
    if config.getoption("--fast"):
        # an audit hook cannot be removed: it stays for the rest of this process, and
        # is armed only around each test
        sys.addaudithook(_GUARD)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        slow = item.get_closest_marker("slow") or item.get_closest_marker("processes")
        (left if slow else kept).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    _GUARD.armed = item.config.getoption("--fast")
    try:
        return (yield)
    finally:
        _GUARD.armed = False
