"""Spans -> request-side histograms: the span contract of docs/spans.md, read on the hot path.

Request metrics come only from gpuscope's own instrumentation scope, so a request that
other instrumentation also traces (FastAPI's built-in telemetry, the contrib ASGI
middleware) is counted once. Of gpuscope's spans only SERVER spans and
``gpuscope.batch`` spans are aggregated; the phase child spans (``gpuscope.queue`` …)
repeat what the server span's ``gpuscope.<phase>.duration`` attributes already say,
so they are received (and forwarded) but never counted twice. SERVER spans of other
scopes feed the spanmetrics-shaped family of ``stock_spans``; their other spans are
received and forwarded only.

A serving engine's own request span (vLLM's ``llm_request``, see
``gpuscope.engine_spans``) also feeds the request families, read through the engine's
attribute names, unless it carries ``gpuscope.request.counted``: then a gpuscope
server span of the same process counts that request (with the engine's phases folded
in by the middleware), whichever of the two arrives first, so it is counted once.

Spans without a GPU UUID are joined to the GPUs their process holds where the GPU
source can list processes (``uuids_for_pid``, from the resource's ``process.pid`` or
vLLM's ``vllm.process_id``, with ``container.id`` / ``k8s.pod.uid`` where the sender has
a pid namespace of its own: ``pid_claims``); a process on several GPUs (tensor parallel)
or on none the exporter can see keeps an empty UUID, and the rules join it per host.
Whether the request was authenticated goes with the claim (``ingest(authenticated=)``).

Each span's attribute list is walked once and only the keys in ``_SERVER_SLOTS`` /
``_BATCH_SLOTS`` have their values read: with the upb protobuf backend, touching a
value costs far more than skipping it. A span that breaks the contract (wrong type,
NaN or negative duration, over-long label, bad ids) is rejected as a whole with a
reason; the other spans of the same request still count. So is a span whose numbers
each pass but contradict each other (phases longer than the span, stages longer than
their compute, a first token after the end): ``inconsistent_durations``. Every count
and duration a span gives is bounded (``spans.MAX_COUNT``, ``spans.MAX_DURATION_S``, the
span's own end - start included), so no single span can freeze a counter or fill a
histogram's ``_sum``. A span counted once is not counted again: a (trace id, span id)
among the recently counted ones (``RecentSpans``) is rejected as ``duplicate``.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuscope import engine_spans, spans
from gpuscope.contract import exporter as defs
from gpuscope.contract import labels as L
from gpuscope.contract.rows import label_order
from gpuscope.exporter.gpu.pid_namespaces import PidClaim
from gpuscope.exporter.gpu.source import ComputeObserver, GpuDevice
from gpuscope.exporter.ingest.pid_claims import read_pid_claim
from gpuscope.exporter.ingest.recent_spans import RecentSpans
from gpuscope.exporter.ingest.series import (
    ModelCap,
    SpanRef,
    counter_family,
    histogram_family,
)
from gpuscope.exporter.ingest.stock_spans import StatusUnreadable, StockSpanMetrics

SPAN_KIND_SERVER = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
SERVICE_NAME_RESOURCE = "service.name"
# The OpenTelemetry semantic conventions' Kubernetes resource attributes: the pod a
# request's spans came from (set from the downward API, ``OTEL_RESOURCE_ATTRIBUTES``).
K8S_NAMESPACE_NAME = "k8s.namespace.name"
K8S_POD_NAME = "k8s.pod.name"
# (namespace, pod) of a resource; ("", "") where it names none
Pod = tuple[str, str]
NO_POD: Pod = ("", "")
UuidsForPid = Callable[[PidClaim], tuple[str, ...]]

# The order in which the code below writes each family's label values; ``label_order``
# puts them in the row's order by name, so a row may reorder its labels freely.
_BASE = (L.SERVICE, L.MODEL, L.UUID, L.GPU, L.NAMESPACE, L.POD)
_WITH_OPERATION = (L.SERVICE, L.MODEL, L.OPERATION, L.UUID, L.GPU, L.NAMESPACE, L.POD)
_DURATION = (L.SERVICE, L.MODEL, L.OPERATION, L.ROUTE, L.CODE, L.UUID, L.GPU, L.NAMESPACE, L.POD)
_TOKENS = (L.DIRECTION, L.SERVICE, L.MODEL, L.OPERATION)

# Reasons for ``gpuscope_spans_rejected_total{reason}``.
INVALID_ID = "invalid_id"
INVALID_DURATION = "invalid_duration"
WRONG_ATTRIBUTE_TYPE = "wrong_attribute_type"
INVALID_ATTRIBUTE_VALUE = "invalid_attribute_value"
INVALID_LABEL = "invalid_label"
MISSING_ATTRIBUTE = "missing_attribute"
INCONSISTENT_DURATIONS = "inconsistent_durations"
DUPLICATE = "duplicate"
SPAN_REJECT_REASONS = (
    INVALID_ID,
    INVALID_DURATION,
    WRONG_ATTRIBUTE_TYPE,
    INVALID_ATTRIBUTE_VALUE,
    INVALID_LABEL,
    MISSING_ATTRIBUTE,
    INCONSISTENT_DURATIONS,
    DUPLICATE,
)
_MAX_DURATION_NS = int(spans.MAX_DURATION_S * 1e9)

_STRING, _INT, _DOUBLE = "string_value", "int_value", "double_value"

# Server span: attribute key -> (slot, expected AnyValue field).
_ROUTE, _CODE, _MODEL, _UUID, _SERVICE, _IN, _OUT, _TTFT, _TPOT, _OPERATION = range(10)
_PHASE0 = 10
_SERVER_SLOTS: dict[str, tuple[int, str]] = {
    spans.HTTP_ROUTE: (_ROUTE, _STRING),
    spans.GEN_AI_OPERATION_NAME: (_OPERATION, _STRING),
    spans.HTTP_RESPONSE_STATUS_CODE: (_CODE, _INT),
    spans.GEN_AI_REQUEST_MODEL: (_MODEL, _STRING),
    spans.GPU_UUID: (_UUID, _STRING),
    spans.SERVICE_NAME: (_SERVICE, _STRING),
    spans.GEN_AI_USAGE_INPUT_TOKENS: (_IN, _INT),
    spans.GEN_AI_USAGE_OUTPUT_TOKENS: (_OUT, _INT),
    spans.TIME_TO_FIRST_TOKEN: (_TTFT, _DOUBLE),
    spans.TIME_PER_OUTPUT_TOKEN: (_TPOT, _DOUBLE),
} | {spans.PHASE_DURATION[phase]: (_PHASE0 + i, _DOUBLE) for i, phase in enumerate(spans.PHASES)}
_STAGE0 = _PHASE0 + len(spans.PHASES)
_SERVER_SLOTS |= {
    spans.COMPUTE_STAGE_DURATION[stage]: (_STAGE0 + i, _DOUBLE)
    for i, stage in enumerate(spans.COMPUTE_STAGES)
}
_SERVER_SLOT_COUNT = _STAGE0 + len(spans.COMPUTE_STAGES)
_SLOT_KEYS = {slot: key for key, (slot, _) in _SERVER_SLOTS.items()}
_COMPUTE_INDEX = spans.PHASES.index("compute")
_SECONDS_SLOTS = (_TTFT, _TPOT, *range(_PHASE0, _SERVER_SLOT_COUNT))

# Engine request span: the attributes ``engine_spans.read_engine_span`` reads, by type.
_ENGINE_KEYS: dict[str, str] = (
    dict.fromkeys(engine_spans.SECONDS_ATTRIBUTES, _DOUBLE)
    | dict.fromkeys(engine_spans.COUNT_ATTRIBUTES, _INT)
    | dict.fromkeys(engine_spans.TEXT_ATTRIBUTES, _STRING)
    | {engine_spans.COUNTED_BY_SERVER_SPAN: "bool_value"}
)

_B_SIZE, _B_MAX, _B_MODEL, _B_UUID, _B_SERVICE = range(5)
_BATCH_SLOTS: dict[str, tuple[int, str]] = {
    spans.BATCH_SIZE: (_B_SIZE, _INT),
    spans.BATCH_MAX_SIZE: (_B_MAX, _INT),
    spans.GEN_AI_REQUEST_MODEL: (_B_MODEL, _STRING),
    spans.GPU_UUID: (_B_UUID, _STRING),
    spans.SERVICE_NAME: (_B_SERVICE, _STRING),
}


class SpanRejected(Exception):
    """A span that breaks the contract; ``reason`` is the metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class IngestResult:
    """What one export request did: spans seen, aggregated, rejected by reason."""

    received: int = 0
    aggregated: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    first_error: str | None = None

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def error_message(self) -> str:
        """The text for ``partial_success.error_message``: counts and one example."""
        if not self.rejected:
            return ""
        counts = ", ".join(f"{reason}={n}" for reason, n in sorted(self.rejected.items()))
        return f"rejected {self.rejected_total} span(s) ({counts}); first: {self.first_error}"


class SpanAggregator:
    """Owns the request-side metric families and feeds them from decoded requests."""

    def __init__(
        self,
        *,
        max_series: int = 2000,
        max_models_per_service: int = 20,
        max_label_length: int = 128,
        compute_observers: Sequence[ComputeObserver] = (),
        uuids_for_pid: UuidsForPid | None = None,
        recent_spans: int = RecentSpans.DEFAULT_CAPACITY,
    ) -> None:
        # One capped family per row of the tables, in their (scrape) order.
        # One model cap for every family, so a model is folded in all of them or none.
        self.model_cap = ModelCap(max_models_per_service)
        histograms = {
            row: histogram_family(row, max_series, self.model_cap) for row in defs.SPAN_HISTOGRAMS
        }
        counters = {
            row: counter_family(row, max_series, self.model_cap) for row in defs.SPAN_COUNTERS
        }
        self.histograms = tuple(histograms.values())
        self.counters = counters  # row -> family, for the collector
        self.duration = histograms[defs.REQUEST_DURATION]
        self.phase = histograms[defs.REQUEST_PHASE]
        self.compute_stage = histograms[defs.REQUEST_COMPUTE_STAGE]
        self.ttft = histograms[defs.TIME_TO_FIRST_TOKEN]
        self.tpot = histograms[defs.TIME_PER_OUTPUT_TOKEN]
        self.batch_size = histograms[defs.BATCH_SIZE]
        self.tokens = counters[defs.TOKENS]
        self.stock = StockSpanMetrics(counters[defs.SPAN_CALLS], histograms[defs.SPAN_DURATION])
        self._duration_key = label_order(defs.REQUEST_DURATION, _DURATION)
        self._phase_key = label_order(defs.REQUEST_PHASE, (L.PHASE, *_BASE))
        self._stage_key = label_order(defs.REQUEST_COMPUTE_STAGE, (L.STAGE, *_BASE))
        self._ttft_key = label_order(defs.TIME_TO_FIRST_TOKEN, _WITH_OPERATION)
        self._tpot_key = label_order(defs.TIME_PER_OUTPUT_TOKEN, _WITH_OPERATION)
        self._tokens_key = label_order(defs.TOKENS, _TOKENS)
        self._batch_key = label_order(defs.BATCH_SIZE, _BASE)
        self.uuids_for_pid = uuids_for_pid
        self.max_label_length = max_label_length
        self.compute_observers = tuple(compute_observers)
        self._gpu_index: dict[str, str] = {}
        self.recent = RecentSpans(recent_spans)
        # Caches of validated label values and phase label tuples; cleared when full.
        self._cache_limit = 4 * max_series + 64
        self._known_labels: set[str] = set()
        self._phase_keys: dict[tuple[str, ...], tuple[tuple[str, ...], ...]] = {}

    def set_gpu_devices(self, devices: Sequence[GpuDevice]) -> None:
        """Learn ``uuid -> NVML index`` for the ``gpu`` label of new observations."""
        self._gpu_index = {device.uuid: device.label for device in devices}

    def ingest(self, request: Any, authenticated: bool = False) -> IngestResult:
        """Aggregate every span of a decoded ``ExportTraceServiceRequest``;
        ``authenticated``: whether its sender passed the exporter's authentication."""
        result = IngestResult()
        rejected = result.rejected
        for resource_spans in request.resource_spans:
            resource_error: SpanRejected | None = None
            try:
                service = self._label(
                    _resource_service(resource_spans.resource.attributes), SERVICE_NAME_RESOURCE
                )
            except SpanRejected as exc:  # every span of this resource would carry it
                service, resource_error = "", exc
            process_uuid = self._process_uuid(resource_spans.resource.attributes, authenticated)
            pod = NO_POD
            if resource_error is None:
                try:
                    pod = self._resource_pod(resource_spans.resource.attributes)
                except SpanRejected as exc:
                    pod, resource_error = NO_POD, exc
            for scope_spans in resource_spans.scope_spans:
                received = scope_spans.spans
                result.received += len(received)
                if resource_error is not None:
                    rejected[resource_error.reason] += len(received)
                    result.first_error = result.first_error or f"resource: {resource_error}"
                    continue
                own = scope_spans.scope.name == spans.INSTRUMENTATION_NAME
                for span in received:
                    try:
                        if not self._aggregate(span, service, own, process_uuid, pod):
                            continue
                    except SpanRejected as exc:
                        rejected[exc.reason] += 1
                        if result.first_error is None:
                            result.first_error = f"span {span.span_id.hex() or '?'}: {exc}"
                        continue
                    result.aggregated += 1
        return result

    def _process_uuid(self, attributes: Any, authenticated: bool) -> str:
        """The one GPU the resource's process (or its children) holds, else ""."""
        if self.uuids_for_pid is None:
            return ""
        claim = read_pid_claim(attributes, authenticated=authenticated)
        if claim is None:
            return ""
        uuids = self.uuids_for_pid(claim)
        return uuids[0] if len(uuids) == 1 else ""

    def _resource_pod(self, attributes: Any) -> Pod:
        """The resource's ``k8s.namespace.name`` and ``k8s.pod.name``, checked as labels;
        ("", "") unless it names both (the rules join on the two: a pod name is unique
        only within its namespace)."""
        namespace = pod = None
        for kv in attributes:
            if kv.key == K8S_POD_NAME or kv.key == K8S_NAMESPACE_NAME:
                value = kv.value
                if value.WhichOneof("value") != _STRING:
                    raise SpanRejected(WRONG_ATTRIBUTE_TYPE, f"{kv.key} must be {_STRING}")
                if kv.key == K8S_POD_NAME:
                    pod = self._label(value.string_value, K8S_POD_NAME)
                else:
                    namespace = self._label(value.string_value, K8S_NAMESPACE_NAME)
        if not pod or not namespace:
            return NO_POD
        return namespace, pod

    def _aggregate(
        self, span: Any, service: str, own: bool, process_uuid: str = "", pod: Pod = NO_POD
    ) -> bool:
        """Feed one span to its family; False for spans that feed none."""
        counted = span.kind == SPAN_KIND_SERVER or (own and span.name == spans.BATCH_SPAN_NAME)
        if not counted:
            return False
        # Only spans that feed a family are remembered: the phase child spans are not.
        key = span.trace_id + span.span_id
        if key in self.recent:
            raise SpanRejected(DUPLICATE, "a span with this trace and span id was counted already")
        self._feed(span, service, own, process_uuid, pod)
        self.recent.add(key)  # once counted in full: a rejected span may be sent again
        return True

    def _feed(self, span: Any, service: str, own: bool, process_uuid: str, pod: Pod) -> None:
        if not own:
            engine = None
            if engine_spans.is_engine_request_span(span.name):
                engine = self._engine_span(span, service, process_uuid, pod)
            self._stock_span(span, service)
            if engine is not None:  # observed only once the whole span proved valid
                self._observe_engine_span(*engine)
        elif span.kind == SPAN_KIND_SERVER:
            self._server_span(span, service, process_uuid, pod)
        else:
            self._batch_span(span, service, pod)

    def _stock_span(self, span: Any, service: str) -> None:
        ref = _span_ref(span)
        _span_times(span)  # bounded like every other span, before it counts
        try:
            self.stock.observe(span, service, ref, self._label)
        except StatusUnreadable as exc:
            raise SpanRejected(WRONG_ATTRIBUTE_TYPE, str(exc)) from exc

    def _engine_span(
        self, span: Any, service: str, process_uuid: str, pod: Pod = NO_POD
    ) -> tuple[engine_spans.EngineReport, tuple[str, ...], float, SpanRef] | None:
        """An engine's request span that no gpuscope server span counts, validated.

        Returns what ``_observe_engine_span`` counts, or None when a server span counts
        this request (``gpuscope.request.counted``). The stock family counts the span
        too (it is another instrumentation's SERVER span).
        """
        ref = _span_ref(span)
        start, end = _span_times(span)
        values = _read_engine_attributes(span.attributes)
        if values.get(engine_spans.COUNTED_BY_SERVER_SPAN) is True:
            return None
        try:
            report = engine_spans.read_engine_span(values, (end - start) / 1e9)
        except engine_spans.EngineSpanInvalid as exc:
            if exc.inconsistent:
                reason = INCONSISTENT_DURATIONS
            else:
                reason = INVALID_DURATION if exc.is_duration else INVALID_ATTRIBUTE_VALUE
            raise SpanRejected(reason, str(exc)) from exc
        model = self._label(report.model, spans.GEN_AI_REQUEST_MODEL)
        gpu = self._gpu_index.get(process_uuid, "") if process_uuid else ""
        namespace, pod_name = NO_POD if process_uuid else pod
        base = (service, model, process_uuid, gpu, namespace, pod_name)
        return report, base, (end - start) / 1e9, ref

    def _observe_engine_span(
        self,
        report: engine_spans.EngineReport,
        base: tuple[str, ...],
        seconds: float,
        ref: SpanRef,
    ) -> None:
        service, model, uuid, gpu, namespace, pod = base
        duration_key = self._duration_key((service, model, "", "", "", *base[2:]))
        self.duration.observe(duration_key, seconds, ref)
        for phase, seconds in report.phases.items():
            self.phase.observe(self._phase_key((phase, *base)), seconds, ref)
        for stage, seconds in report.stages.items():
            self.compute_stage.observe(self._stage_key((stage, *base)), seconds, ref)
        with_operation = (service, model, "", uuid, gpu, namespace, pod)
        if report.time_to_first_token is not None:
            ttft_key = self._ttft_key(with_operation)
            self.ttft.observe(ttft_key, report.time_to_first_token, ref)
        if report.time_per_output_token is not None:
            tpot_key = self._tpot_key(with_operation)
            self.tpot.observe(tpot_key, report.time_per_output_token, ref)
        if report.input_tokens is not None:
            input_key = self._tokens_key((L.INPUT, service, model, ""))
            self.tokens.inc(input_key, report.input_tokens)
        if report.output_tokens is not None:
            output_key = self._tokens_key((L.OUTPUT, service, model, ""))
            self.tokens.inc(output_key, report.output_tokens)

    def _server_span(
        self, span: Any, resource_service: str, process_uuid: str = "", pod: Pod = NO_POD
    ) -> None:
        ref = _span_ref(span)
        start, end = _span_times(span)
        values = _read_attributes(span.attributes, _SERVER_SLOTS, _SERVER_SLOT_COUNT)
        label = self._label
        service = label(values[_SERVICE], spans.SERVICE_NAME) or resource_service
        model = label(values[_MODEL], spans.GEN_AI_REQUEST_MODEL)
        uuid = label(values[_UUID], spans.GPU_UUID) or process_uuid
        route = label(values[_ROUTE], spans.HTTP_ROUTE)
        operation = label(values[_OPERATION], spans.GEN_AI_OPERATION_NAME)
        code = values[_CODE]
        if code is None:
            code_label = ""
        elif 100 <= code <= 599:
            code_label = str(code)
        else:
            raise SpanRejected(INVALID_ATTRIBUTE_VALUE, f"status code {code} is not 100-599")
        for slot in _SECONDS_SLOTS:
            seconds = values[slot]
            # One chained comparison rejects NaN, negatives, infinity and the absurd alike.
            if seconds is not None and not 0.0 <= seconds <= spans.MAX_DURATION_S:
                key = _SLOT_KEYS[slot]
                raise SpanRejected(
                    INVALID_DURATION,
                    f"{key} is {seconds}, not a duration in 0-{spans.MAX_DURATION_S:g} s",
                )
        phases = values[_PHASE0:_STAGE0]
        stages = values[_STAGE0:_SERVER_SLOT_COUNT]
        ttft, tpot = values[_TTFT], values[_TPOT]
        duration = (end - start) / 1e9
        _check_server_durations(duration, phases, stages, ttft, tpot)
        tokens_in = _count(values[_IN], spans.GEN_AI_USAGE_INPUT_TOKENS)
        tokens_out = _count(values[_OUT], spans.GEN_AI_USAGE_OUTPUT_TOKENS)
        # Validated in full: from here on nothing can reject the span half-counted.
        gpu = self._gpu_index.get(uuid, "") if uuid else ""
        # the pod only where the request names no GPU: the rules join it to the pod's
        namespace, pod_name = NO_POD if uuid else pod
        where = (uuid, gpu, namespace, pod_name)
        self.duration.observe(
            self._duration_key((service, model, operation, route, code_label, *where)),
            duration,
            ref,
        )
        base = (service, model, *where)
        with_operation = (service, model, operation, *where)
        phase_keys = self._phase_keys.get(base)
        if phase_keys is None:
            phase_keys = self._new_phase_keys(base)
        observe_phase = self.phase.observe
        for labels, seconds in zip(phase_keys, phases, strict=True):
            if seconds is not None:
                observe_phase(labels, seconds, ref)
        for stage, seconds in zip(spans.COMPUTE_STAGES, stages, strict=True):
            if seconds is not None:
                self.compute_stage.observe(self._stage_key((stage, *base)), seconds, ref)
        if ttft is not None:
            self.ttft.observe(self._ttft_key(with_operation), ttft, ref)
        if tpot is not None:
            self.tpot.observe(self._tpot_key(with_operation), tpot, ref)
        if tokens_in is not None:
            self.tokens.inc(self._tokens_key((L.INPUT, service, model, operation)), tokens_in)
        if tokens_out is not None:
            self.tokens.inc(self._tokens_key((L.OUTPUT, service, model, operation)), tokens_out)

    def _new_phase_keys(self, base: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        if len(self._phase_keys) >= self._cache_limit:  # bounded, whatever senders do
            self._phase_keys.clear()
        keys = tuple(self._phase_key((phase, *base)) for phase in spans.PHASES)
        self._phase_keys[base] = keys
        return keys

    def _batch_span(self, span: Any, resource_service: str, pod: Pod = NO_POD) -> None:
        ref = _span_ref(span)
        start, end = _span_times(span)
        values = _read_attributes(span.attributes, _BATCH_SLOTS, len(_BATCH_SLOTS))
        size = _count(values[_B_SIZE], spans.BATCH_SIZE)
        if size is None:
            raise SpanRejected(MISSING_ATTRIBUTE, f"batch span without {spans.BATCH_SIZE}")
        if size < 1:
            raise SpanRejected(INVALID_ATTRIBUTE_VALUE, f"{spans.BATCH_SIZE} {size} is below 1")
        max_size = _count(values[_B_MAX], spans.BATCH_MAX_SIZE)
        label = self._label
        service = label(values[_B_SERVICE], spans.SERVICE_NAME) or resource_service
        model = label(values[_B_MODEL], spans.GEN_AI_REQUEST_MODEL)
        uuid = label(values[_B_UUID], spans.GPU_UUID)
        gpu = self._gpu_index.get(uuid, "") if uuid else ""
        namespace, pod_name = NO_POD if uuid else pod
        batch_key = self._batch_key((service, model, uuid, gpu, namespace, pod_name))
        self.batch_size.observe(batch_key, size, ref)
        if uuid:
            seconds, most = (end - start) / 1e9, max(size, max_size or size)
            for observer in self.compute_observers:
                observer.observe_compute(uuid, seconds, size, most)

    def _label(self, value: str | None, key: str) -> str:
        if value is None:
            return ""
        known = self._known_labels
        if value in known:
            return value
        if len(value) > self.max_label_length:
            raise SpanRejected(
                INVALID_LABEL, f"{key} is {len(value)} characters (max {self.max_label_length})"
            )
        if not _printable(value):
            raise SpanRejected(INVALID_LABEL, f"{key} holds control characters")
        if len(known) >= self._cache_limit:
            known.clear()
        known.add(value)
        return value


def _read_attributes(attributes: Any, slots: dict[str, tuple[int, str]], count: int) -> list[Any]:
    """One pass over the key-value list; values are read for wanted keys only.

    The typed field is read first; only a default (0, 0.0, "") needs ``WhichOneof``
    to tell a real zero from a value of another type.
    """
    values: list[Any] = [None] * count
    for kv in attributes:
        wanted = slots.get(kv.key)
        if wanted is None:
            continue
        slot, kind = wanted
        value = kv.value
        if kind is _DOUBLE:
            found: Any = value.double_value
        elif kind is _STRING:
            found = value.string_value
        else:
            found = value.int_value
        if not found:
            which = value.WhichOneof("value")
            if which == _INT and kind is _DOUBLE:  # some SDKs send whole seconds as ints
                found = float(value.int_value)
            elif which != kind:
                raise SpanRejected(
                    WRONG_ATTRIBUTE_TYPE, f"{kv.key} must be {kind}, got {which or 'no value'}"
                )
        values[slot] = found
    return values


def _read_engine_attributes(attributes: Any) -> dict[str, object]:
    """The engine span's wanted attributes as Python values; a wrong type rejects the span.

    vLLM sends token counts as ints and durations as doubles; a whole number of seconds
    sent as an int is accepted as a duration, as for gpuscope's own spans.
    """
    found: dict[str, object] = {}
    for kv in attributes:
        kind = _ENGINE_KEYS.get(kv.key)
        if kind is None:
            continue
        value = kv.value
        which = value.WhichOneof("value")
        if which == kind:
            found[kv.key] = getattr(value, kind)
        elif kind == _DOUBLE and which == _INT:
            found[kv.key] = float(value.int_value)
        else:
            raise SpanRejected(
                WRONG_ATTRIBUTE_TYPE, f"{kv.key} must be {kind}, got {which or 'no value'}"
            )
    return found


def _printable(text: str) -> bool:
    """No control, format, surrogate or line-breaking characters; a space of another
    kind (a no-break or thin space, which ``str.isprintable`` refuses) is text."""
    return text.isprintable() or all(
        char.isprintable() or unicodedata.category(char) == "Zs" for char in text
    )


def _resource_service(attributes: Any) -> str | None:
    """The resource's ``service.name``; one of another type is refused, as the pod's
    attributes are (an int was counted under an empty service)."""
    for kv in attributes:
        if kv.key == SERVICE_NAME_RESOURCE:
            value = kv.value
            which = value.WhichOneof("value")
            if which != _STRING:
                raise SpanRejected(
                    WRONG_ATTRIBUTE_TYPE,
                    f"{SERVICE_NAME_RESOURCE} must be a string, got {which or 'no value'}",
                )
            name: str = value.string_value
            return name
    return None


def _span_ref(span: Any) -> tuple[bytes, bytes, int]:
    trace_id, span_id = span.trace_id, span.span_id
    if len(trace_id) != 16 or len(span_id) != 8 or not any(trace_id) or not any(span_id):
        raise SpanRejected(INVALID_ID, "trace_id must be 16 bytes and span_id 8, not all zero")
    return trace_id, span_id, span.end_time_unix_nano


def _count(value: int | None, key: str) -> int | None:
    if value is not None and not 0 <= value <= spans.MAX_COUNT:
        raise SpanRejected(
            INVALID_ATTRIBUTE_VALUE, f"{key} is {value}, not a count in 0-{spans.MAX_COUNT:,}"
        )
    return value


def _span_times(span: Any) -> tuple[int, int]:
    """``(start, end)`` in epoch ns, rejected unless end - start is 0 to a day."""
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start == 0 or end < start:
        raise SpanRejected(INVALID_DURATION, f"end {end} before start {start}")
    if end - start > _MAX_DURATION_NS:
        raise SpanRejected(
            INVALID_DURATION,
            f"the span lasts {(end - start) / 1e9:g} s, over {spans.MAX_DURATION_S:g} s",
        )
    return start, end


def _check_server_durations(
    duration: float,
    phases: Sequence[float | None],
    stages: Sequence[float | None],
    ttft: float | None,
    tpot: float | None = None,
) -> None:
    """The phases together, the first token and the time per output token within the
    span, the stages within compute and, with or without it, within the span;
    ``spans.DURATION_SLACK_S`` of slack for rounding."""
    slack = spans.DURATION_SLACK_S
    in_phases = sum(seconds for seconds in phases if seconds is not None)
    if in_phases > duration + slack:
        raise SpanRejected(
            INCONSISTENT_DURATIONS,
            f"the phases add up to {in_phases:g} s, over the span's {duration:g} s",
        )
    if ttft is not None and ttft > duration + slack:
        raise SpanRejected(
            INCONSISTENT_DURATIONS,
            f"{spans.TIME_TO_FIRST_TOKEN} is {ttft:g} s, over the span's {duration:g} s",
        )
    if tpot is not None and tpot > duration + slack:
        raise SpanRejected(
            INCONSISTENT_DURATIONS,
            f"{spans.TIME_PER_OUTPUT_TOKEN} is {tpot:g} s, over the span's {duration:g} s",
        )
    compute = phases[_COMPUTE_INDEX]
    in_stages = sum(seconds for seconds in stages if seconds is not None)
    if compute is not None and in_stages > compute + slack:
        raise SpanRejected(
            INCONSISTENT_DURATIONS,
            f"the compute stages add up to {in_stages:g} s, over compute's {compute:g} s",
        )
    if in_stages > duration + slack:  # without compute, nothing else bounds them
        raise SpanRejected(
            INCONSISTENT_DURATIONS,
            f"the compute stages add up to {in_stages:g} s, over the span's {duration:g} s",
        )
