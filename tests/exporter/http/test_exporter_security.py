"""Bearer token on /v1/traces, bcrypt basic auth and TLS from an exporter-toolkit web config."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import aiohttp
import bcrypt
import pytest

from gpuscope.exporter.config import ConfigError
from gpuscope.exporter.http.security import load_web_config
from gpuscope.exporter.service import start_exporter
from support.exporter_fixtures import SpanFactory, encode, loopback_config, post_spans, samples
from support.exporter_fixtures import value as sample_value

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


BODY = encode([SpanFactory().server(0.01)]).SerializeToString()


async def test_bearer_token_guards_traces_only(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    exporter = await start_exporter(loopback_config(bearer_token_file=token_file))
    try:
        async with aiohttp.ClientSession() as session:
            assert (await post_spans(session, exporter, BODY))[0] == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await post_spans(session, exporter, BODY, headers=wrong))[0] == 401
            right = {"Authorization": "Bearer s3cret"}
            assert (await post_spans(session, exporter, BODY, headers=right))[0] == 200
            async with session.get(exporter.url + "/metrics") as response:
                assert response.status == 200
                scraped = samples(await response.text())
        rejected = "gpuscope_otlp_requests_rejected_total"
        assert sample_value(scraped, rejected, {"reason": "unauthorized"}) == 2
        assert sample_value(scraped, "gpuscope_spans_received_total") == 1
    finally:
        await exporter.stop()


async def test_basic_auth_from_web_config_guards_every_endpoint_but_the_probes(
    tmp_path: Path,
) -> None:
    # exporter-toolkit configs carry Go's $2y$ prefix; cost 4 keeps the test fast.
    hashed = bcrypt.hashpw(b"pa55", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)
    web_config = tmp_path / "web.yml"
    web_config.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    exporter = await start_exporter(loopback_config(web_config_file=web_config))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(exporter.url + "/metrics") as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"].startswith("Basic")
            wrong = {"Authorization": basic("prom", "guess")}
            async with session.get(exporter.url + "/metrics", headers=wrong) as response:
                assert response.status == 401
            header = {"Authorization": basic("prom", "pa55")}
            for _ in range(2):  # the second one is served from the verified cache
                async with session.get(exporter.url + "/metrics", headers=header) as response:
                    assert response.status == 200
            assert (await post_spans(session, exporter, BODY, headers=header))[0] == 200
            assert (await post_spans(session, exporter, BODY))[0] == 401
            # but the probes, which a kubelet sends without credentials
            for probe in ("/healthz", "/readyz"):
                async with session.get(exporter.url + probe) as response:
                    assert response.status == 200, probe
    finally:
        await exporter.stop()


async def test_tls_from_web_config(tmp_path: Path, self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    web_config = tmp_path / "web.yml"
    web_config.write_text(
        f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n"
        "  min_version: TLS12\n"
    )
    exporter = await start_exporter(loopback_config(web_config_file=web_config))
    try:
        assert exporter.url.startswith("https://")
        trust = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as session:
            async with session.get(exporter.url + "/healthz", ssl=trust) as response:
                assert response.status == 200
            plain = exporter.url.replace("https://", "http://")
            with pytest.raises(aiohttp.ClientError):
                async with session.get(plain + "/healthz") as response:
                    await response.read()
    finally:
        await exporter.stop()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http_server_config: {http2: false}\n", "unsupported keys ['http_server_config']"),
        ("tls_server_config: {cert_file: a.crt}\n", "needs both cert_file and key_file"),
        ("tls_server_config: {cert_file: a, key_file: b, cipher_suites: []}\n", "cipher_suites"),
        ("basic_auth_users: {prom: plaintext}\n", "basic_auth_users.prom is not a bcrypt hash"),
        ("- a list\n", "must hold a mapping"),
        ("key: [unclosed\n", "cannot read"),
    ],
)
def test_web_config_errors_name_the_flag_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_web_config(path)
    assert str(caught.value).startswith("--web-config-file: ")
    assert message in str(caught.value)
