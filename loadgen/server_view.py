"""The exporter's view of one load step, from two ``/metrics`` scrapes, free of I/O.

``parse_snapshot`` reads the exporter's text exposition (prometheus_client's parser)
into the few totals a step needs, summed over every label set: the phase and batch
size histograms, the request count, the PCIe byte counters and the GPU gauges.
``step_view`` subtracts the scrape taken before a step from the one taken after it,
so the histograms describe only that step's requests: mean time per phase, each
phase's share of the mean, and its share of the P99 (each phase's P99 over the sum of
the phases' P99s, interpolated from the bucket deltas as Prometheus does).
Gauges (SM occupancy, clock ratio) are averaged over the scrapes taken during the step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpuscope.exporter import definitions as exporter_rows
from gpuscope.exporter.gpu import metrics as gpu_rows
from gpuscope.loadgen.stats import histogram_quantile, mean
from gpuscope.spans import PHASES

# The exporter's families this view reads, by the names the exporter's tables give them.
PHASE_METRIC = exporter_rows.REQUEST_PHASE.name
DURATION_METRIC = exporter_rows.REQUEST_DURATION.name
BATCH_METRIC = exporter_rows.BATCH_SIZE.name
PCIE_COUNTERS = (gpu_rows.PCIE_TRANSMIT.sample_name, gpu_rows.PCIE_RECEIVE.sample_name)
# a counter's family may or may not end in _total, depending on the parser
GPU_FAMILIES = frozenset(name for r in gpu_rows.GPU_METRICS for name in (r.name, r.sample_name))


@dataclass
class Histogram:
    """One histogram summed over label sets: ``{le: cumulative count}``, sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def minus(self, earlier: Histogram) -> Histogram:
        buckets = {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()}
        return Histogram(buckets, self.sum - earlier.sum, self.count - earlier.count)


@dataclass
class Snapshot:
    """What one scrape said; ``taken_s`` is the scraper's monotonic clock."""

    taken_s: float
    requests: float = 0.0
    phases: dict[str, Histogram] = field(default_factory=dict)
    batch_size: Histogram = field(default_factory=Histogram)
    pcie_bytes: float | None = None
    sm_occupancy: float | None = None
    clock_ratio: float | None = None


@dataclass(frozen=True)
class ServerStep:
    """The exporter's account of one step."""

    requests: int
    phase_mean_ms: dict[str, float]
    phase_mean_share: dict[str, float]
    phase_p99_share: dict[str, float]
    batch_size_mean: float | None
    sm_occupancy: float | None
    clock_ratio: float | None
    pcie_bytes_per_s: float | None


def parse_snapshot(text: str, taken_s: float) -> Snapshot:
    snapshot = Snapshot(taken_s)
    gauges: defaultdict[str, list[float]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        if family.name == PHASE_METRIC:
            for sample in family.samples:
                phase = sample.labels.get("phase", "")
                _add_sample(snapshot.phases.setdefault(phase, Histogram()), family.name, sample)
        elif family.name == BATCH_METRIC:
            for sample in family.samples:
                _add_sample(snapshot.batch_size, family.name, sample)
        elif family.name == DURATION_METRIC:
            snapshot.requests += sum(
                s.value
                for s in family.samples
                if s.name == DURATION_METRIC + "_count" and _is_load_route(s.labels)
            )
        elif family.name in GPU_FAMILIES:
            for sample in family.samples:
                if sample.name in PCIE_COUNTERS:  # the family may or may not end in _total
                    snapshot.pcie_bytes = (snapshot.pcie_bytes or 0.0) + sample.value
                else:
                    gauges[sample.name].append(sample.value)
    snapshot.sm_occupancy = mean(gauges[gpu_rows.SM_OCCUPANCY.sample_name])
    clocks, maxima = (
        gauges[gpu_rows.SM_CLOCK.sample_name],
        gauges[gpu_rows.SM_CLOCK_MAX.sample_name],
    )
    if clocks and maxima and sum(maxima) > 0:
        snapshot.clock_ratio = sum(clocks) / sum(maxima)
    return snapshot


def _is_load_route(labels: dict[str, str]) -> bool:
    """Not the model listing the load generator reads before it starts."""
    return not labels.get("route", "").endswith("/models")


def _add_sample(histogram: Histogram, base: str, sample: Sample) -> None:
    if sample.name == base + "_bucket":
        le = float(sample.labels["le"])
        histogram.buckets[le] = histogram.buckets.get(le, 0.0) + sample.value
    elif sample.name == base + "_sum":
        histogram.sum += sample.value
    elif sample.name == base + "_count":
        histogram.count += sample.value


def step_view(before: Snapshot, after: Snapshot, during: Sequence[Snapshot] = ()) -> ServerStep:
    """The step between two scrapes; ``during`` are scrapes inside it (for the gauges)."""
    means: dict[str, float] = {}
    p99s: dict[str, float] = {}
    for phase in PHASES:
        delta = after.phases.get(phase, Histogram()).minus(before.phases.get(phase, Histogram()))
        if delta.count <= 0:
            continue  # a phase that never happened stays absent
        means[phase] = delta.sum / delta.count * 1000
        p99 = histogram_quantile(0.99, delta.buckets) if math.inf in delta.buckets else None
        if p99 is not None:
            p99s[phase] = p99 * 1000
    batch = after.batch_size.minus(before.batch_size)
    gauges = list(during) or [after]
    elapsed = after.taken_s - before.taken_s
    pcie = None
    if after.pcie_bytes is not None and before.pcie_bytes is not None and elapsed > 0:
        pcie = (after.pcie_bytes - before.pcie_bytes) / elapsed
    return ServerStep(
        requests=round(after.requests - before.requests),
        phase_mean_ms=means,
        phase_mean_share=shares(means),
        phase_p99_share=shares(p99s),
        batch_size_mean=batch.sum / batch.count if batch.count > 0 else None,
        sm_occupancy=mean([s.sm_occupancy for s in gauges if s.sm_occupancy is not None]),
        clock_ratio=mean([s.clock_ratio for s in gauges if s.clock_ratio is not None]),
        pcie_bytes_per_s=pcie,
    )


def shares(parts: dict[str, float]) -> dict[str, float]:
    """Each part over their total (empty when the total is not positive)."""
    total = sum(parts.values())
    if total <= 0:
        return {}
    return {name: value / total for name, value in parts.items()}
