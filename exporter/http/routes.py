"""The error answer in OTLP's shape that any part of the
HTTP side (handlers, the auth middleware) gives a sender on the OTLP path
(``gpuscope.contract.http.TRACES_PATH``).

An OTLP exporter reads a refusal's ``google.rpc.Status`` body in the media type it
sent, so a 401 or 503 from the middleware must be shaped like the handler's own 400.
"""

from __future__ import annotations

from aiohttp import web

from gpuscope.exporter.ingest import otlp


def otlp_error(media: str, status: int, message: str) -> web.Response:
    return web.Response(
        status=status, body=otlp.encode_status(media, status, message), content_type=media
    )
