"""Exporter test helpers: a running exporter on 127.0.0.1 port 0, spans made by the real
OpenTelemetry SDK, a scrape parser, and a fake GPU source (the one part that cannot
exist here)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from asyncio.subprocess import DEVNULL
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import AttributeValue
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.samples import Sample

from gpuscope import spans as contract
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading
from gpuscope.exporter.service import RunningExporter, start_exporter
from support.binaries import require_binary

T0 = 1_700_000_000_000_000_000  # a fixed epoch instant (ns) for span times


class SpanFactory:
    """Finished SDK spans with chosen attributes, as the middleware would emit them."""

    def __init__(
        self, service: str = "test-worker", resource: Mapping[str, AttributeValue] | None = None
    ) -> None:
        self.memory = InMemorySpanExporter()
        attributes = {"service.name": service, **(resource or {})}
        self.provider = TracerProvider(resource=Resource.create(attributes))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer("gpuscope")

    def server(
        self,
        duration_s: float = 0.05,
        *,
        phases: Mapping[str, float] | None = None,
        route: str = "/v1/completions",
        code: int = 200,
        start_ns: int = T0,
        attrs: Mapping[str, AttributeValue] | None = None,
    ) -> ReadableSpan:
        attributes: dict[str, AttributeValue] = {
            contract.HTTP_REQUEST_METHOD: "POST",
            contract.HTTP_ROUTE: route,
            contract.HTTP_RESPONSE_STATUS_CODE: code,
            contract.GEN_AI_REQUEST_MODEL: "m1",
            contract.GPU_UUID: "GPU-aaaa",
        }
        for phase, seconds in (phases or {}).items():
            attributes[contract.PHASE_DURATION[phase]] = seconds
        attributes.update(attrs or {})
        span = self.tracer.start_span(
            f"POST {route}", kind=SpanKind.SERVER, attributes=attributes, start_time=start_ns
        )
        span.end(end_time=start_ns + round(duration_s * 1e9))
        return self._last()

    def internal(self, name: str, duration_s: float = 0.01) -> ReadableSpan:
        span = self.tracer.start_span(name, kind=SpanKind.INTERNAL, start_time=T0)
        span.end(end_time=T0 + round(duration_s * 1e9))
        return self._last()

    def batch(
        self,
        size: int,
        *,
        duration_s: float = 0.02,
        links: Sequence[ReadableSpan] = (),
        attrs: Mapping[str, AttributeValue] | None = None,
    ) -> ReadableSpan:
        attributes: dict[str, AttributeValue] = {
            contract.BATCH_ID: "b-1",
            contract.BATCH_SIZE: size,
            contract.BATCH_MAX_SIZE: 32,
            contract.BATCH_TRIGGER: contract.BatchTrigger.FULL,
            contract.GPU_UUID: "GPU-aaaa",
            contract.GEN_AI_REQUEST_MODEL: "m1",
        }
        attributes.update(attrs or {})
        span = self.tracer.start_span(
            contract.BATCH_SPAN_NAME,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=[Link(s.context) for s in links if s.context is not None],
            start_time=T0,
        )
        span.end(end_time=T0 + round(duration_s * 1e9))
        return self._last()

    def _last(self) -> ReadableSpan:
        return self.memory.get_finished_spans()[-1]


def encode(spans: Iterable[ReadableSpan]) -> Any:
    """The ``ExportTraceServiceRequest`` the SDK's OTLP exporter would send."""
    return encode_spans(list(spans))


def samples(text: str, *, openmetrics: bool = False) -> list[Sample]:
    parser = parse_openmetrics if openmetrics else parse_text
    return [sample for family in parser(text) for sample in family.samples]


def value(
    scraped: Sequence[Sample], name: str, labels: Mapping[str, str] | None = None
) -> float | None:
    """The value of the one sample ``name`` whose labels include ``labels``."""
    wanted = dict(labels or {})
    found = [
        s.value
        for s in scraped
        if s.name == name and all(s.labels.get(k) == v for k, v in wanted.items())
    ]
    if len(found) > 1:
        raise AssertionError(f"{name}{wanted} matches {len(found)} samples")
    return found[0] if found else None


async def scrape(
    session: aiohttp.ClientSession, exporter: RunningExporter, accept: str | None = None
) -> str:
    headers = {"Accept": accept} if accept else {}
    async with session.get(exporter.url + "/metrics", headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.text()


async def post_spans(
    session: aiohttp.ClientSession,
    exporter: RunningExporter,
    body: bytes,
    *,
    content_type: str = "application/x-protobuf",
    headers: Mapping[str, str] | None = None,
) -> tuple[int, bytes]:
    all_headers = {"Content-Type": content_type} | dict(headers or {})
    async with session.post(
        exporter.url + "/v1/traces", data=body, headers=all_headers
    ) as response:
        return response.status, await response.read()


class FakeGpuSource:
    """Two GPUs with fixed readings; as a ``ComputeObserver``, records the batches it is told of."""

    name = "fake"

    def __init__(self) -> None:
        self._devices = (
            GpuDevice(index=0, uuid="GPU-aaaa", name="Fake H100", pci_bus_id="0000:01:00.0"),
            GpuDevice(index=1, uuid="GPU-bbbb", name="Fake H100", pci_bus_id="0000:02:00.0"),
        )
        self.compute: list[tuple[str, float, int, int]] = []
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def devices(self) -> Sequence[GpuDevice]:
        return self._devices

    def sample(self) -> Sequence[GpuReading]:
        return [
            GpuReading(
                index=d.index,
                uuid=d.uuid,
                values={"sm_clock_hz": 1.98e9, "utilization_ratio": 0.5},
            )
            for d in self._devices
        ]

    def close(self) -> None:
        self.closed.set()

    def observe_compute(self, uuid: str, seconds: float, batch_size: int, max_size: int) -> None:
        with self._lock:
            self.compute.append((uuid, seconds, batch_size, max_size))


def loopback_config(**overrides: Any) -> ExporterConfig:
    return ExporterConfig(**({"listen": "127.0.0.1:0", "gpu_source": "none"} | overrides))


@pytest.fixture
async def running_exporter() -> AsyncIterator[RunningExporter]:
    """A started exporter without a GPU source, on a free loopback port."""
    running = await start_exporter(loopback_config())
    try:
        yield running
    finally:
        await running.stop()


async def make_self_signed(folder: Path) -> tuple[Path, Path]:
    """``server.crt`` and ``server.key`` in ``folder``: a self-signed certificate for
    127.0.0.1, made by the openssl binary."""
    openssl = require_binary("openssl")
    cert, key = folder / "server.crt", folder / "server.key"
    process = await asyncio.create_subprocess_exec(
        openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        "-keyout", str(key), "-out", str(cert),
        stdout=DEVNULL, stderr=DEVNULL,
    )  # fmt: skip
    assert await asyncio.wait_for(process.wait(), 60) == 0
    return cert, key


@pytest.fixture
async def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for 127.0.0.1, in ``tmp_path``."""
    return await make_self_signed(tmp_path)


@pytest.fixture
async def exporter_http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def otlp_json(request: object) -> bytes:
    """OTLP/JSON as the spec writes it: protobuf JSON mapping, ids as hex not base64."""
    document = json_format.MessageToDict(request)  # type: ignore[arg-type]
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(document).encode()
