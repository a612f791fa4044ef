"""What ``gpuscope doctor`` reports on per GPU: the GPU rows (``gpuscope.contract.gpu``)
grouped by how a source reads them.
"""

from __future__ import annotations

from typing import Final

from gpuscope.contract.gpu import (
    DRAM_ACTIVE,
    ENERGY,
    MEMORY_CLOCK,
    MEMORY_CLOCK_MAX,
    MEMORY_RESERVED,
    MEMORY_TOTAL,
    MEMORY_USED,
    NVLINK_LINKS,
    NVLINK_RECEIVE,
    NVLINK_TRANSMIT,
    PCIE_LINK_GENERATION,
    PCIE_LINK_WIDTH,
    PCIE_RECEIVE,
    PCIE_TRANSMIT,
    POWER,
    POWER_LIMIT,
    SM_ACTIVE,
    SM_CLOCK,
    SM_CLOCK_MAX,
    SM_CLOCK_TARGET,
    SM_OCCUPANCY,
    TEMPERATURE,
    TENSOR_ACTIVE,
    UTILIZATION,
)

# What ``gpuscope doctor`` (and ``scripts/gpu-check``) report on per GPU: readings a source
# gives or not together (NVML reads a group with one call or a few), as the ``field`` of
# their rows or, for the labelled families, the ``GpuReading`` attribute. Every row of
# ``PER_GPU`` is in one group (a test checks).
METRIC_GROUPS: Final[dict[str, tuple[str, ...]]] = {
    "sm_clock": (SM_CLOCK.field,),
    "sm_clock_max": (SM_CLOCK_MAX.field,),
    "sm_clock_target": (SM_CLOCK_TARGET.field,),
    "memory_clock": (MEMORY_CLOCK.field,),
    "memory_clock_max": (MEMORY_CLOCK_MAX.field,),
    "clock_event_reasons": ("clock_event_reasons",),
    "utilization": (UTILIZATION.field,),
    "memory": (MEMORY_USED.field, MEMORY_TOTAL.field),
    "memory_reserved": (MEMORY_RESERVED.field,),
    "power": (POWER.field,),
    "power_limit": (POWER_LIMIT.field,),
    "energy": (ENERGY.field,),
    "temperature": (TEMPERATURE.field,),
    "pcie_link_generation": (PCIE_LINK_GENERATION.field,),
    "pcie_link_width": (PCIE_LINK_WIDTH.field,),
    "ecc_errors": ("ecc_errors_total",),
    "pcie_bytes": (PCIE_TRANSMIT.field, PCIE_RECEIVE.field),
    "nvlink": (NVLINK_LINKS.field, NVLINK_TRANSMIT.field, NVLINK_RECEIVE.field),
    "gpm": (SM_OCCUPANCY.field, SM_ACTIVE.field, TENSOR_ACTIVE.field, DRAM_ACTIVE.field),
    "xid_errors": ("xid_errors_total",),
    "compute_mode": ("compute_mode",),
    "process_utilization": ("process_sm",),
}
