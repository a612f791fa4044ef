"""The prometheus_client collector for GPU metrics, built fresh from the poller's snapshot.

The families are the rows of ``gpu.metrics``; the plain per-GPU rows need no code here.

Every scrape builds new metric families, so a GPU that went away (lost, MIG
reconfigured) simply has no series: nothing stale, nothing to unregister. A metric
that is None in a reading is absent; a GPU that is down keeps only ``gpu_up 0``
and ``gpu_info``. The process join's status is one series per state, 1 for the
current one (a state set), so an alert can test ``{status="ok"} == 0``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.gpu import metrics as rows
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.processes import ProcessJoin
from gpuscope.exporter.gpu.source import GpuDevice, GpuReading


class GpuCollector(Collector):
    """Register with a ``CollectorRegistry``; reads only the poller's cached snapshot."""

    def __init__(self, poller: GpuPoller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        snapshot = self._poller.snapshot()
        yield self._info(snapshot.devices)
        readings = snapshot.readings
        up_family = rows.UP.family()
        for reading in readings:
            up_family.add_metric(_labels(reading), 1.0 if reading.up else 0.0)
        yield up_family
        live = [r for r in readings if r.up]
        yield from self._per_gpu(live)
        yield from self._labelled(live)
        yield from self._process_join()
        success = rows.COLLECTOR_SUCCESS.family()
        duration = rows.COLLECTOR_DURATION.family()
        for run in snapshot.runs:
            success.add_metric([run.collector], 1.0 if run.success else 0.0)
            duration.add_metric([run.collector], run.duration_s)
        yield success
        yield duration

    def _process_join(self) -> Iterator[Metric]:
        join = self._poller.processes.state()
        status = rows.PROCESS_JOIN_STATUS.family()
        for state in ProcessJoin:
            if state is not ProcessJoin.NO_GPU_SOURCE:  # with no source, no GPU families at all
                status.add_metric([state.value], 1.0 if join.status is state else 0.0)
        yield status
        yield rows.PROCESS_JOIN_PROCESSES.one_value(
            len(join.visible) if join.status is ProcessJoin.OK else 0
        )

    @staticmethod
    def _info(devices: Sequence[GpuDevice]) -> Metric:
        family = rows.INFO.family()
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
        for row in rows.PER_GPU:
            family = row.family()
            for reading in live:
                value = getattr(reading, row.field)
                if value is not None:
                    family.add_metric(_labels(reading), float(value))
            yield family

    @staticmethod
    def _labelled(live: list[GpuReading]) -> Iterator[Metric]:
        reasons = rows.CLOCK_EVENT_ACTIVE.family()
        xid_events = rows.XID_EVENTS.family()
        xids = rows.XID_ERRORS.family()
        ecc = rows.ECC_ERRORS.family()
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
