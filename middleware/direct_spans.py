"""gpuscope's own spans handed straight to gpuscope's own span pipeline.

Under ``setup_tracing()``'s provider every span of the ``gpuscope`` instrumentation
(the server span, the batch span, the phase children) goes to one place: the
provider's ``CountingBatchSpanProcessor``, and the engine bridge, which reads a span's
name and parent only. The SDK's ``Span`` pays for generality those spans do not use: a
lock per call, every attribute value cleaned by the generic path, a sampler and a span
processor fan-out per span. Measured in ``benchmarks/middleware_overhead.py``, that was
the largest share of the middleware's cost per request (``docs/benchmarks.md``).

``DirectTracer`` builds those spans as ``DirectSpan`` objects, which implement the
tracing API's ``Span`` with a plain dict of attributes, and on ``end()`` hand one
``ReadableSpan`` (the SDK's public read-only span, what every processor and exporter
takes) to the provider's processors. What the SDK guarantees is kept: values are
checked as the SDK checks them (the common scalar types by type, anything else through
the API's own ``BoundedAttributes``; event and link attributes always through it, as
the SDK's ``Span`` does), the attribute, event and link limits are the SDK's
``SpanLimits`` from the same environment variables, with what they drop counted, ids
come from the provider's ``id_generator``, the parent and its trace state from the
context. It applies only where it cannot change what anyone sees: the provider is
``BoundedTracerProvider`` with the ``ALWAYS_ON`` sampler, and each of its processors
says it takes direct spans (``takes_direct_spans``). A processor that a user adds with
``add_span_processor`` (which may call SDK-only methods in ``on_start``) switches every
later span back to the SDK's own path.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.util.types import Attributes

logger = logging.getLogger(__name__)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_EMPTY_TRACE_STATE = TraceState()
# Values the SDK keeps as they are (bool before int: it is one); anything else is
# checked by BoundedAttributes, the API's own cleaning.
_SCALARS = (str, bool, int, float)


def _is_scalar(value: object) -> bool:
    kind = type(value)
    return kind is str or kind is bool or kind is int or kind is float


class _Attributes:
    """Attribute values checked as the SDK checks them, within its count limit (the
    oldest dropped first) and its value length limit."""

    def __init__(self, limit: int | None, max_length: int | None) -> None:
        self.limit = limit
        self.max_length = max_length

    def clean(self, key: str, value: object) -> tuple[bool, AttributeValue | None, int]:
        """Whether to store ``value`` under ``key``, as what, and how many values the
        SDK would count as dropped if not (an invalid key). The SDK stores what its
        cleaning returns, None for a value it could not convert (the API logs why)."""
        if isinstance(key, str) and key:
            if _is_scalar(value) and (self.max_length is None or type(value) is not str):
                return True, value, 0  # type: ignore[return-value]
            if type(value) in (list, tuple) and self._homogeneous(value):  # type: ignore[arg-type]
                return True, tuple(value), 0  # type: ignore[arg-type]
        checked = BoundedAttributes(
            maxlen=None, attributes=None, immutable=False, max_value_len=self.max_length
        )
        checked[key] = value  # type: ignore[assignment]
        if key not in checked:
            return False, None, checked.dropped
        cleaned: AttributeValue | None = checked[key]
        return True, cleaned, 0

    def _homogeneous(self, values: Sequence[object]) -> bool:
        """A sequence the SDK keeps unchanged but as a tuple: one scalar type, no None."""
        if not values or self.max_length is not None:
            return False
        first = type(values[0])
        return first in _SCALARS and all(type(item) is first for item in values)

    def put_all(self, into: dict[str, AttributeValue], values: Mapping[str, object]) -> int:
        """``put`` each of ``values``; the common case (a scalar under a new key, room
        left, no length limit) inline, since a span sets twenty at a time. Returns how
        many values the count limit dropped."""
        dropped = 0
        room = self.limit if self.limit is not None else len(into) + len(values)
        plain = self.max_length is None
        invalid_keys: dict[object, object] | None = None
        for key, value in values.items():
            kind = type(value)
            if (
                plain
                and (kind is str or kind is float or kind is int or kind is bool)
                and type(key) is str
                and key
                and key not in into
                and len(into) < room
            ):
                into[key] = value  # type: ignore[assignment]
            elif type(key) is not str or not key:
                invalid_keys = invalid_keys or {}
                invalid_keys[key] = value
            else:
                dropped += self.put(into, key, value)
        if invalid_keys:
            dropped += self._put_invalid_keys(into, invalid_keys)
        return dropped

    def _put_invalid_keys(
        self, into: dict[str, AttributeValue], values: dict[object, object]
    ) -> int:
        """Keys that are no non-empty str, as the SDK's ``set_attributes`` takes them:
        through the API's own cleaning of a mapping (which, depending on its release,
        converts a key with ``str()`` or drops it, and counts what it drops)."""
        checked = BoundedAttributes(
            maxlen=None,
            attributes=values,  # type: ignore[arg-type]
            immutable=False,
            max_value_len=self.max_length,
        )
        dropped = checked.dropped
        for key, value in checked.items():
            dropped += self.put(into, key, value)
        return dropped

    def put(self, into: dict[str, AttributeValue], key: str, value: object) -> int:
        """Store ``value`` under ``key`` as the SDK's ``BoundedAttributes`` does: a key
        set again moves to the end, and past the count limit the oldest is dropped.
        Returns how many values that dropped (0 or 1), which the SDK counts."""
        keep, cleaned, invalid = self.clean(key, value)
        if not keep:
            return invalid
        if key in into:
            del into[key]
        elif self.limit is not None and len(into) >= self.limit:
            if self.limit == 0:
                return 1
            del into[next(iter(into))]
            into[key] = cleaned
            return 1
        into[key] = cleaned
        return 0


class DirectSpan(trace.Span):
    """A recording span whose ``end()`` hands a ``ReadableSpan`` to ``processors``."""

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        start_time: int,
        tracer: DirectTracer,
        processors: tuple[SpanProcessor, ...],
        record_exception: bool,
        set_status_on_exception: bool,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.start_time = start_time
        self.end_time: int | None = None
        self.attributes: dict[str, AttributeValue] = {}
        self.dropped_attributes = 0
        # The SDK's own bounded list: it counts what its limit drops, and ReadableSpan
        # reports that count (dropped_events, dropped_links) to the exporter.
        self.events: BoundedList[Event] | None = None
        self.links: BoundedList[Link] | None = None
        self.status = Status(StatusCode.UNSET)
        self._tracer = tracer
        self._processors = processors
        self._record_exception = record_exception
        self._set_status_on_exception = set_status_on_exception

    # -- the tracing API ------------------------------------------------------------

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if not self._ended("set_attributes"):
            self.dropped_attributes += self._tracer.attributes.put_all(self.attributes, attributes)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if not self._ended("set_attribute"):
            self.dropped_attributes += self._tracer.attributes.put(self.attributes, key, value)

    def add_event(
        self, name: str, attributes: Attributes = None, timestamp: int | None = None
    ) -> None:
        if self._ended("add_event"):
            return
        limits = self._tracer.limits
        if self.events is None:
            self.events = BoundedList(limits.max_events)
        # As the SDK's Span: every value checked and the event limits applied (an
        # Event keeps whatever it is given, and one value the encoder cannot write
        # would fail the export of its whole batch).
        checked = BoundedAttributes(
            limits.max_event_attributes,
            attributes,
            immutable=True,
            max_value_len=limits.max_attribute_length,
        )
        self.events.append(Event(name, checked, time.time_ns() if timestamp is None else timestamp))

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        if self._ended("add_link"):
            return
        link = self._tracer.checked_link(context, attributes)
        if link is None:
            return
        if self.links is None:
            self.links = BoundedList(self._tracer.limits.max_links)
        self.links.append(link)

    def update_name(self, name: str) -> None:
        if not self._ended("update_name"):
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # As the SDK: OK is final, UNSET is never set, a Status carries its own description.
        if self._ended("set_status") or self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is StatusCode.UNSET:
                return
            if description is not None:
                logger.warning(
                    "Description %s ignored. Use either `Status` or `(StatusCode, Description)`",
                    description,
                )
            self.status = status
        elif status is not StatusCode.UNSET:
            self.status = Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        # The event the SDK (1.45) writes: exception.type is module.qualname.
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        event: dict[str, AttributeValue] = {
            "exception.type": f"{module}.{qualname}"
            if module and module != "builtins"
            else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended("end"):
            return
        self.end_time = time.time_ns() if end_time is None else end_time
        attributes: Mapping[str, AttributeValue] = self.attributes
        if self.dropped_attributes:
            # ReadableSpan reports dropped attributes only from the SDK's own mapping.
            bounded = BoundedAttributes(
                self._tracer.limits.max_span_attributes, self.attributes, immutable=True
            )
            bounded.dropped = self.dropped_attributes
            attributes = bounded
        finished = ReadableSpan(
            self.name,
            self.context,
            self.parent,
            self._tracer.resource,
            attributes,
            self.events if self.events is not None else (),
            self.links if self.links is not None else (),
            self.kind,
            status=self.status,
            start_time=self.start_time,
            end_time=self.end_time,
            instrumentation_scope=self._tracer.scope,
        )
        for processor in self._processors:
            processor.on_end(finished)

    def __exit__(self, exc_type: Any, exc_val: BaseException | None, exc_tb: Any) -> None:
        if exc_val is not None and self.is_recording():
            if self._record_exception:
                self.record_exception(exc_val, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        super().__exit__(exc_type, exc_val, exc_tb)

    def _ended(self, method: str) -> bool:
        if self.end_time is None:
            return False
        logger.warning("Tried calling %s on an ended span.", method)
        return True


class DirectTracer(trace.Tracer):
    """Starts ``DirectSpan`` objects while ``direct_processors()`` names the processors
    to hand them to; the SDK tracer ``fallback`` otherwise."""

    def __init__(
        self,
        fallback: trace.Tracer,
        scope: InstrumentationScope,
        resource: Resource,
        id_generator: IdGenerator,
        direct_processors: Callable[[], tuple[SpanProcessor, ...] | None],
    ) -> None:
        self.fallback = fallback
        self.scope = scope
        self.resource = resource
        self.id_generator = id_generator
        self.direct_processors = direct_processors
        # SpanLimits() reads the OTEL_*_LIMIT variables, as the provider's own did.
        self.limits = SpanLimits()
        self.attributes = _Attributes(
            self.limits.max_span_attributes, self.limits.max_span_attribute_length
        )

    def checked_link(
        self, context: SpanContext, attributes: Attributes, given: Link | None = None
    ) -> Link | None:
        """The link the SDK keeps for ``context`` and ``attributes``, or None if it keeps
        none: it keeps a link to an invalid context only if it carries attributes or a
        trace state, and checks the link's attributes as it checks an event's. A
        ``given`` link without attributes is kept as it is (a link is immutable)."""
        if not (context and (context.is_valid or attributes or context.trace_state)):
            return None
        if not attributes:
            return given if given is not None else Link(context)
        limits = self.limits
        checked = BoundedAttributes(
            limits.max_link_attributes,
            attributes,
            immutable=True,
            max_value_len=limits.max_attribute_length,
        )
        return Link(context, checked)

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        processors = self.direct_processors()
        if processors is None:
            return self.fallback.start_span(
                name,
                context,
                kind,
                attributes,
                links,
                start_time,
                record_exception,
                set_status_on_exception,
            )
        parent: SpanContext | None = trace.get_current_span(context).get_span_context()
        if parent is not None and parent.is_valid:
            trace_id, trace_state = parent.trace_id, parent.trace_state
        else:
            parent, trace_id, trace_state = None, self.id_generator.generate_trace_id(), None
        span = DirectSpan(
            name,
            SpanContext(
                trace_id,
                self.id_generator.generate_span_id(),
                is_remote=False,
                trace_flags=_SAMPLED,
                trace_state=trace_state or _EMPTY_TRACE_STATE,
            ),
            parent,
            kind,
            time.time_ns() if start_time is None else start_time,
            self,
            processors,
            record_exception,
            set_status_on_exception,
        )
        if attributes:
            span.set_attributes(attributes)
        if links:
            # One list for all of them: a batch span links every member request.
            kept = [self.checked_link(link.context, link.attributes, link) for link in links]
            span.links = BoundedList.from_seq(
                self.limits.max_links, [link for link in kept if link is not None]
            )
        for processor in processors:
            processor.on_start(span, parent_context=context)  # type: ignore[arg-type]
        return span

    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        span = self.start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current
