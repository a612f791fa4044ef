"""``RequestTimeline``: the marks of one request, and the phases derived from them.

A timeline is created by the middleware when a request arrives and travels with
the request through the application: the handler reaches it with
``current_timeline()``, a scheduler receives it with the queued item and marks it
from its own task or thread. Marks are ``perf_counter_ns()`` readings taken in
this process; durations are only ever computed between marks of one process.

Marks never raise. A mark that is set twice keeps its first value; a mark set
after a later one (``admitted`` after ``dispatched``, say), or dated before an
earlier one, is ignored and counted
in ``gpuscope.middleware.stats`` as ``marks_out_of_order``, and a mark set after
the response finished is counted as ``marks_after_finish``.
"""

from __future__ import annotations

import contextvars
import time
from typing import TYPE_CHECKING

from gpuscope.middleware import stats
from gpuscope.spans import MARKS, PHASE_MARKS

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

    from gpuscope.engine_spans import EngineReport

# Indices of the ordered marks (``gpuscope.spans.MARKS``). ``first_token`` is kept
# apart: under continuous batching it falls between ``dispatched`` and ``computed``.
_MARK_INDEX = {name: index for index, name in enumerate(MARKS)}
ARRIVED = _MARK_INDEX["arrived"]
ENQUEUED = _MARK_INDEX["enqueued"]
ADMITTED = _MARK_INDEX["admitted"]
DISPATCHED = _MARK_INDEX["dispatched"]
COMPUTED = _MARK_INDEX["computed"]
FINISHED = _MARK_INDEX["finished"]
_UNSET = 0

# phase -> (start mark index, end mark index), from the contract's table
PHASE_BOUNDS: dict[str, tuple[int, int]] = {
    phase: (_MARK_INDEX[start], _MARK_INDEX[end]) for phase, (start, end) in PHASE_MARKS.items()
}

# perf_counter_ns() -> wall-clock epoch ns. One process-wide offset keeps the spans of
# a batch and of its members on exactly the same instants; it is re-read every few
# seconds so that a wall-clock step (NTP) is followed.
_RECALIBRATE_NS = 5_000_000_000
_calibration = [time.perf_counter_ns(), time.time_ns() - time.perf_counter_ns()]


def epoch_offset_ns(perf_ns: int) -> int:
    """The offset to add to a ``perf_counter_ns()`` reading taken now to get epoch ns."""
    if perf_ns - _calibration[0] > _RECALIBRATE_NS:
        _calibration[1] = time.time_ns() - time.perf_counter_ns()
        _calibration[0] = perf_ns
    return _calibration[1]


_current: contextvars.ContextVar[RequestTimeline | None] = contextvars.ContextVar(
    "gpuscope_timeline", default=None
)


def current_timeline() -> RequestTimeline | None:
    """The timeline of the request being handled, or ``None`` outside a request."""
    return _current.get()


class RequestTimeline:
    """The marks of one request plus what the application knows about it."""

    __slots__ = (
        "_epoch_offset_ns",
        "_first_token_ns",
        "_marks",
        "batch_id",
        "batch_size",
        "engine_report",
        "gpu_uuid",
        "ignored_marks",
        "input_tokens",
        "model",
        "operation",
        "output_tokens",
        "route",
        "service_name",
        "span_context",
    )

    def __init__(self) -> None:
        arrived = time.perf_counter_ns()
        # Fixed for the request, so its spans start and end exactly at its marks.
        self._epoch_offset_ns = epoch_offset_ns(arrived)
        self._marks = [arrived] + [_UNSET] * (len(MARKS) - 1)
        self._first_token_ns = _UNSET
        self.ignored_marks = 0
        self.model: str | None = None
        self.operation: str | None = None
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.batch_id: str | None = None
        self.batch_size: int | None = None
        self.gpu_uuid: str | None = None
        self.route: str | None = None
        # The middleware's ``service_name=``, for the batch spans this request rides in.
        self.service_name: str | None = None
        # The server span of this request, for the batch span's links.
        self.span_context: SpanContext | None = None
        # What a serving engine's own request span said (``engine_bridge``): phases it
        # measured that no mark of this timeline covers.
        self.engine_report: EngineReport | None = None

    # -- marks -----------------------------------------------------------------

    def enqueued(self) -> None:
        """The request entered the scheduler's queue (after parsing/tokenizing)."""
        self.mark_at(ENQUEUED, time.perf_counter_ns())

    def admitted(self) -> None:
        """Taken from the queue into a forming batch or the running batch."""
        self.mark_at(ADMITTED, time.perf_counter_ns())

    def dispatched(self) -> None:
        """The batch holding this request was launched on the device."""
        self.mark_at(DISPATCHED, time.perf_counter_ns())

    def computed(self) -> None:
        """This request's result is ready on the host (after a device sync)."""
        self.mark_at(COMPUTED, time.perf_counter_ns())

    def first_token(self) -> None:
        """The first streamed chunk was handed to ``send``."""
        if self._first_token_ns == _UNSET and self._marks[FINISHED] == _UNSET:
            self._first_token_ns = time.perf_counter_ns()

    def mark_at(self, index: int, now_ns: int) -> None:
        """Set mark ``index`` to the ``perf_counter_ns()`` reading ``now_ns``.

        Schedulers use this to give every member of a batch the same instant.
        """
        marks = self._marks
        if marks[index] != _UNSET:
            return
        if marks[FINISHED] != _UNSET:
            stats.count("marks_after_finish")
            return
        for later in range(index + 1, FINISHED):
            if marks[later] != _UNSET:
                self._ignore()
                return
        # Dated before an earlier mark (a clock read on another thread before the earlier
        # mark was set): keeping it would make a phase negative, and the exporter drops
        # a span with a negative duration whole.
        for earlier in range(index):
            if marks[earlier] > now_ns:
                self._ignore()
                return
        marks[index] = now_ns

    def _ignore(self) -> None:
        self.ignored_marks += 1
        stats.count("marks_out_of_order")

    def finish(self, now_ns: int) -> bool:
        """Set ``finished``; returns False if the request had already finished."""
        if self._marks[FINISHED] != _UNSET:
            return False
        self._marks[FINISHED] = now_ns
        return True

    # -- what the application knows ----------------------------------------------

    def set_model(self, model: str) -> None:
        self.model = model

    def set_operation(self, operation: str) -> None:
        """``embeddings``, ``text_completion`` or ``chat``."""
        self.operation = operation

    def set_route(self, route: str) -> None:
        """The route template, for applications without a router that exposes one."""
        self.route = route

    def set_tokens(
        self, *, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> None:
        if input_tokens is not None:
            self.input_tokens = input_tokens
        if output_tokens is not None:
            self.output_tokens = output_tokens

    def add_output_tokens(self, count: int = 1) -> None:
        self.output_tokens = (self.output_tokens or 0) + count

    def set_batch(self, batch_id: str, size: int) -> None:
        """Record the batch the request was computed in; the first one wins."""
        if self.batch_id is None:
            self.batch_id = batch_id
            self.batch_size = size

    # -- reading ---------------------------------------------------------------

    def mark_ns(self, index: int) -> int | None:
        """The ``perf_counter_ns()`` reading of a mark, or None if it was never set."""
        value = self._marks[index]
        return None if value == _UNSET else value

    @property
    def first_token_ns(self) -> int | None:
        return None if self._first_token_ns == _UNSET else self._first_token_ns

    def epoch_ns(self, perf_ns: int) -> int:
        """Wall-clock epoch nanoseconds of a ``perf_counter_ns()`` reading."""
        return perf_ns + self._epoch_offset_ns

    def _settled_marks(self) -> list[int]:
        """A copy of the marks without any dated after ``finished``.

        A mark set from another thread can slip in just as the request finishes (it
        passed the "not finished yet" check before ``finish`` ran); reading from one
        copy that drops such marks keeps every phase non-negative.
        """
        marks = list(self._marks)
        finished = marks[FINISHED]
        if finished != _UNSET:
            for index in range(ENQUEUED, FINISHED):
                if marks[index] > finished:
                    marks[index] = _UNSET
        return marks

    def phases_ns(self) -> dict[str, tuple[int, int]]:
        """``phase -> (start, end)`` in perf-counter ns, for phases whose marks are both set."""
        marks = self._settled_marks()
        result: dict[str, tuple[int, int]] = {}
        for phase, (start, end) in PHASE_BOUNDS.items():
            if marks[start] != _UNSET and marks[end] != _UNSET:
                result[phase] = (marks[start], marks[end])
        return result

    def phase_seconds(self) -> dict[str, float]:
        """Duration in seconds of every phase that happened."""
        return {phase: (end - start) / 1e9 for phase, (start, end) in self.phases_ns().items()}

    def duration_seconds(self) -> float | None:
        """``finished − arrived``, once finished."""
        finished = self._marks[FINISHED]
        return None if finished == _UNSET else (finished - self._marks[ARRIVED]) / 1e9

    def streaming_seconds(self) -> tuple[float | None, float | None]:
        """``(time_to_first_token, time_per_output_token)``; None where unknown."""
        first = self._first_token_ns
        if first == _UNSET:
            return None, None
        finished = self._marks[FINISHED]
        if finished != _UNSET and first > finished:  # slipped in as the request finished
            return None, None
        ttft = (first - self._marks[ARRIVED]) / 1e9
        tokens = self.output_tokens
        if finished == _UNSET or tokens is None or tokens < 2:
            return ttft, None
        return ttft, (finished - first) / 1e9 / (tokens - 1)


def activate(timeline: RequestTimeline) -> contextvars.Token[RequestTimeline | None]:
    """Make ``timeline`` the current one (the middleware's job)."""
    return _current.set(timeline)


def deactivate(token: contextvars.Token[RequestTimeline | None]) -> None:
    _current.reset(token)
