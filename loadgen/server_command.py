"""Any serving engine as the tuned server: a command template rendered per value, the
tracing environment it starts with, and what its log says when it does not start.

``gpuscope tune --command TEMPLATE`` starts ``TEMPLATE`` once per swept value with the
placeholders below replaced, word by word after ``shlex`` has split the template (so a
value with a space stays one argument). Only these names are replaced: a Triton
``config.pbtxt`` or a JSON file is full of braces that are not placeholders.

=================  ===========================================================
``{value}``        the swept value
``{port}``         a free loopback port the engine must serve HTTP on
``{metrics_port}`` a second free port (Triton's metrics, say)
``{grpc_port}``    a third free port (Triton's gRPC frontend, say)
``{config}``       the file ``--config-template`` was rendered to for this value
``{workdir}``      this value's folder (its log, its rendered file)
``{otlp}``         the exporter's OTLP/HTTP traces endpoint (``.../v1/traces``)
``{exporter}``     the exporter's base URL
=================  ===========================================================

Free of I/O but ``render_config`` (one file written) and ``log_tail`` (one file read).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpuscope.children import LOOPBACK, TRACES_PATH

PLACEHOLDERS: Final = (
    "value",
    "port",
    "metrics_port",
    "grpc_port",
    "config",
    "workdir",
    "otlp",
    "exporter",
)
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
LOG_TAIL_LINES: Final = 5
LOG_TAIL_BYTES: Final = 64 * 1024  # enough for the last lines of any traceback


def render(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each known placeholder that ``values`` has replaced."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def placeholders(template: str) -> set[str]:
    return set(_PLACEHOLDER.findall(template))


def tracing_environment(exporter_url: str, gpu_uuid: str | None, label: str) -> dict[str, str]:
    """What the engine's OpenTelemetry SDK (and gpuscope's middleware, if it runs one)
    reads to send its spans to the exporter: OTLP over HTTP, since the exporter takes
    OTLP/HTTP only and several SDKs (vLLM's among them) default to gRPC."""
    traces = exporter_url.rstrip("/") + TRACES_PATH
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": exporter_url.rstrip("/"),
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "GPUSCOPE_TUNE_CONFIG": label,
    }
    if gpu_uuid is not None:
        env["GPUSCOPE_GPU_UUID"] = gpu_uuid  # the simulated GPU the exporter polls
    return env


@dataclass(frozen=True)
class Launch:
    """One value's engine: its command line, environment, files and URLs."""

    label: str
    argv: list[str]
    env: dict[str, str]
    workdir: Path
    log: Path
    config: Path | None
    port: int
    ready_url: str
    base_url: str  # where the load goes: the API root (with --api-path)
    metrics_url: str  # the server-side view's base URL (``/metrics`` is added)
    engine_metrics_url: str | None = None  # the engine's own, to compare with (--engine-metrics)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)


def safe_name(text: str) -> str:
    """A folder name for a value: a model path or ``a/b:c`` must not make folders."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("._") or "value"


def render_config(template: Path, target: Path, values: Mapping[str, str]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(template.read_text(), values))


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last non-empty ``lines`` of ``log`` (read from its end, at most 64 KiB)."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - LOG_TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def loopback(port: int, path: str = "") -> str:
    return f"http://{LOOPBACK}:{port}{path}"
