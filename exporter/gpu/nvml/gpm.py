"""GPU Performance Monitoring (GPM, Hopper and newer): SM occupancy and activity.

GPM metrics are computed from two samples taken at least 100 ms apart. The sampler
keeps the previous sample and, each poll, takes a new one into the spare buffer,
asks ``nvmlGpmMetricsGet`` for the four ratios, then swaps the buffers. Polls that
come sooner than 100 ms after the previous sample reuse the last values.

A metric GPM answers NaN for (seen on idle GPUs and right after a reset) is left out
of that interval, never turned into 0, and ``nan`` names it for ``gpuscope doctor``.
Where the PCIe byte-count fields are missing, ``pcie.PcieByteCounter`` asks for GPM's
PCIe rates too (``track_pcie``): MiB/s averaged over the interval between the two
samples, so rate x interval is the bytes of that interval, added to ``pcie_totals``.

A MIG instance's sampler takes its samples with ``nvmlGpmMigSampleGet(parent,
gpuInstanceId, sample)`` on the parent's handle (``gpu_instance_id``): the counters of
that GPU instance, which every compute instance in it shares.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

MIN_SAMPLE_GAP_S = 0.1
MIB = float(2**20)
# nvml.h NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20, NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21 ("PCIe
# traffic from/to this GPU in MiB/sec"); every pynvml from 12.535 has the names too.
PCIE_METRICS: tuple[tuple[str, int], ...] = (
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21),
)

# GpuReading field -> pynvml constant name (percent 0-100 from NVML)
GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("sm_occupancy_ratio", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("sm_active_ratio", "NVML_GPM_METRIC_SM_UTIL"),
    ("tensor_active_ratio", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_active_ratio", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)


def gpm_supported(nvml: Any, handle: Any) -> bool:
    """Whether the device supports GPM; raises the NVMLError when the driver cannot say."""
    return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)


class GpmSampler:
    def __init__(self, nvml: Any, handle: Any, *, gpu_instance_id: int | None = None) -> None:
        self._nvml = nvml
        self._handle = handle  # a MIG instance's: its parent's (nvmlGpmMigSampleGet)
        self._gpu_instance_id = gpu_instance_id
        self._previous = nvml.nvmlGpmSampleAlloc()
        self._spare = nvml.nvmlGpmSampleAlloc()
        self._previous_at: float | None = None
        self._last: dict[str, float] = {}
        self._pcie = False  # asked for PCIe rates too
        self.pcie_totals: tuple[float, float] | None = None  # None until one interval
        self.pcie_refused: str | None = None  # why GPM gives no PCIe rate on this GPU
        self.nan: set[str] = set()  # metrics GPM answered NaN for in the last interval

    def track_pcie(self) -> None:
        """From the next interval on, also integrate GPM's PCIe rates into ``pcie_totals``."""
        self._pcie = True

    def read(self, now: float) -> dict[str, float]:
        """The four ratios between the previous sample and now ({} on the first call)."""
        if self._previous_at is not None and now - self._previous_at < MIN_SAMPLE_GAP_S:
            return self._last
        nvml = self._nvml
        if self._gpu_instance_id is None:
            nvml.nvmlGpmSampleGet(self._handle, self._spare)
        else:
            nvml.nvmlGpmMigSampleGet(self._handle, self._gpu_instance_id, self._spare)
        if self._previous_at is not None:
            self._last = self._metrics(self._previous, self._spare, now - self._previous_at)
        self._previous, self._spare = self._spare, self._previous
        self._previous_at = now
        return self._last

    def close(self) -> None:
        for sample in (self._previous, self._spare):
            # the GPU or driver may already be gone; then there is nothing left to free
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlGpmSampleFree(sample)

    def _metrics(self, first: Any, second: Any, interval_s: float) -> dict[str, float]:
        nvml = self._nvml
        ids = [getattr(nvml, constant) for _, constant in GPM_METRICS]
        if self._pcie:
            ids += [getattr(nvml, constant, number) for constant, number in PCIE_METRICS]
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1 = first
        request.sample2 = second
        for slot, metric_id in enumerate(ids):
            request.metrics[slot].metricId = metric_id
        nvml.nvmlGpmMetricsGet(request)
        values: dict[str, float] = {}
        self.nan = set()
        for slot, (field, _) in enumerate(GPM_METRICS):
            value = self._value(request.metrics[slot], field)
            if value is not None:
                values[field] = min(1.0, max(0.0, value / 100.0))
        if self._pcie:
            rates = [
                self._value(request.metrics[len(GPM_METRICS) + slot], name)
                for slot, (name, _) in enumerate(PCIE_METRICS)
            ]
            self._add_pcie(request.metrics[len(GPM_METRICS)].nvmlReturn, rates, interval_s)
        return values

    def _value(self, metric: Any, name: str) -> float | None:
        """One metric's value; None for a per-metric NotSupported or a NaN (absent)."""
        if metric.nvmlReturn != self._nvml.NVML_SUCCESS:
            return None
        value = float(metric.value)
        if not math.isfinite(value):
            self.nan.add(name)
            return None
        return value

    def _add_pcie(self, status: int, rates: list[float | None], interval_s: float) -> None:
        nvml = self._nvml
        if status in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_NO_PERMISSION):
            self.pcie_refused = f"GPM gives no PCIe rate on this GPU (NVML error {status})"
            return
        tx, rx = rates
        if tx is None or rx is None:
            return  # this interval's bytes are unknown: the counter stays where it is
        old_tx, old_rx = self.pcie_totals or (0.0, 0.0)
        self.pcie_totals = (old_tx + tx * MIB * interval_s, old_rx + rx * MIB * interval_s)
