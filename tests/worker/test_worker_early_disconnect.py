"""A client that gives up before its first token, against the worker on a real server:
no ``Exception in ASGI application`` in the log, and the request still ends as a 499."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

from gpuscope.worker.backends import numpy_models
from support.span_recorder import SpanRecorder
from support.worker_servers import SMALL, Gate, GatedGenerator, attrs, serve_worker


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def uvicorn_errors() -> Iterator[Records]:
    """What uvicorn logs under ``uvicorn.error``: it does not propagate to the root
    logger, so ``caplog`` never sees its tracebacks, and uvicorn's logging setup
    replaces that logger's handlers, so this must be entered once the server runs."""
    handler = Records()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("batching", ["continuous", "static"])
@pytest.mark.parametrize("stream", [True, False])
async def test_worker_client_gone_before_first_token_logs_no_traceback(
    span_recorder: SpanRecorder, batching: str, stream: bool
) -> None:
    gate = Gate()
    gate.close()  # the device holds the first step: no token can come
    _, generator = numpy_models(SMALL)
    with (
        serve_worker(
            span_recorder, generator=GatedGenerator(generator, gate), batching=batching
        ) as url,
        uvicorn_errors() as errors,
    ):
        address = urlsplit(url)
        assert address.hostname is not None and address.port is not None
        body = json.dumps(
            {"model": SMALL.model_name, "prompt": "never read", "max_tokens": 8, "stream": stream}
        ).encode()
        _, writer = await asyncio.open_connection(address.hostname, address.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        assert await asyncio.to_thread(gate.entered.wait, 10), (
            "the request never reached the device"
        )
        writer.close()  # gone before the first token
        await writer.wait_closed()
        await asyncio.to_thread(
            span_recorder.wait_for, lambda s: len(s.server_spans("/v1/completions")) == 1
        )
        gate.open()
    span = span_recorder.server_spans("/v1/completions")[0]
    assert attrs(span)["http.response.status_code"] == 499
    assert attrs(span)["error.type"] == "client_disconnected"
    logged = [record.getMessage() for record in errors.records]
    assert not [message for message in logged if "Exception in ASGI application" in message]
    assert not [record for record in errors.records if record.exc_info]
