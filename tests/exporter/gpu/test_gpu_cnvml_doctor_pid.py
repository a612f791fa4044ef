"""``gpuscope doctor --pid`` on the C fake NVML: the checklist of one serving process (a
real process here, pinned to CPU 0) on the H200 of the capture. Shared with two other
processes without MPS, on the far NUMA node, with a swinging SM clock, every check but
the links names its fix; through MPS, local, with a steady clock, none does; on a MIG
instance of the H200-MIG capture it is isolated and has no NVLink; a process on no GPU
is told so (exit 1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cnvml import library, profiles

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

UUID = "GPU-00000000-0000-0000-0000-000000000000"
MIG_UUID = "MIG-00000003-0000-0000-0000-000000000003"
FAR_NODE = 7  # a node no process here may allocate on
OTHERS = "10291:2690646016 10293:1616904192"  # two co-tenants of the load capture
SWINGING = "gpu.0.clock.sm_mhz_cycle=1980,1410;gpu.0.clock.sm_mhz_cycle_s=0.3"
DOCTOR = [sys.executable, "-m", "gpuscope.cli", "doctor", "--gpu-source", "nvml"]


@pytest.fixture
def pinned() -> Iterator[int]:
    """A process allowed CPU 0 only, as `taskset -c 0` would start it."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, time; os.sched_setaffinity(0, {0}); time.sleep(120)"]
    )
    try:
        for _ in range(100):  # until the child has pinned itself
            if "Cpus_allowed_list:\t0\n" in Path(f"/proc/{child.pid}/status").read_text():
                break
            time.sleep(0.05)
        yield child.pid
    finally:
        child.kill()
        child.wait()


def _own_nodes() -> str:
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    return re.search(r"^Mems_allowed_list:\s*(\S+)", status, re.M).group(1)  # type: ignore[union-attr]


def _h200(tmp_path: Path, *settings: str) -> dict[str, str]:
    profile = profiles.profile_from_capture(profiles.capture("nvidia-h200__590"))
    return library.environment(profile.write(tmp_path / "h200"), knobs={"SET": ";".join(settings)})


def _doctor(env: dict[str, str], pid: int, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DOCTOR, "--pid", str(pid), *flags],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _checks(env: dict[str, str], pid: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    done = _doctor(env, pid, "--json")
    assert done.returncode == 0, done.stderr
    (gpu,) = json.loads(done.stdout)["gpus"]
    return gpu, {check["check"]: check for check in gpu["checks"]}


def test_a_shared_remote_unlocked_process_gets_every_fix(tmp_path: Path, pinned: int) -> None:
    env = _h200(
        tmp_path,
        f"gpu.0.processes.compute={pinned}:1048576 {OTHERS}",
        f"gpu.0.cpu_affinity=1;gpu.0.memory_affinity={FAR_NODE}",
        SWINGING,
    )
    gpu, checks = _checks(env, pinned)
    assert (gpu["uuid"], gpu["pids"]) == (UUID, [pinned])
    assert [c["status"] for c in gpu["checks"]] == ["fix", "fix", "fix", "info", "fix"]
    sharing = checks["MIG/MPS"]
    assert "compute mode default; MPS clients 0" in sharing["read"]
    assert "nvidia-cuda-mps-control -d" in sharing["fix"]
    assert "EXCLUSIVE_PROCESS" in sharing["fix"]
    assert re.search(r"others: 10291 \(2566 MiB.*10293 \(1542 MiB", checks["co-tenants"]["read"])
    numa = checks["NUMA"]
    assert f"process {pinned} may run on CPUs 0" in numa["read"] and numa["read"].endswith("remote")
    fix = f"numactl --cpunodebind={FAR_NODE} --membind={FAR_NODE} "
    assert numa["fix"].startswith(fix) and "time.sleep(120)" in numa["fix"]
    assert checks["links"]["read"].startswith("18 NVLinks")
    assert "holds this GPU only" in checks["links"]["read"]
    clocks = checks["clocks"]
    assert "SM clock 1410, 1980 MHz" in clocks["read"]
    # what R590 answers for the applications clocks, as NVML said it
    assert re.search(r"no applications clock target \(.*[Dd]eprecated", clocks["read"])
    assert clocks["fix"].startswith("nvidia-smi -i 0 -lgc 1410,1980")
    assert "boost headroom" in clocks["fix"]
    text = _doctor(env, pinned).stdout
    assert f"Process {pinned}" in text and "[fix    ] NUMA:" in text
    assert f"fix: {fix}" in text


def test_mps_a_local_binding_and_a_steady_clock_need_no_fix(tmp_path: Path, pinned: int) -> None:
    env = _h200(
        tmp_path,
        f"gpu.0.processes.compute={pinned}:1048576 {OTHERS}",
        f"gpu.0.processes.mps={pinned}:1048576 {OTHERS}",
        f"gpu.0.cpu_affinity=0;gpu.0.memory_affinity={_own_nodes()}",
    )
    gpu, checks = _checks(env, pinned)
    assert [c["fix"] for c in gpu["checks"]] == [None] * 5
    assert checks["MIG/MPS"]["read"].endswith("MPS clients 3: the processes share it through MPS")
    assert checks["co-tenants"]["status"] == "info"
    assert checks["NUMA"]["read"].endswith("local")
    assert checks["clocks"]["status"] == "ok"


def test_a_process_on_a_mig_instance_is_isolated_without_nvlink(
    tmp_path: Path, pinned: int
) -> None:
    capture = profiles.capture("nvidia-h200-mig__590")
    profile = profiles.profile_from_capture(capture).write(tmp_path / "mig")
    knobs = {"SET": f"gpu.0.mig.3.processes.compute={pinned}:1048576"}
    gpu, checks = _checks(library.environment(profile, knobs=knobs), pinned)
    assert (gpu["gpu"], gpu["uuid"]) == ("0:3", MIG_UUID)
    assert checks["MIG/MPS"]["status"] == "ok"
    assert checks["MIG/MPS"]["read"].startswith("MIG instance ")
    assert checks["links"]["read"].startswith("no NVLink (")
    assert "a MIG instance reaches no peer over NVLink" in checks["links"]["read"]
    assert checks["clocks"]["read"].startswith("SM clock ")  # the parent's


def test_a_process_on_no_gpu_is_told_so(tmp_path: Path, pinned: int) -> None:
    done = _doctor(_h200(tmp_path, "gpu.0.processes.compute=10291:1048576"), pinned)
    assert done.returncode == 1
    assert f"Process {pinned}" in done.stdout and "holds no GPU here" in done.stdout
