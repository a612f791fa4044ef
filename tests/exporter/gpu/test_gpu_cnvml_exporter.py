"""The exporter and ``gpuscope doctor`` end to end on the C fake NVML: the real pynvml
loads ``libnvidia-ml.so.1`` built from ``tests/support/cnvml/fake_nvml.c`` with a profile
made from a real GPU's ``nvidia-smi`` capture, and ``/metrics`` must equal the golden
file of that capture (``tests/fixtures/gpu-captures/golden/``, reviewed by hand against
the capture: see its README). ``GPUSCOPE_UPDATE_GOLDEN=1`` rewrites the golden files.

Series whose values depend on time (energy and PCIe byte counters, which the fake
integrates, durations, ages) are compared by name and labels only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpuscope.children import free_port
from support.cnvml import library, profiles

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

GOLDEN = profiles.CAPTURES / "golden"
CAPTURES = {
    "h200": "nvidia-h200__590",
    "h200-mig": "nvidia-h200-mig__590",
    "h100": "nvidia-h100-80gb-hbm3__590",
    "h100-mig": "nvidia-h100-mig__590",
    "l40s": "nvidia-l40s__595",
}
# values that move with time: kept by name and labels, value masked
TIME_DEPENDENT = re.compile(
    r"^gpuscope_gpu_(energy_joules_total|(pcie|nvlink)_(transmit|receive)_bytes_total|sample_age_seconds)"
)
GPU_LINE = re.compile(r"^gpuscope_gpu_[a-z_]+(\{[^}]*\})? ")


def _profile(tmp_path: Path, name: str) -> Path:
    return profiles.profile_from_capture(profiles.capture(CAPTURES[name])).write(
        tmp_path / f"{name}.profile"
    )


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@contextmanager
def exporter(env: dict[str, str], *extra: str) -> Iterator[str]:
    port = free_port()
    command = [
        sys.executable, "-m", "gpuscope.cli", "exporter", "--listen", f"127.0.0.1:{port}",
        "--gpu-source", "nvml", "--gpu-interval-s", "0.2", "--log-level", "warning", *extra,
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                pytest.fail(f"the exporter exited {process.returncode}: {process.communicate()[1]}")
            try:
                if _get(f"{url}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the exporter did not become ready within 20 s")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)
        if process.stderr is not None:
            process.stderr.close()


def gpu_series(metrics: str) -> list[str]:
    lines = []
    for line in metrics.splitlines():
        if not GPU_LINE.match(line):
            continue
        name_labels = line.rpartition(" ")[0]
        lines.append(f"{name_labels} <varies>" if TIME_DEPENDENT.match(line) else line)
    return sorted(lines)


def scraped(env: dict[str, str]) -> list[str]:
    with exporter(env) as url:
        time.sleep(0.6)  # timed: a few poll rounds: GPM needs two samples
        status, text = _get(f"{url}/metrics")
    assert status == 200
    return gpu_series(text)


def check_golden(name: str, lines: list[str]) -> None:
    path = GOLDEN / f"{name}.prom"
    text = "\n".join(lines) + "\n"
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), (
        f"no golden file {path}: run with GPUSCOPE_UPDATE_GOLDEN=1, then review it"
    )
    assert text == path.read_text()


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_metrics_equal_the_reviewed_golden_file(tmp_path: Path, name: str) -> None:
    env = library.environment(_profile(tmp_path, name))
    check_golden(name, scraped(env))


@pytest.mark.parametrize("release", [library.PYNVML_FLOOR, library.PYNVML_NEWEST])
def test_both_ends_of_the_declared_pynvml_serve_the_h200(tmp_path: Path, release: str) -> None:
    # the same driver (R580) under the lowest and the newest nvidia-ml-py declared:
    # everything the driver gives is served whichever pynvml names it
    env = library.environment(_profile(tmp_path, "h200"), pynvml=release)
    lines = scraped(env)
    names = {line.split("{")[0].split(" ")[0] for line in lines}
    assert "gpuscope_gpu_up" in names and 'gpuscope_gpu_up{gpu="0"' in "\n".join(lines)
    for series in ("gpuscope_gpu_memory_used_bytes", "gpuscope_gpu_memory_reserved_bytes",
                   "gpuscope_gpu_pcie_transmit_bytes_total", "gpuscope_gpu_sm_occupancy_ratio",
                   "gpuscope_gpu_clock_event_active"):  # fmt: skip
        assert series in names, (release, series)


@pytest.mark.parametrize("branch", library.BRANCHES)
def test_each_driver_branch_serves_what_it_has(tmp_path: Path, branch: int) -> None:
    env = library.environment(_profile(tmp_path, "h200"), branch=branch)
    names = {line.split("{")[0] for line in scraped(env)}
    # PCIe bytes: fields 197/198 from R555, GPM's PCIe rates on Hopper before that
    assert "gpuscope_gpu_pcie_transmit_bytes_total" in names
    assert "gpuscope_gpu_clock_event_active" in names  # ThrottleReasons before R535


def test_doctor_reports_every_group_on_the_h200(tmp_path: Path) -> None:
    env = library.environment(_profile(tmp_path, "h200"))
    done = subprocess.run(
        [sys.executable, "-m", "gpuscope.cli", "doctor", "--gpu-source", "nvml", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (gpu,) = report["gpus"]
    assert (gpu["name"], gpu["driver_version"], gpu["up"]) == ("NVIDIA H200", "590.48.01", True)
    # every metric group the exporter knows, each supported by what an H200 on R580 gives,
    # but the application clock target, which the capture's R590 driver calls deprecated
    missing = {group: m["why"] for group, m in gpu["metrics"].items() if not m["supported"]}
    assert list(missing) == ["sm_clock_target"] and "deprecated" in missing["sm_clock_target"]
    assert {"memory", "memory_reserved", "pcie_bytes", "gpm", "xid_errors"} <= set(gpu["metrics"])


def test_doctor_says_what_an_r535_driver_lacks(tmp_path: Path) -> None:
    env = library.environment(_profile(tmp_path, "h200"), branch=535, pynvml=library.PYNVML_FLOOR)
    done = subprocess.run(
        [sys.executable, "-m", "gpuscope.cli", "doctor", "--gpu-source", "nvml", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (gpu,) = json.loads(done.stdout)["gpus"]
    # no PCIe byte fields before R555: the bytes come from GPM's rates, and doctor says so
    assert gpu["metrics"]["pcie_bytes"]["supported"]
    assert "GPM" in (gpu["metrics"]["pcie_bytes"]["note"] or "")
