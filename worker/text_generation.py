"""Running a generation request: one sequence per choice, decoded, cut at stop strings,
and answered whole or as Server-Sent Events; shared by completions and chat completions.

The sequences of one request are queued together, so they share batches. A choice
whose text reaches a stop string ends there (``finish_reason: "stop"``) and its
sequence leaves its batch at the next iteration; otherwise it ends after
``max_tokens`` tokens (``"length"``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gpuscope.middleware import RequestTimeline
from gpuscope.worker.errors import error_event
from gpuscope.worker.generation import GenerationScheduler, TokenStream
from gpuscope.worker.protocol import GenerationOptions
from gpuscope.worker.responses import usage
from gpuscope.worker.scheduler import SchedulerError
from gpuscope.worker.stopping import StopMatcher
from gpuscope.worker.streaming import EventStreamResponse, sse_event, unless_disconnected

T = TypeVar("T")


class Bodies(Protocol):
    """How an endpoint shapes its answer (``CompletionBodies``, ``ChatBodies``)."""

    include_usage: bool

    def whole(
        self, choices: Sequence[tuple[str, str]], usage: dict[str, int]
    ) -> dict[str, Any]: ...

    def opening(self, index: int) -> list[dict[str, Any]]: ...

    def chunk(self, index: int, text: str, finish_reason: str | None) -> dict[str, Any]: ...

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]: ...


class Choice:
    """One prompt's sequence: its tokens decoded into text, cut at the first stop string."""

    def __init__(
        self,
        index: int,
        stream: TokenStream,
        decode: Callable[[int], str],
        stop: Sequence[str],
        timeline: RequestTimeline,
    ) -> None:
        self.index = index
        self.stream = stream
        self.tokens = 0
        self.finish_reason = "length"
        self._decode = decode
        self._stop = stop
        self._timeline = timeline
        self._first: int | None = None

    async def start(self) -> None:
        """Wait for the first token (so that a refusal or timeout is still a status code)."""
        self._first = await anext(self.stream)

    async def pieces(self) -> AsyncIterator[str]:
        """The text, piece by piece (empty pieces skipped)."""
        matcher = StopMatcher(self._stop)
        token = self._first
        while token is not None:
            self.tokens += 1
            self._timeline.add_output_tokens(1)
            piece = matcher.feed(self._decode(token))
            if piece:
                yield piece
            if matcher.stopped:
                self.finish_reason = "stop"
                self.stream.stop()
                return
            token = await anext(self.stream, None)
        if rest := matcher.flush():
            yield rest

    async def text(self) -> str:
        return "".join([piece async for piece in self.pieces()])

    async def chunks(self) -> AsyncIterator[tuple[int, str, str | None]]:
        """``(index, text, finish_reason)``; the last piece carries the finish reason."""
        pending: str | None = None
        async for piece in self.pieces():
            if pending is not None:
                yield self.index, pending, None
            pending = piece
        yield self.index, pending or "", self.finish_reason


class GenerationRun:
    """The choices of one request, from queueing to the answer."""

    def __init__(
        self,
        scheduler: GenerationScheduler,
        prompts: Sequence[Sequence[int]],
        options: GenerationOptions,
        decode: Callable[[int], str],
        timeline: RequestTimeline,
        timeout_s: float,
    ) -> None:
        self.options = options
        self.timeline = timeline
        self.prompt_tokens = sum(len(prompt) for prompt in prompts)
        streams = scheduler.generate_all(
            [list(prompt) for prompt in prompts], options.max_tokens, timeline, timeout_s=timeout_s
        )
        self.choices = [
            Choice(index, stream, decode, options.stop, timeline)
            for index, stream in enumerate(streams)
        ]

    def cancel(self) -> None:
        """Every sequence still running leaves its batch (no-op for the finished ones)."""
        for choice in self.choices:
            choice.stream.cancel()

    def usage(self) -> dict[str, int]:
        return usage(self.prompt_tokens, sum(choice.tokens for choice in self.choices))

    async def answer(self, request: Request, bodies: Bodies) -> Response:
        try:
            await unless_disconnected(
                request, asyncio.gather(*(choice.start() for choice in self.choices))
            )
        except BaseException:
            self.cancel()
            raise
        if self.options.stream:
            return EventStreamResponse(self._events(bodies), self.timeline, self.cancel)
        try:
            texts = await unless_disconnected(
                request, asyncio.gather(*(choice.text() for choice in self.choices))
            )
        finally:
            self.cancel()
        reasons = [choice.finish_reason for choice in self.choices]
        return JSONResponse(bodies.whole(list(zip(texts, reasons, strict=True)), self.usage()))

    async def _events(self, bodies: Bodies) -> AsyncIterator[bytes]:
        try:
            for choice in self.choices:
                for body in bodies.opening(choice.index):
                    yield sse_event(body)
            async for index, text, reason in _merged([c.chunks() for c in self.choices]):
                yield sse_event(bodies.chunk(index, text, reason))
        except SchedulerError as exc:  # too late for a status code: an error event
            yield error_event(exc)
            return
        finally:
            self.cancel()
        if bodies.include_usage:
            yield sse_event(bodies.usage_chunk(self.usage()))
        yield sse_event("[DONE]")


_DONE = object()


async def _merged(iterators: list[AsyncIterator[T]]) -> AsyncIterator[T]:
    """The items of several iterators as they come; the first error ends all of them."""
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield item
        return
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(iterator: AsyncIterator[T]) -> None:
        try:
            async for item in iterator:
                queue.put_nowait(item)
        except Exception as exc:
            queue.put_nowait(exc)
        queue.put_nowait(_DONE)

    tasks = [asyncio.ensure_future(pump(iterator)) for iterator in iterators]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
