"""A GPU poll that never returns (an NVML call hung in the driver): never served as
live, readiness says why, and neither the poller nor the exporter process waits on it
at shutdown. Also NVML released on request (SIGUSR1) and taken again (SIGUSR2)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pynvml
import pytest
from prometheus_client import CollectorRegistry

from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.nvml.source import NvmlSource
from gpuscope.exporter.gpu.poller import GpuPoller, default_deadline
from gpuscope.exporter.service import start_exporter
from support.exporter_fixtures import loopback_config
from support.gpu_fake_nvml import FakeNvml, fake_gpu
from support.waiting import await_until

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

TESTS = Path(__file__).parents[2]


class ManualTimer:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def hung_poller(timer: ManualTimer) -> tuple[GpuPoller, FakeNvml, CollectorRegistry]:
    fake = FakeNvml([fake_gpu(0), fake_gpu(1)])
    poller = GpuPoller(NvmlSource(fake, xid_wait_ms=20), 1.0, timer=timer, deadline_s=2.0)
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    return poller, fake, registry


def gpu(index: int, fake: FakeNvml) -> dict[str, str]:
    return {"gpu": str(index), "uuid": fake.gpus[index].uuid}


def test_the_default_deadline_is_two_intervals_with_a_floor() -> None:
    assert default_deadline(1.0) == 2.0 and default_deadline(5.0) == 10.0
    assert default_deadline(0.1) == 2.0


def test_a_hung_round_reads_failed_after_its_deadline_and_the_sample_age_grows() -> None:
    timer = ManualTimer()
    poller, fake, registry = hung_poller(timer)
    poller.poll_once()
    fake.hang_in["nvmlDeviceGetPowerUsage"] = fake.calls["nvmlDeviceGetPowerUsage"]
    hung = threading.Thread(target=poller.poll_once, daemon=True)
    hung.start()
    try:
        assert fake.hanging.wait(5)
        timer.now += 1.5  # within the deadline: the last round still stands
        assert registry.get_sample_value("gpuscope_gpu_up", gpu(0, fake)) == 1.0
        assert poller.unready() is None
        timer.now += 1.0  # 2.5 s into the round: past its 2 s deadline
        for index in (0, 1):
            assert registry.get_sample_value("gpuscope_gpu_up", gpu(index, fake)) == 0.0
            reason = gpu(index, fake) | {"reason": "poll_overdue"}
            assert registry.get_sample_value("gpuscope_gpu_down_reason", reason) == 1.0
            assert registry.get_sample_value("gpuscope_gpu_power_watts", gpu(index, fake)) is None
        assert registry.get_sample_value("gpuscope_collector_success", {"collector": "nvml"}) == 0
        assert registry.get_sample_value("gpuscope_gpu_sample_age_seconds") == 2.5
        timer.now += 3.0
        assert registry.get_sample_value("gpuscope_gpu_sample_age_seconds") == 5.5
        why = poller.unready()
        assert why is not None and "stuck in nvml sample" in why
    finally:
        fake.unhang()
        hung.join(5)
    assert registry.get_sample_value("gpuscope_gpu_up", gpu(0, fake)) == 1.0  # back to live
    # the readings served were taken when that round began, 5.5 s ago
    assert registry.get_sample_value("gpuscope_gpu_sample_age_seconds") == 5.5
    poller.stop()


def test_stop_does_not_wait_on_a_hung_call_nor_close_nvml_under_it() -> None:
    fake = FakeNvml([fake_gpu(0)])
    poller = GpuPoller(NvmlSource(fake, xid_wait_ms=20), 0.05, deadline_s=0.1)
    poller.start()
    assert poller.wait_for_round(1, timeout_s=5)
    fake.hang_in["nvmlDeviceGetPowerUsage"] = fake.calls["nvmlDeviceGetPowerUsage"]
    try:
        assert fake.hanging.wait(5)
        started = time.monotonic()
        poller.stop(timeout_s=0.2)
        assert time.monotonic() - started < 1.0
        assert fake.calls.get("nvmlShutdown", 0) == 0  # not beside the hung call
        assert (
            fake.calls["nvmlDeviceGetPowerUsage"]
            == fake.hang_in.get(
                "nvmlDeviceGetPowerUsage", fake.calls["nvmlDeviceGetPowerUsage"] - 1
            )
            + 1
        )  # one hung call, no second one started beside it
    finally:
        fake.unhang()


def test_release_reports_the_gpus_released_and_acquire_polls_again() -> None:
    fake = FakeNvml([fake_gpu(0)])
    poller = GpuPoller(NvmlSource(fake, xid_wait_ms=20), 0.02)
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    poller.start()
    try:
        assert poller.wait_for_round(1, timeout_s=5)
        poller.release()
        deadline = time.monotonic() + 5
        while poller.unready() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        why = poller.unready()
        assert why is not None and "released" in why
        assert fake.refcount == 0  # nvmlShutdown: a reset or MIG change finds no client
        reason = gpu(0, fake) | {"reason": "released"}
        assert registry.get_sample_value("gpuscope_gpu_down_reason", reason) == 1.0
        assert (
            registry.get_sample_value("gpuscope_collector_success", {"collector": "nvml"}) is None
        )
        rounds = poller.snapshot().round
        poller.acquire()
        assert poller.wait_for_round(rounds + 1, timeout_s=5)
        assert registry.get_sample_value("gpuscope_gpu_up", gpu(0, fake)) == 1.0
        assert fake.refcount == 1 and poller.unready() is None
    finally:
        poller.stop()


async def test_readyz_and_healthz_say_what_is_wrong() -> None:
    fake = FakeNvml([fake_gpu(0)])
    exporter = await start_exporter(
        loopback_config(gpu_interval_s=0.05, gpu_poll_deadline_s=0.2),
        gpu_source=NvmlSource(fake, xid_wait_ms=20),
    )
    try:
        async with aiohttp.ClientSession() as session:
            await wait_status(session, exporter.url + "/readyz", 200)
            fake.driver_error = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
            text = await wait_status(session, exporter.url + "/healthz", 503)
            assert "restart the exporter" in text
            fake.driver_error = None
            fake.hang_in["nvmlInit"] = fake.calls["nvmlInit"]  # the retry hangs
            text = await wait_status(session, exporter.url + "/readyz", 503, "stuck")
            assert "deadline 0.2 s" in text
    finally:
        fake.unhang()
        await exporter.stop()


async def wait_status(
    session: aiohttp.ClientSession, url: str, status: int, contains: str = ""
) -> str:
    for _ in range(500):
        async with session.get(url) as response:
            text = await response.text()
            if response.status == status and contains in text:
                return text
        await asyncio.sleep(0.02)
    raise AssertionError(f"{url} never answered {status} {contains!r}; last: {text}")


@pytest.fixture
async def hung_exporter() -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "support.hung_nvml_exporter", "--listen", "127.0.0.1:0",
        "--gpu-interval-s", "0.2", "--gpu-poll-deadline-s", "0.4", "--shutdown-timeout-s", "2",
        stderr=asyncio.subprocess.PIPE,
        cwd="/",
        env=os.environ | {"PYTHONPATH": str(TESTS)},
    )  # fmt: skip
    assert process.stderr is not None
    try:
        found = None
        while found is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, "exporter exited before serving"
            found = re.search(r"serving on (http://[\d.]+:\d+)", line)
        yield process, found.group(1)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_hung_call_reads_failed_within_two_intervals_and_sigterm_exits_in_time(
    hung_exporter: tuple[asyncio.subprocess.Process, str],
) -> None:
    process, url = hung_exporter
    async with aiohttp.ClientSession() as session:
        await wait_status(session, url + "/readyz", 200)
        hung_since = time.monotonic()  # round 2 starts within one interval of ready
        text = await wait_status(session, url + "/metrics", 200, 'reason="poll_overdue"')
        # the deadline is two intervals; the hung round began within one of ready
        assert time.monotonic() - hung_since < 0.4 + 0.2 + 1.0
        assert 'gpuscope_collector_success{collector="nvml"} 0.0' in text
        ages = [
            float(m) for m in re.findall(r"^gpuscope_gpu_sample_age_seconds (\S+)$", text, re.M)
        ]

        async def older() -> float | None:
            async with session.get(url + "/metrics") as response:
                later = re.findall(
                    r"^gpuscope_gpu_sample_age_seconds (\S+)$", await response.text(), re.M
                )
            return float(later[0]) if later and float(later[0]) > ages[0] else None

        await await_until(older, "the sample's age growing while the call hangs", 10)
        assert ages[0] >= 0.4
        await wait_status(session, url + "/readyz", 503, "stuck")
        await wait_status(session, url + "/healthz", 200)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0
    assert time.monotonic() - started < 2.0  # the --shutdown-timeout-s
