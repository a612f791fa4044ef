"""``ThreadPool``: a few daemon threads with a bound on the work they accept.

asyncio's default executor is shared by everything that calls ``asyncio.to_thread``
(the ``/metrics`` render among them) and queues without limit, so a flood of slow jobs
(bcrypt checks of wrong passwords) made a scrape wait behind all of them: 4 ms became
7-8 s with 50 attackers. A ``ThreadPool`` serves one kind of job only, and refuses
(``Busy``, at once) a job that would make more than ``max_pending`` accepted and not
yet finished, so the caller can answer 503 instead of queueing without end.

The threads are daemons: the interpreter does not wait for them at exit, so a job still
running when the shutdown timeout runs out (a long decode) cannot hold the process up.
A job's result reaches the event loop that submitted it through
``call_soon_threadsafe``; a job whose future was cancelled meanwhile is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]


class Busy(Exception):
    """Every thread is busy and the pool's waiting room is full."""


class ThreadPool:
    """``threads`` daemon threads named ``name-N``; at most ``max_pending`` jobs
    accepted and not finished (running or waiting). Use from one event loop's thread."""

    def __init__(self, name: str, threads: int, max_pending: int) -> None:
        if not 1 <= threads <= max_pending:
            raise ValueError(f"{name}: need 1 <= threads <= max_pending")
        self.name = name
        self.max_pending = max_pending
        self.pending = 0  # changed on the event loop's thread only
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.threads = tuple(
            threading.Thread(target=self._run, name=f"{name}-{n}", daemon=True)
            for n in range(threads)
        )
        for thread in self.threads:
            thread.start()

    def submit(self, function: Callable[[], T]) -> asyncio.Future[T]:
        """The future of ``function()`` run on one of the threads; ``Busy`` if the pool
        already holds ``max_pending`` jobs."""
        if self.pending >= self.max_pending:
            raise Busy(f"{self.name}: {self.pending} jobs pending")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.pending += 1
        self._jobs.put((loop, future, function))
        return future

    def close(self) -> None:
        """Let the threads end once the jobs already given are done (without waiting)."""
        for _ in self.threads:
            self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, function = job
            outcome: tuple[Any, BaseException | None] = (None, None)
            if not future.cancelled():  # else the caller gave up before it started
                try:
                    outcome = (function(), None)
                except BaseException as exc:  # handed to the caller, as executors do
                    outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(self._settle, future, *outcome)

    def _settle(
        self, future: asyncio.Future[Any], result: Any, error: BaseException | None
    ) -> None:
        # Counted until the job has left its thread, not until its caller stopped
        # waiting: a cancelled caller does not free a thread that is still busy.
        self.pending -= 1
        if future.done():  # cancelled while it waited or ran
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
