"""A huge request body against a real worker process: refused unread, memory bounded."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from urllib.parse import urlsplit

import httpx
import pytest

from support.worker_process import worker_process

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

MIB = 1024 * 1024
HUGE = 100 * MIB
LIMIT = 4 * MIB  # --max-body-bytes' default


def _head(host: str, length: str | None) -> bytes:
    framing = "transfer-encoding: chunked" if length is None else f"content-length: {length}"
    return (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: {host}\r\n"
        f"content-type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def _response(sock: socket.socket) -> tuple[int, dict[str, object]]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, json.loads(response.read())


def _upload_chunked(sock: socket.socket, sent: list[int]) -> None:
    """Send ``HUGE`` bytes as 1 MiB chunks until the server stops reading and closes."""
    chunk = b"%x\r\n" % MIB + b"1" * MIB + b"\r\n"
    try:
        while sent[0] < HUGE:
            sock.sendall(chunk)
            sent[0] += MIB
        sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server answered and closed, or the test closed the socket


def test_worker_refuses_a_huge_body_before_buffering_it() -> None:
    with worker_process([]) as worker:
        url = urlsplit(worker.url)
        address = (url.hostname or "", url.port or 0)
        warm = httpx.post(
            f"{worker.url}/v1/embeddings", json={"model": "gpuscope-synthetic", "input": "x"}
        )
        assert warm.status_code == 200
        before = worker.peak_rss_bytes()
        with socket.create_connection(address) as sock:  # the declared length is enough
            sock.sendall(_head(url.netloc, str(HUGE)))
            declared = _response(sock)
        sent = [0]
        with socket.create_connection(address) as sock:  # no length: counted as it arrives
            sock.sendall(_head(url.netloc, None))
            uploader = threading.Thread(target=_upload_chunked, args=(sock, sent))
            uploader.start()
            health = [httpx.get(f"{worker.url}/healthz", timeout=30) for _ in range(3)]
            streamed = _response(sock)
            with contextlib.suppress(OSError):  # unblocks the uploader if still sending
                sock.shutdown(socket.SHUT_RDWR)
            uploader.join(30)
        after = worker.peak_rss_bytes()
        health.append(httpx.get(f"{worker.url}/healthz", timeout=30))
    for status, body in (declared, streamed):
        assert status == 413
        assert body["error"] == {
            "message": f"the request body exceeds {LIMIT} bytes (--max-body-bytes)",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    assert all(answer.status_code == 200 for answer in health)
    assert sent[0] < HUGE / 2, "the server read the whole body"
    # Peak memory grew by little more than the limit, nowhere near the body's 100 MiB.
    assert after - before < 8 * LIMIT, (before, after)
