"""What the batching schedulers share, free of HTTP: a bounded queue in front of one
device thread, batch forming, shutdown, and the errors a request may get instead of a
result. ``EmbeddingScheduler`` (``embedding``) and ``GenerationScheduler``
(``generation``) build on ``QueueingScheduler``.

``BatchPolicy.mode`` decides how a batch forms from the queue:

* ``none``: one request per batch.
* ``static``: when the device is free, whatever is queued (up to ``max_batch_size``)
  forms the batch at once; a batch of generations runs until its longest sequence
  ends, and newcomers wait for the whole batch.
* ``dynamic``: like ``static``, but a forming batch waits up to ``max_queue_delay_s``
  for more requests to fill it (Triton's ``max_queue_delay_microseconds``).
* ``continuous``: iteration-level batching (``GenerationScheduler``): new sequences
  join the running batch at every iteration and finished ones leave. With one
  forward pass per request (embeddings) it forms batches like ``static``.

Every request is marked ``enqueued`` when queued and ``admitted`` when taken into a
batch; ``BatchRecorder`` marks ``dispatched``/``computed`` and records the batch.
Model calls run on the ``DeviceThread``, so the event loop stays responsive.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpuscope.middleware import BatchRecorder, RequestTimeline
from gpuscope.spans import BatchTrigger
from gpuscope.worker.config import BatchingMode

T = TypeVar("T")
P = TypeVar("P")

logger = logging.getLogger("gpuscope.worker")


class SchedulerError(Exception):
    """A request the scheduler did not serve; ``status`` is the HTTP answer."""

    status = 500
    code = "scheduler_error"


class QueueFull(SchedulerError):
    status = 429
    code = "queue_full"

    def __init__(self, limit: int, retry_after_s: float) -> None:
        super().__init__(f"the queue holds {limit} requests already; retry later")
        self.retry_after_s = retry_after_s


class RequestTimedOut(SchedulerError):
    status = 504
    code = "request_timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the request was not served within {timeout_s:g} s")


class ShuttingDown(SchedulerError):
    status = 503
    code = "shutting_down"

    def __init__(self) -> None:
        super().__init__("the worker is shutting down")


class ModelFailed(SchedulerError):
    """The model raised during a call: the requests of that call fail (500, or an
    error event once streaming); the scheduler carries on with the others."""

    status = 500
    code = "model_error"

    def __init__(self, error: Exception) -> None:
        super().__init__(f"the model failed ({type(error).__name__}); see the worker's log")


@dataclass(frozen=True)
class BatchPolicy:
    mode: BatchingMode
    max_batch_size: int
    max_queue_delay_s: float
    max_queue: int


@dataclass
class Counters:
    """What the scheduler served, turned away or lost (health endpoint, /metrics)."""

    completed: int = 0
    rejected_queue_full: int = 0
    timed_out: int = 0
    cancelled: int = 0
    failed: int = 0
    batches: int = 0  # model calls: a batch, or an iteration under continuous batching

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class DeviceThread:
    """The one thread that runs model calls, in order, as a single device would."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuscope-device")

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


def _log_crash(task: asyncio.Task[None]) -> None:
    """A scheduler loop must never end on its own: say why it did (readyz turns 503)."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("scheduler %s stopped", task.get_name(), exc_info=task.exception())


def _new_future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


@dataclass(eq=False)
class WorkItem(Generic[P]):
    """A queued request: its input, its timeline and where its result goes."""

    payload: P
    timeline: RequestTimeline
    future: asyncio.Future[Any] = field(default_factory=_new_future)

    @property
    def abandoned(self) -> bool:
        """The client gave up (timeout, disconnect): skip or drop this request."""
        return self.future.done()


class QueueingScheduler(Generic[P]):
    """The queue, batch forming and lifecycle that both schedulers share."""

    def __init__(self, policy: BatchPolicy, recorder: BatchRecorder, device: DeviceThread) -> None:
        self.policy = policy
        self.recorder = recorder
        self.device = device
        self.counters = Counters()
        self._queue: collections.deque[WorkItem[P]] = collections.deque()
        self._wakeup = asyncio.Event()
        self._accepting = True
        self._busy = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self._recent_batch_s = 0.01

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def accepting(self) -> bool:
        return self._accepting and self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=type(self).__name__)
        self._task.add_done_callback(_log_crash)

    async def _run(self) -> None:
        raise NotImplementedError

    def check_room(self, count: int) -> None:
        """Refuse at once (counted once) unless ``count`` more items fit in the queue now,
        so a request of several sequences is queued whole or not at all."""
        if not self.accepting:
            raise ShuttingDown()
        if len(self._queue) + count > self.policy.max_queue:
            self.counters.rejected_queue_full += 1
            raise QueueFull(self.policy.max_queue, self._retry_after_s())

    def submit(self, payload: P, timeline: RequestTimeline) -> WorkItem[P]:
        """Queue a request (marks ``enqueued``) or refuse it at once."""
        self.check_room(1)
        item = WorkItem(payload, timeline)
        timeline.enqueued()
        self._queue.append(item)
        self._idle.clear()
        self._wakeup.set()
        return item

    def _retry_after_s(self) -> float:
        """About how long the queue ahead takes to drain, from the last batch's duration."""
        batches_ahead = len(self._queue) / self.policy.max_batch_size + 1
        return max(1.0, batches_ahead * self._recent_batch_s)

    def abandon(self, item: WorkItem[P], error: BaseException | None = None) -> None:
        """The client gave up: drop the item from the queue, count why."""
        if item.future.done():
            return
        if isinstance(error, RequestTimedOut):
            self.counters.timed_out += 1
        else:
            self.counters.cancelled += 1
        item.future.cancel()
        # Already taken into a batch when not queued: the scheduler drops it there.
        with contextlib.suppress(ValueError):
            self._queue.remove(item)
        self._note_idle()

    def finish_early(self, item: WorkItem[P]) -> None:
        """The request needs no more results (a stop sequence matched): count it complete;
        like an abandoned one, it leaves the queue or its batch."""
        if item.future.done():
            return
        self.counters.completed += 1
        item.timeline.computed()
        item.future.set_result(None)
        with contextlib.suppress(ValueError):
            self._queue.remove(item)
        self._note_idle()

    async def _take(self, deadline: float | None) -> WorkItem[P] | None:
        """The next live queued item; waits for one until ``deadline`` (None: forever)."""
        while True:
            self._wakeup.clear()
            while self._queue:
                item = self._queue.popleft()
                if not item.abandoned:
                    return item
            if deadline is None:
                await self._wakeup.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                return None

    async def _form_batch(self, limit: int) -> tuple[list[WorkItem[P]], BatchTrigger]:
        """Wait for a request, then fill a batch up to ``limit`` as the mode says."""
        first = await self._take(None)
        assert first is not None
        self._busy = True
        first.timeline.admitted()
        items = [first]
        dynamic = self.policy.mode == BatchingMode.DYNAMIC
        wait_s = self.policy.max_queue_delay_s if dynamic else 0.0
        deadline = time.monotonic() + wait_s
        while len(items) < limit:
            item = await self._take(deadline)
            if item is None:
                break
            item.timeline.admitted()
            items.append(item)
        return items, BatchTrigger.FULL if len(items) == limit else BatchTrigger.TIMEOUT

    def _batch_limit(self) -> int:
        return 1 if self.policy.mode == BatchingMode.NONE else self.policy.max_batch_size

    def _note_batch(self, seconds: float) -> None:
        self._recent_batch_s = seconds
        self.counters.batches += 1

    def _note_idle(self) -> None:
        if not self._busy and not any(not item.abandoned for item in self._queue):
            self._idle.set()

    def _done_with_batch(self) -> None:
        self._busy = False
        self._note_idle()

    def _fail(self, items: Sequence[WorkItem[P]], error: BaseException) -> None:
        """Answer ``items`` with ``error`` (each scheduler delivers results its own way)."""
        raise NotImplementedError

    async def close(self, timeout_s: float) -> None:
        """Stop accepting, let queued and running work finish for ``timeout_s``, fail the
        rest with ``ShuttingDown``. Calling it again waits for the first call's end."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(timeout_s))
        await asyncio.shield(self._closing)

    async def _close(self, timeout_s: float) -> None:
        self._accepting = False
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            pass
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        leftover = list(self._queue)
        self._queue.clear()
        self._fail(leftover, ShuttingDown())
