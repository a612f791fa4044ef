"""Send one request with aiohttp and measure it from the client's side.

An ``Outcome`` holds the end-to-end latency and, for streams, the time to the first
token and the time per output token (``(end − first) / (tokens − 1)``). A failure is
an ``error`` of one kind, and nothing is retried:

- ``status NNN``: an answer other than 200 (at most ``MAX_ERROR_BODY_BYTES`` of its
  body is read);
- ``timeout``: the whole exchange, body included, took longer than the timeout;
- ``connection``: no answer (refused, reset, closed before the status line);
- ``stream``: an error event, a body cut short, or a stream that ended before
  ``data: [DONE]``;
- ``malformed``: a 200 whose body or event is not what the OpenAI API defines (not
  JSON, not an object, ``choices`` or ``usage`` of the wrong type, a token count that
  is not a count);
- ``too_large``: a body past ``max_body_bytes``, or an event line past
  ``MAX_EVENT_BYTES``;
- ``unexpected <exception>``: anything else the exchange raised, so that one odd
  answer costs one error and never the run (its results and report).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import aiohttp

from gpuscope.loadgen.bounded import KIB, MIB, TooLarge, lines, read_body, skim
from gpuscope.loadgen.workload import PATHS, RequestSpec

MAX_EVENT_BYTES: Final = 1 * MIB  # one line of a stream: one chunk of a few tokens
MAX_ERROR_BODY_BYTES: Final = 64 * KIB
DEFAULT_MAX_BODY_BYTES: Final = 16 * MIB
MAX_MODELS_BYTES: Final = 1 * MIB
# Outcomes whose request the server answered with a status line (and so saw, and traced).
ANSWERED: Final = ("status", "stream", "malformed", "too_large")


class Malformed(ValueError):
    """A 200 whose body or event is not what the OpenAI API defines."""


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
        return self.error is None or self.error.startswith(ANSWERED)


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    spec: RequestSpec,
    *,
    timeout_s: float = 30.0,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Outcome:
    started = time.monotonic()
    try:
        # The session's own timeout leaves out what happens after the last read (the
        # parse of a body); this one covers the whole exchange, and the check after it
        # what ran without yielding (a deadline passed in a parse is seen only later).
        async with asyncio.timeout(timeout_s):
            outcome = await _exchange(session, base_url, model, spec, started, max_body_bytes)
        if outcome.latency_s > timeout_s:
            raise TimeoutError
        return outcome
    except TimeoutError:
        return _failed(spec, started, "timeout")
    except TooLarge:
        return _failed(spec, started, "too_large")
    except Malformed:
        return _failed(spec, started, "malformed")
    except aiohttp.ClientPayloadError:
        return _failed(spec, started, "stream")
    except (aiohttp.ClientError, OSError):
        return _failed(spec, started, "connection")
    except Exception as exc:  # one odd answer must not end the whole run
        return _failed(spec, started, f"unexpected {type(exc).__name__}")


async def _exchange(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    spec: RequestSpec,
    started: float,
    max_body_bytes: int,
) -> Outcome:
    url = base_url + PATHS[spec.endpoint].replace("{model}", quote(model, safe=""))
    async with session.post(url, json=spec.json_body(model)) as answer:
        if answer.status != 200:
            await skim(answer, MAX_ERROR_BODY_BYTES)
            return _failed(spec, started, f"status {answer.status}")
        if spec.stream:
            return await _read_stream(answer, spec, started)
        body = _json_object(await read_body(answer, max_body_bytes))
        tokens = _usage_tokens(body)
        return Outcome(spec.label, started, time.monotonic() - started, output_tokens=tokens or 0)


def _failed(spec: RequestSpec, started: float, error: str) -> Outcome:
    return Outcome(spec.label, started, time.monotonic() - started, error=error)


class _StreamError(Exception):
    """The server ended the stream with an error event."""


async def _read_stream(
    response: aiohttp.ClientResponse, spec: RequestSpec, started: float
) -> Outcome:
    first: float | None = None
    last = started
    chunks = 0
    usage_tokens: int | None = None
    async for raw in lines(response.content, MAX_EVENT_BYTES):
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        event = _json_object(data)
        if "error" in event:
            return _failed(spec, started, "stream")
        usage_tokens = _usage_tokens(event, usage_tokens)
        if any(_texts(event)):
            last = time.monotonic()
            first = first if first is not None else last
            chunks += 1
    else:  # the body ended without [DONE]: cut short
        return _failed(spec, started, "stream")
    end = time.monotonic()
    tokens = usage_tokens if usage_tokens is not None else chunks
    ttft = None if first is None else first - started
    tpot = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return Outcome(spec.label, started, end - started, None, ttft, tpot, tokens)


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, 4,300+ digits, too deep
        raise Malformed("not JSON") from None
    if not isinstance(value, dict):
        raise Malformed(f"a JSON {type(value).__name__}, not an object")
    return value


def _texts(event: dict[str, Any]) -> Iterator[str]:
    """The text of each choice of a completion or chat chunk."""
    choices = event.get("choices")
    if choices is None:
        return
    if not isinstance(choices, list):
        raise Malformed("'choices' is not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise Malformed("a choice is not an object")
        delta = choice.get("delta")
        if delta is not None and not isinstance(delta, dict):
            raise Malformed("'delta' is not an object")
        for text in (choice.get("text"), (delta or {}).get("content")):
            if text is not None and not isinstance(text, str):
                raise Malformed("a choice's text is not a string")
            if text:
                yield text


def _usage_tokens(body: dict[str, Any], default: int | None = None) -> int | None:
    """``usage.completion_tokens`` when the body has it, else ``default``."""
    usage = body.get("usage")
    if usage is None:
        return default
    if not isinstance(usage, dict):
        raise Malformed("'usage' is not an object")
    tokens = usage.get("completion_tokens")
    if tokens is None:
        return default
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise Malformed("'usage.completion_tokens' is not a count")
    return tokens


def _no_models_list(base_url: str, status: int) -> str:
    """Why ``/models`` could not name a model; a 404 under a URL without ``/v1`` is most
    often the server's root given where the API's base belongs."""
    message = f"{base_url}/models answered {status}; pass --model"
    if status == 404 and not base_url.rstrip("/").endswith("/v1"):
        message += f", or, if the API lives under /v1, --url {base_url.rstrip('/')}/v1"
    return message


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first model the endpoint lists under ``/models``."""
    try:
        async with session.get(base_url + "/models") as response:
            if response.status != 200:
                raise RuntimeError(_no_models_list(base_url, response.status))
            body = _json_object(await read_body(response, MAX_MODELS_BYTES))
    except (TimeoutError, aiohttp.ClientError, OSError, Malformed, TooLarge) as exc:
        why = str(exc) or type(exc).__name__  # a TimeoutError says nothing of itself
        raise RuntimeError(f"cannot read {base_url}/models: {why}") from None
    try:
        model = body["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        model = None
    if not isinstance(model, str) or not model:
        raise RuntimeError(f"{base_url}/models lists no model; pass --model")
    return model
