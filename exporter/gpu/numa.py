"""Whether a process on a GPU runs on the GPU's NUMA node.

A GPU hangs off one CPU socket's PCIe root: its DMA (the host side of every copy, the
pinned buffers) is fastest to that socket's memory, and the CPU threads feeding it
fastest on that socket's cores. NVML names that side (``nvmlDeviceGetCpuAffinity``: the
CPUs, ``nvmlDeviceGetMemoryAffinity`` with ``NVML_AFFINITY_SCOPE_NODE``: the NUMA
nodes), as does sysfs (``/sys/bus/pci/devices/<bus id>/local_cpulist`` and
``numa_node``); a process's allowed CPUs and memory nodes are ``Cpus_allowed_list`` and
``Mems_allowed_list`` of ``/proc/<pid>/status``.

A process is ``local`` when it may run only on the GPU's CPUs and allocate only on its
nodes, ``remote`` when none of its CPUs (or none of its nodes) is the GPU's, ``split``
otherwise (unbound: the scheduler may move it across sockets). ``numactl
--cpunodebind=N --membind=N`` makes it local.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

SYS_PCI = Path("/sys/bus/pci/devices")


class Locality(StrEnum):
    LOCAL = "local"
    SPLIT = "split"
    REMOTE = "remote"


def parse_list(text: str) -> frozenset[int]:
    """A kernel list ("0-3,8,10-11") as its numbers; empty for "" (or garbage)."""
    found: set[int] = set()
    for part in text.strip().split(","):
        low, _, high = part.strip().partition("-")
        try:
            found.update(range(int(low), int(high or low) + 1))
        except ValueError:
            continue
    return frozenset(found)


def format_list(numbers: Iterable[int]) -> str:
    """The kernel's form of a set of numbers: "0-3,8"."""
    ranges: list[str] = []
    for n in sorted(set(numbers)):
        if ranges and ranges[-1].split("-")[-1] == str(n - 1):
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{n}"
        else:
            ranges.append(str(n))
    return ",".join(ranges)


def from_mask(words: Iterable[int]) -> frozenset[int]:
    """The bits set in NVML's affinity arrays (64 per word, lowest first)."""
    return frozenset(
        64 * i + bit for i, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1
    )


@dataclass(frozen=True)
class Affinity:
    """The CPUs and NUMA nodes a GPU is local to (``source`` says who said so)."""

    cpus: frozenset[int]
    nodes: frozenset[int]
    source: str = "nvml"

    @property
    def node(self) -> int | None:
        """The one node to bind to (the lowest, where NVML names several)."""
        return min(self.nodes) if self.nodes else None


def sysfs_affinity(pci_bus_id: str, root: Path = SYS_PCI) -> Affinity | None:
    """The GPU's CPUs and node from sysfs, where NVML gives none."""
    domain, _, rest = pci_bus_id.lower().partition(":")
    folder = root / f"{domain[-4:]}:{rest}"
    try:
        cpus = parse_list((folder / "local_cpulist").read_text())
        node = int((folder / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return Affinity(cpus, frozenset() if node < 0 else frozenset({node}), "sysfs")


@dataclass(frozen=True)
class Allowed:
    """Where a process may run and allocate (``/proc/<pid>/status``)."""

    cpus: frozenset[int]
    nodes: frozenset[int]


def read_allowed(proc: Path, pid: int) -> Allowed | None:
    try:
        text = (proc / str(pid) / "status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = dict(line.partition(":")[::2] for line in text.splitlines())
    cpus = parse_list(fields.get("Cpus_allowed_list", ""))
    nodes = parse_list(fields.get("Mems_allowed_list", ""))
    return Allowed(cpus, nodes) if cpus else None


def _side(allowed: frozenset[int], near: frozenset[int]) -> Locality | None:
    if not allowed or not near:
        return None  # unknown: no say
    if allowed <= near:
        return Locality.LOCAL
    return Locality.REMOTE if not allowed & near else Locality.SPLIT


def locality(allowed: Allowed, gpu: Affinity) -> Locality | None:
    """local, split or remote; None where neither CPUs nor nodes can be compared."""
    sides = [s for s in (_side(allowed.cpus, gpu.cpus), _side(allowed.nodes, gpu.nodes)) if s]
    if not sides:
        return None
    if Locality.REMOTE in sides:
        return Locality.REMOTE
    return Locality.SPLIT if Locality.SPLIT in sides else Locality.LOCAL


def numactl(gpu: Affinity) -> str | None:
    """The command prefix that runs a process on the GPU's node (on its CPUs, allocating
    where it runs, where the node is unknown)."""
    node = gpu.node
    if node is not None:
        return f"numactl --cpunodebind={node} --membind={node}"
    if gpu.cpus:
        return f"numactl --physcpubind={format_list(gpu.cpus)} --localalloc"
    return None
