"""A MIG GPU's instances, each opened as a GPU of its own.

In MIG mode NVML hands out a device handle per MIG device under the parent
(``nvmlDeviceGetMaxMigDeviceCount``, then ``nvmlDeviceGetMigDeviceHandleByIndex`` for
each slot, NotFound for an empty one). Such a handle has its own ``MIG-...`` UUID, a
name ending in its profile (``NVIDIA H200 MIG 3g.71gb``), its GPU and compute
instance ids, its own memory and its own processes; GPM is sampled per GPU instance on
the parent's handle (``nvmlGpmMigSampleGet``, see ``device``); clocks, power,
temperature, the PCIe link and XIDs stay the parent's.
"""

from __future__ import annotations

from typing import Any

from gpuscope.exporter.gpu.source import GpuDevice, MigInstance

PROFILE_SEPARATOR = " MIG "  # NVML's MIG device names: "<GPU name> MIG <profile>"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether the GPU runs in MIG mode now (NotSupported before Ampere)."""
    function = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if function is None:
        return False
    try:
        current = function(handle)[0]
    except nvml.NVMLError:
        return False
    return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


def _instance_id(nvml: Any, name: str, handle: Any) -> int | None:
    try:
        return int(getattr(nvml, name)(handle))
    except nvml.NVMLError:
        return None


def mig_device(nvml: Any, parent: GpuDevice, handle: Any, slot: int) -> GpuDevice:
    """The MIG device of ``handle`` (slot ``slot`` under ``parent``); raises NVMLError."""
    name = _text(nvml.nvmlDeviceGetName(handle))
    return GpuDevice(
        index=parent.index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=name,
        pci_bus_id=parent.pci_bus_id,  # one PCIe function: the parent's
        numa_node=parent.numa_node,
        driver_version=parent.driver_version,
        affinity=parent.affinity,  # one PCIe function: the parent's socket
        mig=MigInstance(
            parent_uuid=parent.uuid,
            device_index=slot,
            profile=name.partition(PROFILE_SEPARATOR)[2],
            gpu_instance_id=_instance_id(nvml, "nvmlDeviceGetGpuInstanceId", handle),
            compute_instance_id=_instance_id(nvml, "nvmlDeviceGetComputeInstanceId", handle),
        ),
    )


def mig_handles(nvml: Any, handle: Any) -> list[tuple[int, Any]]:
    """(slot, handle) of each MIG device under a GPU in MIG mode; [] otherwise.

    NVMLError other than an empty slot's NotFound propagates (GpuIsLost, ...)."""
    if not mig_enabled(nvml, handle):
        return []
    count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    not_found = getattr(nvml, "NVMLError_NotFound", ())
    found = []
    for slot in range(count):
        try:
            found.append((slot, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)))
        except not_found:
            continue  # an empty slot: no instance was created there
    return found
