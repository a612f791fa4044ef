"""Bounded polls on an observable condition, for tests that wait on another thread or process.

A test that needs something to have happened (a request queued, a batch retried, a scrape
taken) waits for it to be visible rather than sleeping a guessed time: ``wait_until`` in
plain code, ``await_until`` in a coroutine. Each returns the condition's first truthy value
and fails with ``what`` and the last value seen once ``timeout_s`` has passed.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _timed_out(what: str, timeout_s: float, last: object) -> AssertionError:
    return AssertionError(f"{what}: not seen within {timeout_s:g} s (last: {last!r})")


def wait_until(
    condition: Callable[[], T | None], what: str, timeout_s: float = 10.0, interval_s: float = 0.05
) -> T:
    """Call ``condition`` until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, last)
        time.sleep(interval_s)  # poll interval: another thread's progress gives no event


@overload
async def await_until(
    condition: Callable[[], Awaitable[T | None]],
    what: str,
    timeout_s: float = ...,
    interval_s: float = ...,
) -> T: ...


@overload
async def await_until(
    condition: Callable[[], T | None], what: str, timeout_s: float = ..., interval_s: float = ...
) -> T: ...


async def await_until(
    condition: Callable[[], Any], what: str, timeout_s: float = 10.0, interval_s: float = 0.02
) -> Any:
    """``wait_until`` for a coroutine; ``condition`` may be a plain or a coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = condition()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, last)
        await asyncio.sleep(interval_s)  # poll interval
