"""``GenerationScheduler``: token generation under request-level or continuous batching.

Request-level (``none``, ``static``, ``dynamic``): a batch forms as in
``QueueingScheduler`` and runs until its longest sequence ends; rows that finished
early keep being computed as padding (the batch's shape is fixed, as on a GPU
without iteration-level scheduling) and newcomers wait for the whole batch. One
``gpuscope.batch`` span covers the whole run.

Continuous (``continuous``): every iteration first admits queued sequences into
free slots, then steps every running sequence once (prefill for the new ones,
one decoded token for the rest); a sequence that ends leaves at once and frees
its slot. Every iteration is a ``gpuscope.batch`` span with trigger ``iteration``.

Tokens reach the request through a per-sequence ``asyncio.Queue`` as soon as their
iteration is back on the host. A request whose client went away leaves its batch at
the next iteration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpuscope.middleware import Batch, BatchRecorder, RequestTimeline
from gpuscope.worker.kv_cache import KvStats
from gpuscope.worker.models import Generator
from gpuscope.worker.scheduler import (
    BatchPolicy,
    DeviceThread,
    QueueingScheduler,
    RequestTimedOut,
    ShuttingDown,
    WorkItem,
)

TRIGGER_ITERATION: Final = "iteration"
_END: Final = -1  # sentinel in a token stream: the sequence is complete


@dataclass(eq=False)
class GenerationRequest:
    prompt: list[int]
    max_tokens: int
    tokens: asyncio.Queue[int | BaseException] = field(default_factory=asyncio.Queue)
    generated: int = 0
    state: object = None

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_tokens


Item = WorkItem[GenerationRequest]


class GenerationScheduler(QueueingScheduler[GenerationRequest]):
    """Schedules sequences of a ``Generator`` on the device thread."""

    def __init__(
        self, model: Generator, policy: BatchPolicy, recorder: BatchRecorder, device: DeviceThread
    ) -> None:
        super().__init__(policy, recorder, device)
        self.model = model
        self._running: list[Item] = []
        self._preemptions = 0
        self._iterations = 0

    @property
    def running(self) -> int:
        """Sequences holding a slot in the running batch."""
        return len(self._running)

    def kv_stats(self) -> KvStats:
        """The key/value cache and batch right now (cheap: read at every scrape)."""
        return KvStats(
            blocks_used=0,
            blocks_total=0,
            preemptions_total=self._preemptions,
            iterations_total=self._iterations,
            running=len(self._running),
            waiting=self.queued,
        )

    def generate(
        self, prompt: list[int], max_tokens: int, timeline: RequestTimeline, *, timeout_s: float
    ) -> TokenStream:
        """Queue a sequence at once (raising ``QueueFull``/``ShuttingDown`` here) and
        return the stream of its tokens; ``TokenStream.cancel()`` when leaving early.
        """
        item = self.submit(GenerationRequest(prompt, max_tokens), timeline)
        return TokenStream(self, item, timeout_s)

    # -- the loop --------------------------------------------------------------------

    async def _run(self) -> None:
        if self.policy.mode == "continuous":
            await self._run_continuous()
        else:
            await self._run_request_level()

    async def _run_request_level(self) -> None:
        while True:
            items, trigger = await self._form_batch(self._batch_limit())
            self._running = items
            try:
                await self._run_to_completion(items, trigger)
            except asyncio.CancelledError:  # close() gave up on this batch
                self._fail(self._running, ShuttingDown())
                raise
            finally:
                _release(self._running)
                self._running = []
                self._done_with_batch()

    async def _run_to_completion(self, items: list[Item], trigger: str) -> None:
        live = [item for item in items if not item.abandoned]
        if not live:
            return
        batch = self.recorder.batch()
        for item in live:
            batch.admit(item.timeline)
        started = time.monotonic()
        with batch.compute(trigger=trigger, all_complete=False):
            if not await self._start_sequences(live):
                return
            rows = live
            while any(not item.payload.finished and not item.abandoned for item in rows):
                rows = _staying(rows, lambda item: not item.abandoned)  # cancelled rows leave
                if not await self._iterate(rows, None):
                    return
        self._note_batch(time.monotonic() - started)

    async def _run_continuous(self) -> None:
        try:
            await self._iterate_forever()
        except asyncio.CancelledError:  # close() gave up on the running batch
            self._fail(self._running, ShuttingDown())
            self._running = []
            raise

    async def _iterate_forever(self) -> None:
        while True:
            self._running = _staying(self._running, lambda item: not item.abandoned)
            admitted: list[Item] = []
            if not self._running:
                self._done_with_batch()
                first = await self._take(None)
                assert first is not None
                self._busy = True
                first.timeline.admitted()
                admitted.append(first)
            while len(self._running) + len(admitted) < self.policy.max_batch_size:
                item = await self._take(time.monotonic())  # only what is already queued
                if item is None:
                    break
                item.timeline.admitted()
                admitted.append(item)
            if admitted and await self._start_sequences(admitted):
                self._running.extend(admitted)
            if not self._running:
                continue
            batch = self.recorder.batch()
            for item in self._running:
                batch.admit(item.timeline)  # keeps the first ``admitted`` mark
            started = time.monotonic()
            await self._iterate(self._running, batch)
            self._note_batch(time.monotonic() - started)
            self._running = _staying(self._running, lambda item: not item.payload.finished)

    async def _start_sequences(self, items: list[Item]) -> bool:
        """Allocate each new sequence's state; a failure fails those requests."""
        try:
            for item in items:
                item.payload.state = self.model.start(item.payload.prompt)
        except Exception as exc:
            self._fail(items, exc)
            return False
        return True

    async def _iterate(self, rows: list[Item], batch: Batch | None) -> bool:
        """Step every row once on the device and hand each live row its token."""
        states = [item.payload.state for item in rows]

        def step() -> list[int]:
            if batch is None:  # inside a request-level batch's compute block
                tokens = self.model.step(states)
                self._mark_last_tokens(rows)
                return tokens
            with batch.compute(trigger=TRIGGER_ITERATION, all_complete=False):
                tokens = self.model.step(states)
                for item in rows:
                    if item.payload.generated + 1 == item.payload.max_tokens:
                        batch.complete(item.timeline)
                return tokens

        self._iterations += 1
        try:
            tokens = await self.device.run(step)
        except Exception as exc:
            self._fail(rows, exc)
            return False
        for item, token in zip(rows, tokens, strict=True):
            self._deliver(item, token)
        return True

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
        if any(not item.abandoned for item in self._running):
            return
        super()._note_idle()


def _staying(items: list[Item], stays: Callable[[Item], bool]) -> list[Item]:
    """The items that stay in the running batch; the others leave it and let go of their
    model state, so a request still streaming out holds no key/value cache."""
    staying = []
    for item in items:
        if stays(item):
            staying.append(item)
        else:
            item.payload.state = None
    return staying


def _release(items: Sequence[Item]) -> None:
    for item in items:
        item.payload.state = None


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
