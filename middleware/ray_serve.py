"""Ray Serve's ``@serve.batch`` with gpuscope's queue / batch-wait / compute split.

``batch`` takes ``@serve.batch``'s place, with the same arguments, on a deployment whose
FastAPI ingress runs under ``GpuscopeMiddleware``::

    from gpuscope.middleware import GpuscopeMiddleware, ray_serve, setup_tracing

    app = FastAPI()
    app.add_middleware(GpuscopeMiddleware)

    @serve.deployment(num_replicas=2, max_ongoing_requests=32)
    @serve.ingress(app)
    class Embedder:
        def __init__(self) -> None:
            setup_tracing(service_name="embedder")  # in the replica: OTLP/HTTP to :9420

        @app.post("/embed")
        async def embed(self, body: EmbedRequest) -> dict[str, list[float]]:
            return {"embedding": await self.embed_batch(body.text)}

        @ray_serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01, model="mlp")
        async def embed_batch(self, texts: list[str]) -> list[list[float]]:
            ...

Each request then gets ``enqueued`` when it calls the batched method, ``admitted`` when
Ray's batcher takes it off its queue, ``dispatched`` when Ray calls the handler with
the batch and ``computed`` when the handler returns; each handler call is one
``gpuscope.batch`` span linked to its members, with trigger ``full`` when it held
``max_batch_size`` requests (by ``batch_size_fn`` where given), else ``timeout``.

Why a wrapper around ``@serve.batch`` rather than marks inside the handler:

- Ray creates its batcher task from the first request that reaches the method, and
  runs every batch in copies of that task's context: inside the handler,
  ``current_timeline()`` is the first request's, whatever the batch holds. The
  per-request call is the last place that sees the request's own timeline, so the
  wrapper hands it to Ray's queue together with the arguments.
- Ray keeps no per-request instant for the take (its batch wait is per batch, from
  when the batcher takes the first request). The wrapper notes it as Ray's batcher
  takes each item off its ``asyncio.Queue``, through the queue's ``_get``, the method
  asyncio provides for subclasses to override. That reaches into Ray's private
  ``_BatchQueue`` (checked against ``ray[serve]`` 2.60.0 by ``make ray-check``); where
  it is not found, ``queue`` and ``batch_wait`` stay absent rather than wrong, and the
  miss is counted as ``ray_serve_batch_queue`` in ``gpuscope.middleware.stats``.

Calls that did not come through the middleware (a ``DeploymentHandle`` call from
another deployment, an excluded path) are batched as before and count in the batch's
size, without a request span. Importing this module does not import Ray; applying
``batch`` does. Async generator handlers (streaming batches) are not supported.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from gpuscope.middleware import environment, stats
from gpuscope.middleware.batch import BatchRecorder
from gpuscope.middleware.timeline import RequestTimeline, current_timeline
from gpuscope.spans import BatchTrigger

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

S = TypeVar("S", contravariant=True)
T = TypeVar("T")
R = TypeVar("R")

# The attributes of ``@serve.batch``'s wrapper that user code calls (and the getters Ray's
# own tests and debugging use); the traced method carries them over unchanged.
_WRAPPER_ATTRIBUTES = (
    "set_max_batch_size",
    "set_batch_wait_timeout_s",
    "_get_max_batch_size",
    "_get_batch_wait_timeout_s",
    "_get_curr_iteration_start_times",
    "_is_batching_task_alive",
    "_get_handling_task_stack",
)
QUEUE_HOOK_FAILURE = "ray_serve_batch_queue"


@dataclass(eq=False, slots=True)
class _Member:
    """One call of the batched method, as it travels through Ray's batch queue."""

    self_arg: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    timeline: RequestTimeline | None
    # perf_counter_ns() when Ray's batcher last took it off the queue; a later take wins
    # (with batch_size_fn, Ray puts an item that does not fit back for the next batch).
    taken_ns: int | None = None


def _note_taken(item: object) -> None:
    """Stamp the member inside one of Ray's queued ``_SingleRequest`` items."""
    now_ns = time.perf_counter_ns()
    for value in getattr(item, "flattened_args", ()):
        if isinstance(value, _Member):
            value.taken_ns = now_ns


class _Runtime:
    """What one process builds on first use. Pickled empty: Ray ships the deployment
    class, and with it this decorator's closure, from the driver to each replica, where
    the recorder and the hook are made anew."""

    __slots__ = ("hook_failed", "hooked_queue", "recorder")

    def __init__(self) -> None:
        self.recorder: BatchRecorder | None = None
        self.hooked_queue: object | None = None
        self.hook_failed = False

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.recorder = None
        self.hooked_queue = None
        self.hook_failed = False

    def hook_queue(self, lazy_queue: Any) -> None:
        """Note each take on the asyncio.Queue behind Ray's batch queue (hooked once).

        Reading ``lazy_queue.queue`` creates Ray's ``_BatchQueue`` (and its batcher task)
        on the first call, in the request's task, exactly as Ray's own enqueue would.
        """
        if self.hook_failed:  # another Ray: do not pay for the same exception per call
            return
        try:
            queue = lazy_queue.queue.queue  # _LazyBatchQueueWrapper -> _BatchQueue -> Queue
            if queue is self.hooked_queue:
                return
            take = queue._get  # every get() and get_nowait() of asyncio.Queue ends here

            def take_and_note() -> Any:
                item = take()
                _note_taken(item)
                return item

            queue._get = take_and_note
            self.hooked_queue = queue
        except Exception as exc:  # telemetry must never fail the request
            self.hook_failed = True
            stats.record_failure(QUEUE_HOOK_FAILURE, exc)


class _TracedBatchDecorator(Protocol):
    """What ``batch(...)`` returns: like ``@serve.batch(...)``, for methods and functions."""

    @overload
    def __call__(
        self, func: Callable[[S, list[T]], Awaitable[Sequence[R]]], /
    ) -> Callable[[S, T], Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(
        self, func: Callable[[list[T]], Awaitable[Sequence[R]]], /
    ) -> Callable[[T], Coroutine[Any, Any, R]]: ...


def batch(
    *,
    max_batch_size: int | None = None,
    batch_wait_timeout_s: float | None = None,
    max_concurrent_batches: int | None = None,
    batch_size_fn: Callable[[list[Any]], int] | None = None,
    model: str | None = None,
    gpu_uuid: str | None = None,
    tracer_provider: TracerProvider | None = None,
) -> _TracedBatchDecorator:
    """``@serve.batch(...)`` whose requests and batches gpuscope measures.

    The first four arguments go to ``ray.serve.batch`` unchanged (left out, Ray's
    defaults apply). ``model`` and ``gpu_uuid`` label the batch span and the members
    that did not set their own (``gpu_uuid`` defaults to ``GPUSCOPE_GPU_UUID`` in the
    replica's environment); ``tracer_provider`` defaults to the global one, which
    ``setup_tracing()`` in the deployment's ``__init__`` installs.
    """
    from ray import serve

    options = {
        "max_batch_size": max_batch_size,
        "batch_wait_timeout_s": batch_wait_timeout_s,
        "max_concurrent_batches": max_concurrent_batches,
    }

    def decorate(func: Callable[..., Awaitable[Sequence[Any]]]) -> Any:
        return traced_batch(
            func,
            serve.batch,
            serve_options={key: value for key, value in options.items() if value is not None},
            batch_size_fn=batch_size_fn,
            model=model,
            gpu_uuid=gpu_uuid,
            tracer_provider=tracer_provider,
        )

    return decorate


def traced_batch(
    func: Callable[..., Awaitable[Sequence[Any]]],
    serve_batch: Callable[..., Callable[[Callable[..., Any]], Any]],
    *,
    serve_options: dict[str, Any] | None = None,
    batch_size_fn: Callable[[list[Any]], int] | None = None,
    model: str | None = None,
    gpu_uuid: str | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """Wrap the batch handler ``func`` with ``serve_batch(**serve_options)``, measuring
    every call and every batch. ``batch`` is the public form; this one takes the
    batcher (``ray.serve.batch``) as an argument so that it can be tested without Ray.
    """
    if inspect.isasyncgenfunction(func):
        raise TypeError(
            f"{func.__qualname__}: gpuscope's ray_serve.batch does not support async "
            "generator (streaming) batch handlers; use ray.serve.batch for it"
        )
    if not inspect.iscoroutinefunction(func):
        raise TypeError(f"{func.__qualname__}: a batch handler must be 'async def'")
    runtime = _Runtime()

    def first_items(members: list[_Member]) -> list[Any]:
        # What Ray hands batch_size_fn: the first positional argument of each call.
        return [member.args[0] if member.args else None for member in members]

    options = dict(serve_options or {})
    if batch_size_fn is not None:
        # Ray calls it with the first argument of each queued call, which is a _Member.
        options["batch_size_fn"] = lambda members: batch_size_fn(first_items(members))

    async def run_batch(members: list[_Member]) -> Sequence[Any]:
        """Ray's handler: one batch of calls, run as one gpuscope batch."""
        max_size = max(1, int(batched._get_max_batch_size()))  # set_max_batch_size() moves it
        recorder = runtime.recorder
        if recorder is None:  # first batch in this replica, after its __init__
            recorder = runtime.recorder = BatchRecorder(
                max_size=max_size,
                model=model,
                gpu_uuid=gpu_uuid or environment.gpu_uuid(),
                tracer_provider=tracer_provider,
            )
        recorder.max_size = max_size
        current = recorder.batch()
        for member in members:
            # A call that came without a request still counts in the batch's size.
            timeline = member.timeline if member.timeline is not None else RequestTimeline()
            if member.taken_ns is not None:
                current.admit(timeline, now_ns=member.taken_ns)
            else:  # no take instant: queue and batch_wait stay absent, never zero
                current.members.append(timeline)
        size = batch_size_fn(first_items(members)) if batch_size_fn else len(members)
        trigger = BatchTrigger.FULL if size >= max_size else BatchTrigger.TIMEOUT
        args, kwargs = _batched_arguments(members)
        self_arg = members[0].self_arg
        with current.compute(trigger=trigger):
            if self_arg is None:
                return await func(*args, **kwargs)
            return await func(self_arg, *args, **kwargs)

    # Ray names its metrics' function_name after the handler: keep the user's name. No
    # __wrapped__: Ray would then take a call with a _Member for a method call.
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(run_batch, name, getattr(func, name))
    batched = serve_batch(**options)(run_batch)
    get_max_batch_size = getattr(batched, "_get_max_batch_size", None)
    lazy_queue = getattr(get_max_batch_size, "__self__", None)
    if get_max_batch_size is None:
        raise TypeError(
            "this ray.serve.batch is not the one gpuscope's ray_serve.batch was built for "
            "(its wrapper has no _get_max_batch_size); ray[serve] 2.60.0 is"
        )

    @functools.wraps(func)
    async def call(*args: Any, **kwargs: Any) -> Any:
        self_arg = None
        # A method call: the first argument's class holds this very function.
        if args and getattr(type(args[0]), func.__name__, None) is call:
            self_arg, args = args[0], args[1:]
        member = _Member(self_arg, args, kwargs, current_timeline())
        runtime.hook_queue(lazy_queue)
        if member.timeline is not None:
            member.timeline.enqueued()
        return await batched(member)

    for name in _WRAPPER_ATTRIBUTES:
        if hasattr(batched, name):
            setattr(call, name, getattr(batched, name))
    return call


def _batched_arguments(members: Sequence[_Member]) -> tuple[list[Any], dict[str, Any]]:
    """Each argument position (and keyword) as the list of the members' values, as Ray
    passes them to a batch handler."""
    shapes = {(len(member.args), tuple(sorted(member.kwargs))) for member in members}
    if len(shapes) != 1:
        raise TypeError("every call in a batch must pass the same arguments")
    count, keywords = shapes.pop()
    args = [[member.args[index] for member in members] for index in range(count)]
    kwargs = {key: [member.kwargs[key] for member in members] for key in keywords}
    return args, kwargs
