"""Profiles of the C fake NVML from real ``nvidia-smi`` captures.

A capture (``tests/fixtures/gpu-captures/*.txt``, from utkuozdemir/nvidia_gpu_exporter)
holds one machine's ``nvidia-smi`` outputs in sections. The converter reads the CSV of
``--query-gpu`` (idle or under load), ``--version``, ``-q`` (PCIe throughput),
``topo -m`` (GPU NUMA id), ``-L`` and the MIG table, and writes the key=value file that
``fake_nvml.c`` reads at ``nvmlInit``. A value the capture does not have stays absent
(the fake then answers NVML_ERROR_NOT_SUPPORTED); the few the fake must invent (counter
starting points, GPM ratios, which events a GPU delivers) are marked ``# invented`` or
``# assumed`` in the file, with why.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu-captures"
MIB = 2**20
XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
# NVML_GPM_METRIC_* ids (nvml.h): the ones the exporter asks for
GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_ANY_TENSOR_UTIL, GPM_DRAM_BW_UTIL = 2, 3, 5, 10
GPM_PCIE_TX, GPM_PCIE_RX = 20, 21  # NVML_GPM_METRIC_PCIE_TX_PER_SEC / RX_PER_SEC
# nvidia-smi's compute_mode -> nvmlComputeMode_t (nvml.h)
COMPUTE_MODES = {"Default": 0, "Exclusive_Thread": 1, "Prohibited": 2, "Exclusive_Process": 3}
# compute capability major.minor -> NVML_DEVICE_ARCH_* (nvml.h)
ARCHITECTURES = {"7.0": 5, "7.5": 6, "8.0": 7, "8.6": 7, "8.7": 7, "8.9": 8, "9.0": 9}

_SECTION = re.compile(r"^# (?P<title>[a-z]+ :: .+)$")
_UNIT = re.compile(r"\s*\[[^\]]*\]$")


class CaptureError(ValueError):
    """The capture lacks a section or value the converter needs."""


def sections(text: str) -> dict[str, str]:
    """Section title ("idle :: query-gpu (csv, what the exporter parses)") -> its body."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = _SECTION.match(line)
        if match and i > 0 and lines[i - 1].startswith("####"):
            current = found.setdefault(match.group("title"), [])
            continue
        if current is not None and not line.startswith("####") and not line.startswith("# $"):
            current.append(line)
    return {title: "\n".join(body).strip("\n") for title, body in found.items()}


def _section(parts: dict[str, str], prefix: str) -> str:
    for title, body in parts.items():
        if title.startswith(prefix):
            return body
    raise CaptureError(f"the capture has no section {prefix!r}")


def query_gpu_rows(parts: dict[str, str], state: str) -> list[dict[str, str]]:
    """The ``--query-gpu`` CSV of ``state`` (idle or load), keys without their units."""
    body = _section(parts, f"{state} :: query-gpu")
    rows = list(
        csv.reader([line for line in body.splitlines() if line.strip()], skipinitialspace=True)
    )
    header = [_UNIT.sub("", name) for name in rows[0]]
    return [dict(zip(header, row, strict=True)) for row in rows[1:]]


def _present(value: str | None) -> str | None:
    """None for nvidia-smi's ways of saying 'no value' ([N/A], N/A, [Not Supported], ...)."""
    if value is None:
        return None
    value = value.strip()
    if not value or value.startswith("[") or value in ("N/A", "Not Supported"):
        return None
    return value


def _number(value: str | None) -> float | None:
    present = _present(value)
    if present is None:
        return None
    return float(present.split()[0])


@dataclass
class Profile:
    """Ordered key=value lines with the capture value each came from."""

    source: str
    lines: list[tuple[str, str, str]] = field(default_factory=list)  # key, value, comment

    def set(self, key: str, value: object, comment: str = "") -> None:
        self.lines.append((key, str(value), comment))

    def values(self) -> dict[str, str]:
        return {key: value for key, value, _ in self.lines}

    def text(self) -> str:
        out = [
            "# profile of the C fake NVML, written by tests/support/cnvml/profiles.py"
            f" from {self.source}"
        ]
        for key, value, comment in self.lines:
            out.append(f"{key}={value}" + (f"  # {comment}" if comment else ""))
        return "\n".join(out) + "\n"

    def write(self, path: Path) -> Path:
        path.write_text(self.text())
        return path


def _versions(profile: Profile, parts: dict[str, str]) -> None:
    body = _section(parts, "capabilities :: version")
    found = dict(
        (name.strip(), value.strip())
        for name, _, value in (line.partition(":") for line in body.splitlines())
        if value
    )
    profile.set("driver_version", found["DRIVER version"], "nvidia-smi --version: DRIVER version")
    profile.set("nvml_version", found["NVML version"], "nvidia-smi --version: NVML version")
    major, _, minor = found["CUDA Version"].partition(".")
    profile.set("cuda_driver_version", int(major) * 1000 + int(minor or 0) * 10, "CUDA Version")


def _throughput(parts: dict[str, str], state: str) -> list[tuple[int, int]]:
    """Per GPU (tx, rx) KB/s from ``-q``'s PCI section."""
    body = _section(parts, f"{state} :: query (-q)")
    tx = [int(m) for m in re.findall(r"Tx Throughput\s*:\s*(\d+) KB/s", body)]
    rx = [int(m) for m in re.findall(r"Rx Throughput\s*:\s*(\d+) KB/s", body)]
    return list(zip(tx, rx, strict=False))


def _topology(parts: dict[str, str]) -> list[dict[str, str | None]]:
    """``topo -m``'s columns per GPU: "GPU NUMA ID" (N/A on hosts where GPUs are no NUMA
    nodes), "CPU Affinity" and "NUMA Affinity" (the CPUs and node the GPU is local to)."""
    try:
        body = _section(parts, "capabilities :: topo -m")
    except CaptureError:
        return []
    header: list[str] = []
    found: list[dict[str, str | None]] = []
    for line in body.splitlines():
        clean = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if not header and "CPU Affinity" in clean:
            header = [name.strip() for name in clean.split("\t")]
        elif re.match(r"^GPU\d+\s", clean):
            cells = [cell.strip() for cell in clean.split("\t")]
            row = dict(zip(header, cells, strict=False))
            found.append(
                {
                    "numa": _present(cells[-1]),
                    "cpus": _present(row.get("CPU Affinity")),
                    "nodes": _present(row.get("NUMA Affinity")),
                }
            )
    return found


def _nvlinks(parts: dict[str, str]) -> list[int]:
    """Per GPU, the links ``nvidia-smi nvlink -s`` lists (none: no NVLink, or MIG mode)."""
    try:
        body = _section(parts, "capabilities :: nvlink -s")
    except CaptureError:
        return []
    counts: list[int] = []
    for line in body.splitlines():
        if line.startswith("GPU "):
            counts.append(0)
        elif counts and re.match(r"^\s+Link \d+: ", line):
            counts[-1] += 1
    return counts


def _gpu_numa_ids(parts: dict[str, str]) -> list[str | None]:
    return [gpu["numa"] for gpu in _topology(parts)]


def _migs(parts: dict[str, str], state: str) -> list[dict[str, str]]:
    """MIG devices from ``-L`` (profile name, UUID) and the summary table (GI, CI, memory)."""
    listing = _section(parts, "capabilities :: list (-L)")
    named = re.findall(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)", listing, re.M)
    try:
        table = _section(parts, f"{state} :: nvidia-smi (default table)")
    except CaptureError:
        table = ""
    memory = re.findall(
        r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\s+(\d+)MiB /\s*(\d+)MiB", table, re.M
    )
    by_index = {int(m[3]): m for m in memory}
    # the table's processes carry their GPU and compute instance ids (GI, CI)
    running = re.findall(
        r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+[CG+]+\s+\S.*?\s(\d+)MiB\s*\|", table, re.M
    )
    migs = []
    for name, index, uuid in named:
        row = by_index.get(int(index))
        mig = {"name": name, "uuid": uuid, "index": index}
        if row is not None:
            mig.update(gi=row[1], ci=row[2], used_mib=row[4], total_mib=row[5])
            mig["processes"] = " ".join(
                f"{pid}:{int(mib) * MIB}"
                for _, gi, ci, pid, mib in running
                if (gi, ci) == (row[1], row[2])
            )
        migs.append(mig)
    return migs


def _gpu(
    profile: Profile,
    index: int,
    row: dict[str, str],
    throughput: tuple[int, int] | None,
    numa: str | None,
    migs: list[dict[str, str]],
    processes: list[tuple[str, str]],
    utilization: list[tuple[str, str, str]],
    topology: dict[str, str | None] | None = None,
    nvlinks: int = 0,
) -> None:
    p = f"gpu.{index}."

    def put(key: str, column: str, convert: object = None, note: str = "") -> None:
        value = _present(row.get(column))
        if value is None:
            return  # absent in the capture: the fake answers NOT_SUPPORTED
        number = _number(value) if convert is not None else None
        if callable(convert) and number is not None:
            value = str(convert(number))
        profile.set(p + key, value, f"query-gpu {column}" + (f"; {note}" if note else ""))

    put("name", "name")
    put("uuid", "uuid", note="masked in the capture")
    put("pci.bus_id", "pci.bus_id")
    for key in ("domain", "bus", "device", "device_id", "sub_device_id"):
        put(f"pci.{key}", f"pci.{key}")
    compute_cap = _present(row.get("compute_cap"))
    architecture = ARCHITECTURES.get(compute_cap or "")
    if architecture is not None:
        profile.set(p + "architecture", architecture, f"from query-gpu compute_cap {compute_cap}")
    if numa is not None:
        profile.set(p + "numa_node", numa, "topo -m: GPU NUMA ID")
    for key, column, title in (
        ("cpu_affinity", "cpus", "CPU Affinity"),
        ("memory_affinity", "nodes", "NUMA Affinity"),
    ):
        near = (topology or {}).get(column)
        if near is not None:
            profile.set(p + key, near, f"topo -m: {title}")
    put("pcie.generation", "pcie.link.gen.current", int)
    put("pcie.generation_max", "pcie.link.gen.max", int)
    put("pcie.width", "pcie.link.width.current", int)
    put("pcie.width_max", "pcie.link.width.max", int)
    put("clock_event_reasons", "clocks_event_reasons.active")
    put("memory.total_bytes", "memory.total", lambda mib: int(mib) * MIB, "MiB")
    put("memory.reserved_bytes", "memory.reserved", lambda mib: int(mib) * MIB, "MiB")
    put(
        "memory.used_bytes",
        "memory.used",
        lambda mib: int(mib) * MIB,
        "MiB; v2 used (reserved apart)",
    )
    put("utilization.gpu_percent", "utilization.gpu", int)
    put("utilization.memory_percent", "utilization.memory", int)
    put("temperature.gpu_c", "temperature.gpu", int)
    put("power.usage_mw", "power.draw", lambda w: round(w * 1000), "W")
    put("power.enforced_limit_mw", "enforced.power.limit", lambda w: round(w * 1000), "W")
    for key, column in (
        ("graphics", "graphics"),
        ("sm", "sm"),
        ("memory", "memory"),
        ("video", "video"),
    ):
        put(f"clock.{key}_mhz", f"clocks.current.{column}", int)
        put(f"clock.{key}_max_mhz", f"clocks.max.{column}", int)
    if _present(row.get("ecc.mode.current")) == "Enabled":
        for scope in ("volatile", "aggregate"):
            for kind in ("corrected", "uncorrected"):
                put(f"ecc.{scope}.{kind}", f"ecc.errors.{kind}.{scope}.total", int)
    applications = (row.get("clocks.applications.graphics") or "").strip()
    if "deprecated" in applications:  # R590 and newer: NVML_ERROR_DEPRECATED
        profile.set(p + "clock.applications", "deprecated", "query-gpu " + applications)
    else:
        put("clock.applications_mhz", "clocks.applications.graphics", int)
    mode = COMPUTE_MODES.get(_present(row.get("compute_mode")) or "")
    if mode is not None:
        profile.set(p + "compute_mode", mode, f"query-gpu compute_mode {row['compute_mode']}")
    mig_mode = _present(row.get("mig.mode.current"))
    if mig_mode is not None:
        profile.set(
            p + "mig.mode",
            1 if mig_mode == "Enabled" else 0,
            f"query-gpu mig.mode.current {mig_mode}",
        )
    if throughput is not None:
        tx, rx = throughput
        profile.set(p + "pcie.tx_bytes_per_s", tx * 1024, f"-q Tx Throughput {tx} KB/s")
        profile.set(p + "pcie.rx_bytes_per_s", rx * 1024, f"-q Rx Throughput {rx} KB/s")
    if processes and not migs:  # in MIG mode the fake lists the instances' processes
        listed = " ".join(f"{pid}:{int(float(mib)) * MIB}" for pid, mib in processes)
        profile.set(p + "processes.compute", listed, "query-compute-apps pid:used_gpu_memory")
    if nvlinks:
        profile.set(p + "nvlink.links", nvlinks, "nvlink -s: Link lines")
        for direction in ("tx", "rx"):
            profile.set(
                p + f"nvlink.{direction}_bytes_per_s",
                0,
                "invented: nvlink -s shows link speeds, not traffic (an idle link)",
            )
    if utilization:
        sampled = " ".join(f"{pid}:{sm}:{mem}" for pid, sm, mem in utilization)
        profile.set(p + "processes.utilization", sampled, "pmon pid:sm%:mem% (first cycle)")
    for mig in migs:
        q = f"{p}mig.{mig['index']}."
        profile.set(q + "uuid", mig["uuid"], "-L")
        profile.set(
            q + "name",
            f"{row.get('name', 'GPU')} MIG {mig['name']}",
            "-L: GPU name and MIG profile",
        )
        if "gi" in mig:
            profile.set(q + "gpu_instance_id", mig["gi"], "MIG table GI ID")
            profile.set(q + "compute_instance_id", mig["ci"], "MIG table CI ID")
            profile.set(
                q + "memory.total_bytes",
                int(mig["total_mib"]) * MIB,
                "MIG table, shared memory MiB",
            )
            profile.set(
                q + "memory.used_bytes", int(mig["used_mib"]) * MIB, "MIG table, shared memory MiB"
            )
        if mig.get("processes"):
            profile.set(
                q + "processes.compute",
                mig["processes"],
                "table Processes: pid:memory of this GI/CI",
            )
    # what nvidia-smi cannot show, invented or assumed so that the fake answers at all
    if p + "power.usage_mw" in profile.values():
        profile.set(
            p + "energy.at_init_mj",
            0,
            "invented: the counter starts at 0 and grows with power.usage_mw",
        )
    profile.set(
        p + "events.supported", XID_CRITICAL_ERROR, "assumed: datacenter GPUs deliver XID events"
    )
    if architecture is not None and architecture >= 9:
        profile.set(p + "gpm.supported", 1, "GPM: Hopper and newer (nvml.h)")
        sm = _number(row.get("utilization.gpu"))
        invented = "invented: nvidia-smi shows no GPM values"
        profile.set(
            p + f"gpm.{GPM_SM_UTIL}",
            sm if sm is not None else 0.0,
            invented + " (SM activity = utilization.gpu)",
        )
        profile.set(p + f"gpm.{GPM_SM_OCCUPANCY}", 0.0, invented)
        profile.set(p + f"gpm.{GPM_ANY_TENSOR_UTIL}", 0.0, invented)
        profile.set(p + f"gpm.{GPM_DRAM_BW_UTIL}", 0.0, invented)
        if throughput is not None:
            # GPM's PCIe rates are MiB/s (pynvml 13.615.71's comment); the capture's -q
            # throughput is the same link measured by nvidia-smi
            tx, rx = throughput
            profile.set(
                p + f"gpm.{GPM_PCIE_TX}", tx * 1024 / MIB, f"-q Tx Throughput {tx} KB/s in MiB/s"
            )
            profile.set(
                p + f"gpm.{GPM_PCIE_RX}", rx * 1024 / MIB, f"-q Rx Throughput {rx} KB/s in MiB/s"
            )


def _processes(parts: dict[str, str], state: str) -> dict[str, list[tuple[str, str]]]:
    """uuid -> [(pid, used MiB)] from ``--query-compute-apps``."""
    try:
        body = _section(parts, f"{state} :: query-compute-apps")
    except CaptureError:
        return {}
    rows = list(
        csv.reader([line for line in body.splitlines() if line.strip()], skipinitialspace=True)
    )
    if not rows:
        return {}
    header = [_UNIT.sub("", name) for name in rows[0]]
    found: dict[str, list[tuple[str, str]]] = {}
    for row in rows[1:]:
        entry = dict(zip(header, row, strict=False))
        used = _number(entry.get("used_gpu_memory"))
        if used is not None and "pid" in entry:
            found.setdefault(entry["gpu_uuid"], []).append((entry["pid"], str(used)))
    return found


def _pmon(parts: dict[str, str], state: str) -> dict[int, list[tuple[str, str, str]]]:
    """GPU index -> [(pid, sm %, mem %)] of ``pmon``'s first cycle, the processes that ran
    a kernel (those with "-" had none sampled, which NVML leaves out of its samples)."""
    try:
        body = _section(parts, f"{state} :: pmon")
    except CaptureError:
        return {}
    found: dict[int, list[tuple[str, str, str]]] = {}
    seen: set[tuple[str, str]] = set()
    for line in body.splitlines():
        fields = line.split()
        if len(fields) < 5 or line.startswith("#") or not fields[0].isdigit():
            continue
        gpu, pid, _, sm, mem = fields[:5]
        if (gpu, pid) in seen:
            break  # the second cycle begins
        seen.add((gpu, pid))
        if sm.isdigit() and mem.isdigit():
            found.setdefault(int(gpu), []).append((pid, sm, mem))
    return found


def profile_from_capture(path: Path, *, state: str = "idle") -> Profile:
    """The fake's profile of every GPU in one capture file, at ``state`` (idle or load)."""
    parts = sections(path.read_text(encoding="utf-8"))
    profile = Profile(source=f"{path.name} ({state})")
    _versions(profile, parts)
    rows = query_gpu_rows(parts, state)
    profile.set("device_count", len(rows), "query-gpu rows")
    throughput = _throughput(parts, state)
    numa = _gpu_numa_ids(parts)
    topology = _topology(parts)
    nvlinks = _nvlinks(parts)
    migs = _migs(parts, state)
    processes = _processes(parts, state)
    pmon = _pmon(parts, state)
    for index, row in enumerate(rows):
        _gpu(
            profile,
            index,
            row,
            throughput[index] if index < len(throughput) else None,
            numa[index] if index < len(numa) else None,
            migs if index == 0 else [],  # -L lists MIG devices under GPU 0 in these captures
            processes.get(row.get("uuid", ""), []),
            pmon.get(index, []),
            topology[index] if index < len(topology) else None,
            nvlinks[index] if index < len(nvlinks) else 0,
        )
    return profile


def captures() -> Iterator[Path]:
    return iter(sorted(CAPTURES.glob("*.txt")))


def capture(name: str) -> Path:
    """The capture file whose name contains ``name`` (e.g. "h200__590")."""
    found = [path for path in captures() if name in path.name]
    if len(found) != 1:
        raise CaptureError(f"{name!r} matches {len(found)} captures: {[p.name for p in found]}")
    return found[0]
