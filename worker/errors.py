"""Errors in OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``), rendered
once for the whole app by Starlette exception handlers."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gpuscope.worker.protocol import InvalidRequest, error_body
from gpuscope.worker.scheduler import QueueFull, SchedulerError
from gpuscope.worker.streaming import ClientDisconnected, NoResponse, sse_event

_KINDS: Final = {429: "rate_limit_error", 503: "server_error", 504: "timeout_error"}


class ErrorResponse(JSONResponse):
    """JSON escaped to ASCII: an error may quote what the client sent, lone surrogates
    included, and those cannot be encoded as UTF-8."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_response(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = error_body(message, kind=kind, param=param, code=code)
    return ErrorResponse(body, status_code=status, headers=headers)


def refusal_kind(exc: SchedulerError) -> str:
    default = "invalid_request_error" if exc.status < 500 else "server_error"
    return _KINDS.get(exc.status, default)


def error_event(exc: SchedulerError) -> bytes:
    """A stream that can no longer change its status code ends with this event."""
    return sse_event(error_body(str(exc), kind=refusal_kind(exc), code=exc.code))


async def _invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InvalidRequest)
    return error_response(
        exc.status, str(exc), kind=exc.kind, param=exc.param, code=exc.code, headers=exc.headers
    )


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SchedulerError)
    headers = None
    if isinstance(exc, QueueFull):
        headers = {"retry-after": str(math.ceil(exc.retry_after_s))}
    return error_response(
        exc.status, str(exc), kind=refusal_kind(exc), code=exc.code, headers=headers
    )


async def _disconnected(request: Request, exc: Exception) -> Response:
    return NoResponse()


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, exc.detail, headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """A bug, not the client's fault: still a 500 in OpenAI's shape (Starlette re-raises
    for the server to log it, and the server then drops the connection: say so, or a
    client reusing it loses its next request)."""
    return error_response(
        500, "internal error in the worker", kind="server_error", headers={"connection": "close"}
    )


Handler = Callable[[Request, Exception], Coroutine[Any, Any, Response]]

EXCEPTION_HANDLERS: Final[Mapping[Any, Handler]] = {
    InvalidRequest: _invalid,
    SchedulerError: _refused,
    ClientDisconnected: _disconnected,
    HTTPException: _http,
    Exception: _unexpected,
}
