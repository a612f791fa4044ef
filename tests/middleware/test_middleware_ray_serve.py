"""``gpuscope.middleware.ray_serve.batch`` without Ray: the wrapper against a fake
``@serve.batch`` with Ray's calling convention.

``fake_serve_batch`` follows ``ray/serve/batching.py`` of ``ray[serve]`` 2.60.0, reduced
to what the wrapper depends on: the decorator takes Ray's options and returns a wrapper
whose ``_get_max_batch_size`` is bound to a lazy holder; the holder's ``queue`` property
builds the batch queue, whose batcher task is created from the calling request's
context (so the handler runs in copies of the first caller's context, as in Ray); the
batcher takes the first call with ``queue.get()``, the rest with ``get_nowait()`` until
the batch is full or the window ended, then calls the handler with each argument as a
list, under a semaphore of ``max_concurrent_batches``. ``make ray-check`` runs the
same wrapper on the real Ray (tests/engines/test_ray_serve_live.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from gpuscope import spans as contract
from gpuscope.middleware import GpuscopeMiddleware, current_timeline, stats
from gpuscope.middleware.ray_serve import QUEUE_HOOK_FAILURE, traced_batch
from gpuscope.middleware.types import ASGIApp, Receive, Scope, Send
from support.middleware_asgi import call, http_scope
from support.span_recorder import SpanRecorder

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

_POSITIONAL = object()  # Ray's DUMMY_TYPE in flattened arguments


@dataclass
class FakeRequest:
    """Ray's ``_SingleRequest``: what its batch queue holds."""

    self_arg: Any
    flattened_args: list[Any]
    future: asyncio.Future[Any]


class FakeBatchQueue:
    """Ray's ``_BatchQueue``: the queue, the batcher task and the handler calls."""

    def __init__(
        self,
        max_batch_size: int,
        batch_wait_timeout_s: float,
        max_concurrent_batches: int,
        func: Callable[..., Awaitable[Sequence[Any]]],
        batch_size_fn: Callable[[list[Any]], int] | None,
    ) -> None:
        self.queue: asyncio.Queue[FakeRequest] = asyncio.Queue()
        self.max_batch_size = max_batch_size
        self.batch_wait_timeout_s = batch_wait_timeout_s
        self.batch_size_fn = batch_size_fn
        self.semaphore = asyncio.Semaphore(max_concurrent_batches)
        self.available = asyncio.Event()
        self.handler_timelines: list[object] = []
        # From the caller's context, as Ray does: every batch inherits it.
        self.task = asyncio.get_running_loop().create_task(self._process(func))
        self.tasks: set[asyncio.Task[None]] = set()

    def put(self, request: FakeRequest) -> None:
        self.queue.put_nowait(request)
        self.available.set()

    def _size(self, batch: list[FakeRequest]) -> int:
        if self.batch_size_fn is None:
            return len(batch)
        return self.batch_size_fn([request.flattened_args[1] for request in batch])

    async def wait_for_batch(self) -> list[FakeRequest]:
        batch = [await self.queue.get()]
        started = time.monotonic()
        while True:
            remaining = max(self.batch_wait_timeout_s - (time.monotonic() - started), 0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.available.wait(), remaining)
            while len(batch) < self.max_batch_size and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            if self.queue.empty():
                self.available.clear()
            if (
                time.monotonic() - started >= self.batch_wait_timeout_s
                or self._size(batch) >= self.max_batch_size
            ):
                return batch

    async def _process(self, func: Callable[..., Awaitable[Sequence[Any]]]) -> None:
        while True:
            batch = await self.wait_for_batch()
            task = asyncio.create_task(self._run(func, batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run(
        self, func: Callable[..., Awaitable[Sequence[Any]]], batch: list[FakeRequest]
    ) -> None:
        async with self.semaphore:
            batch = [request for request in batch if not request.future.cancelled()]
            if not batch:
                return
            self.handler_timelines.append(current_timeline())
            # Each argument position as a list, the first call's self (Ray's
            # _batch_args_kwargs with positional arguments only).
            count = len(batch[0].flattened_args) // 2
            args = [[r.flattened_args[2 * i + 1] for r in batch] for i in range(count)]
            self_arg = batch[0].self_arg
            try:
                coroutine = func(*args) if self_arg is None else func(self_arg, *args)
                results = await coroutine
                for request, result in zip(batch, results, strict=True):
                    if not request.future.done():
                        request.future.set_result(result)
            except Exception as exc:
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)


class FakeLazyQueue:
    """Ray's ``_LazyBatchQueueWrapper``: builds the batch queue at first use."""

    def __init__(self, options: dict[str, Any], func: Callable[..., Any]) -> None:
        self.max_batch_size: int = options.get("max_batch_size", 10)
        self.options = options
        self.func = func
        self._queue: FakeBatchQueue | None = None

    @property
    def queue(self) -> FakeBatchQueue:
        if self._queue is None:
            self._queue = FakeBatchQueue(
                self.max_batch_size,
                self.options.get("batch_wait_timeout_s", 0.01),
                self.options.get("max_concurrent_batches", 1),
                self.func,
                self.options.get("batch_size_fn"),
            )
        return self._queue

    def get_max_batch_size(self) -> int:
        return self.max_batch_size

    def set_max_batch_size(self, size: int) -> None:
        self.max_batch_size = size
        if self._queue is not None:
            self._queue.max_batch_size = size


def fake_serve_batch(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``ray.serve.batch(**options)``."""

    def decorate(func: Callable[..., Any]) -> Any:
        lazy = FakeLazyQueue(options, func)

        async def wrapper(*args: Any) -> Any:
            self_arg = None
            # Ray's extract_self_if_method_call: a method if args[0] holds func, wrapped.
            method = getattr(args[0], func.__name__, None) if args else None
            if method is not None and getattr(method, "__wrapped__", None) is func:
                self_arg, args = args[0], args[1:]
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            flattened = [value for arg in args for value in (_POSITIONAL, arg)]
            lazy.queue.put(FakeRequest(self_arg, flattened, future))
            return await future

        wrapper.__wrapped__ = func  # type: ignore[attr-defined]  # Ray's @wraps(_func)
        wrapper._get_max_batch_size = lazy.get_max_batch_size  # type: ignore[attr-defined]
        wrapper.set_max_batch_size = lazy.set_max_batch_size  # type: ignore[attr-defined]
        return wrapper

    return decorate


def fake_batch(provider: Any, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``ray_serve.batch(**options)`` on the fake batcher: what a deployment writes."""

    def decorate(func: Callable[..., Any]) -> Any:
        return traced_batch(
            func, fake_serve_batch, serve_options=options, model="toy", tracer_provider=provider
        )

    return decorate


def deployment(
    provider: Any, *, compute_s: float = 0.002, fail: bool = False, **options: Any
) -> Any:
    """An instance of a deployment class whose batched method is wrapped as documented."""

    class Deployment:
        def __init__(self) -> None:
            self.batches: list[list[str]] = []

        @fake_batch(provider, **options)
        async def embed(self, texts: list[str]) -> list[int]:
            self.batches.append(list(texts))
            await asyncio.sleep(compute_s)  # timed: the batch's compute
            if fail:
                raise RuntimeError("model failed")
            return [len(text) for text in texts]

    return Deployment()


def asgi_app(handler: Callable[[str], Awaitable[int]]) -> ASGIApp:
    """A raw ASGI app: the path is the text to embed; answers its length."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        try:
            result = await handler(scope["path"].strip("/"))
        except RuntimeError:
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(result).encode()})

    return app


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def serve(
    span_recorder: SpanRecorder, handler: Callable[[str], Awaitable[int]], texts: Sequence[str]
) -> list[bytes]:
    """Send one request per text, all at once; the response bodies."""
    app = GpuscopeMiddleware(
        asgi_app(handler), tracer_provider=span_recorder.provider, phase_spans=True
    )
    answers = await asyncio.gather(*(call(app, http_scope(f"/{text}")) for text in texts))
    return [answer[-1]["body"] for answer in answers]


def seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


def phases(span: ReadableSpan) -> dict[str, float]:
    values = attributes(span)
    return {phase: values[key] for phase, key in contract.PHASE_DURATION.items() if key in values}


async def test_a_full_batch_gives_every_request_its_phases_and_one_linked_batch_span(
    span_recorder: SpanRecorder,
) -> None:
    # The window is long: only reaching max_batch_size can close this batch in time.
    instance = deployment(span_recorder.provider, max_batch_size=4, batch_wait_timeout_s=30)
    bodies = await serve(span_recorder, instance.embed, ["a", "bb", "ccc", "dddd"])

    assert bodies == [b"1", b"2", b"3", b"4"]
    assert instance.batches == [["a", "bb", "ccc", "dddd"]]
    (batch,) = span_recorder.batches()
    servers = span_recorder.server_spans()
    battrs = attributes(batch)
    assert battrs[contract.BATCH_SIZE] == 4
    assert battrs[contract.BATCH_MAX_SIZE] == 4
    assert battrs[contract.BATCH_TRIGGER] == "full"
    assert battrs[contract.GEN_AI_REQUEST_MODEL] == "toy"
    assert {link.context.span_id for link in batch.links} == {
        server.context.span_id for server in servers
    }
    for server in servers:
        values = attributes(server)
        assert values[contract.BATCH_ID] == battrs[contract.BATCH_ID]
        assert values[contract.BATCH_SIZE] == 4
        split = phases(server)
        assert set(split) == set(contract.PHASES)
        assert sum(split.values()) == pytest.approx(seconds(server))
        assert split["compute"] == pytest.approx(seconds(batch))
        children = {span.name for span in span_recorder.children_of(server)}
        assert children == set(contract.PHASE_SPANS.values())


async def test_a_lone_request_waits_the_window_in_batch_wait_not_in_queue(
    span_recorder: SpanRecorder,
) -> None:
    window_s = 0.05
    instance = deployment(span_recorder.provider, max_batch_size=4, batch_wait_timeout_s=window_s)
    await serve(span_recorder, instance.embed, ["solo"])

    (server,) = span_recorder.server_spans()
    split = phases(server)
    # Taken off the queue at once (the batcher was idle), then held for the window.
    assert split["batch_wait"] >= window_s
    assert split["queue"] < window_s / 5
    (batch,) = span_recorder.batches()
    assert attributes(batch)[contract.BATCH_TRIGGER] == "timeout"
    assert attributes(batch)[contract.BATCH_SIZE] == 1


async def test_requests_behind_a_busy_handler_wait_after_the_take(
    span_recorder: SpanRecorder,
) -> None:
    """Ray forms the next batch while one runs: the wait for the handler is batch_wait."""
    instance = deployment(
        span_recorder.provider, compute_s=0.1, max_batch_size=2, batch_wait_timeout_s=0
    )
    await serve(span_recorder, instance.embed, ["a", "b", "c", "d", "e", "f"])

    batches = span_recorder.batches()
    assert sorted(attributes(b)[contract.BATCH_SIZE] for b in batches) == [2, 2, 2]
    assert {attributes(b)[contract.BATCH_TRIGGER] for b in batches} == {"full"}
    last = max(batches, key=lambda span: span.start_time or 0)
    linked = {link.context.span_id for link in last.links}
    for server in span_recorder.server_spans():
        if server.context.span_id in linked:
            # two batches of 0.1 s ran first, one after the other
            assert phases(server)["batch_wait"] >= 0.15


async def test_the_timeline_reaches_the_batch_although_the_handler_runs_in_another_context(
    span_recorder: SpanRecorder,
) -> None:
    instance = deployment(span_recorder.provider, max_batch_size=2, batch_wait_timeout_s=30)
    first = await serve(span_recorder, instance.embed, ["x", "y"])
    second = await serve(span_recorder, instance.embed, ["zz", "ww"])
    assert first + second == [b"1", b"1", b"2", b"2"]

    # The batcher's task was created in the first request's context: its handler calls
    # see that request's timeline (the fake does what Ray does) ...
    queue = type(instance).embed._get_max_batch_size.__self__.queue
    assert len(queue.handler_timelines) == 2
    assert queue.handler_timelines[0] is queue.handler_timelines[1]
    # ... yet each request is a member of the batch it rode in.
    batches = span_recorder.batches()
    by_id = {
        attributes(b)[contract.BATCH_ID]: {x.context.span_id for x in b.links} for b in batches
    }
    for server in span_recorder.server_spans():
        assert server.context.span_id in by_id[attributes(server)[contract.BATCH_ID]]
    assert len(by_id) == 2


async def test_a_call_without_a_request_counts_in_the_batch_size_only(
    span_recorder: SpanRecorder,
) -> None:
    instance = deployment(span_recorder.provider, max_batch_size=3, batch_wait_timeout_s=30)
    app = GpuscopeMiddleware(asgi_app(instance.embed), tracer_provider=span_recorder.provider)
    # one call from outside any request (a DeploymentHandle call, an excluded path)
    results = await asyncio.gather(
        call(app, http_scope("/a")), call(app, http_scope("/b")), instance.embed("ccc")
    )
    assert results[2] == 3

    (batch,) = span_recorder.batches()
    assert attributes(batch)[contract.BATCH_SIZE] == 3
    assert attributes(batch)[contract.BATCH_TRIGGER] == "full"
    assert len(batch.links) == 2
    assert len(span_recorder.server_spans()) == 2


async def test_batch_size_fn_sees_the_callers_items_and_decides_full(
    span_recorder: SpanRecorder,
) -> None:
    seen: list[list[str]] = []

    def tokens(items: list[str]) -> int:
        seen.append(list(items))
        return sum(len(item) for item in items)

    provider = span_recorder.provider
    embed = traced_batch(
        _lengths,
        fake_serve_batch,
        serve_options={"max_batch_size": 6, "batch_wait_timeout_s": 30},
        batch_size_fn=tokens,
        tracer_provider=provider,
    )
    await serve(span_recorder, embed, ["aaa", "bbb"])

    assert seen and all(isinstance(item, str) for items in seen for item in items)
    (batch,) = span_recorder.batches()
    assert attributes(batch)[contract.BATCH_TRIGGER] == "full"  # 6 tokens of 6
    assert attributes(batch)[contract.BATCH_SIZE] == 2


async def _lengths(texts: list[str]) -> list[int]:
    """A batch handler that is a plain function, not a method."""
    return [len(text) for text in texts]


async def test_a_plain_function_and_set_max_batch_size(span_recorder: SpanRecorder) -> None:
    embed = traced_batch(
        _lengths,
        fake_serve_batch,
        serve_options={"max_batch_size": 8, "batch_wait_timeout_s": 30},
        tracer_provider=span_recorder.provider,
    )
    assert embed.__name__ == "_lengths"
    embed.set_max_batch_size(2)  # type: ignore[attr-defined]  # Ray's setter, carried over
    assert list(await asyncio.gather(embed("aa"), embed("b"))) == [2, 1]

    (batch,) = span_recorder.batches()
    assert attributes(batch)[contract.BATCH_MAX_SIZE] == 2
    assert attributes(batch)[contract.BATCH_TRIGGER] == "full"


async def test_a_failing_handler_fails_its_requests_and_marks_the_batch(
    span_recorder: SpanRecorder,
) -> None:
    instance = deployment(
        span_recorder.provider, fail=True, max_batch_size=2, batch_wait_timeout_s=30
    )
    await serve(span_recorder, instance.embed, ["a", "b"])

    (batch,) = span_recorder.batches()
    assert attributes(batch)[contract.ERROR_TYPE] == "RuntimeError"
    for server in span_recorder.server_spans():
        assert attributes(server)[contract.HTTP_RESPONSE_STATUS_CODE] == 500
        # never computed: compute and postprocess stay absent
        assert set(phases(server)) == {"preprocess", "queue", "batch_wait"}


async def test_without_the_queue_hook_queue_and_batch_wait_stay_absent(
    span_recorder: SpanRecorder,
) -> None:
    def opaque_batch(**options: Any) -> Callable[[Callable[..., Any]], Any]:
        decorate = fake_serve_batch(**options)

        def hide_queue(func: Callable[..., Any]) -> Any:
            wrapper = decorate(func)
            lazy = wrapper._get_max_batch_size.__self__
            lazy.queue.queue = _NoHookQueue()  # another batcher: no asyncio.Queue to hook
            return wrapper

        return hide_queue

    embed = traced_batch(
        _lengths,
        opaque_batch,
        serve_options={"max_batch_size": 2, "batch_wait_timeout_s": 30},
        tracer_provider=span_recorder.provider,
    )
    # The fake's queue is built by the decorator here, so build it in a running loop.
    await serve(span_recorder, embed, ["a", "bb"])

    for server in span_recorder.server_spans():
        assert set(phases(server)) == {"preprocess", "compute", "postprocess"}
    (batch,) = span_recorder.batches()
    assert attributes(batch)[contract.BATCH_SIZE] == 2
    assert stats.snapshot()[QUEUE_HOOK_FAILURE] == 1


class _NoHookQueue(asyncio.Queue[Any]):
    """A queue whose ``_get`` cannot be replaced (a batcher built otherwise)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_get":
            raise AttributeError("read-only")
        super().__setattr__(name, value)


def test_streaming_and_sync_handlers_are_refused() -> None:
    async def stream(texts: list[str]) -> Any:
        yield texts

    def sync(texts: list[str]) -> list[int]:
        return [1]

    with pytest.raises(TypeError, match="async generator"):
        traced_batch(stream, fake_serve_batch)
    with pytest.raises(TypeError, match="async def"):
        traced_batch(sync, fake_serve_batch)  # type: ignore[arg-type]


def test_a_batcher_without_rays_accessors_is_refused_when_decorating() -> None:
    def other_batch(**options: Any) -> Callable[[Callable[..., Any]], Any]:
        return lambda func: func

    with pytest.raises(TypeError, match=re.escape("ray[serve] 2.60.0")):
        traced_batch(_lengths, other_batch)


def test_importing_the_middleware_never_imports_ray() -> None:
    """``gpuscope.middleware`` and even ``ray_serve`` load without Ray; ``batch()`` needs it."""
    code = """
import importlib.abc, json, sys

class NoRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoRay())
import gpuscope.middleware
loaded = {"ray_serve_by_middleware": "gpuscope.middleware.ray_serve" in sys.modules}
from gpuscope.middleware import ray_serve
loaded["ray"] = any(m == "ray" or m.startswith("ray.") for m in sys.modules)
try:
    ray_serve.batch(max_batch_size=2)
except ModuleNotFoundError as exc:
    loaded["batch_error"] = exc.name
print(json.dumps(loaded))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == {
        "ray_serve_by_middleware": False,
        "ray": False,
        "batch_error": "ray",
    }
