"""``gpuscope doctor --pid PID``: the sharing and topology checklist of one serving process.

For each GPU the process (or one of its descendants: an engine's workers) holds, as the
exporter's process join finds it, five checks, each with what was read and, where it
is not as it should be, the fix:

- **MIG/MPS**: a MIG instance of its own, MPS, or the compute mode;
- **co-tenants**: the other processes on that GPU, with their memory and SM use;
- **NUMA**: where the process may run against the GPU's NUMA side (the ``numactl`` line);
- **links**: NVLink for a process on several GPUs (tensor parallelism), or PCIe;
- **clocks**: whether the SM clock held still over the doctor's samples, its target,
  and the ``nvidia-smi -lgc`` line.

Where NVML lacks a call on this driver (no applications clock target on R590, no NVLink
fields in MIG mode, no per-process utilisation), the check says so with NVML's answer.
A MIG instance's clocks and links are its parent GPU's, and are read there.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO

from gpuscope.contract.gpu import SM_CLOCK_CHANGES
from gpuscope.exporter.gpu import numa
from gpuscope.exporter.gpu.capabilities import ExplainsSupport
from gpuscope.exporter.gpu.processes import PROC, ProcessGpuMap, ProcessJoin, read_parent
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading, GpuSource

# SM clock readings over about a second: a clock that swings under load steps within it
CLOCK_SAMPLES = 7
SAMPLE_GAP_S = 0.15  # GPM, as the doctor's own two samples, needs 100 ms between two
MHZ = 1e6


class Status(StrEnum):
    OK = "ok"
    FIX = "fix"  # not as it should be: the check names the fix
    INFO = "info"  # nothing to fix, or nothing that can be judged here
    UNKNOWN = "unknown"  # NVML (or /proc) did not say


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    read: str
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.name, "status": self.status.value, "read": self.read, "fix": self.fix}


@dataclass(frozen=True)
class _Gpu:
    """What the checks of one GPU read: its device, its readings over the samples (the
    last one first), and why NVML gives no value for a metric group."""

    device: GpuDevice
    readings: Sequence[GpuReading]
    clocks: Sequence[GpuReading]  # the parent's for a MIG instance
    why: Mapping[str, str]
    clock_why: Mapping[str, str]


def checklist(
    source: GpuSource, pid: int, *, proc_root: Path = PROC, samples: int = CLOCK_SAMPLES
) -> dict[str, Any]:
    """The checklist of process ``pid`` on the GPUs it holds (JSON-ready)."""
    join = ProcessGpuMap(proc_root=proc_root)
    try:
        join.refresh(source)
    except Exception as exc:  # say what failed, as the doctor's process join does
        join.unavailable(ProcessJoin.NOT_SUPPORTED, f"listing the processes failed: {exc}")
    state = join.state()
    uuids = join.uuids_for_pid(pid)
    report: dict[str, Any] = {
        "pid": pid,
        "command": _command(proc_root, pid),
        "process_join": {"status": state.status.value, "why": state.why},
        "gpus": [],
    }
    if not uuids:
        return report
    rounds = _sample(source, samples)
    devices = {d.uuid: d for d in source.devices()}
    reasons = source.unsupported_metrics() if isinstance(source, ExplainsSupport) else {}
    instances: Mapping[str, tuple[Mapping[str, str], Mapping[str, str]]] = getattr(
        source, "mig_support", dict
    )()
    listing = state.listing
    for uuid in uuids:
        device = devices.get(uuid)
        if device is None:
            continue
        parent = uuid if device.mig is None else device.mig.parent_uuid
        gpu = _Gpu(
            device=device,
            readings=[r[uuid] for r in rounds if uuid in r],
            clocks=[r[parent] for r in rounds if parent in r],
            why=reasons.get(device.index, {})
            if device.mig is None
            else instances.get(uuid, ({}, {}))[0],
            clock_why=reasons.get(device.index, {}),
        )
        own = [p for p in listing.pids.get(uuid, ()) if _descends(proc_root, p, pid)]
        others = [p for p in listing.pids.get(uuid, ()) if p not in own]
        checks = [
            _sharing(gpu),
            _co_tenants(gpu, own, others, proc_root),
            _numa(device, own or [pid], proc_root),
            _links(gpu, uuids, devices),
            _clocks(gpu),
        ]
        report["gpus"].append(
            {
                "gpu": device.label,
                "uuid": uuid,
                "name": device.name,
                "pids": own,
                "checks": [c.as_dict() for c in checks],
            }
        )
    return report


def _sample(source: GpuSource, samples: int) -> list[dict[str, GpuReading]]:
    """``samples`` readings of every GPU, ``SAMPLE_GAP_S`` apart, the last one first."""
    rounds = []
    for n in range(max(samples, 2)):
        if n:
            time.sleep(SAMPLE_GAP_S)
        rounds.append({r.uuid: r for r in source.sample()})
    return rounds[::-1]


def _descends(proc: Path, pid: int, ancestor: int) -> bool:
    seen = 0
    while pid and seen < 64:  # a loop in a fake /proc is not followed for ever
        if pid == ancestor:
            return True
        parent = read_parent(proc, pid)
        if parent is None or parent == pid:
            return False
        pid, seen = parent, seen + 1
    return False


def _command(proc: Path, pid: int) -> str | None:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a) or None


def _latest(readings: Sequence[GpuReading]) -> GpuReading | None:
    return readings[0] if readings else None


def _why(why: Mapping[str, str], group: str) -> str:
    return why.get(group) or "no value from this source"


def _sharing(gpu: _Gpu) -> Check:
    device, reading = gpu.device, _latest(gpu.readings)
    if device.mig is not None:
        mig = device.mig
        return Check(
            "MIG/MPS",
            Status.OK,
            f"MIG instance {mig.profile} of GPU {mig.parent_uuid} (GPU instance "
            f"{mig.gpu_instance_id}, compute instance {mig.compute_instance_id}): its SMs and "
            "memory are its own",
        )
    if reading is None:
        return Check("MIG/MPS", Status.UNKNOWN, "the GPU gave no reading")
    mode = reading.compute_mode or f"unknown ({_why(gpu.why, 'compute_mode')})"
    mps = "unknown" if reading.mps_processes is None else str(reading.mps_processes)
    read = f"not in MIG mode; compute mode {mode}; MPS clients {mps}"
    if reading.mps_processes:
        return Check("MIG/MPS", Status.OK, read + ": the processes share it through MPS")
    if reading.compute_mode in ("exclusive_process", "prohibited"):
        return Check("MIG/MPS", Status.OK, read + ": no other process can time-slice it")
    if reading.contended:
        return Check(
            "MIG/MPS",
            Status.FIX,
            read + ": several processes time-slice it",
            "run the co-tenants as clients of one MPS server (nvidia-cuda-mps-control -d), "
            "or give each its own GPU or MIG instance (nvidia-smi mig -cgi ... -C); then "
            f"nvidia-smi -i {device.index} -c EXCLUSIVE_PROCESS keeps others off",
        )
    return Check("MIG/MPS", Status.OK, read + ": no other process shares it now")


def _co_tenants(gpu: _Gpu, own: Sequence[int], others: Sequence[int], proc: Path) -> Check:
    reading = _latest(gpu.readings)
    tenants = {} if reading is None or reading.tenants is None else reading.tenants

    def described(pid: int, *, command: bool = True) -> str:
        use = tenants.get(pid)
        parts = []
        if use is not None and use.memory_used_bytes is not None:
            parts.append(f"{use.memory_used_bytes / 2**20:.0f} MiB")
        if use is not None and use.sm_utilization_ratio is not None:
            parts.append(f"SM {use.sm_utilization_ratio:.0%}")
        line = _command(proc, pid) if command else None
        if line:
            parts.append(line if len(line) <= 60 else line[:57] + "...")
        return f"{pid}" + (f" ({', '.join(parts)})" if parts else "")

    mine = ", ".join(described(p, command=False) for p in own) or "none listed"
    if not others:
        return Check("co-tenants", Status.OK, f"this process: {mine}; no other process")
    read = f"this process: {mine}; others: {', '.join(described(p) for p in others)}"
    if reading is not None and reading.process_sm is None:
        read += f" (per-process SM use: {_why(gpu.why, 'process_utilization')})"
    if reading is not None and reading.contended:
        return Check(
            "co-tenants",
            Status.FIX,
            read,
            "move the processes that do not serve (a notebook, a benchmark) to another GPU; "
            "serve the others through MPS or on MIG instances (see MIG/MPS)",
        )
    return Check("co-tenants", Status.INFO, read + "; they do not time-slice it (MPS, MIG or mode)")


def _numa(device: GpuDevice, pids: Sequence[int], proc: Path) -> Check:
    affinity = device.affinity
    if affinity is None:
        why = (
            "a MIG instance: see its parent GPU"
            if device.mig is not None
            else ("neither NVML nor sysfs names this GPU's CPUs or node")
        )
        return Check("NUMA", Status.UNKNOWN, why)
    side = (
        f"the GPU is local to CPUs {numa.format_list(affinity.cpus) or '?'}, node "
        f"{numa.format_list(affinity.nodes) or '?'} ({affinity.source})"
    )
    fix = numa.numactl(affinity)
    for pid in pids:
        allowed = numa.read_allowed(proc, pid)
        if allowed is None:
            continue
        where = numa.locality(allowed, affinity)
        read = (
            f"{side}; process {pid} may run on CPUs {numa.format_list(allowed.cpus)}, "
            f"allocate on nodes {numa.format_list(allowed.nodes)}: "
            f"{'unknown' if where is None else where.value}"
        )
        if where in (None, numa.Locality.LOCAL):
            return Check("NUMA", Status.OK if where else Status.UNKNOWN, read)
        command = _command(proc, pid) or f"<the command of process {pid}>"
        return Check("NUMA", Status.FIX, read, None if fix is None else f"{fix} {command}")
    return Check("NUMA", Status.UNKNOWN, f"{side}; /proc/<pid>/status not readable here")


def _links(gpu: _Gpu, uuids: Sequence[str], devices: Mapping[str, GpuDevice]) -> Check:
    reading = _latest(gpu.clocks)
    links = None if reading is None else reading.values.get("nvlink_links")
    peers = [devices[u].label for u in uuids if u != gpu.device.uuid and u in devices]
    if links:
        read = f"{links:.0f} NVLinks"
        if reading is not None and "nvlink_transmit_bytes_total" in reading.values:
            sent = reading.values["nvlink_transmit_bytes_total"]
            got = reading.values.get("nvlink_receive_bytes_total", 0.0)
            read += f" ({sent / 2**30:.1f} GiB sent, {got / 2**30:.1f} GiB received so far)"
    else:
        read = f"no NVLink ({_why(gpu.clock_why, 'nvlink')})"
    if gpu.device.mig is not None:
        read += "; a MIG instance reaches no peer over NVLink"
    if not peers:
        return Check("links", Status.INFO, read + "; the process holds this GPU only")
    read += f"; the process holds GPUs {', '.join(peers)} too (tensor parallelism)"
    if links:
        return Check("links", Status.OK, read + ": its peer traffic can ride NVLink")
    return Check(
        "links",
        Status.FIX,
        read + ": its all-reduce crosses PCIe (and the host bridge between sockets)",
        "place its ranks on GPUs joined by NVLink (nvidia-smi topo -m: NV# between them), "
        "or run it on one GPU (a smaller tensor-parallel size)",
    )


def _clocks(gpu: _Gpu) -> Check:
    clocks = [r.values["sm_clock_hz"] for r in gpu.clocks if "sm_clock_hz" in r.values]
    if not clocks:
        return Check("clocks", Status.UNKNOWN, f"no SM clock ({_why(gpu.clock_why, 'sm_clock')})")
    latest = gpu.clocks[0].values
    changes = sum(1 for a, b in itertools.pairwise(clocks) if a != b)
    seen = sorted({c / MHZ for c in clocks})
    read = f"SM clock {', '.join(f'{c:.0f}' for c in seen)} MHz over {len(clocks)} samples"
    if "sm_clock_max_hz" in latest:
        read += f" (max {latest['sm_clock_max_hz'] / MHZ:.0f} MHz)"
    if "sm_clock_target_hz" in latest:
        read += f"; applications clock target {latest['sm_clock_target_hz'] / MHZ:.0f} MHz"
    else:
        read += f"; no applications clock target ({_why(gpu.clock_why, 'sm_clock_target')})"
    index = gpu.device.index
    if changes:
        low, high = seen[0], seen[-1]
        return Check(
            "clocks",
            Status.FIX,
            read + f": it changed {changes} times, unlocked",
            f"nvidia-smi -i {index} -lgc {low:.0f},{high:.0f} (or one clock the GPU holds "
            "under load at its power limit: -lgc F,F; undo with -rgc): a steadier compute "
            "time, at the cost of the boost headroom above the lock, and more power and heat "
            "at a high one; a power or thermal cap still lowers a locked clock",
        )
    return Check(
        "clocks",
        Status.OK,
        read + ": steady over the samples (under load a locked clock stays so; "
        f"{SM_CLOCK_CHANGES.name}_total counts the swings over minutes)",
    )


def render(report: Mapping[str, Any], out: TextIO) -> None:
    command = f"  {report['command']}" if report.get("command") else ""
    print(f"Process {report['pid']}{command}", file=out)
    join = report["process_join"]
    if not report["gpus"]:
        print(
            f"  holds no GPU here (process join: {join['status']} - {join['why']})",
            file=out,
        )
        return
    for gpu in report["gpus"]:
        pids = ", ".join(map(str, gpu["pids"])) or "?"
        print(f"\nGPU {gpu['gpu']}  {gpu['name']}  {gpu['uuid']}  (processes {pids})", file=out)
        for check in gpu["checks"]:
            print(f"  [{check['status']:<7}] {check['check']}: {check['read']}", file=out)
            if check["fix"]:
                print(f"            fix: {check['fix']}", file=out)
