"""The narrow interface every GPU source implements, and the readings it returns.

A source (NVML, simulated) lists its devices and takes one sample of all of
them at a time. A reading leaves out every metric the device cannot give
(NotSupported, NoPermission): such a metric is absent from ``/metrics``, never 0.
Units are base units: hertz, bytes, watts, joules, ratios in 0-1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from gpuscope.contract import gpu as metrics
from gpuscope.exporter.gpu.numa import Affinity


class DownReason(StrEnum):
    """Why a GPU reads ``gpuscope_gpu_up 0`` when it is not one NVML error's (those are in
    ``nvml.errors.ERRORS``: ``lost``, ``reset_required``, ``insufficient_power``, ...)."""

    LOST = "lost"  # the default: the GPU does not answer
    SOURCE_FAILED = "source_failed"  # the whole source failed this round (driver error)
    POLL_OVERDUE = "poll_overdue"  # the poll round did not finish by its deadline (hung call)
    RELEASED = "released"  # NVML released on request (SIGUSR1), until told to take it again
    UNANSWERED = "unanswered"  # every metric it should give failed this round


class GpuSourceKind(StrEnum):
    """The values of ``--gpu-source``: a backend, ``auto`` (the first of
    ``factory.HARDWARE_SOURCES`` that opens, else none) or none."""

    AUTO = "auto"
    NVML = "nvml"
    DCGM = "dcgm"  # retired: refused with a pointer to dcgm-exporter (``factory.RETIRED``)
    SIMULATED = "simulated"
    NONE = "none"


def gpu_label(index: int, mig_device: int | None = None) -> str:
    """The ``gpu`` label: the GPU's index, or ``<parent index>:<MIG device index>`` for a
    MIG instance (the numbering of ``nvidia-smi -L``'s "MIG ... Device N" lines)."""
    return str(index) if mig_device is None else f"{index}:{mig_device}"


@dataclass(frozen=True)
class MigInstance:
    """What makes a GPU a MIG instance of another (``GpuDevice.mig``)."""

    parent_uuid: str
    device_index: int  # nvmlDeviceGetMigDeviceHandleByIndex's index under the parent
    profile: str  # "3g.71gb", "1c.3g.71gb" (compute instance sub-profile first)
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class GpuDevice:
    """What identifies a GPU; descriptive fields end up on ``gpuscope_gpu_info`` only.

    A MIG instance is a GPU of its own: its ``MIG-...`` UUID, its parent's ``index``
    and ``mig`` set."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    numa_node: int | None = None
    driver_version: str | None = None
    mig: MigInstance | None = None
    affinity: Affinity | None = None  # the CPUs and NUMA nodes the GPU is local to

    @property
    def label(self) -> str:
        return gpu_label(self.index, None if self.mig is None else self.mig.device_index)


@dataclass(frozen=True)
class ProcessUse:
    """One process's share of a GPU it shares: its device memory (the process list's,
    refreshed with the process join) and its SM utilisation since the last poll (NVML's
    per-process utilisation; 0 for a process NVML saw no kernel of)."""

    memory_used_bytes: float | None = None
    sm_utilization_ratio: float | None = None
    numa_locality: str | None = None  # "local", "split", "remote" (gpu.numa.Locality)


@dataclass(frozen=True)
class GpuReading:
    """One device's readings at one instant. ``up=False``: the GPU is lost.

    ``values`` holds the plain per-GPU metrics, keyed by the ``field`` of their row in
    ``gpuscope.contract.gpu.PER_GPU`` (``"power_watts"``, ``"sm_clock_hz"``, ...), in base units;
    a metric the source cannot give has no key. The other attributes feed the
    labelled families. A key that names no row is a programmer error: ``ValueError``.
    """

    index: int
    uuid: str
    up: bool = True
    # the MIG device index under GPU ``index`` for a MIG instance's reading, else None
    mig_device: int | None = None
    # why ``up`` is False: a ``DownReason`` (or an NVML error's, see ``nvml.errors``); ""
    # while up. The ``reason`` label of ``gpuscope_gpu_down_reason``.
    down_reason: str = ""
    values: Mapping[str, float] = field(default_factory=dict)
    # reason (e.g. "sw_power_cap", "hw_thermal_slowdown", "gpu_idle") -> active now
    clock_event_reasons: Mapping[str, bool] | None = None
    # xid -> errors seen since the source started; type ("volatile_corrected", ...) -> count
    xid_errors_total: Mapping[int, int] = field(default_factory=dict)
    # False where the source cannot watch this GPU's XIDs (NVML refused the event
    # registration): its XID totals are then absent, not 0.
    xid_supported: bool = True
    ecc_errors_total: Mapping[str, int] | None = None
    # sharing: NVML's compute mode ("default", "exclusive_process", "prohibited"), the
    # processes on the GPU (pid -> use; None: unknown), MPS clients (None: unknown)
    compute_mode: str | None = None
    tenants: Mapping[int, ProcessUse] | None = None
    mps_processes: int | None = None
    # pid -> SM utilisation of the processes NVML sampled this poll; None where NVML has
    # no per-process utilisation (MIG, older pynvml)
    process_sm: Mapping[int, float] | None = None
    # polls whose SM clock differed from the previous poll's, since the exporter started
    # (the poller counts it; None until the GPU gave an SM clock)
    sm_clock_changes_total: int | None = None

    def __post_init__(self) -> None:
        unknown = self.values.keys() - {row.field for row in metrics.PER_GPU}
        if unknown:
            raise ValueError(
                f"GPU reading values {sorted(unknown)} name no row of gpuscope.contract.gpu.PER_GPU"
            )

    @property
    def label(self) -> str:
        return gpu_label(self.index, self.mig_device)

    @property
    def contended(self) -> bool | None:
        """More than one process time-slicing the GPU: several processes on it, none
        through MPS, in the default compute mode. None where the processes are unknown."""
        if self.tenants is None or self.mps_processes is None:
            return None
        return (
            len(self.tenants) > 1
            and self.mps_processes == 0
            and self.compute_mode
            in (
                None,
                "default",
            )
        )

    def has(self, name: str) -> bool:
        """Whether the reading holds ``name``: a key of ``values`` or an attribute
        (``clock_event_reasons``, ...) that is not None."""
        return name in self.values or getattr(self, name, None) is not None


class GpuSource(Protocol):
    """A backend that can enumerate GPUs and sample them.

    ``sample()`` is called from one background thread at the poll interval, never
    from a scrape. It must not raise for a single failing GPU (that GPU's reading
    gets ``up=False``); an exception from it means the whole source failed this
    round and is counted as a collector failure.
    """

    name: str  # "nvml", "simulated": the ``collector`` label

    def devices(self) -> Sequence[GpuDevice]: ...

    def sample(self) -> Sequence[GpuReading]: ...

    def close(self) -> None: ...


@runtime_checkable
class Releasable(Protocol):
    """A source that can let go of the driver while the exporter runs (NVML), so that a
    GPU reset or a MIG change by another tool finds no client. Both are called from the
    poller's thread, between rounds."""

    def release(self) -> None:
        """Close the library (``nvmlShutdown``); ``sample()`` is not called until ``acquire``."""

    def acquire(self) -> None:
        """Open it again; may raise as opening at start-up does (the poller retries)."""


@runtime_checkable
class ReportsUnrecoverable(Protocol):
    """A source that knows when it cannot heal in this process (a driver upgraded under
    it), so that liveness fails and the supervisor restarts the exporter."""

    def unrecoverable(self) -> str | None:
        """Why a restart is needed, or None."""


@runtime_checkable
class ComputeObserver(Protocol):
    """Told of every batch span the exporter ingests. The simulated source is one, so
    that simulated occupancy follows the real workload (bigger batches, busier GPU).
    """

    def observe_compute(self, uuid: str, seconds: float, batch_size: int, max_size: int) -> None:
        """A batch of ``batch_size`` (of at most ``max_size``) ran ``seconds`` on ``uuid``."""
