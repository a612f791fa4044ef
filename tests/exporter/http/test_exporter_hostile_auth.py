"""Malformed credentials and malformed web-config files, sent over real sockets: a bad
``Authorization`` header is a 401 (never a 500), a bad config file exits 2 naming its key."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import bcrypt
import pytest

from gpuscope.exporter.cli import main
from gpuscope.exporter.service import RunningExporter, start_exporter
from support.exporter_fixtures import SpanFactory, encode, loopback_config
from support.raw_http import get_request, post_request, raw_exchange, status_of

LONG_PASSWORD = b"p" * 72 + b"-and-what-bcrypt-never-reads"
BODY = encode([SpanFactory().server(0.01)]).SerializeToString()


def basic(credentials: bytes) -> bytes:
    return b"Basic " + base64.b64encode(credentials)


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[RunningExporter]:
    """Basic auth for everything (hashes of a short and a >72-byte password), a token for
    /v1/traces."""
    short = bcrypt.hashpw(b"pa55", bcrypt.gensalt(rounds=4)).decode()
    # The hash of what bcrypt reads of a long password: its first 72 bytes.
    long = bcrypt.hashpw(LONG_PASSWORD[:72], bcrypt.gensalt(rounds=4)).decode()
    web_config = tmp_path / "web.yml"
    web_config.write_text(f"basic_auth_users:\n  prom: '{short}'\n  long: '{long}'\n")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    exporter = await start_exporter(
        loopback_config(web_config_file=web_config, bearer_token_file=token)
    )
    try:
        yield exporter
    finally:
        await exporter.stop()


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (b"Basic \xc3\xa9", 401),  # "Basic é": not base64
        (b"Basic \xff\xfe", 401),  # not UTF-8 at all
        (b"Basic %%%notbase64", 401),
        (basic(b"\xff\xfe:pa55"), 401),  # user name not UTF-8
        (basic(b"no-colon"), 401),
        (basic(b"prom:" + b"x" * 100), 401),  # wrong and longer than bcrypt reads
        (basic(b"prom:wrong"), 401),
        (basic(b"nobody:pa55"), 401),
        (b"Bearer s3cret", 401),  # a token is not basic auth
        (basic(b"prom:pa55"), 200),
        (basic(b"long:" + LONG_PASSWORD), 200),  # hashed from its first 72 bytes
    ],
)
async def test_authorization_header_matrix_on_metrics(
    guarded: RunningExporter, authorization: bytes, status: int
) -> None:
    request = get_request("/metrics", {"Authorization": authorization})
    response = await raw_exchange(guarded.host, guarded.port, request)
    assert status_of(response) == status, response[:300]


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (b"Bearer \xff", 401),
        (b"Bearer s3cret\xff", 401),
        (b"Bearer \xc3\xa9", 401),
        (b"Bearer", 401),
        (b"Basic \xc3\xa9", 401),
        (b"Bearer s3cret", 200),
    ],
)
async def test_authorization_header_matrix_on_traces(
    guarded: RunningExporter, authorization: bytes, status: int
) -> None:
    request = post_request("/v1/traces", BODY, {"Authorization": authorization})
    response = await raw_exchange(guarded.host, guarded.port, request)
    assert status_of(response) == status, response[:300]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (b"basic_auth_users: {prom: '$2y$10$short'}\n", "basic_auth_users.prom"),
        (b"basic_auth_users: {prom: '$2y$99$" + b"a" * 53 + b"'}\n", "basic_auth_users.prom"),
        (b"tls_server_config: {cert_file: 123, key_file: k}\n", "tls_server_config.cert_file"),
        (b"tls_server_config: {cert_file: c, key_file: [k]}\n", "tls_server_config.key_file"),
        (b"tls_server_config: {cert_file: c, key_file: k, min_version: [TLS12]}\n", "min_version"),
        (
            b"tls_server_config: {cert_file: c, key_file: k, client_auth_type: [a, b]}\n",
            "client_auth_type",
        ),
        (b"basic_auth_users: {prom: \xff\xfe}\n", "cannot read"),
    ],
)
def test_web_config_type_errors_exit_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: bytes, key: str
) -> None:
    path = tmp_path / "web.yml"
    path.write_bytes(text)
    assert main(["--web-config-file", str(path), "--gpu-source", "none"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("gpuscope exporter: --web-config-file: ")
    assert key in error


def test_binary_bearer_token_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"\xff\xfe\x00token")
    assert main(["--bearer-token-file", str(path), "--gpu-source", "none"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--bearer-token-file: cannot read" in error
