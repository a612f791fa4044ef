"""The HTTP semantic conventions' recommended server-span attributes, from the ASGI scope.

``server.address``/``server.port`` (the ``Host`` header, else the socket the server
listens on), ``client.address`` (the peer), ``user_agent.original``,
``network.protocol.version`` and ``url.query``. They are span attributes only, never
metric labels (the exporter reads none of them), so their cardinality costs nothing in
Prometheus. Values of query parameters whose names look like credentials are replaced
by ``REDACTED``, as the conventions ask of instrumentations that can recognise them.
Nothing here may raise: a malformed scope yields fewer attributes, not a failed request.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from gpuscope import spans

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from gpuscope.middleware.types import Scope

MAX_VALUE_LENGTH: Final = 1024  # a span attribute, not a place for a whole header
_SECRET_KEY = re.compile(r"(key|token|secret|passw|signature|sig|auth|credential)", re.I)
_HOST = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[^:\[\]]+)(?::(\d{1,5}))?$")


def request_attributes(scope: Scope) -> dict[str, AttributeValue]:
    found: dict[str, AttributeValue] = {}
    try:
        host = agent = None
        for name, value in scope.get("headers", ()):  # one pass: this runs per request
            if name == b"host" or name == b"Host":
                host = value
            elif name == b"user-agent" or name == b"User-Agent":
                agent = value
        _add_server(scope, host, found)
        client = scope.get("client")
        if isinstance(client, list | tuple) and client and isinstance(client[0], str):
            found[spans.CLIENT_ADDRESS] = client[0][:MAX_VALUE_LENGTH]
        version = scope.get("http_version")
        if isinstance(version, str) and version:
            found[spans.NETWORK_PROTOCOL_VERSION] = version[:16]
        if isinstance(agent, bytes) and agent:
            found[spans.USER_AGENT_ORIGINAL] = agent[:MAX_VALUE_LENGTH].decode("latin-1")
        query = scope.get("query_string")
        if isinstance(query, bytes) and query:
            found[spans.URL_QUERY] = redacted_query(query.decode("latin-1"))[:MAX_VALUE_LENGTH]
    except Exception:  # a hostile or odd scope: leave the rest out
        return found
    return found


def redacted_query(query: str) -> str:
    """``query`` with the value of every credential-like parameter replaced."""
    parts = []
    for part in query.split("&"):
        name, sep, _ = part.partition("=")
        parts.append(f"{name}=REDACTED" if sep and _SECRET_KEY.search(name) else part)
    return "&".join(parts)


def _add_server(scope: Scope, host: object, found: dict[str, AttributeValue]) -> None:
    match = _HOST.match(host.decode("latin-1")) if isinstance(host, bytes) else None
    if match is not None:
        found[spans.SERVER_ADDRESS] = match.group(1)[:MAX_VALUE_LENGTH]
        if match.group(2):
            found[spans.SERVER_PORT] = int(match.group(2))
        return
    server = scope.get("server")
    if isinstance(server, list | tuple) and len(server) == 2 and isinstance(server[0], str):
        found[spans.SERVER_ADDRESS] = server[0][:MAX_VALUE_LENGTH]
        if isinstance(server[1], int):
            found[spans.SERVER_PORT] = server[1]
