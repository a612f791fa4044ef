"""NVLink traffic through NVML's field values.

``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`` / ``_RX`` (138/139) are the driver's
cumulative counters of the data sent and received over NVLink, in KiB; a ``scopeId`` of
UINT_MAX sums them over all links (nvml.h). ``NVML_FI_DEV_NVLINK_LINK_COUNT`` (91) is the
number of links. A GPU without NVLink (L40S), or in MIG mode ("Nvlink queries are not
supported for Devices in MIG mode"), answers NotSupported for them: the group is then
absent, and a GPU whose link count is 0 has none either. The ids are nvml.h's, since
pynvml releases name them differently over time.
"""

from __future__ import annotations

from typing import Any

from gpuscope.exporter.gpu.nvml.pcie import field_value

LINK_COUNT_FIELD = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
TX_FIELD, RX_FIELD = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX, KiB
ALL_LINKS = 0xFFFFFFFF  # scopeId: summed over every link
KIB = 1024


def read_nvlink(nvml: Any, handle: Any) -> dict[str, float]:
    """Link count and data bytes sent / received over all links; raises the NVMLError of
    the first field that failed (NotSupported: no NVLink here)."""
    entries = nvml.nvmlDeviceGetFieldValues(
        handle, [LINK_COUNT_FIELD, (TX_FIELD, ALL_LINKS), (RX_FIELD, ALL_LINKS)]
    )
    for entry in entries:
        if entry.nvmlReturn != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(entry.nvmlReturn)
    links, tx, rx = (field_value(nvml, entry) for entry in entries)
    if not links or tx is None or rx is None:
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)  # a GPU with no link
    return {
        "nvlink_links": links,
        "nvlink_transmit_bytes_total": tx * KIB,
        "nvlink_receive_bytes_total": rx * KIB,
    }
