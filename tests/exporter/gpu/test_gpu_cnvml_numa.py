"""NUMA locality on the C fake NVML: a real process pinned to CPU 0 holds the H200 of the
capture, whose CPU and NUMA affinity (``nvidia-smi topo -m``'s columns, through
``nvmlDeviceGetCpuAffinity`` / ``nvmlDeviceGetMemoryAffinity``) the test moves to its side
or away from it; the exporter says local or remote per (process, GPU) from the
process's ``Cpus_allowed_list`` / ``Mems_allowed_list``, and ``gpuscope doctor`` prints the
``numactl`` line that fixes a remote one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gpu_cnvml_defects import wait_for
from test_gpu_cnvml_exporter import exporter

from support.cnvml import library, profiles

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

UUID = "GPU-00000000-0000-0000-0000-000000000000"
RELEASES = [library.PYNVML_FLOOR, library.PYNVML_NEWEST]
FAR_NODE = 7  # a node no process here may allocate on


@pytest.fixture
def pinned() -> Iterator[int]:
    """A process allowed CPU 0 only, as `taskset -c 0` would start it."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, time; os.sched_setaffinity(0, {0}); time.sleep(120)"]
    )
    try:
        for _ in range(100):  # until the child has pinned itself
            if "Cpus_allowed_list:\t0\n" in _status(child.pid):
                break
            time.sleep(0.05)
        yield child.pid
    finally:
        child.kill()
        child.wait()


def _status(pid: int) -> str:
    return Path(f"/proc/{pid}/status").read_text()


def _own_nodes() -> str:
    return re.search(r"^Mems_allowed_list:\s*(\S+)", _status(os.getpid()), re.M).group(1)  # type: ignore[union-attr]


def _environment(tmp_path: Path, release: str, pid: int, cpus: str, nodes: str) -> dict[str, str]:
    profile = profiles.profile_from_capture(profiles.capture("nvidia-h200__590"))
    path = profile.write(tmp_path / "h200")
    listed = f"gpu.0.processes.compute={pid}:1048576"
    knobs = {"SET": f"{listed};gpu.0.cpu_affinity={cpus};gpu.0.memory_affinity={nodes}"}
    if release == library.PYNVML_FLOOR:  # a driver of its time: R535's 32-byte records
        knobs["PROCESS_STRIDE"] = "32"
        return library.environment(path, branch=535, pynvml=release, knobs=knobs)
    return library.environment(path, pynvml=release, knobs=knobs)


def _locality(text: str, pid: int) -> list[str]:
    labels = rf'gpu="0",locality="(\w+)",pid="{pid}",uuid="{UUID}"'
    return re.findall(rf"^gpuscope_gpu_process_numa_locality{{{labels}}} 1.0$", text, re.M)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("side", ["local", "remote"])
def test_a_process_on_the_far_node_reads_remote(
    tmp_path: Path, pinned: int, release: str, side: str
) -> None:
    # the capture's H200 is local to CPUs 0-23, node 0; moved here to the pinned
    # process's side (CPU 0, its nodes) or away from it (CPU 1, a node it may not use)
    cpus, nodes = ("0", _own_nodes()) if side == "local" else ("1", str(FAR_NODE))
    env = _environment(tmp_path, release, pinned, cpus, nodes)
    with exporter(env) as url:
        text = wait_for(url, lambda t: bool(_locality(t, pinned)))
    assert _locality(text, pinned) == [side]


def test_doctor_prints_the_numactl_line_that_fixes_it(tmp_path: Path, pinned: int) -> None:
    env = _environment(tmp_path, library.PYNVML_NEWEST, pinned, "1", str(FAR_NODE))
    command = [sys.executable, "-m", "gpuscope.cli", "doctor", "--gpu-source", "nvml"]
    done = subprocess.run(
        [*command, "--json"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    checks = json.loads(done.stdout)["process_join"]["gpus"][UUID]["numa"]
    assert (checks["cpus"], checks["nodes"], checks["source"]) == ("1", str(FAR_NODE), "nvml")
    (process,) = checks["processes"]
    assert (process["pid"], process["cpus"], process["locality"]) == (pinned, "0", "remote")
    fix = f"numactl --cpunodebind={FAR_NODE} --membind={FAR_NODE} "
    assert process["fix"].startswith(fix) and "time.sleep(120)" in process["fix"]
    text = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, check=False
    ).stdout
    assert f"process {pinned}: remote (allowed CPUs 0" in text
    assert f"fix: {fix}" in text
