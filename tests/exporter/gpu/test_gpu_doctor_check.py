"""``gpuscope doctor`` and the logic of ``scripts/gpu-check`` on canned readings."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuscope import flags
from gpuscope.exporter.doctor import DoctorConfig, diagnose, run
from gpuscope.exporter.gpu.collector import GpuCollector
from gpuscope.exporter.gpu.nvml.source import NvmlSource
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.source import GpuSourceKind
from gpuscope.flags import ConfigError
from scripts.gpu_validation import (
    GpuCheckConfig,
    check_clock_power_memory,
    check_doctor,
    check_pcie,
    check_process_join,
    gpu_samples,
)
from support.gpu_fake_nvml import AMPERE, FakeNvml, fake_gpu

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

SCRIPT = Path(__file__).parents[3] / "scripts" / "gpu-check"


def test_doctor_explains_what_an_ampere_gpu_lacks() -> None:
    fake = FakeNvml([fake_gpu(0), fake_gpu(1, architecture=AMPERE, name="NVIDIA A100-SXM4-80GB")])
    fake.gpus[1].errors["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_NO_PERMISSION
    out = io.StringIO()
    assert run(NvmlSource(fake, xid_wait_ms=50), DoctorConfig(), out) == 0
    text = out.getvalue()
    hopper, ampere = text.split("\nGPU 1")
    assert "yes  gpm" in hopper and "no   gpm" not in hopper
    assert "no   gpm  - GPM (SM occupancy, SM/tensor/DRAM activity) needs Hopper" in ampere
    assert "Ampere" in ampere and "no   energy  - no permission" in ampere
    assert fake.refcount == 0  # the doctor closes what it opened


def test_doctor_json_matches_what_the_exporter_serves() -> None:
    fake = FakeNvml([fake_gpu(0, pcie_fields_supported=True)])
    fake.gpus[0].errors["nvmlDeviceGetCurrPcieLinkWidth"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    report = diagnose(NvmlSource(fake, xid_wait_ms=50))
    assert report["gpus"][0]["metrics"]["pcie_link_width"]["supported"] is False
    assert report["gpus"][0]["metrics"]["gpm"]["supported"] is True

    now = [100.0]
    poller = GpuPoller(NvmlSource(fake, clock=lambda: now[0], xid_wait_ms=50), 1.0)
    registry = CollectorRegistry()
    registry.register(GpuCollector(poller))
    poller.poll_once()
    now[0] += 1.0  # GPM rates need a second sample 100 ms or more later
    poller.poll_once()
    scrape = gpu_samples(generate_latest(registry).decode(), 0)
    assert check_doctor(report, scrape, 0).passed
    poller.stop()
    lying = json.loads(json.dumps(report))
    lying["gpus"][0]["metrics"]["pcie_link_width"]["supported"] = True
    result = check_doctor(lying, scrape, 0)
    assert not result.passed and "pcie_link_width: doctor says yes" in result.detail


def parse_args(argv: list[str], environ: dict[str, str]) -> DoctorConfig:
    return flags.parse(DoctorConfig, argv, environ, exit_on_error=False)


def parse_check_args(argv: list[str], environ: dict[str, str]) -> GpuCheckConfig:
    return flags.parse(GpuCheckConfig, argv, environ, exit_on_error=False)


def test_doctor_flags_and_environment_twins() -> None:
    assert parse_args(["--gpu-source", "simulated", "--json"], {}) == DoctorConfig(
        GpuSourceKind.SIMULATED, None, 1, True
    )
    assert (
        parse_args(
            [], {"GPUSCOPE_GPU_SOURCE": "none", "GPUSCOPE_SIMULATED_GPUS": "4"}
        ).simulated_gpus
        == 4
    )
    with pytest.raises(ConfigError, match=r"^--gpu-source: cannot read 'cuda' as one of "):
        parse_args([], {"GPUSCOPE_GPU_SOURCE": "cuda"})


def canned(
    sm_mhz: float, watts: float, used_gib: float, occupancy: float | None
) -> dict[str, float]:
    samples = {
        "gpuscope_gpu_sm_clock_hertz": sm_mhz * 1e6,
        "gpuscope_gpu_sm_clock_max_hertz": 1980e6,
        "gpuscope_gpu_power_watts": watts,
        "gpuscope_gpu_memory_used_bytes": used_gib * 2**30,
    }
    if occupancy is not None:
        samples["gpuscope_gpu_sm_occupancy_ratio"] = occupancy
    return samples


def test_load_checks_pass_on_a_healthy_gpu_and_fail_on_a_stuck_one() -> None:
    idle = canned(345, 70, 0.5, 0.0)
    healthy = check_clock_power_memory(idle, canned(1980, 650, 5.2, 0.45), 4 * 2**30)
    assert [r.passed for r in healthy] == [True, True, True, True]
    stuck = check_clock_power_memory(idle, canned(345, 72, 0.6, None), 4 * 2**30)
    assert [r.name for r in stuck if not r.passed] == [
        "sm_clock_under_load",
        "power_rises_under_load",
        "memory_used_grows",
        "gpm_occupancy_rises",
    ]


def test_process_join_check_wants_the_loader_listed_on_its_gpu() -> None:
    def doctor(status: str, pids: list[int]) -> dict[str, object]:
        gpus = {"GPU-a": {"index": 0, "pids": pids, "why": None}}
        return {"process_join": {"status": status, "why": "x", "gpus": gpus}}

    assert check_process_join(doctor("ok", [7, 42]), 0, 42).passed
    assert not check_process_join(doctor("ok", [7]), 0, 42).passed
    assert not check_process_join(doctor("ok", [42]), 1, 42).passed  # another GPU
    failed = check_process_join(doctor("no_permission", [42]), 0, 42)
    assert not failed.passed and "status no_permission" in failed.detail
    assert not check_process_join({}, 0, 42).passed  # a doctor without the join


@pytest.mark.parametrize(
    ("counted", "passed"),
    [
        (2**31 * 1.079, True),  # what a real H200 counted for a 2 GiB copy received
        (2**31 * 1.094, True),  # and sent: the link's bytes, packet headers included
        (2**31 * 1.20, False),
        (2**31 * 0.99, False),  # fewer than were copied: the counter missed some
        (2**31 - 4.0e9, False),  # the modulo-2^32 fields read without unwrapping
        (0, False),
    ],
)
def test_pcie_check_allows_the_links_overhead_and_never_less(counted: float, passed: bool) -> None:
    before = {"gpuscope_gpu_pcie_receive_bytes_total": 1e6}
    after = {"gpuscope_gpu_pcie_receive_bytes_total": 1e6 + counted}
    assert check_pcie("receive", before, after, 2**31, 0.15).passed is passed
    assert not check_pcie("transmit", before, after, 2**31, 0.15).passed  # absent metric


def test_gpu_check_flags_environment_and_errors() -> None:
    config = parse_check_args(["--output", "o.json", "--copy-bytes", "1048576"], {})
    assert (config.output, config.copy_bytes, config.gpu) == (Path("o.json"), 2**20, 0)
    env = parse_check_args(
        [], {"GPUSCOPE_GPU_CHECK_OUTPUT": "e.json", "GPUSCOPE_GPU_CHECK_GPU": "1"}
    )
    assert (env.output, env.gpu) == (Path("e.json"), 1)
    for argv in (
        ["--copy-bytes", "lots", "--output", "x"],
        ["--load-seconds", "0", "--output", "x"],
        [],
    ):
        with pytest.raises(ConfigError):
            parse_check_args(argv, {})


def test_gpu_check_fails_fast_without_a_gpu(tmp_path: Path) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present: run scripts/gpu-check itself")
    output = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "gpu-check: FAIL (cannot run): no NVIDIA GPU or driver" in result.stderr
    assert not output.exists()


def no_gpu_here() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return True
    pynvml.nvmlShutdown()
    return False


@pytest.mark.parametrize(
    ("gpu_source", "outcome"),
    [
        (
            "auto",
            "the exporter would serve request metrics only (with --require-gpu it would exit)",
        ),
        ("nvml", "'gpuscope exporter --gpu-source nvml' would exit with an error"),
    ],
)
def test_doctor_without_a_gpu_says_what_the_exporter_does_in_json_alone(
    gpu_source: str, outcome: str
) -> None:
    if not no_gpu_here():
        pytest.skip("an NVIDIA driver is present")
    argv = ["doctor", "--gpu-source", gpu_source, "--json"]
    doctor = subprocess.run(
        [sys.executable, "-m", "gpuscope.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert doctor.returncode == 1
    assert doctor.stderr == ""  # --json prints the document instead of the text
    report = json.loads(doctor.stdout)
    assert report["source"] is None and report["gpus"] == []
    assert outcome in report["exporter"] and report["errors"]
    if gpu_source == "nvml":  # and the exporter does exactly that
        exporter = subprocess.run(
            [sys.executable, "-m", "gpuscope.cli", "exporter", "--gpu-source", "nvml"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert exporter.returncode == 1
        assert "--gpu-source nvml" in exporter.stderr
