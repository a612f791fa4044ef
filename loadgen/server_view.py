"""The exporter's view of one load step, from two ``/metrics`` scrapes, free of I/O.

``SnapshotBuilder`` reads the exporter's text exposition a line at a time into the
few totals a step needs, summed over every label set as the lines come: the phase and
batch size histograms, the request count, the PCIe byte counters and the GPU gauges.
Its memory does not grow with the scrape (a 1 GiB ``/metrics`` parsed whole took the
load generator to 6 GB), and anything that is not the text format, or a histogram
bucket without a numeric ``le``, is ``MalformedMetrics`` naming the line.
``step_view`` subtracts the scrape taken before a step from the one taken after it,
so the histograms describe only that step's requests: mean time per phase, each
phase's share of the mean, and its share of the P99: each phase's P99 over the
end-to-end P99 of the same requests, both interpolated from the bucket deltas as
Prometheus does. (Over the sum of the phases' P99s it would divide by a time no request
took: the slowest queue waits and the slowest computes are rarely the same requests.)
Gauges (SM occupancy, clock ratio) are averaged over the scrapes taken during the step.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract import gpu as gpu_rows
from gpuscope.loadgen.stats import histogram_quantile, mean
from gpuscope.spans import PHASES

# The exporter's families this view reads, by the names the exporter's tables give them.
PHASE_METRIC = exporter_rows.REQUEST_PHASE.name
DURATION_METRIC = exporter_rows.REQUEST_DURATION.name
BATCH_METRIC = exporter_rows.BATCH_SIZE.name
PCIE_COUNTERS = (gpu_rows.PCIE_TRANSMIT.sample_name, gpu_rows.PCIE_RECEIVE.sample_name)
SM_OCCUPANCY = gpu_rows.SM_OCCUPANCY.sample_name
SM_CLOCK = gpu_rows.SM_CLOCK.sample_name
SM_CLOCK_MAX = gpu_rows.SM_CLOCK_MAX.sample_name


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
    duration: Histogram = field(default_factory=Histogram)
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


GAUGES: Final = (SM_OCCUPANCY, SM_CLOCK, SM_CLOCK_MAX)


# Every family a snapshot reads (the others are checked only for a metric name).
_WANTED: Final = (PHASE_METRIC, BATCH_METRIC, DURATION_METRIC, *PCIE_COUNTERS, *GAUGES)


class MalformedMetrics(ValueError):
    """A scrape that is not the Prometheus text format the exporter serves."""


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One label and what follows it: the next one (after a comma) or the end of the set. The
# two branches of the value start with different characters, so matching is linear.
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*([,}])')
_CLOSE = re.compile(r"\s*\}")
_UNESCAPE = re.compile(r"\\(.)")


def parse_sample(line: str) -> tuple[str, dict[str, str], float]:
    """Name, labels and value of one sample line (``name{a="b"} 1 [timestamp] [# exemplar]``)."""
    name = _NAME.match(line)
    if name is None:
        raise MalformedMetrics("not a sample")
    labels: dict[str, str] = {}
    at = name.end()
    if line.startswith("{", at):
        at += 1
        while (close := _CLOSE.match(line, at)) is None:
            label = _LABEL.match(line, at)
            if label is None:
                raise MalformedMetrics("labels not in the text format")
            labels[label.group(1)] = _UNESCAPE.sub(_unescaped, label.group(2))
            at = label.end()
            if label.group(3) == "}":
                break
        else:  # an empty set, or one ending in a comma
            at = close.end()
    fields = line[at:].partition("#")[0].split()
    if not 1 <= len(fields) <= 2 or (at == name.end() and not line[at : at + 1].isspace()):
        raise MalformedMetrics("not a sample")
    try:
        value = float(fields[0])
    except ValueError:
        raise MalformedMetrics(f"value {fields[0][:40]!r} is not a number") from None
    return name.group(), labels, value


def _unescaped(escape: re.Match[str]) -> str:
    return "\n" if escape.group(1) == "n" else escape.group(1)


class SnapshotBuilder:
    """One scrape's ``Snapshot``, added to a line at a time."""

    def __init__(self) -> None:
        self.snapshot = Snapshot(0.0)
        self._gauges: defaultdict[str, list[float]] = defaultdict(list)
        self._lines = 0

    def add(self, line: str) -> None:
        self._lines += 1
        line = line.strip()
        if not line or line.startswith("#"):
            return  # HELP, TYPE, EOF and comments
        try:
            name = _NAME.match(line)
            if name is None or line[name.end() : name.end() + 1] not in ("{", " ", "\t"):
                raise MalformedMetrics("not a sample")
            if not name.group().startswith(_WANTED):
                return  # a family the view does not use: not parsed further, for speed
            name_text, labels, value = parse_sample(line)
            self._add_sample(name_text, labels, value)
        except MalformedMetrics as exc:
            raise MalformedMetrics(f"line {self._lines}: {exc}") from None

    def _add_sample(self, name: str, labels: dict[str, str], value: float) -> None:
        snapshot = self.snapshot
        if name.startswith(PHASE_METRIC):
            phase = labels.get("phase", "")
            _add(snapshot.phases.setdefault(phase, Histogram()), PHASE_METRIC, name, labels, value)
        elif name.startswith(BATCH_METRIC):
            _add(snapshot.batch_size, BATCH_METRIC, name, labels, value)
        elif name.startswith(DURATION_METRIC):
            if _is_load_route(labels):
                _add(snapshot.duration, DURATION_METRIC, name, labels, value)
                if name == DURATION_METRIC + "_count":
                    snapshot.requests += value
        elif name in PCIE_COUNTERS:  # the family may or may not end in _total
            snapshot.pcie_bytes = (snapshot.pcie_bytes or 0.0) + _count(name, value)
        elif name in GAUGES and math.isfinite(value):
            self._gauges[name].append(value)

    def finish(self, taken_s: float) -> Snapshot:
        snapshot = self.snapshot
        snapshot.taken_s = taken_s
        snapshot.sm_occupancy = mean(self._gauges[SM_OCCUPANCY])
        clocks, maxima = (
            self._gauges[SM_CLOCK],
            self._gauges[SM_CLOCK_MAX],
        )
        if clocks and maxima and sum(maxima) > 0:
            snapshot.clock_ratio = sum(clocks) / sum(maxima)
        return snapshot


def parse_snapshot(text: str | Iterable[str], taken_s: float) -> Snapshot:
    """The ``Snapshot`` of one scrape's text (or its lines); ``MalformedMetrics``."""
    builder = SnapshotBuilder()
    for line in text.splitlines() if isinstance(text, str) else text:
        builder.add(line)
    return builder.finish(taken_s)


def _is_load_route(labels: dict[str, str]) -> bool:
    """Not the model listing the load generator reads before it starts."""
    return not labels.get("route", "").endswith("/models")


def _count(name: str, value: float) -> float:
    """A counter's or bucket's value: a finite number, never below 0."""
    if not math.isfinite(value) or value < 0:
        raise MalformedMetrics(f"{name} is {value}, not a count")
    return value


def _add(histogram: Histogram, base: str, name: str, labels: dict[str, str], value: float) -> None:
    if name == base + "_bucket":
        try:
            le = float(labels["le"])
        except (KeyError, ValueError):
            raise MalformedMetrics(f"{name} without a numeric 'le'") from None
        histogram.buckets[le] = histogram.buckets.get(le, 0.0) + _count(name, value)
    elif name == base + "_sum":
        histogram.sum += value  # may be non-finite: that phase's mean is then left out
    elif name == base + "_count":
        histogram.count += _count(name, value)


def went_down(before: Snapshot, after: Snapshot) -> bool:
    """Whether a counter fell between two scrapes: the server restarted and its counters
    began again, so their differences mean nothing (a phase mean came out negative)."""
    pairs = [
        (before.requests, after.requests),
        (before.duration.count, after.duration.count),
        (before.batch_size.count, after.batch_size.count),
        *(
            (h.count, after.phases.get(phase, Histogram()).count)
            for phase, h in before.phases.items()
        ),
    ]
    return any(now < then for then, now in pairs)


def step_view(before: Snapshot, after: Snapshot, during: Sequence[Snapshot] = ()) -> ServerStep:
    """The step between two scrapes; ``during`` are scrapes inside it (for the gauges)."""
    means: dict[str, float] = {}
    p99s: dict[str, float] = {}
    for phase in PHASES:
        delta = after.phases.get(phase, Histogram()).minus(before.phases.get(phase, Histogram()))
        if delta.count <= 0 or not math.isfinite(delta.sum):
            continue  # a phase that never happened (or whose sum is poisoned) stays absent
        means[phase] = delta.sum / delta.count * 1000
        p99 = histogram_quantile(0.99, delta.buckets) if math.inf in delta.buckets else None
        if p99 is not None:
            p99s[phase] = p99 * 1000
    end_to_end = after.duration.minus(before.duration)
    end_to_end_p99 = (
        histogram_quantile(0.99, end_to_end.buckets)
        if end_to_end.count > 0 and math.inf in end_to_end.buckets
        else None
    )
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
        phase_p99_share=(
            {phase: p99 / (end_to_end_p99 * 1000) for phase, p99 in p99s.items()}
            if end_to_end_p99
            else {}
        ),
        batch_size_mean=(
            batch.sum / batch.count if batch.count > 0 and math.isfinite(batch.sum) else None
        ),
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
