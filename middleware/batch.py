"""``BatchRecorder``: marks batch phases on every member and emits ``gpuscope.batch``.

One recorder per scheduler holds what all its batches share (tracer, model, GPU
UUID, maximum size). Each batch the scheduler forms is a ``Batch``::

    recorder = BatchRecorder(model="mlp", gpu_uuid=uuid, max_size=32)
    batch = recorder.batch()
    for item in taken_from_queue:
        batch.admit(item.timeline)          # marks ``admitted``
    with batch.compute(trigger="timeout"):  # marks ``dispatched`` on entry
        run_model_and_synchronize(...)      # marks ``computed`` on exit

A scheduler that closes the batch on one thread and runs it on another (a device
thread that may still be busy) passes ``dispatched_ns=`` the instant it handed the
batch over, so that the batch's window (``batch_wait``) ends when the batch closed.

Under continuous batching every iteration is a ``Batch`` entered with
``trigger="iteration", all_complete=False``; members whose sequence ended in that
iteration are passed to ``batch.complete(timeline)`` and get ``computed`` at the
end of the iteration.

The batch span is the root of its own trace and links to every member's server
span: OpenTelemetry's model for fan-in batching. Telemetry failures are counted
(``stats``) and never raised; exceptions from the model propagate unchanged.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from gpuscope import __version__, spans
from gpuscope.middleware import stats
from gpuscope.middleware.timeline import (
    ADMITTED,
    COMPUTED,
    DISPATCHED,
    RequestTimeline,
    epoch_offset_ns,
)

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

_ROOT = Context()  # an empty context: the batch span starts a trace of its own


class BatchRecorder:
    """Shared settings of one scheduler's batches; hands out ``Batch`` objects."""

    def __init__(
        self,
        *,
        max_size: int,
        model: str | None = None,
        gpu_uuid: str | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.max_size = max_size
        self.model = model
        self.gpu_uuid = gpu_uuid
        self.tracer = trace.get_tracer(
            spans.INSTRUMENTATION_NAME, __version__, tracer_provider=tracer_provider
        )
        # Unique across processes without coordination: pid plus a random tag.
        self._prefix = f"{os.getpid():x}-{os.urandom(3).hex()}"
        self._serial = itertools.count(1)

    def batch(self) -> Batch:
        """Start forming a new batch."""
        return Batch(self, f"{self._prefix}-{next(self._serial)}")


class Batch:
    """One batch execution: its members and, once computed, its span."""

    __slots__ = ("_completed", "_recorder", "id", "members")

    def __init__(self, recorder: BatchRecorder, batch_id: str) -> None:
        self._recorder = recorder
        self.id = batch_id
        self.members: list[RequestTimeline] = []
        self._completed: list[RequestTimeline] = []

    def __len__(self) -> int:
        return len(self.members)

    def admit(self, timeline: RequestTimeline, *, now_ns: int | None = None) -> None:
        """Add a request; marks ``admitted`` (kept from an earlier iteration if set)."""
        timeline.mark_at(ADMITTED, time.perf_counter_ns() if now_ns is None else now_ns)
        self.members.append(timeline)

    def complete(self, timeline: RequestTimeline) -> None:
        """Under ``all_complete=False``: this member's result is ready at the end of the block."""
        self._completed.append(timeline)

    @contextmanager
    def compute(
        self,
        trigger: str = spans.BatchTrigger.FULL,
        *,
        all_complete: bool = True,
        dispatched_ns: int | None = None,
    ) -> Iterator[Batch]:
        """Run the batch: ``dispatched`` on entry, ``computed`` on exit, one span.

        ``trigger`` says why the batch was dispatched (a ``gpuscope.spans.BatchTrigger``).
        ``dispatched_ns`` (a ``perf_counter_ns()`` reading) dates ``dispatched`` earlier
        than the entry: when the batch was closed and handed to a device that runs its
        work in order (a stream, a device thread) and the block runs once the device
        gets to it. Waiting behind earlier work is then part of ``compute``, as it is
        for a kernel launched on a busy GPU, and not of the batch's window.

        Exit only once the results are on the host (after a device synchronisation),
        or ``compute`` will measure the launch instead of the work.
        """
        recorder = self._recorder
        size = len(self.members)
        if dispatched_ns is None:
            dispatched_ns = time.perf_counter_ns()
        dispatched_epoch_ns = dispatched_ns + epoch_offset_ns(dispatched_ns)
        for timeline in self.members:
            timeline.mark_at(DISPATCHED, dispatched_ns)
            timeline.set_batch(self.id, size)
            if timeline.gpu_uuid is None:
                timeline.gpu_uuid = recorder.gpu_uuid
            if timeline.model is None:
                timeline.model = recorder.model
        error: BaseException | None = None
        try:
            yield self
        except BaseException as exc:
            error = exc
            raise
        finally:
            computed_ns = time.perf_counter_ns()
            done = self.members if all_complete and error is None else self._completed
            for timeline in done:
                timeline.mark_at(COMPUTED, computed_ns)
            try:
                self._emit_span(trigger, dispatched_epoch_ns, computed_ns - dispatched_ns, error)
            except Exception as exc:  # telemetry must never break the model loop
                stats.record_failure("batch_span", exc)

    def _emit_span(
        self, trigger: str, start_epoch_ns: int, duration_ns: int, error: BaseException | None
    ) -> None:
        recorder = self._recorder
        attributes: dict[str, AttributeValue] = {
            spans.BATCH_ID: self.id,
            spans.BATCH_SIZE: len(self.members),
            spans.BATCH_MAX_SIZE: recorder.max_size,
            spans.BATCH_TRIGGER: str(trigger),
        }
        if recorder.gpu_uuid is not None:
            attributes[spans.GPU_UUID] = recorder.gpu_uuid
        if recorder.model is not None:
            attributes[spans.GEN_AI_REQUEST_MODEL] = recorder.model
        # Members served under a middleware ``service_name=`` are labelled with it by the
        # exporter; the batch follows them when they agree, as its own resource would not.
        services = {member.service_name for member in self.members}
        if len(services) == 1 and (service := services.pop()) is not None:
            attributes[spans.SERVICE_NAME] = service
        links = [
            Link(member.span_context)
            for member in self.members
            if member.span_context is not None and member.span_context.is_valid
        ]
        span = recorder.tracer.start_span(
            spans.BATCH_SPAN_NAME,
            context=_ROOT,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=start_epoch_ns,
        )
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
            span.set_attribute(spans.ERROR_TYPE, type(error).__qualname__)
        span.end(end_time=start_epoch_ns + duration_ns)
