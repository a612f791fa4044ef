"""BatchRecorder: batch spans, links to members, and the marks it sets on them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from gpuscope.middleware import BatchRecorder, GpuscopeMiddleware, RequestTimeline, current_timeline
from gpuscope.middleware.timeline import ADMITTED, COMPUTED, DISPATCHED
from gpuscope.middleware.types import Receive, Scope, Send
from support.middleware_asgi import call, http_scope
from support.span_recorder import SpanRecorder

UUID = "GPU-11111111-2222-3333-4444-555555555555"


def attributes(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_a_batch_links_every_member_and_shares_its_instants(
    span_recorder: SpanRecorder,
) -> None:
    recorder = BatchRecorder(
        max_size=4, model="mlp", gpu_uuid=UUID, tracer_provider=span_recorder.provider
    )
    queue: asyncio.Queue[tuple[RequestTimeline, asyncio.Future[None]]] = asyncio.Queue()

    async def scheduler() -> None:
        batch = recorder.batch()
        waiters = []
        for _ in range(3):
            timeline, done = await queue.get()
            batch.admit(timeline)
            waiters.append(done)
        with batch.compute(trigger="timeout"):
            await asyncio.sleep(0.003)  # timed: the batch's compute
        for done in waiters:
            done.set_result(None)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        timeline = current_timeline()
        assert timeline is not None
        timeline.enqueued()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await queue.put((timeline, done))
        await done
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    wrapped = GpuscopeMiddleware(app, tracer_provider=span_recorder.provider, phase_spans=True)
    task = asyncio.create_task(scheduler())
    await asyncio.gather(*(call(wrapped, http_scope(f"/{i}")) for i in range(3)))
    await task

    (batch_span,) = span_recorder.named("gpuscope.batch")
    servers = span_recorder.server_spans()
    assert batch_span.kind is SpanKind.INTERNAL
    assert batch_span.parent is None  # root of its own trace
    battrs = attributes(batch_span)
    assert battrs["gpuscope.batch.size"] == 3
    assert battrs["gpuscope.batch.max_size"] == 4
    assert battrs["gpuscope.batch.trigger"] == "timeout"
    assert battrs["gpuscope.gpu.uuid"] == UUID
    assert battrs["gen_ai.request.model"] == "mlp"
    linked = {link.context.span_id for link in batch_span.links}
    assert linked == {server.context.span_id for server in servers}
    for server in servers:
        attrs = attributes(server)
        assert attrs["gpuscope.batch.id"] == battrs["gpuscope.batch.id"]
        assert attrs["gpuscope.batch.size"] == 3
        assert attrs["gpuscope.gpu.uuid"] == UUID
        (compute,) = [s for s in span_recorder.children_of(server) if s.name == "gpuscope.compute"]
        # every member's compute phase is exactly the batch execution
        assert (compute.start_time, compute.end_time) == (
            batch_span.start_time,
            batch_span.end_time,
        )


def test_dispatched_ns_dates_the_launch_before_the_block_runs(
    span_recorder: SpanRecorder,
) -> None:
    """A batch handed to a busy device: ``dispatched`` and the span start at the
    hand-over, so the wait for the device is compute, not batch wait."""
    recorder = BatchRecorder(max_size=2, tracer_provider=span_recorder.provider)
    member = RequestTimeline()
    batch = recorder.batch()
    batch.admit(member)
    handed_over_ns = time.perf_counter_ns()
    time.sleep(0.02)  # timed: the device finishes earlier work
    with batch.compute(trigger="timeout", dispatched_ns=handed_over_ns):
        pass
    assert member.mark_ns(DISPATCHED) == handed_over_ns
    computed = member.mark_ns(COMPUTED)
    assert computed is not None and computed - handed_over_ns >= 20_000_000
    (span,) = span_recorder.named("gpuscope.batch")
    assert span.start_time is not None and span.end_time is not None
    assert span.end_time - span.start_time == computed - handed_over_ns


def test_continuous_batching_marks_computed_only_for_completed_members(
    span_recorder: SpanRecorder,
) -> None:
    recorder = BatchRecorder(max_size=8, tracer_provider=span_recorder.provider)
    short, long = RequestTimeline(), RequestTimeline()
    first = recorder.batch()
    first.admit(short)
    first.admit(long)
    with first.compute(trigger="iteration", all_complete=False):
        pass
    assert short.mark_ns(DISPATCHED) == long.mark_ns(DISPATCHED)
    assert short.mark_ns(COMPUTED) is None
    second = recorder.batch()
    second.admit(short)
    second.admit(long)
    with second.compute(trigger="iteration", all_complete=False):
        second.complete(short)
    assert short.mark_ns(COMPUTED) is not None
    assert long.mark_ns(COMPUTED) is None
    # admitted and the batch id stay those of the first iteration
    assert short.batch_id == first.id
    assert short.mark_ns(ADMITTED) is not None
    batches = span_recorder.named("gpuscope.batch")
    assert [attributes(b)["gpuscope.batch.trigger"] for b in batches] == ["iteration"] * 2
    assert len({attributes(b)["gpuscope.batch.id"] for b in batches}) == 2


def test_a_model_error_propagates_and_marks_the_batch_span(span_recorder: SpanRecorder) -> None:
    recorder = BatchRecorder(max_size=2, tracer_provider=span_recorder.provider)
    batch = recorder.batch()
    member = RequestTimeline()
    batch.admit(member)
    with pytest.raises(MemoryError), batch.compute():
        raise MemoryError("CUDA out of memory")
    assert member.mark_ns(COMPUTED) is None  # a failed batch computed nothing
    (span,) = span_recorder.named("gpuscope.batch")
    assert span.status.status_code is StatusCode.ERROR
    assert attributes(span)["error.type"] == "MemoryError"


def test_max_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_size"):
        BatchRecorder(max_size=0)
