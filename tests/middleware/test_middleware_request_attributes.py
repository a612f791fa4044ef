"""The HTTP conventions' recommended server-span attributes, from real and odd scopes."""

from __future__ import annotations

from typing import Any

import pytest

from gpuscope.middleware.request_attributes import redacted_query, request_attributes


def scope(**fields: Any) -> dict[str, Any]:
    return {"type": "http", "headers": [], **fields}


def test_a_typical_request() -> None:
    found = request_attributes(
        scope(
            headers=[(b"host", b"vllm.internal:8000"), (b"user-agent", b"OpenAI/Python 1.99")],
            client=("10.0.0.7", 51000),
            server=("0.0.0.0", 8000),
            http_version="1.1",
            query_string=b"stream=true",
        )
    )
    assert found == {
        "server.address": "vllm.internal",
        "server.port": 8000,
        "client.address": "10.0.0.7",
        "user_agent.original": "OpenAI/Python 1.99",
        "network.protocol.version": "1.1",
        "url.query": "stream=true",
    }


def test_without_a_host_header_the_listening_socket_is_the_server() -> None:
    found = request_attributes(scope(server=("127.0.0.1", 9420)))
    assert found == {"server.address": "127.0.0.1", "server.port": 9420}


def test_an_ipv6_host_keeps_its_brackets() -> None:
    found = request_attributes(scope(headers=[(b"host", b"[::1]:8000")]))
    assert found["server.address"] == "[::1]" and found["server.port"] == 8000


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("api_key=s3cret&stream=1", "api_key=REDACTED&stream=1"),
        ("token=abc", "token=REDACTED"),
        ("X-Goog-Signature=zz&a=b", "X-Goog-Signature=REDACTED&a=b"),
        ("flag&model=x", "flag&model=x"),
    ],
)
def test_credential_like_query_values_are_redacted(query: str, expected: str) -> None:
    assert redacted_query(query) == expected


@pytest.mark.parametrize(
    "odd",
    [
        scope(headers=[(b"host", b"a:b:c")], client="nonsense", http_version=2),
        scope(headers=[(b"user-agent", "not bytes")], server=None, query_string="x=1"),
        scope(headers=[(b"host",)], client=(None, 1)),
        {"type": "http", "headers": None},
    ],
)
def test_odd_scopes_give_fewer_attributes_never_an_error(odd: dict[str, Any]) -> None:
    found = request_attributes(odd)
    assert all(isinstance(v, str | int) for v in found.values())
