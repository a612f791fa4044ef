"""``gpuscope exporter``: flags and their GPUSCOPE_* twins, and the command's life cycle."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
from dataclasses import fields
from pathlib import Path

import aiohttp
import pytest

from gpuscope import flags
from gpuscope import spans as contract
from gpuscope.exporter.cli import main
from gpuscope.exporter.config import ConfigError, ExporterConfig
from gpuscope.exporter.gpu.simulated import simulated_uuid
from support.exporter_fixtures import SpanFactory, encode, samples, value

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


def parse_config(argv: list[str], environ: dict[str, str]) -> ExporterConfig:
    return flags.parse(ExporterConfig, argv, environ, exit_on_error=False)


def test_defaults_flags_and_environment_twins() -> None:
    assert parse_config([], {}) == ExporterConfig()
    assert ExporterConfig().listen_address() == (None, 9420)  # every interface
    environ = {"GPUSCOPE_MAX_SERIES": "50", "GPUSCOPE_LISTEN": "127.0.0.1:1234"}
    config = parse_config(["--max-series", "70"], environ)
    assert config.max_series == 70  # the flag wins over its twin
    assert config.listen_address() == ("127.0.0.1", 1234)
    assert parse_config([], {"GPUSCOPE_GPU_INTERVAL": "0.25"}).gpu_interval_s == 0.25
    assert parse_config([], {"GPUSCOPE_BODY_TIMEOUT_S": "2.5"}).body_timeout_s == 2.5
    assert ExporterConfig().body_timeout_s == 30.0
    assert ExporterConfig(listen="[::1]:9420").listen_address() == ("::1", 9420)


def test_every_flag_has_an_environment_twin_in_its_help() -> None:
    help_text = flags.build_parser(ExporterConfig).format_help()
    for field in fields(ExporterConfig):
        assert "GPUSCOPE_" + field.name.upper() in help_text


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--listen", "9420"], "--listen"),
        (["--listen", ":http"], "--listen"),
        (["--listen", ":70000"], "--listen"),
        (["--max-series", "0"], "--max-series"),
        (["--max-series", "many"], "--max-series"),
        (["--gpu-source", "tpu"], "--gpu-source"),
        (["--gpu-interval-s", "0"], "--gpu-interval-s"),
        (["--body-timeout-s", "0"], "--body-timeout-s"),
        (["--forward-otlp", "tempo:4318"], "--forward-otlp"),
        (["--web-config-file", "/nonexistent/web.yml"], "--web-config-file"),
        (["--log-level", "loud"], "--log-level"),
    ],
)
def test_bad_values_name_their_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(flag)}: "):
        parse_config(argv, {})


def test_bad_flag_exits_2_with_the_flag_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--max-body-bytes", "-1"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "gpuscope exporter: --max-body-bytes: must be at least 1, got -1"
        " (see 'gpuscope exporter --help')\n"
    )


def test_bad_bearer_token_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert main(["--bearer-token-file", str(empty), "--gpu-source", "none"]) == 2
    assert "--bearer-token-file" in capsys.readouterr().err


async def test_command_serves_and_stops_cleanly_on_sigterm() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscope", "exporter",
        "--listen", "127.0.0.1:0", "--gpu-source", "simulated", "--simulated-gpus", "2",
        stderr=asyncio.subprocess.PIPE,
        cwd="/",  # away from the repository's own gpuscope/ folder
    )  # fmt: skip
    assert process.stderr is not None
    try:
        url = None
        while url is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, "exporter exited before serving"
            found = re.search(r"serving on (http://\S+)", line)
            url = found.group(1) if found else None
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/healthz") as response:
                assert response.status == 200
            async with session.get(url + "/metrics") as response:
                assert 'gpuscope_gpu_up{gpu="1"' in await response.text()
            await _busy_after_a_batch(session, url)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _busy_after_a_batch(session: aiohttp.ClientSession, url: str) -> None:
    """The simulated source is told of the batches the command ingests: GPU 0 turns busy."""
    batch = SpanFactory().batch(8, duration_s=0.5, attrs={contract.GPU_UUID: simulated_uuid(0)})
    body = encode([batch]).SerializeToString()
    headers = {"Content-Type": "application/x-protobuf"}
    async with session.post(url + "/v1/traces", data=body, headers=headers) as response:
        assert response.status == 200
    deadline = asyncio.get_running_loop().time() + 30
    busy = None
    while not busy and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.2)
        async with session.get(url + "/metrics") as response:
            scraped = samples(await response.text())
        busy = value(scraped, "gpuscope_gpu_utilization_ratio", {"gpu": "0"})
    assert busy, "the simulated GPU never saw the batch"
    assert value(scraped, "gpuscope_gpu_utilization_ratio", {"gpu": "1"}) == 0.0


def test_a_taken_port_is_one_line_naming_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--listen", f"127.0.0.1:{port}", "--gpu-source", "none"]) == 1
    err = capsys.readouterr().err
    assert err == f"gpuscope exporter: cannot serve on 127.0.0.1:{port}: Address already in use\n"
