"""``GenerationScheduler``: token generation under request-level or continuous batching,
its sequences' keys and values in the model's paged cache (``Generator.kv_pool``).

Request-level (``none``, ``static``, ``dynamic``): a batch forms as in
``QueueingScheduler`` and runs until its longest sequence ends; rows that finished
early keep being computed as padding (the batch's shape is fixed, as on a GPU
without iteration-level scheduling) and newcomers wait for the whole batch. Every
row holds the blocks for the whole run from the start; a batch takes the queued
requests, in order, that fit in the pool. One ``gpuscope.batch`` span covers the
whole run.

Continuous (``continuous``): every iteration first reserves the blocks the running
sequences grow into, oldest first; when the pool runs dry the youngest running
sequence is preempted: its blocks are freed and it waits, ahead of the queue, to be
recomputed from its tokens (vLLM's recompute preemption). Then waiting sequences
join while the batch has room and the pool has blocks for them, and every running
sequence is stepped once (prefill for the new ones, one decoded token for the rest);
a sequence that ends leaves at once and frees its blocks. Every iteration is a
``gpuscope.batch`` span with trigger ``iteration``.

A request that could not fit even in the whole pool is refused at once (400).
Tokens reach the request through a per-sequence ``asyncio.Queue`` as soon as their
iteration is back on the host. A request whose client went away leaves its batch at
the next iteration.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpuscope.middleware import Batch, BatchRecorder, RequestTimeline
from gpuscope.spans import BatchTrigger
from gpuscope.worker.config import BatchingMode
from gpuscope.worker.kv_cache import KvStats, SequenceState
from gpuscope.worker.model_api import Generator
from gpuscope.worker.scheduler import (
    BatchPolicy,
    DeviceThread,
    ModelFailed,
    QueueingScheduler,
    RequestTimedOut,
    SchedulerError,
    ShuttingDown,
    WorkItem,
    logger,
)

_END: Final = -1  # sentinel in a token stream: the sequence is complete


class PromptRejected(SchedulerError):
    """The model cannot take this prompt."""

    status = 400
    code = "invalid_prompt"


class CacheTooSmall(SchedulerError):
    """The request could never fit in the key/value cache, even alone."""

    status = 400
    code = "context_length_exceeded"

    def __init__(self, positions: int, capacity: int) -> None:
        super().__init__(
            f"the request needs {positions} key/value cache positions (prompt and "
            f"max_tokens) but the whole cache holds {capacity} "
            "(--kv-cache-blocks × --kv-block-size)"
        )


@dataclass(eq=False)
class GenerationRequest:
    prompt: list[int]
    max_tokens: int
    state: SequenceState
    tokens: asyncio.Queue[int | BaseException] = field(default_factory=asyncio.Queue)
    generated: int = 0

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_tokens

    def positions(self, steps: int) -> int:
        """Cache positions the sequence fills in ``steps`` steps from its start (the
        last chosen token is never written)."""
        return len(self.state.tokens) + steps - 1


Item = WorkItem[GenerationRequest]


class GenerationScheduler(QueueingScheduler[GenerationRequest]):
    """Schedules sequences of a ``Generator`` on the device thread."""

    def __init__(
        self, model: Generator, policy: BatchPolicy, recorder: BatchRecorder, device: DeviceThread
    ) -> None:
        super().__init__(policy, recorder, device)
        self.model = model
        self.pool = model.kv_pool
        self._running: list[Item] = []
        self._preempted: collections.deque[Item] = collections.deque()
        self._preemptions = 0
        self._iterations = 0

    @property
    def running(self) -> int:
        """Sequences holding a slot in the running batch."""
        return len(self._running)

    def kv_stats(self) -> KvStats:
        """The key/value cache and batch right now (cheap: read at every scrape)."""
        return KvStats(
            blocks_used=self.pool.used,
            blocks_total=self.pool.total,
            preemptions_total=self._preemptions,
            iterations_total=self._iterations,
            running=len(self._running),
            waiting=self.queued + len(self._preempted),
        )

    def generate_all(
        self,
        prompts: Sequence[list[int]],
        max_tokens: int,
        timeline: RequestTimeline,
        *,
        timeout_s: float,
    ) -> list[TokenStream]:
        """Queue one sequence per prompt, all or none, and return the streams of their
        tokens; ``TokenStream.cancel()`` when leaving early. Refused at once, with
        nothing queued: ``QueueFull``/``ShuttingDown``, or a 400 for a prompt the model
        or the cache cannot take.
        """
        requests = [self._request(prompt, max_tokens) for prompt in prompts]
        self.check_room(len(requests))
        return [
            TokenStream(self, self.submit(request, timeline), timeout_s) for request in requests
        ]

    def _request(self, prompt: list[int], max_tokens: int) -> GenerationRequest:
        try:
            state = self.model.start(prompt)
        except ValueError as exc:
            raise PromptRejected(str(exc)) from None
        request = GenerationRequest(prompt, max_tokens, state)
        if self.pool.blocks_for(request.positions(max_tokens)) > self.pool.total:
            raise CacheTooSmall(request.positions(max_tokens), self.pool.positions)
        return request

    # -- request-level batches ------------------------------------------------------

    async def _run(self) -> None:
        if self.policy.mode == BatchingMode.CONTINUOUS:
            await self._run_continuous()
        else:
            await self._run_request_level()

    async def _run_request_level(self) -> None:
        while True:
            items, trigger = await self._form_batch(self._batch_limit())
            items, trigger = self._fit_in_pool(items, trigger)
            self._running = items
            try:
                await self._run_to_completion(items, trigger)
            except asyncio.CancelledError:  # close() gave up on this batch
                self._fail(self._running, ShuttingDown())
                raise
            finally:
                self._running = self._leaving(self._running, lambda item: False)
                self._done_with_batch()

    def _fit_in_pool(
        self, items: list[Item], trigger: BatchTrigger
    ) -> tuple[list[Item], BatchTrigger]:
        """Reserve every row's blocks for the whole run (rows are stepped until the
        batch's longest request ends); the first rows that fit run, the others go back
        to the front of the queue. The first always fits: the pool is free between
        batches and ``generate`` refused what cannot fit alone."""
        for count in range(len(items), 0, -1):
            rows = items[:count]
            steps = max(item.payload.max_tokens for item in rows)
            wanted = [item.payload.positions(steps) for item in rows]
            if sum(map(self.pool.blocks_for, wanted)) <= self.pool.free:
                break
        self._queue.extendleft(reversed(items[count:]))
        for item, positions in zip(rows, wanted, strict=True):
            self.pool.reserve(item.payload.state, positions)
        return rows, trigger if count == len(items) else BatchTrigger.FULL

    async def _run_to_completion(self, items: list[Item], trigger: BatchTrigger) -> None:
        live = [item for item in items if not item.abandoned]
        if not live:
            return
        batch = self.recorder.batch()
        for item in live:
            batch.admit(item.timeline)
        started = time.monotonic()
        with batch.compute(trigger=trigger, all_complete=False):
            rows = live
            while any(not item.payload.finished and not item.abandoned for item in rows):
                rows = self._leaving(rows, lambda item: not item.abandoned)  # cancelled leave
                if not await self._iterate(rows, None):
                    return
        self._note_batch(time.monotonic() - started)

    # -- continuous batching ----------------------------------------------------------

    async def _run_continuous(self) -> None:
        try:
            await self._iterate_forever()
        except asyncio.CancelledError:  # close() gave up on the running batch
            waiting = [*self._running, *self._preempted]
            self._running = self._leaving(self._running, lambda item: False)
            self._preempted.clear()
            self._fail(waiting, ShuttingDown())
            raise

    async def _iterate_forever(self) -> None:
        while True:
            self._running = self._leaving(self._running, lambda item: not item.abandoned)
            self._preempted = collections.deque(i for i in self._preempted if not i.abandoned)
            if not self._running and not self._preempted:
                self._done_with_batch()
                first = await self._take(None)
                assert first is not None
                self._busy = True
                self._queue.appendleft(first)  # admitted below, like any other
            self._make_room()
            await self._admit()
            if not self._running:
                continue
            batch = self.recorder.batch()
            for item in self._running:
                batch.admit(item.timeline)  # keeps the first ``admitted`` mark
            started = time.monotonic()
            await self._iterate(self._running, batch)
            self._note_batch(time.monotonic() - started)
            self._running = self._leaving(self._running, lambda item: not item.payload.finished)

    def _make_room(self) -> None:
        """Reserve the blocks each running sequence's next tokens need, oldest first;
        when the pool runs dry, preempt the youngest (perhaps the one growing)."""
        index = 0
        while index < len(self._running):
            if self.pool.reserve(self._running[index].payload.state):
                index += 1
            else:
                self._preempt(self._running.pop())

    def _preempt(self, item: Item) -> None:
        """Free the sequence's blocks; it waits ahead of the queue (the older ones
        ahead of the younger) and is recomputed from its tokens when it rejoins."""
        self.pool.release(item.payload.state)
        self._preempted.appendleft(item)
        self._preemptions += 1

    async def _admit(self) -> None:
        """Waiting sequences join while the batch has room and the pool has blocks for
        them: preempted ones first, then the queue, in order. One that does not fit
        waits, and everyone behind it."""
        while len(self._running) < self.policy.max_batch_size:
            resumed = bool(self._preempted)
            item = self._preempted.popleft() if resumed else await self._take(time.monotonic())
            if item is None:
                return
            if not self.pool.reserve(item.payload.state):
                (self._preempted if resumed else self._queue).appendleft(item)
                return
            if not resumed:
                item.timeline.admitted()
            self._running.append(item)

    # -- both -------------------------------------------------------------------------

    async def _iterate(self, rows: list[Item], batch: Batch | None) -> bool:
        """Step every row once on the device and hand each live row its token."""
        states = [item.payload.state for item in rows]

        def step() -> list[int]:
            if batch is None:  # inside a request-level batch's compute block
                tokens = self.model.step(states)
                self._mark_last_tokens(rows)
                return tokens
            with batch.compute(
                trigger=BatchTrigger.ITERATION, all_complete=False, dispatched_ns=launched_ns
            ):
                tokens = self.model.step(states)
                for item in rows:
                    if item.payload.generated + 1 == item.payload.max_tokens:
                        batch.complete(item.timeline)
                return tokens

        self._iterations += 1
        # Launched now: time the device thread spends on the embeddings' batch first is
        # this iteration's compute, not the window of the sequences joining it.
        launched_ns = time.perf_counter_ns()
        try:
            tokens = await self.device.run(step)
        except Exception as exc:
            logger.error("model step failed for %d sequences", len(rows), exc_info=exc)
            self._fail(rows, ModelFailed(exc))
            return False
        for item, token in zip(rows, tokens, strict=True):
            self._deliver(item, token)
        return True

    def _leaving(self, items: list[Item], stays: Callable[[Item], bool]) -> list[Item]:
        """The items that stay in the running batch; the others leave it and free their
        blocks, so a request still streaming out holds no key/value cache."""
        staying = []
        for item in items:
            if stays(item):
                staying.append(item)
            else:
                self.pool.release(item.payload.state)
        return staying

    @staticmethod
    def _mark_last_tokens(rows: list[Item]) -> None:
        """Request-level batches: a row's result is ready when its last token is."""
        for item in rows:
            if item.payload.generated + 1 == item.payload.max_tokens:
                item.timeline.computed()

    def _deliver(self, item: Item, token: int) -> None:
        request = item.payload
        if request.finished:
            return  # a padding row of a request-level batch
        request.generated += 1
        if item.abandoned:
            return
        request.tokens.put_nowait(token)
        if request.finished:
            request.tokens.put_nowait(_END)
            self.counters.completed += 1
            item.future.set_result(None)

    def _fail(self, items: Sequence[Item], error: BaseException) -> None:
        for item in items:
            if not item.future.done():
                self.counters.failed += 1
                item.future.set_result(None)
                item.payload.tokens.put_nowait(error)

    def _note_idle(self) -> None:
        if any(not item.abandoned for item in (*self._running, *self._preempted)):
            return
        super()._note_idle()


class TokenStream:
    """The tokens of one queued sequence, as they come back from the device."""

    def __init__(self, scheduler: GenerationScheduler, item: Item, timeout_s: float) -> None:
        self._scheduler = scheduler
        self._item = item
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s

    def __aiter__(self) -> TokenStream:
        return self

    async def __anext__(self) -> int:
        tokens = self._item.payload.tokens
        try:
            async with asyncio.timeout(max(0.0, self._deadline - time.monotonic())):
                token = await tokens.get()
        except TimeoutError:
            self._scheduler.abandon(self._item, RequestTimedOut(self._timeout_s))
            raise RequestTimedOut(self._timeout_s) from None
        if isinstance(token, BaseException):
            raise token
        if token == _END:
            raise StopAsyncIteration
        return token

    def cancel(self) -> None:
        """The client went away: the sequence leaves its batch (no-op once complete)."""
        self._scheduler.abandon(self._item)

    def stop(self) -> None:
        """The request needs no more tokens (a stop sequence matched): it ends complete
        and leaves its batch at the next iteration."""
        self._scheduler.finish_early(self._item)
