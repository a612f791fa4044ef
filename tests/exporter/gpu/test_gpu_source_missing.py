"""An exporter without a GPU says so: ``gpuscope_gpu_source_info``, and ``--require-gpu``
to make it fatal. NVML is the fake of ``support.gpu_fake_nvml``, failing as the real
library does on a host without a driver (``Driver Not Loaded``) or without the library
itself (``NVML Shared Library Not Found``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pynvml
import pytest

from gpuscope import flags
from gpuscope.exporter.config import ConfigError, ExporterConfig
from gpuscope.exporter.gpu import factory
from gpuscope.exporter.gpu.factory import GpuSourceUnavailable, open_gpu_source
from gpuscope.exporter.gpu.nvml import source as nvml_source
from gpuscope.exporter.gpu.nvml.source import NvmlSource
from gpuscope.exporter.gpu.source import GpuSourceKind
from gpuscope.exporter.service import start_exporter
from support.exporter_fixtures import loopback_config, samples, scrape
from support.gpu_fake_nvml import FakeNvml, fake_gpu

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

TESTS = Path(__file__).resolve().parents[2]
NO_DRIVER = {
    "NVML_ERROR_DRIVER_NOT_LOADED": "Driver Not Loaded",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "NVML Shared Library Not Found",
}
# ``gpuscope`` with the fake NVML in place of pynvml: argv[1] names the error every
# NVML call raises ("" for none), argv[2] how many GPUs the fake has, the rest is the
# command line. Everything else is the real command.
FAKE_NVML_MAIN = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pynvml
from support.gpu_fake_nvml import FakeNvml, fake_gpu
fake = FakeNvml([fake_gpu(i) for i in range(int(sys.argv[2]))])
fake.driver_error = getattr(pynvml, sys.argv[1]) if sys.argv[1] else None
sys.modules["pynvml"] = fake
from gpuscope.cli import main
sys.exit(main(sys.argv[3:]))
"""


def fake_nvml_without_driver(monkeypatch: pytest.MonkeyPatch, error: str) -> FakeNvml:
    fake = FakeNvml([fake_gpu(0)])
    fake.driver_error = getattr(pynvml, error)
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    return fake


@pytest.mark.parametrize("error", sorted(NO_DRIVER))
def test_auto_without_a_driver_settles_for_none_unless_required(
    monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    fake_nvml_without_driver(monkeypatch, error)
    assert open_gpu_source(GpuSourceKind.AUTO, scenario=None, simulated_count=1) is None
    with pytest.raises(GpuSourceUnavailable) as raised:
        open_gpu_source(GpuSourceKind.AUTO, scenario=None, simulated_count=1, require=True)
    message = str(raised.value)
    assert message == f"--require-gpu: no GPU found (nvml: nvmlInit failed: {NO_DRIVER[error]})"
    assert "\n" not in message


def test_a_library_that_sees_no_gpu_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML that initialises but counts 0 GPUs (a container given the library but no
    device): auto goes on and closes it; an explicit choice serves it unless required."""
    empty = FakeNvml([])
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: empty)
    assert open_gpu_source(GpuSourceKind.AUTO, scenario=None, simulated_count=1) is None
    assert empty.refcount == 0  # shut down again
    explicit = open_gpu_source(GpuSourceKind.NVML, scenario=None, simulated_count=1)
    assert isinstance(explicit, NvmlSource) and explicit.devices() == ()
    explicit.close()
    with pytest.raises(GpuSourceUnavailable, match=r"^--require-gpu: no GPU found \(nvml: no GPU"):
        open_gpu_source(GpuSourceKind.NVML, scenario=None, simulated_count=1, require=True)
    assert empty.refcount == 0


def test_required_and_found_opens_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([fake_gpu(0), fake_gpu(1)])
    monkeypatch.setattr(nvml_source, "load_pynvml", lambda: fake)
    source = open_gpu_source(GpuSourceKind.AUTO, scenario=None, simulated_count=1, require=True)
    assert isinstance(source, NvmlSource) and len(source.devices()) == 2
    source.close()
    simulated = open_gpu_source(
        GpuSourceKind.SIMULATED, scenario=None, simulated_count=2, require=True
    )
    assert simulated is not None and len(simulated.devices()) == 2


def parse_config(argv: list[str], environ: dict[str, str]) -> ExporterConfig:
    return flags.parse(ExporterConfig, argv, environ, exit_on_error=False)


def test_require_gpu_flag_twin_and_contradiction() -> None:
    assert parse_config([], {}).require_gpu is False
    assert parse_config(["--require-gpu"], {}).require_gpu is True
    assert parse_config([], {"GPUSCOPE_REQUIRE_GPU": "1"}).require_gpu is True
    with pytest.raises(ConfigError, match=r"^--require-gpu: --gpu-source none opens no GPU"):
        parse_config(["--require-gpu", "--gpu-source", "none"], {})


@pytest.mark.parametrize(
    ("requested", "source", "expected"),
    [("auto", None, "none"), ("none", None, "none"), ("simulated", "simulated", "simulated")],
)
async def test_the_source_in_use_is_served(
    exporter_http: aiohttp.ClientSession, requested: str, source: str | None, expected: str
) -> None:
    opened = None if source is None else factory.open_simulated_source(1, None)
    exporter = await start_exporter(loopback_config(gpu_source=requested), gpu_source=opened)
    try:
        scraped = samples(await scrape(exporter_http, exporter))
    finally:
        await exporter.stop()
    info = [s for s in scraped if s.name == "gpuscope_gpu_source_info"]
    assert [(s.labels, s.value) for s in info] == [
        ({"requested": requested, "source": expected}, 1.0)
    ]


def run_command(error: str, gpus: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", FAKE_NVML_MAIN, error, str(gpus), "exporter", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",  # away from the repository's folders
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )


@pytest.mark.parametrize("error", sorted(NO_DRIVER))
def test_the_command_exits_with_one_line_when_a_required_gpu_is_missing(error: str) -> None:
    result = run_command(error, 1, "--listen", "127.0.0.1:0", "--require-gpu")
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        "gpuscope exporter: --require-gpu: no GPU found "
        f"(nvml: nvmlInit failed: {NO_DRIVER[error]})"
    )


def test_the_command_refuses_require_gpu_with_no_source() -> None:
    result = run_command("", 1, "--gpu-source", "none", "--require-gpu")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpuscope exporter: --require-gpu: --gpu-source none opens no GPU")


async def test_the_command_without_a_driver_serves_and_says_so() -> None:
    """Not required: the command serves, ready, and states the missing source."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FAKE_NVML_MAIN, "NVML_ERROR_DRIVER_NOT_LOADED", "1", "exporter",
        "--listen", "127.0.0.1:0",
        stderr=asyncio.subprocess.PIPE,
        cwd="/",
    )  # fmt: skip
    assert process.stderr is not None
    log: list[str] = []
    try:
        while not (log and "serving on " in log[-1]):
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, f"exporter exited: {log}"
            log.append(line)
        url = log[-1].split("serving on ", 1)[1].strip()
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/readyz") as response:
                assert response.status == 200
            async with session.get(url + "/metrics") as response:
                scraped = samples(await response.text())
    finally:
        process.terminate()
        await process.wait()
    assert any("no GPU source" in line and "Driver Not Loaded" in line for line in log)
    info = [(s.labels, s.value) for s in scraped if s.name == "gpuscope_gpu_source_info"]
    assert info == [({"requested": "auto", "source": "none"}, 1.0)]
    assert not [s for s in scraped if s.name.startswith(("gpuscope_gpu_up", "gpuscope_collector"))]
