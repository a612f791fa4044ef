"""``EmbeddingScheduler``: embedding requests batched into one forward pass per batch.

Batches form as ``QueueingScheduler`` says for the policy's mode (``continuous``
forms them like ``static``: an embedding is one forward pass, no iterations).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from gpuscope.middleware import BatchRecorder, RequestTimeline
from gpuscope.spans import BatchTrigger
from gpuscope.worker.model_api import EmbeddingModel, FloatArray
from gpuscope.worker.scheduler import (
    BatchPolicy,
    DeviceThread,
    ModelFailed,
    QueueingScheduler,
    RequestTimedOut,
    ShuttingDown,
    WorkItem,
    logger,
)


class EmbeddingScheduler(QueueingScheduler[Sequence[Sequence[int]]]):
    """Batches embedding requests into one forward pass per batch."""

    def __init__(
        self,
        model: EmbeddingModel,
        policy: BatchPolicy,
        recorder: BatchRecorder,
        device: DeviceThread,
    ) -> None:
        super().__init__(policy, recorder, device)
        self.model = model
        self._in_batch = 0

    @property
    def running(self) -> int:
        """Requests in the batch on the device now."""
        return self._in_batch

    async def embed(
        self, inputs: Sequence[Sequence[int]], timeline: RequestTimeline, *, timeout_s: float
    ) -> FloatArray:
        """One embedding per input (rows of the result), or a ``SchedulerError``."""
        item = self.submit(inputs, timeline)
        try:
            async with asyncio.timeout(timeout_s):
                result: FloatArray = await asyncio.shield(item.future)
        except TimeoutError:
            self.abandon(item, RequestTimedOut(timeout_s))
            raise RequestTimedOut(timeout_s) from None
        except asyncio.CancelledError:
            self.abandon(item)
            raise
        return result

    async def _run(self) -> None:
        while True:
            items, trigger = await self._form_batch(self._batch_limit())
            self._in_batch = len(items)
            try:
                await self._compute(items, trigger)
            except asyncio.CancelledError:  # close() gave up on this batch
                self._fail(items, ShuttingDown())
                raise
            finally:
                self._in_batch = 0
                self._done_with_batch()

    async def _compute(
        self, items: list[WorkItem[Sequence[Sequence[int]]]], trigger: BatchTrigger
    ) -> None:
        live = [item for item in items if not item.abandoned]
        if not live:
            return
        batch = self.recorder.batch()
        for item in live:
            batch.admit(item.timeline)  # keeps the ``admitted`` mark set when taken
        rows = [tokens for item in live for tokens in item.payload]

        def forward() -> FloatArray:
            with batch.compute(trigger=trigger, dispatched_ns=launched_ns):
                return self.model.embed(rows)

        # The batch is closed and handed to the device here; the device thread may still
        # be running the other scheduler's work, and that wait is compute (as behind a
        # busy GPU), not the batch's window.
        launched_ns = time.perf_counter_ns()
        started = time.monotonic()
        try:
            vectors = await self.device.run(forward)
        except Exception as exc:
            logger.error("model call failed for %d requests", len(live), exc_info=exc)
            for item in live:
                if not item.future.done():
                    self.counters.failed += 1
                    item.future.set_exception(ModelFailed(exc))
            return
        self._note_batch(time.monotonic() - started)
        offset = 0
        for item in live:
            count = len(item.payload)
            if not item.future.done():
                self.counters.completed += 1
                item.future.set_result(vectors[offset : offset + count])
            offset += count

    def _fail(
        self, items: Sequence[WorkItem[Sequence[Sequence[int]]]], error: BaseException
    ) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)
