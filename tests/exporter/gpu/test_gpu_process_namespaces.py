"""The process join across pid namespaces: engine pods under an exporter with hostPID.

A fake ``/proc`` tree with ``stat``, ``status`` and ``cgroup`` files in the kernel's
formats (a pod's cgroup as the kubelet's systemd and cgroupfs drivers name it); then a
real process in a real pid namespace of its own (``unshare --pid``), whose ``NSpid``
line the kernel writes, first through the map, then sending spans with gpuscope's own
``setup_tracing()`` to a real exporter.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gpuscope.exporter.gpu.pid_namespaces import (
    PidClaim,
    normal_container_id,
    read_cgroup_ids,
    read_ns_pids,
)
from gpuscope.exporter.gpu.processes import ProcessGpuMap, ProcessJoin, ProcessListing
from gpuscope.exporter.gpu.scenario import parse_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource, simulated_uuid
from gpuscope.exporter.service import start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import loopback_config, samples

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

EXPORTER_PID = 50
GPU0, GPU1 = "GPU-0000", "GPU-1111"
POD = "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"
OTHER_POD = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
CONTAINER = "4f0c2a9be3b1d5c7a8e6f4d2c0b9a7e5d3c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7"
SIDECAR = "a" * 64


def systemd_cgroup(pod: str, container: str, qos: str = "burstable") -> str:
    """cgroup v2, the kubelet's systemd driver, containerd (the uid's '-' become '_')."""
    slice_uid = pod.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/"
        f"cri-containerd-{container}.scope\n"
    )


def cgroupfs_v1(pod: str, container: str) -> str:
    """cgroup v1, the cgroupfs driver: every controller's line names the same path."""
    path = f"/kubepods/besteffort/pod{pod}/{container}"
    controllers = ["cpuset", "cpu,cpuacct", "memory", "devices", "pids", "name=systemd"]
    return "".join(f"{12 - i}:{c}:{path}\n" for i, c in enumerate(controllers)) + "0::/\n"


HOST_CGROUP = "0::/system.slice/containerd.service\n"


class NamespacedProc:
    """A /proc tree whose processes have pids in nested namespaces and a cgroup each."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, pid: int, parent: int, ns_pids: tuple[int, ...] = (), cgroup: str = "") -> None:
        folder = self.root / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stat").write_text(
            f"{pid} (python3) S {parent} {pid} {parent} 0 -1 4194560 1234 0 0 0 12 3 0 0 20 0 "
            "5 0 1234567 123456789 4321 18446744073709551615 1 1 0 0 0 0 0 16781312 17442 0 0 0 "
            "17 3 0 0 0 0 0\n"
        )
        pids = "\t".join(map(str, (pid, *ns_pids)))
        (folder / "status").write_text(
            f"Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\n"
            f"Pid:\t{pid}\nPPid:\t{parent}\nTracerPid:\t0\nUid:\t0\t0\t0\t0\n"
            f"NStgid:\t{pids}\nNSpid:\t{pids}\nNSpgid:\t{pids}\nNSsid:\t{pids}\n"
            "VmPeak:\t  123456 kB\nThreads:\t4\n"
        )
        (folder / "cgroup").write_text(cgroup or HOST_CGROUP)


@pytest.fixture
def pod_tree(tmp_path: Path) -> NamespacedProc:
    """containerd's shim (900, host) starts a pod whose container runs vLLM's API server
    (its pid 1, host 901) and a Worker on GPU 0 (its pid 7, host 902); another pod's
    process (host 950, its pid 1) holds GPU 1; a host process (960) nothing."""
    proc = NamespacedProc(tmp_path / "proc")
    proc.add(1, 0)
    proc.add(EXPORTER_PID, 1)
    proc.add(900, 1)
    proc.add(901, 900, (1,), systemd_cgroup(POD, CONTAINER))
    proc.add(902, 901, (7,), systemd_cgroup(POD, CONTAINER))
    proc.add(950, 900, (1,), cgroupfs_v1(OTHER_POD, SIDECAR))
    proc.add(960, 1)
    return proc


def pod_map(proc: NamespacedProc, **kwargs: bool) -> ProcessGpuMap:
    join = ProcessGpuMap(proc_root=proc.root, own_pid=EXPORTER_PID, **kwargs)
    join.update(ProcessListing({GPU0: (902,), GPU1: (950,)}))
    return join


def test_the_kernels_formats_are_read(pod_tree: NamespacedProc) -> None:
    assert read_ns_pids(pod_tree.root, 902) == (902, 7)
    assert read_ns_pids(pod_tree.root, 960) == (960,)
    assert read_ns_pids(pod_tree.root, 4242) is None  # no such process
    assert read_cgroup_ids(pod_tree.root, 902) == (CONTAINER, POD)  # '_' back to '-'
    assert read_cgroup_ids(pod_tree.root, 950) == (SIDECAR, OTHER_POD)
    assert read_cgroup_ids(pod_tree.root, 960) == ("", "")
    # what a pod's status and Docker write before the id
    assert normal_container_id("containerd://" + CONTAINER.upper()) == CONTAINER
    assert normal_container_id(f"docker://{CONTAINER}") == CONTAINER


def test_a_pods_pids_map_by_its_uid_or_container_id(pod_tree: NamespacedProc) -> None:
    join = pod_map(pod_tree)
    # the API server (its pid 1) and the Worker (its pid 7) of the pod, either id
    assert join.uuids_for_claim(PidClaim(1, pod_uid=POD)) == (GPU0,)
    assert join.uuids_for_claim(PidClaim(7, container_id=CONTAINER)) == (GPU0,)
    assert join.uuids_for_claim(PidClaim(1, pod_uid=OTHER_POD)) == (GPU1,)
    assert join.uuids_for_claim(PidClaim(1, container_id=SIDECAR)) == (GPU1,)
    # another pod's pid, or a pid the pod does not have: nothing
    assert join.uuids_for_claim(PidClaim(7, pod_uid=OTHER_POD)) == ()
    assert join.uuids_for_claim(PidClaim(3, pod_uid=POD)) == ()
    # the containers' host pids are no claim anyone can make: only the host's own
    # processes answer to a bare pid (the shim holds both pods)
    assert join.uuids_for_claim(PidClaim(902)) == ()
    assert join.uuids_for_claim(PidClaim(901)) == ()
    assert join.uuids_for_claim(PidClaim(900)) == (GPU0, GPU1)
    state = join.state()
    assert state.status is ProcessJoin.OK and state.nested == 2
    assert "2 of them in pid namespaces of their own" in state.why


def test_bare_pids_of_namespaced_senders_are_said_not_ok(pod_tree: NamespacedProc) -> None:
    """Before: the pod's spans named pid 1 and 7, joined nothing, and the status said ok."""
    join = pod_map(pod_tree)
    assert join.uuids_for_claim(PidClaim(7)) == ()
    assert join.uuids_for_claim(PidClaim(1)) == ()
    assert join.uuids_for_claim(PidClaim(1, pod_uid=POD)) == (GPU0,)
    join.update(ProcessListing({GPU0: (902,), GPU1: (950,)}))
    state = join.state()
    assert state.status is ProcessJoin.UNMAPPED_PIDS
    assert state.why.startswith("span pids are namespaced and no container id / pod was sent")
    assert (state.claims.unmapped, state.claims.joined) == (2, 1)
    # the map still answers those that name their pod
    assert join.uuids_for_claim(PidClaim(7, pod_uid=POD)) == (GPU0,)
    # a listing with no unmapped claim since: ok again
    join.update(ProcessListing({GPU0: (902,), GPU1: (950,)}))
    assert join.state().status is ProcessJoin.OK


def test_two_containers_of_one_pod_with_the_same_pid_are_told_apart_by_container(
    tmp_path: Path,
) -> None:
    proc = NamespacedProc(tmp_path / "proc")
    proc.add(900, 1)
    proc.add(901, 900, (1,), systemd_cgroup(POD, CONTAINER))
    proc.add(903, 900, (1,), systemd_cgroup(POD, SIDECAR))
    join = ProcessGpuMap(proc_root=proc.root, own_pid=EXPORTER_PID)
    join.update(ProcessListing({GPU0: (901,), GPU1: (903,)}))
    assert join.uuids_for_claim(PidClaim(1, container_id=CONTAINER)) == (GPU0,)
    assert join.uuids_for_claim(PidClaim(1, container_id=SIDECAR)) == (GPU1,)
    assert join.uuids_for_claim(PidClaim(1, pod_uid=POD)) == ()  # which one: unknown


def test_unauthenticated_claims_are_said_or_refused(pod_tree: NamespacedProc) -> None:
    join = pod_map(pod_tree)
    assert join.uuids_for_claim(PidClaim(1, pod_uid=POD, authenticated=False)) == (GPU0,)
    join.update(ProcessListing({GPU0: (902,), GPU1: (950,)}))
    assert join.state().claims.unauthenticated == 1
    assert "1 pid claims joined from unauthenticated senders" in join.state().why

    strict = pod_map(pod_tree, require_auth=True)
    assert strict.uuids_for_claim(PidClaim(1, pod_uid=POD)) == ()
    assert strict.uuids_for_claim(PidClaim(1, pod_uid=POD, authenticated=True)) == (GPU0,)
    strict.update(ProcessListing({GPU0: (902,), GPU1: (950,)}))
    assert strict.state().claims.refused == 1
    assert "1 pid claims from unauthenticated senders ignored" in strict.state().why


# --- a real pid namespace -----------------------------------------------------------------

SENDER = """
import os, sys
from opentelemetry.trace import SpanKind
from gpuscope import spans
from gpuscope.middleware.tracing import setup_tracing
# /proc is the outer namespace's (no --mount-proc): /proc/self names the host pid
print(os.readlink("/proc/self"), os.getpid(), flush=True)
url = sys.stdin.readline().strip()
provider = setup_tracing(url, service_name="vllm", set_global=False)
tracer = provider.get_tracer(spans.INSTRUMENTATION_NAME)
with tracer.start_as_current_span("POST /v1/completions", kind=SpanKind.SERVER) as span:
    span.set_attribute(spans.HTTP_ROUTE, "/v1/completions")
    span.set_attribute(spans.HTTP_RESPONSE_STATUS_CODE, 200)
provider.shutdown()
print("sent", flush=True)
sys.stdin.readline()
"""


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    done = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=10)
    return done.returncode == 0


needs_unshare = pytest.mark.skipif(
    not _can_unshare(), reason="needs root and unshare --pid (a new pid namespace)"
)


@pytest.fixture
def namespaced_sender() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """A Python process in a pid namespace of its own: (process, host pid, its own pid)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GPUSCOPE_"))}
    with subprocess.Popen(
        ["unshare", "--pid", "--fork", sys.executable, "-c", SENDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as process:
        assert process.stdout is not None and process.stdin is not None
        host_pid, own_pid = map(int, process.stdout.readline().split())
        try:
            yield process, host_pid, own_pid
        finally:
            process.kill()  # unshare, whose child (pid 1 of its namespace) dies with it


@needs_unshare
def test_a_real_pid_namespace_is_read_and_mapped(
    namespaced_sender: tuple[subprocess.Popen[str], int, int], tmp_path: Path
) -> None:
    """The kernel's own NSpid line of a real namespaced process; its cgroup here names no
    pod, so a copy of its /proc entry gets the one a pod would have."""
    _, host_pid, own_pid = namespaced_sender
    assert own_pid == 1
    assert read_ns_pids(Path("/proc"), host_pid) == (host_pid, 1)
    # through the real /proc: namespaced, in no pod's cgroup, so no claim maps to it
    real = ProcessGpuMap()
    real.update(ProcessListing({GPU0: (host_pid,)}))
    assert real.state().nested == 1
    assert "in no container or pod cgroup: never joined" in real.state().why
    assert real.uuids_for_claim(PidClaim(own_pid)) == ()
    assert real.uuids_for_claim(PidClaim(host_pid)) == ()  # its host pid is no claim either
    # the same process with a pod's cgroup: the kernel's stat and status, linked
    copy = tmp_path / "proc" / str(host_pid)
    copy.mkdir(parents=True)
    for name in ("stat", "status"):
        (copy / name).symlink_to(f"/proc/{host_pid}/{name}")
    (copy / "cgroup").write_text(systemd_cgroup(POD, CONTAINER))
    join = ProcessGpuMap(proc_root=tmp_path / "proc")
    join.update(ProcessListing({GPU0: (host_pid,)}))
    assert join.uuids_for_claim(PidClaim(own_pid, pod_uid=POD)) == (GPU0,)
    assert join.uuids_for_claim(PidClaim(own_pid, container_id=CONTAINER)) == (GPU0,)


@needs_unshare
async def test_a_sender_in_another_pid_namespace_is_not_joined_and_the_status_says_so(
    namespaced_sender: tuple[subprocess.Popen[str], int, int],
) -> None:
    """Before: its spans named pid 1, joined nothing, and the status said ok."""
    process, host_pid, _ = namespaced_sender
    assert process.stdin is not None and process.stdout is not None
    scenario = parse_scenario({"events": [{"gpu": 0, "fault": "process", "pid": host_pid}]})
    running = await start_exporter(
        loopback_config(), gpu_source=SimulatedSource(1, scenario, clock=time.time)
    )
    try:
        process.stdin.write(running.url + "/v1/traces\n")
        process.stdin.flush()
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 30)
        assert line.strip() == "sent"
        state = running.app[STATE]
        assert state.poller is not None
        # the next listing (the poller's comes every 5 s: this one now)
        await asyncio.to_thread(state.poller.processes.refresh, state.gpu_source)
        join = state.poller.processes.state()
        assert join.status is ProcessJoin.UNMAPPED_PIDS, join.why
        assert join.nested == 1 and join.claims.unmapped == 1
        async with (
            aiohttp.ClientSession() as session,
            session.get(running.url + "/metrics") as response,
        ):
            text = await response.text()
        found = {
            s.labels["status"]: s.value
            for s in samples(text)
            if s.name == "gpuscope_gpu_process_join_status"
        }
        assert found["unmapped_pids"] == 1 and found["ok"] == 0
        # the request was counted, joined per host (no uuid)
        durations = [
            s
            for s in samples(text)
            if s.name == "gpuscope_request_duration_seconds_count" and s.value == 1
        ]
        assert [s.labels["uuid"] for s in durations] == [""]
        assert simulated_uuid(0) in text  # the GPU itself is served
    finally:
        await running.stop()
