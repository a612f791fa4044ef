"""Request bodies: JSON read under a size limit as it arrives, parsed so no input breaks it.

A body over the limit is refused with 413 as soon as its declared length or the
bytes read so far show it, before it is buffered; the connection is then closed, so
what the client still sends is never read. JSON the parser cannot take (an integer
of more than 4,300 digits, nesting that exhausts the recursion limit) is a 400 like
any other bad JSON. A body that stops arriving (a declared length never reached, a
chunked body never ended) is answered 408 once the request's timeout has passed,
rather than holding the connection forever. While a body arrives the connection counts
as uploading, so that the connection cap may cut the slowest upload (503, closed) to let
a new client in: trickled bodies cannot hold every connection for the whole timeout.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request

from gpuscope.connections import current_connection
from gpuscope.worker.protocol import InvalidRequest


def too_large(limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"the request body exceeds {limit} bytes (--max-body-bytes)",
        status=413,
        code="request_too_large",
        # Close rather than read and discard the rest (what the server would do otherwise).
        headers={"connection": "close"},
    )


def too_slow(timeout_s: float) -> InvalidRequest:
    return InvalidRequest(
        f"the request body did not arrive within {timeout_s:g} s (--request-timeout-s)",
        status=408,
        code="request_timeout",
        headers={"connection": "close"},
    )


def cut_at_cap() -> InvalidRequest:
    return InvalidRequest(
        "the request body was still arriving when the server needed its connection "
        "for another client (--max-connections); send it faster or retry",
        status=503,
        code="upload_cut",
        headers={"connection": "close", "retry-after": "1"},
    )


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, or ``InvalidRequest``: 413 once it is known to exceed ``limit``,
    408 when it has not all arrived within ``timeout_s``, 503 when the connection cap
    cut this upload to make room."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    connection = current_connection()
    if connection is None:  # not served through the guarded protocol (a test's server)
        return await _read(request, limit, timeout_s, asyncio.Event())
    with connection.guard.uploading(connection.handler) as cut:
        return await _read(request, limit, timeout_s, cut)


async def _read(request: Request, limit: int, timeout_s: float, cut: asyncio.Event) -> bytes:
    body = bytearray()

    async def receive_all() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise too_large(limit)

    reading = asyncio.ensure_future(receive_all())
    stopped = asyncio.ensure_future(cut.wait())
    try:
        done, _ = await asyncio.wait(
            (reading, stopped), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        stopped.cancel()
        if not reading.done():
            reading.cancel()
    # checked with no await since the wait: a body that completed is never cut after it
    if reading in done:
        reading.result()  # 413 from the loop, or a disconnect
        return bytes(body)
    raise cut_at_cap() if cut.is_set() else too_slow(timeout_s)


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise InvalidRequest("the body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None


async def read_json(request: Request, limit: int, timeout_s: float) -> Any:
    return parse_json(await read_body(request, limit, timeout_s))
