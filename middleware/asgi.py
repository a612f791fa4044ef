"""``GpuscopeMiddleware``: one server span per HTTP request, split into phases.

Pure ASGI: ``lifespan`` and ``websocket`` scopes pass through untouched, bodies are
never buffered, and the span ends on the last body chunk, so background tasks that
run after the response are not counted. Per-request state lives in an
``_Exchange`` object, never on the middleware.

Next to other instrumentation: when a span is already active (an instrumentation
outside this middleware started one), the server span becomes its child instead of
starting a parallel trace; otherwise it continues the caller's ``traceparent``. The
whole context (span, ``tracestate``, baggage) is made current for the app, and the
propagation headers the app sees are rewritten to point at the server span, so an
instrumentation inside that reads headers (FastAPI's own) joins the same trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import SpanKind, Status, StatusCode

from gpuscope import __version__, spans
from gpuscope.middleware import environment, response_fields, stats
from gpuscope.middleware.phase_spans import PhaseSpanEmitter, PhaseSpans
from gpuscope.middleware.request_attributes import request_attributes
from gpuscope.middleware.routes import RouteResolver
from gpuscope.middleware.timeline import ARRIVED, FINISHED, RequestTimeline, activate, deactivate
from gpuscope.middleware.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from gpuscope.middleware.engine_bridge import EngineSpanBridge

RequestHook = Callable[[trace.Span, Scope], None]
ResponseHook = Callable[[trace.Span, RequestTimeline], None]
_HookArgument = TypeVar("_HookArgument")

_KNOWN_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY")
)


def _normalised_method(scope: Scope) -> str:
    """``http.request.method``: a known method as sent, anything else ``_OTHER`` (read
    before the span starts, so it must not raise whatever the server put there)."""
    method = scope.get("method", "GET")
    return method if isinstance(method, str) and method in _KNOWN_METHODS else "_OTHER"


def _run_hook(
    name: str,
    hook: Callable[[trace.Span, _HookArgument], None] | None,
    span: trace.Span,
    argument: _HookArgument,
) -> None:
    """Call a user hook; an exception it raises is counted and logged, never propagated."""
    if hook is None:
        return
    try:
        hook(span, argument)
    except Exception as exc:
        stats.record_failure(name, exc)


class _HeaderGetter(Getter[Scope]):
    """Reads propagation headers straight from the ASGI scope's header list."""

    def get(self, carrier: Scope, key: str) -> list[str] | None:
        wanted = key.lower().encode("latin-1")
        found = [v.decode("latin-1") for k, v in carrier.get("headers", ()) if k.lower() == wanted]
        return found or None

    def keys(self, carrier: Scope) -> list[str]:
        return [k.decode("latin-1") for k, _ in carrier.get("headers", ())]


_GETTER = _HeaderGetter()


def _parent_context(scope: Scope) -> Context:
    """The active span's context if there is one, else the caller's headers on top of it."""
    current = otel_context.get_current()
    if trace.get_current_span(current).get_span_context().is_valid:
        return current
    return propagate.extract(scope, getter=_GETTER, context=current)


class _HeaderSetter(Setter[dict[bytes, bytes]]):
    """Collects what a propagator injects as ASGI header items (lower-case names)."""

    def set(self, carrier: dict[bytes, bytes], key: str, value: str) -> None:
        carrier[key.lower().encode("latin-1")] = value.encode("latin-1")


_SETTER = _HeaderSetter()


def _with_propagation_headers(scope: Scope, context: Context) -> Scope:
    """A copy of ``scope`` whose propagation headers carry ``context`` (the server span)."""
    injected: dict[bytes, bytes] = {}
    propagate.inject(injected, context=context, setter=_SETTER)
    if not injected:
        return scope
    # This runs per request: the caller's own propagation headers are usually absent,
    # and then the list is copied once, not filtered.
    headers = list(scope.get("headers", ()))
    if any(name.lower() in injected for name, _ in headers):
        headers = [item for item in headers if item[0].lower() not in injected]
    headers += injected.items()
    return {**scope, "headers": headers}


def _scope_for_app(scope: Scope, context: Context) -> Scope:
    """``_with_propagation_headers``, or the scope unchanged if a propagator fails."""
    try:
        return _with_propagation_headers(scope, context)
    except Exception as exc:
        stats.record_failure("propagation_headers", exc)
        return scope


class GpuscopeMiddleware:
    """Wrap an ASGI app so that every HTTP request becomes a phase-split span.

    ``tracer_provider`` defaults to the global one (set it with ``setup_tracing()``
    or your own SDK setup); if none is installed by the first request, the middleware
    sets up its own from the ``OTEL_*`` variables (``gpuscope.middleware.environment``).
    ``service_name`` labels these spans with a service other than the provider's
    resource, for several apps in one process. Requests whose path is in
    ``excluded_paths`` (health checks, say) are passed through untraced. Without
    arguments, those two come from ``GPUSCOPE_SERVICE_NAME`` and
    ``GPUSCOPE_EXCLUDED_PATHS``. ``request_hook(span, scope)`` and
    ``response_hook(span, timeline)`` may add attributes; an exception they raise is
    counted and logged, never propagated. ``phase_spans`` (``PhaseSpans``, or a bool
    for on or off) says whether the queue, batch-wait and compute child spans are
    emitted: ``auto`` (the default, or ``GPUSCOPE_PHASE_SPANS``) emits them only where
    the spans reach a trace backend (``phase_spans``); the exporter needs only the
    server span's phase attributes.

    Behind an engine that traces itself (vLLM), the engine's request span is folded
    into this server span (``engine_bridge``) and the model is read from a successful
    response (``response_fields``) when the app does not set it.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        service_name: str | None = None,
        excluded_paths: Iterable[str] | None = None,
        request_hook: RequestHook | None = None,
        response_hook: ResponseHook | None = None,
        phase_spans: PhaseSpans | bool | None = None,
    ) -> None:
        self.app = app
        self.tracer = trace.get_tracer(
            spans.INSTRUMENTATION_NAME, __version__, tracer_provider=tracer_provider
        )
        self.explicit_provider = tracer_provider
        self.service_name = service_name or environment.service_name()
        self.excluded_paths = (
            environment.excluded_paths() if excluded_paths is None else frozenset(excluded_paths)
        )
        self.gpu_uuid = environment.gpu_uuid()
        # Resolved at the first request (the app may install a provider after building us).
        self.bridge: EngineSpanBridge | None = None
        self._provider_resolved = False
        self.request_hook = request_hook
        self.response_hook = response_hook
        self.routes = RouteResolver()
        if phase_spans is None:
            mode = environment.phase_spans()
        elif isinstance(phase_spans, bool):
            mode = PhaseSpans.ON if phase_spans else PhaseSpans.OFF
        else:
            mode = phase_spans
        self.phase_spans = PhaseSpanEmitter(self.tracer, tracer_provider, mode)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.excluded_paths:
            await self.app(scope, receive, send)
            return
        if not self._provider_resolved:
            self._resolve_provider()
        exchange = _Exchange.begin(self, scope)
        try:
            await self.app(exchange.scope, exchange.wrap_receive(receive), exchange.wrap_send(send))
        except BaseException as exc:
            exchange.error = exc
            raise
        finally:
            exchange.end()

    def _resolve_provider(self) -> None:
        """Pick the provider (setting one up if none exists) and attach the engine bridge."""
        self._provider_resolved = True
        try:
            provider = self.explicit_provider or environment.global_provider()
            if hasattr(provider, "add_span_processor"):  # an SDK provider
                from gpuscope.middleware.engine_bridge import bridge_for

                self.bridge = bridge_for(provider)
        except Exception as exc:  # telemetry setup must never fail a request
            stats.record_failure("tracer_provider_setup", exc)


class _Exchange:
    """Everything about one request in flight: its span, timeline and response state."""

    __slots__ = (
        "context_token",
        "disconnected",
        "error",
        "method",
        "middleware",
        "root_path",
        "scope",
        "sniff_response",
        "span",
        "span_id",
        "status",
        "timeline",
        "timeline_token",
    )

    def __init__(
        self,
        middleware: GpuscopeMiddleware,
        scope: Scope,
        timeline: RequestTimeline,
        span: trace.Span,
        parent: Context,
        method: str,
    ) -> None:
        span_valid = span.get_span_context().is_valid
        self.middleware = middleware
        self.method = method
        self.span = span
        self.root_path: str = scope.get("root_path", "")
        self.timeline = timeline
        timeline.span_context = span.get_span_context()
        self.status: int | None = None
        self.sniff_response = False
        self.span_id = 0
        if span_valid and middleware.bridge is not None:
            self.span_id = span.get_span_context().span_id
            middleware.bridge.track(self.span_id, timeline)
        self.disconnected = False
        self.error: BaseException | None = None
        self.timeline_token = activate(timeline)
        request_context = trace.set_span_in_context(span, parent)
        self.context_token = otel_context.attach(request_context)
        self.scope = _scope_for_app(scope, request_context) if span_valid else scope

    @classmethod
    def begin(cls, middleware: GpuscopeMiddleware, scope: Scope) -> _Exchange:
        timeline = RequestTimeline()
        timeline.service_name = middleware.service_name
        parent = otel_context.get_current()
        method = _normalised_method(scope)
        try:
            parent = _parent_context(scope)
            span = cls._start_span(middleware, method, scope, timeline, parent)
        except Exception as exc:
            # Without a span the request is still served, and its marks still work.
            stats.record_failure("server_span_start", exc)
            span = trace.INVALID_SPAN
        else:
            if not span.is_recording():
                stats.count("requests_sampled_out")
        exchange = cls(middleware, scope, timeline, span, parent, method)
        if span.is_recording():
            _run_hook("request_hook", middleware.request_hook, span, scope)
        return exchange

    @staticmethod
    def _start_span(
        middleware: GpuscopeMiddleware,
        method: str,
        scope: Scope,
        timeline: RequestTimeline,
        parent: Context,
    ) -> trace.Span:
        arrived = timeline.mark_ns(ARRIVED)
        assert arrived is not None
        return middleware.tracer.start_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                spans.HTTP_REQUEST_METHOD: method,
                spans.URL_PATH: scope.get("path", ""),
                spans.URL_SCHEME: scope.get("scheme", "http"),
                **request_attributes(scope),
            },
            start_time=timeline.epoch_ns(arrived),
        )

    def wrap_receive(self, receive: Receive) -> Receive:
        async def receive_and_watch() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and self.timeline.mark_ns(FINISHED) is None:
                self.disconnected = True
            return message

        return receive_and_watch

    def wrap_send(self, send: Send) -> Send:
        async def send_and_watch(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start" and self.status is None:
                # A buggy app's second start never reaches the client: keep the first.
                self.status = message["status"]
                # Successful answers only: an error body may echo the request (FastAPI's 422
                # does), and then the client, not the app, would pick the model label.
                self.sniff_response = (
                    self.timeline.model is None
                    and _successful(self.status)
                    and response_fields.sniffable(message.get("headers"))
                )
            elif kind == "http.response.body" and self.sniff_response:
                self.sniff_response = False  # the first chunk only: constant cost
                self._read_response_fields(message.get("body", b""))
            try:
                await send(message)
            except OSError:
                self.disconnected = True
                raise
            if kind == "http.response.body":
                if not message.get("more_body", False):
                    self.finish_span()
            elif kind == "http.response.pathsend":
                self.finish_span()

        return send_and_watch

    def _read_response_fields(self, body: object) -> None:
        if not isinstance(body, bytes | bytearray | memoryview):
            return
        timeline = self.timeline
        found = response_fields.read(bytes(body[: response_fields.SNIFF_BYTES]), self._route())
        if found.model is not None and timeline.model is None:
            timeline.model = found.model
        if found.operation is not None and timeline.operation is None:
            timeline.operation = found.operation
        if found.model is not None:
            self.span.set_attribute(spans.GEN_AI_RESPONSE_MODEL, found.model)
        if found.response_id is not None:
            self.span.set_attribute(spans.GEN_AI_RESPONSE_ID, found.response_id)

    def _route(self) -> str | None:
        """The route template, else the raw path (this runs while the app is sending, so
        it never raises)."""
        try:
            route = self.timeline.route or self.middleware.routes.resolve(
                self.scope, self.root_path
            )
        except Exception as exc:
            stats.record_failure("route_for_response", exc)
            route = None
        path = self.scope.get("path")
        return route or (path if isinstance(path, str) else None)

    def end(self) -> None:
        """After the app returned or raised: end the span if the response did not."""
        try:
            self.finish_span()
        finally:
            otel_context.detach(self.context_token)
            deactivate(self.timeline_token)

    def finish_span(self) -> None:
        """Mark ``finished`` and end the server span with its phase children (once)."""
        if not self.timeline.finish(time.perf_counter_ns()):
            return
        bridge = self.middleware.bridge
        if bridge is not None and self.span_id:
            bridge.forget(self.span_id)
        if not self.span.is_recording():
            self.span.end()
            return
        try:
            self._record()
        except Exception as exc:
            stats.record_failure("server_span_end", exc)
            self.span.end()

    def _record(self) -> None:
        timeline = self.timeline
        span = self.span
        attributes = self._response_attributes()
        phases = timeline.phases_ns()
        for phase, (start, end) in phases.items():
            attributes[spans.PHASE_DURATION[phase]] = (end - start) / 1e9
        _add_engine_report(attributes, timeline)
        route = timeline.route or self.middleware.routes.resolve(self.scope, self.root_path)
        if route is not None:
            attributes[spans.HTTP_ROUTE] = route
            span.update_name(f"{self.method} {route}")
        span.set_attributes(attributes)
        _run_hook("response_hook", self.middleware.response_hook, span, timeline)
        children = self.middleware.phase_spans
        if children.wanted():
            children.emit(
                span,
                [
                    (name, timeline.epoch_ns(phases[phase][0]), timeline.epoch_ns(phases[phase][1]))
                    for phase, name in spans.PHASE_SPANS.items()
                    if phase in phases
                ],
            )
        finished = timeline.mark_ns(FINISHED)
        assert finished is not None
        span.end(end_time=timeline.epoch_ns(finished))

    def _response_attributes(self) -> dict[str, AttributeValue]:
        timeline = self.timeline
        attributes: dict[str, AttributeValue] = {
            spans.HTTP_REQUEST_METHOD: self.method,
        }
        status = self.status
        error = self.error
        if self.disconnected:
            status = spans.CLIENT_CLOSED_REQUEST_STATUS
            attributes[spans.ERROR_TYPE] = spans.CLIENT_DISCONNECTED
        elif error is not None:
            if status is None:
                status = 500
            attributes[spans.ERROR_TYPE] = type(error).__qualname__
            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
        elif status is None:
            # The app returned without starting a response; ASGI servers answer 500.
            status = 500
            attributes[spans.ERROR_TYPE] = spans.NO_RESPONSE
            self.span.set_status(Status(StatusCode.ERROR, spans.NO_RESPONSE))
        elif status >= 500:
            attributes[spans.ERROR_TYPE] = str(status)
            self.span.set_status(Status(StatusCode.ERROR))
        if status is not None:
            attributes[spans.HTTP_RESPONSE_STATUS_CODE] = status
        optional: tuple[tuple[str, AttributeValue | None], ...] = (
            (spans.GEN_AI_REQUEST_MODEL, timeline.model),
            (spans.GEN_AI_OPERATION_NAME, timeline.operation),
            (spans.GEN_AI_USAGE_INPUT_TOKENS, timeline.input_tokens),
            (spans.GEN_AI_USAGE_OUTPUT_TOKENS, timeline.output_tokens),
            (spans.BATCH_ID, timeline.batch_id),
            (spans.BATCH_SIZE, timeline.batch_size),
            (spans.GPU_UUID, timeline.gpu_uuid or self.middleware.gpu_uuid),
            (spans.SERVICE_NAME, self.middleware.service_name),
            (spans.MARKS_IGNORED, timeline.ignored_marks or None),
        )
        for key, value in optional:
            if value is not None:
                attributes[key] = value
        ttft, tpot = timeline.streaming_seconds()
        if ttft is not None:
            attributes[spans.TIME_TO_FIRST_TOKEN] = ttft
        if tpot is not None:
            attributes[spans.TIME_PER_OUTPUT_TOKEN] = tpot
        return attributes


def _successful(status: object) -> bool:
    return isinstance(status, int) and 200 <= status <= 299


def _add_engine_report(attributes: dict[str, AttributeValue], timeline: RequestTimeline) -> None:
    """What the engine's own request span measured, where the timeline's marks did not.

    A mark-derived value always wins: an app that marks phases and also runs under an
    engine that traces keeps its own measurements.
    """
    report = timeline.engine_report
    if report is None:
        return
    for phase, seconds in report.phases.items():
        attributes.setdefault(spans.PHASE_DURATION[phase], seconds)
    for stage, seconds in report.stages.items():
        attributes.setdefault(spans.COMPUTE_STAGE_DURATION[stage], seconds)
    optional: tuple[tuple[str, AttributeValue | None], ...] = (
        (spans.TIME_TO_FIRST_TOKEN, report.time_to_first_token),
        (spans.TIME_PER_OUTPUT_TOKEN, report.time_per_output_token),
        (spans.GEN_AI_USAGE_INPUT_TOKENS, report.input_tokens),
        (spans.GEN_AI_USAGE_OUTPUT_TOKENS, report.output_tokens),
        (spans.GEN_AI_REQUEST_MODEL, report.model),
    )
    for key, value in optional:
        if value is not None:
            attributes.setdefault(key, value)
