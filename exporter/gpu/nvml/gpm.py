"""GPU Performance Monitoring (GPM, Hopper and newer): SM occupancy and activity.

GPM metrics are computed from two samples taken at least 100 ms apart. The sampler
keeps the previous sample and, each poll, takes a new one into the spare buffer,
asks ``nvmlGpmMetricsGet`` for the four ratios, then swaps the buffers. Polls that
come sooner than 100 ms after the previous sample reuse the last values.
"""

from __future__ import annotations

import contextlib
from typing import Any

MIN_SAMPLE_GAP_S = 0.1

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
    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._previous = nvml.nvmlGpmSampleAlloc()
        self._spare = nvml.nvmlGpmSampleAlloc()
        self._previous_at: float | None = None
        self._last: dict[str, float] = {}

    def read(self, now: float) -> dict[str, float]:
        """The four ratios between the previous sample and now ({} on the first call)."""
        if self._previous_at is not None and now - self._previous_at < MIN_SAMPLE_GAP_S:
            return self._last
        nvml = self._nvml
        nvml.nvmlGpmSampleGet(self._handle, self._spare)
        if self._previous_at is not None:
            self._last = self._metrics(self._previous, self._spare)
        self._previous, self._spare = self._spare, self._previous
        self._previous_at = now
        return self._last

    def close(self) -> None:
        for sample in (self._previous, self._spare):
            # the GPU or driver may already be gone; then there is nothing left to free
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlGpmSampleFree(sample)

    def _metrics(self, first: Any, second: Any) -> dict[str, float]:
        nvml = self._nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = first
        request.sample2 = second
        for slot, (_, constant) in enumerate(GPM_METRICS):
            request.metrics[slot].metricId = getattr(nvml, constant)
        nvml.nvmlGpmMetricsGet(request)
        values: dict[str, float] = {}
        for slot, (field, _) in enumerate(GPM_METRICS):
            metric = request.metrics[slot]
            if metric.nvmlReturn == nvml.NVML_SUCCESS:  # per-metric NotSupported: absent
                values[field] = min(1.0, max(0.0, metric.value / 100.0))
        return values
