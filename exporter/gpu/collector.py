"""The prometheus_client collector for GPU metrics, built fresh from the poller's snapshot.

The families are the rows of ``gpuscope.contract.gpu``, in its order; the plain per-GPU rows (those
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

from gpuscope.contract import gpu as rows
from gpuscope.contract import labels as L
from gpuscope.contract.rows import MetricDef, label_values
from gpuscope.exporter.gpu.poller import GpuPoller
from gpuscope.exporter.gpu.processes import ProcessJoin
from gpuscope.exporter.gpu.source import DownReason, GpuDevice, GpuReading
from gpuscope.families import family as new_family

# (label values, value) of one sample
Sample = tuple[Sequence[str], float]


class GpuCollector(Collector):
    """Register with a ``CollectorRegistry``; reads only the poller's cached snapshot.

    Yields one family per row of ``gpuscope.contract.gpu.GPU_METRICS``, in that order.
    """

    def __init__(self, poller: GpuPoller, *, max_process_series: int = 2000) -> None:
        self._poller = poller
        # per-process series (pid labels) in all, across GPUs: the exporter's --max-series
        self._max_process_series = max_process_series

    def collect(self) -> Iterator[Metric]:
        snapshot = self._poller.snapshot()
        live = [reading for reading in snapshot.readings if reading.up]
        samples: dict[MetricDef, list[Sample]] = {
            rows.INFO: [(_info_labels(device), 1.0) for device in snapshot.devices],
            rows.MIG_INFO: [(_mig_labels(d), 1.0) for d in snapshot.devices if d.mig is not None],
            rows.SM_CLOCK_CHANGES: [
                (_labels(r), float(r.sm_clock_changes_total))
                for r in live
                if r.sm_clock_changes_total is not None
            ],
            rows.UP: [(_labels(r), 1.0 if r.up else 0.0) for r in snapshot.readings],
            rows.DOWN_REASON: [
                ([*_labels(r), r.down_reason or DownReason.LOST], 1.0)
                for r in snapshot.readings
                if not r.up
            ],
            rows.SAMPLE_AGE: [([], self._poller.sample_age_s())],
            **self._labelled(live),
            **self._process_join(),
            **_sharing(live, self._max_process_series),
            rows.COLLECTOR_SUCCESS: [
                ([run.collector], 1.0 if run.success else 0.0) for run in snapshot.runs
            ],
            rows.COLLECTOR_DURATION: [([run.collector], run.duration_s) for run in snapshot.runs],
        }
        for row in rows.GPU_METRICS:
            family = new_family(row)
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


COMPUTE_MODES = ("default", "exclusive_process", "prohibited", "exclusive_thread")
OVERFLOW_PID = "__overflow__"


def _sharing(live: list[GpuReading], max_series: int) -> dict[MetricDef, list[Sample]]:
    """Compute mode, processes, MPS, contention, and each process's share, the
    per-process rows capped at ``max_series`` samples each: past it a GPU's remaining
    processes (smallest memory last) are summed under pid ``__overflow__``."""
    modes: list[Sample] = []
    counts: list[Sample] = []
    mps: list[Sample] = []
    contended: list[Sample] = []
    memory: list[Sample] = []
    sm: list[Sample] = []
    numa: list[Sample] = []
    for reading in live:
        gpu = _labels(reading)
        if reading.compute_mode is not None:
            known = (
                *COMPUTE_MODES,
                *(() if reading.compute_mode in COMPUTE_MODES else (reading.compute_mode,)),
            )
            modes += [([*gpu, m], 1.0 if m == reading.compute_mode else 0.0) for m in known]
        if reading.mps_processes is not None:
            mps.append((gpu, float(reading.mps_processes)))
        if reading.contended is not None:
            contended.append((gpu, 1.0 if reading.contended else 0.0))
        tenants = reading.tenants
        if tenants is None:
            continue
        counts.append((gpu, float(len(tenants))))
        ranked = sorted(tenants.items(), key=lambda t: (-(t[1].memory_used_bytes or 0.0), t[0]))
        room = max_series - len(memory)  # series left under the cap
        # past the cap, one series of the rest in place of the last that would fit
        cut = len(ranked) if len(ranked) <= room else max(room - 1, 0)
        kept, folded = ranked[:cut], ranked[cut:]
        for pid, use in kept:
            if use.memory_used_bytes is not None:
                memory.append(([*gpu, str(pid)], use.memory_used_bytes))
            if use.sm_utilization_ratio is not None:
                sm.append(([*gpu, str(pid)], use.sm_utilization_ratio))
            if use.numa_locality is not None:
                numa.append(([*gpu, str(pid), use.numa_locality], 1.0))
        if folded:
            memory.append(
                ([*gpu, OVERFLOW_PID], sum(u.memory_used_bytes or 0.0 for _, u in folded))
            )
            sm.append(([*gpu, OVERFLOW_PID], sum(u.sm_utilization_ratio or 0.0 for _, u in folded)))
    return {
        rows.COMPUTE_MODE: modes,
        rows.COMPUTE_PROCESSES: counts,
        rows.MPS_PROCESSES: mps,
        rows.CONTENDED: contended,
        rows.PROCESS_MEMORY_USED: memory,
        rows.PROCESS_SM_UTILIZATION: sm,
        rows.PROCESS_NUMA_LOCALITY: numa,
    }


def _per_gpu(row: MetricDef, live: list[GpuReading]) -> list[Sample]:
    """A plain per-GPU row: each reading's value of the row's field, where it has one."""
    values = ((reading, reading.values.get(row.field)) for reading in live)
    return [(_labels(reading), float(value)) for reading, value in values if value is not None]


def _info_labels(device: GpuDevice) -> tuple[str, ...]:
    return label_values(
        rows.INFO,
        {
            L.GPU: device.label,
            L.UUID: device.uuid,
            L.NAME: device.name,
            L.PCI_BUS_ID: device.pci_bus_id,
            L.NUMA_NODE: "" if device.numa_node is None else str(device.numa_node),
            L.DRIVER_VERSION: device.driver_version or "",
        },
    )


def _mig_labels(device: GpuDevice) -> tuple[str, ...]:
    mig = device.mig
    assert mig is not None
    return label_values(
        rows.MIG_INFO,
        {
            L.GPU: device.label,
            L.UUID: device.uuid,
            L.PARENT_GPU: str(device.index),
            L.PARENT_UUID: mig.parent_uuid,
            L.PROFILE: mig.profile,
            L.GPU_INSTANCE_ID: "" if mig.gpu_instance_id is None else str(mig.gpu_instance_id),
            L.COMPUTE_INSTANCE_ID: (
                "" if mig.compute_instance_id is None else str(mig.compute_instance_id)
            ),
        },
    )


def _labels(reading: GpuReading) -> list[str]:
    """A GPU's values of ``GPU_LABELS``, which every per-GPU row starts with (the samples
    above append the row's own labels to them: ``_GPU_FIRST`` holds that order)."""
    return [reading.label, reading.uuid]


# The rows whose samples are written as ``[*_labels(reading), ...]``: the GPU labels first.
_GPU_FIRST = (
    rows.SM_CLOCK_CHANGES,
    rows.UP,
    rows.DOWN_REASON,
    *rows.PER_GPU,
    rows.CLOCK_EVENT_ACTIVE,
    rows.XID_EVENTS,
    rows.XID_ERRORS,
    rows.ECC_ERRORS,
    rows.COMPUTE_MODE,
    rows.COMPUTE_PROCESSES,
    rows.MPS_PROCESSES,
    rows.CONTENDED,
    rows.PROCESS_MEMORY_USED,
    rows.PROCESS_SM_UTILIZATION,
    rows.PROCESS_NUMA_LOCALITY,
)
for _row in _GPU_FIRST:
    if _row.labels[: len(rows.GPU_LABELS)] != rows.GPU_LABELS:
        raise LookupError(f"{_row.name}: its labels {_row.labels} must start with GPU_LABELS")
