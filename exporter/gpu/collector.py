"""The prometheus_client collector for GPU metrics, built fresh from the poller's snapshot.

Every scrape builds new metric families, so a GPU that went away (lost, MIG
reconfigured) simply has no series: nothing stale, nothing to unregister. A metric
that is None in a reading is absent; a GPU that is down keeps only ``gpu_up 0``
and ``gpu_info``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading

GPU_LABELS = ["gpu", "uuid"]

# (metric name, GpuReading field, help): one gauge each
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gpuscope_gpu_sm_clock_hertz", "sm_clock_hz", "SM clock."),
    ("gpuscope_gpu_sm_clock_max_hertz", "sm_clock_max_hz", "Maximum SM clock."),
    ("gpuscope_gpu_memory_clock_hertz", "memory_clock_hz", "Memory clock."),
    ("gpuscope_gpu_memory_clock_max_hertz", "memory_clock_max_hz", "Maximum memory clock."),
    (
        "gpuscope_gpu_utilization_ratio",
        "utilization_ratio",
        "Fraction of time a kernel ran (NVML utilization; coarse, see sm_active).",
    ),
    (
        "gpuscope_gpu_sm_occupancy_ratio",
        "sm_occupancy_ratio",
        "Resident warps over the SMs' warp capacity (GPM/DCGM).",
    ),
    ("gpuscope_gpu_sm_active_ratio", "sm_active_ratio", "Fraction of SMs busy (GPM/DCGM)."),
    (
        "gpuscope_gpu_tensor_active_ratio",
        "tensor_active_ratio",
        "Fraction of time tensor cores were busy (GPM/DCGM).",
    ),
    (
        "gpuscope_gpu_dram_active_ratio",
        "dram_active_ratio",
        "DRAM bandwidth used over its maximum (GPM/DCGM).",
    ),
    ("gpuscope_gpu_pcie_link_generation", "pcie_link_generation", "Current PCIe link generation."),
    ("gpuscope_gpu_pcie_link_width", "pcie_link_width", "Current PCIe link width (lanes)."),
    ("gpuscope_gpu_memory_used_bytes", "memory_used_bytes", "Device memory in use."),
    ("gpuscope_gpu_memory_total_bytes", "memory_total_bytes", "Device memory in total."),
    ("gpuscope_gpu_power_watts", "power_watts", "Power draw."),
    ("gpuscope_gpu_power_limit_watts", "power_limit_watts", "Enforced power limit."),
    ("gpuscope_gpu_temperature_celsius", "temperature_celsius", "GPU core temperature."),
)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "gpuscope_gpu_pcie_transmit_bytes",
        "pcie_transmit_bytes_total",
        "Bytes sent by the GPU over PCIe.",
    ),
    (
        "gpuscope_gpu_pcie_receive_bytes",
        "pcie_receive_bytes_total",
        "Bytes received by the GPU over PCIe.",
    ),
    ("gpuscope_gpu_energy_joules", "energy_joules_total", "Energy consumed by the GPU."),
)


class GpuCollector(Collector):
    """Register with a ``CollectorRegistry``; reads only the poller's cached snapshot."""

    def __init__(self, poller: GpuPoller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        snapshot = self._poller.snapshot()
        yield self._info(snapshot.devices)
        readings = snapshot.readings
        up_family = GaugeMetricFamily(
            "gpuscope_gpu_up",
            "1 if the GPU could be read in the last poll, else 0.",
            labels=GPU_LABELS,
        )
        for reading in readings:
            up_family.add_metric(_labels(reading), 1.0 if reading.up else 0.0)
        yield up_family
        live = [r for r in readings if r.up]
        yield from self._per_gpu(live)
        yield from self._labelled(live)
        success = GaugeMetricFamily(
            "gpuscope_collector_success",
            "1 if the collector's last run succeeded, else 0.",
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "gpuscope_collector_duration_seconds",
            "How long the collector's last run took.",
            labels=["collector"],
        )
        for run in snapshot.runs:
            success.add_metric([run.collector], 1.0 if run.success else 0.0)
            duration.add_metric([run.collector], run.duration_s)
        yield success
        yield duration

    @staticmethod
    def _info(devices: Sequence[GpuDevice]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "gpuscope_gpu_info",
            "Descriptive labels of each GPU; join on gpu and uuid.",
            labels=[*GPU_LABELS, "name", "pci_bus_id", "numa_node", "driver_version"],
        )
        for device in devices:
            family.add_metric(
                [
                    str(device.index),
                    device.uuid,
                    device.name,
                    device.pci_bus_id,
                    "" if device.numa_node is None else str(device.numa_node),
                    device.driver_version or "",
                ],
                1.0,
            )
        return family

    @staticmethod
    def _per_gpu(live: list[GpuReading]) -> Iterator[Metric]:
        for name, attr, text in GAUGES:
            gauge = GaugeMetricFamily(name, text, labels=GPU_LABELS)
            for reading in live:
                value = getattr(reading, attr)
                if value is not None:
                    gauge.add_metric(_labels(reading), float(value))
            yield gauge
        for name, attr, text in COUNTERS:
            counter = CounterMetricFamily(name, text, labels=GPU_LABELS)
            for reading in live:
                value = getattr(reading, attr)
                if value is not None:
                    counter.add_metric(_labels(reading), float(value))
            yield counter

    @staticmethod
    def _labelled(live: list[GpuReading]) -> Iterator[Metric]:
        reasons = GaugeMetricFamily(
            "gpuscope_gpu_clock_event_active",
            "1 while the clock event reason holds clocks down (or idle), else 0.",
            labels=[*GPU_LABELS, "reason"],
        )
        xid_events = CounterMetricFamily(
            "gpuscope_gpu_xid_events",
            "XID errors of any code seen since the exporter started (0 until the first).",
            labels=GPU_LABELS,
        )
        xids = CounterMetricFamily(
            "gpuscope_gpu_xid_errors",
            "XID errors seen since the exporter started, by XID code.",
            labels=[*GPU_LABELS, "xid"],
        )
        ecc = CounterMetricFamily(
            "gpuscope_gpu_ecc_errors",
            "ECC errors as counted by the driver.",
            labels=[*GPU_LABELS, "type"],
        )
        for reading in live:
            for reason, active in sorted((reading.clock_event_reasons or {}).items()):
                reasons.add_metric([*_labels(reading), reason], 1.0 if active else 0.0)
            for kind, count in sorted((reading.ecc_errors_total or {}).items()):
                ecc.add_metric([*_labels(reading), kind], float(count))
            if not reading.xid_supported:
                continue  # absent, not 0: nothing watches this GPU's XIDs
            # present from the first scrape, so increase() sees the first burst
            xid_events.add_metric(_labels(reading), float(sum(reading.xid_errors_total.values())))
            for xid, count in sorted(reading.xid_errors_total.items()):
                xids.add_metric([*_labels(reading), str(xid)], float(count))
        yield reasons
        yield xid_events
        yield xids
        yield ecc


def _labels(reading: GpuReading) -> list[str]:
    return [str(reading.index), reading.uuid]
