"""PCIe traffic as byte counters.

Preferred: the driver's cumulative counters ``NVML_FI_DEV_PCIE_COUNT_TX_BYTES`` /
``RX_BYTES`` (field ids 197/198) through ``nvmlDeviceGetFieldValues``: exact, and
one cheap call. Only when the fields are missing does it fall back to
``nvmlDeviceGetPcieThroughput``, which samples for 20 ms per call and returns KB/s;
those rates are integrated over the poll interval into an estimated counter.
"""

from __future__ import annotations

from typing import Any

# A field entry's nvmlReturn that means this driver or device lacks the field
# (INVALID_ARGUMENT: an id the driver does not know).
_FIELDS_MISSING = (
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
)

# c_nvmlValue_t member for each NVML_VALUE_TYPE_*
_VALUE_MEMBER = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def field_value(nvml: Any, entry: Any) -> float | None:
    """The value of one ``c_nvmlFieldValue_t``, or None when its own return is an error."""
    if entry.nvmlReturn != nvml.NVML_SUCCESS:
        return None
    member = _VALUE_MEMBER.get(entry.valueType)
    return None if member is None else float(getattr(entry.value, member))


class PcieByteCounter:
    """Reads (tx_bytes, rx_bytes) counters for one device."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self.integrating = False  # True once the byte-count fields proved missing
        self._totals = [0.0, 0.0]
        self._last_at: float | None = None

    def read(self, now: float) -> tuple[float, float]:
        """Raises the NVMLError of the fallback when neither way works."""
        if not self.integrating:
            counters = self._from_fields()
            if counters is not None:
                return counters
            self.integrating = True
        return self._integrate(now)

    def _from_fields(self) -> tuple[float, float] | None:
        nvml = self._nvml
        ids = [nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        try:
            entries = nvml.nvmlDeviceGetFieldValues(self._handle, ids)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return None
        missing = {getattr(nvml, name) for name in _FIELDS_MISSING}
        for entry in entries:
            status = entry.nvmlReturn
            if status in missing:
                return None
            if status != nvml.NVML_SUCCESS:
                # A lost GPU, a driver failure or a one-off error: classified by the
                # caller like any other call's error. Only missing fields mean the
                # estimate, for good, and switching to it would restart the counter.
                raise nvml.NVMLError(status)
        tx, rx = (field_value(nvml, entry) for entry in entries)
        return None if tx is None or rx is None else (tx, rx)

    def _integrate(self, now: float) -> tuple[float, float]:
        nvml = self._nvml
        tx_kib_s = nvml.nvmlDeviceGetPcieThroughput(self._handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
        rx_kib_s = nvml.nvmlDeviceGetPcieThroughput(self._handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        if self._last_at is not None:
            elapsed = max(0.0, now - self._last_at)
            self._totals[0] += tx_kib_s * 1024.0 * elapsed
            self._totals[1] += rx_kib_s * 1024.0 * elapsed
        self._last_at = now
        return self._totals[0], self._totals[1]
