"""A raw HTTP/1.1 client over a plain socket: sends exactly the bytes a test writes
(non-UTF-8 headers, half a request, one byte at a time), which no HTTP library does."""

from __future__ import annotations

import asyncio


async def raw_exchange(host: str, port: int, request: bytes, timeout_s: float = 30) -> bytes:
    """Send ``request``, half-close, and return everything the server answers."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    """The status code of a raw HTTP/1.1 response."""
    return int(response.split(b" ", 2)[1])


def get_request(path: str, headers: dict[str, bytes] | None = None) -> bytes:
    lines = [f"GET {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    lines += [name.encode() + b": " + value for name, value in (headers or {}).items()]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def post_request(path: str, body: bytes, headers: dict[str, bytes] | None = None) -> bytes:
    extra = {"Content-Type": b"application/x-protobuf", "Content-Length": str(len(body)).encode()}
    return get_request(path, extra | (headers or {})).replace(b"GET", b"POST", 1) + body
