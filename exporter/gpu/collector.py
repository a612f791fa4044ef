"""The prometheus_client collector for GPU metrics, built fresh from the poller's snapshot.

The families are the rows of ``gpu.definitions``, in its order; the plain per-GPU rows (those
with a ``field``) need no code here.

Every scrape builds new metric families, so a GPU that went away (lost, MIG
reconfigured) simply has no series: nothing stale, nothing to unregister. A metric
that a reading lacks is absent; a GPU that is down keeps only ``gpu_up 0``,
``gpu_down_reason{reason}`` and ``gpu_info``. The sample age is read from the poller's
clock at each scrape, so it grows while a poll is stuck. The process join's status is
one series per state, 1 for the current one (a state set), so an alert can test
``{status="ok"} == 0``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.definitions import MetricDef
from gpuscope.exporter.gpu import definitions as rows
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.processes import ProcessJoin
from gpuscope.exporter.gpu.source import DownReason, GpuDevice, GpuReading

# (label values, value) of one sample
Sample = tuple[Sequence[str], float]


class GpuCollector(Collector):
    """Register with a ``CollectorRegistry``; reads only the poller's cached snapshot.

    Yields one family per row of ``gpu.definitions.GPU_METRICS``, in that order.
    """

    def __init__(self, poller: GpuPoller) -> None:
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        snapshot = self._poller.snapshot()
        live = [reading for reading in snapshot.readings if reading.up]
        samples: dict[MetricDef, list[Sample]] = {
            rows.INFO: [(_info_labels(device), 1.0) for device in snapshot.devices],
            rows.MIG_INFO: [(_mig_labels(d), 1.0) for d in snapshot.devices if d.mig is not None],
            rows.UP: [(_labels(r), 1.0 if r.up else 0.0) for r in snapshot.readings],
            rows.DOWN_REASON: [
                ([*_labels(r), r.down_reason or DownReason.LOST], 1.0)
                for r in snapshot.readings
                if not r.up
            ],
            rows.SAMPLE_AGE: [([], self._poller.sample_age_s())],
            **self._labelled(live),
            **self._process_join(),
            rows.COLLECTOR_SUCCESS: [
                ([run.collector], 1.0 if run.success else 0.0) for run in snapshot.runs
            ],
            rows.COLLECTOR_DURATION: [([run.collector], run.duration_s) for run in snapshot.runs],
        }
        for row in rows.GPU_METRICS:
            family = row.family()
            for labels, value in _per_gpu(row, live) if row.field else samples[row]:
                family.add_metric(labels, value)
            yield family

    def _process_join(self) -> dict[MetricDef, list[Sample]]:
        join = self._poller.processes.state()
        return {
            rows.PROCESS_JOIN_STATUS: [
                ([state.value], 1.0 if join.status is state else 0.0)
                for state in ProcessJoin
                # with no source, no GPU families at all
                if state is not ProcessJoin.NO_GPU_SOURCE
            ],
            rows.PROCESS_JOIN_PROCESSES: [
                ([], len(join.visible) if join.status is ProcessJoin.OK else 0)
            ],
        }

    @staticmethod
    def _labelled(live: list[GpuReading]) -> dict[MetricDef, list[Sample]]:
        reasons: list[Sample] = []
        xid_events: list[Sample] = []
        xids: list[Sample] = []
        ecc: list[Sample] = []
        for reading in live:
            gpu = _labels(reading)
            for reason, active in sorted((reading.clock_event_reasons or {}).items()):
                reasons.append(([*gpu, reason], 1.0 if active else 0.0))
            for kind, count in sorted((reading.ecc_errors_total or {}).items()):
                ecc.append(([*gpu, kind], float(count)))
            if not reading.xid_supported:
                continue  # absent, not 0: nothing watches this GPU's XIDs
            # present from the first scrape, so increase() sees the first burst
            xid_events.append((gpu, float(sum(reading.xid_errors_total.values()))))
            for xid, count in sorted(reading.xid_errors_total.items()):
                xids.append(([*gpu, str(xid)], float(count)))
        return {
            rows.CLOCK_EVENT_ACTIVE: reasons,
            rows.XID_EVENTS: xid_events,
            rows.XID_ERRORS: xids,
            rows.ECC_ERRORS: ecc,
        }


def _per_gpu(row: MetricDef, live: list[GpuReading]) -> list[Sample]:
    """A plain per-GPU row: each reading's value of the row's field, where it has one."""
    values = ((reading, reading.values.get(row.field)) for reading in live)
    return [(_labels(reading), float(value)) for reading, value in values if value is not None]


def _info_labels(device: GpuDevice) -> list[str]:
    return [
        device.label,
        device.uuid,
        device.name,
        device.pci_bus_id,
        "" if device.numa_node is None else str(device.numa_node),
        device.driver_version or "",
    ]


def _mig_labels(device: GpuDevice) -> list[str]:
    mig = device.mig
    assert mig is not None
    return [
        device.label,
        device.uuid,
        str(device.index),
        mig.parent_uuid,
        mig.profile,
        "" if mig.gpu_instance_id is None else str(mig.gpu_instance_id),
        "" if mig.compute_instance_id is None else str(mig.compute_instance_id),
    ]


def _labels(reading: GpuReading) -> list[str]:
    return [reading.label, reading.uuid]
