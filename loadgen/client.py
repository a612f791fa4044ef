"""Send one request with aiohttp and measure it from the client's side.

An ``Outcome`` holds the end-to-end latency and, for streams, the time to the first
token and the time per output token (``(end − first) / (tokens − 1)``). A failure is
an ``error`` of one kind: ``status NNN``, ``timeout``, ``connection`` or ``stream``
(an error event or a body that could not be read); nothing is retried.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpuscope.loadgen.workload import PATHS, RequestSpec


@dataclass(frozen=True)
class Outcome:
    label: str
    started_s: float  # monotonic
    latency_s: float
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def answered(self) -> bool:
        """The server sent a status line (it saw, and traced, the request)."""
        return self.error is None or self.error.startswith(("status", "stream"))


async def send(
    session: aiohttp.ClientSession, base_url: str, model: str, spec: RequestSpec
) -> Outcome:
    started = time.monotonic()
    url = base_url + PATHS[spec.endpoint]
    try:
        async with session.post(url, json=spec.json_body(model)) as response:
            if response.status != 200:
                await response.read()
                return _failed(spec, started, f"status {response.status}")
            if spec.stream:
                return await _read_stream(response, spec, started)
            body = await response.json(content_type=None)
            return Outcome(
                spec.label,
                started,
                time.monotonic() - started,
                output_tokens=_completion_tokens(body),
            )
    except TimeoutError:
        return _failed(spec, started, "timeout")
    except aiohttp.ClientPayloadError:
        return _failed(spec, started, "stream")
    except (aiohttp.ClientError, OSError):
        return _failed(spec, started, "connection")
    except ValueError:  # a 200 whose body is not the JSON it should be
        return _failed(spec, started, "stream")


def _failed(spec: RequestSpec, started: float, error: str) -> Outcome:
    return Outcome(spec.label, started, time.monotonic() - started, error=error)


async def _read_stream(
    response: aiohttp.ClientResponse, spec: RequestSpec, started: float
) -> Outcome:
    first: float | None = None
    last = started
    chunks = 0
    usage_tokens: int | None = None
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            return _failed(spec, started, "stream")
        usage = event.get("usage")
        if usage:
            usage_tokens = usage.get("completion_tokens")
        if _has_text(event):
            last = time.monotonic()
            first = first if first is not None else last
            chunks += 1
    end = time.monotonic()
    tokens = usage_tokens if usage_tokens is not None else chunks
    ttft = None if first is None else first - started
    tpot = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return Outcome(spec.label, started, end - started, None, ttft, tpot, tokens)


def _has_text(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def _completion_tokens(body: Any) -> int:
    usage = body.get("usage") if isinstance(body, dict) else None
    if isinstance(usage, dict):
        return int(usage.get("completion_tokens", 0))
    return 0


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model the endpoint lists under ``/models``."""
    try:
        async with session.get(base_url + "/models") as response:
            if response.status != 200:
                raise RuntimeError(f"{base_url}/models answered {response.status}; pass --model")
            body = await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read {base_url}/models: {exc or type(exc).__name__}") from None
    try:
        model: str = body["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise RuntimeError(f"{base_url}/models lists no model; pass --model") from None
    return model
