"""What a metric is: one ``MetricDef`` row (name, type, help, labels) per family.

The code that serves a row builds its families from it (``gpuscope.families`` for the
prometheus_client families of a scrape, ``gpuscope.exporter.ingest.series`` for the
hot-path histograms and counters); the OpenMetrics ``# UNIT`` of a family is the unit
its name ends with (``unit_of``). A label tuple is built from a row's label names
(``label_values``, or ``label_order`` on a hot path), never by position alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import itemgetter
from typing import Final


class MetricType(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


COUNTER, GAUGE, HISTOGRAM = MetricType.COUNTER, MetricType.GAUGE, MetricType.HISTOGRAM

# Every metric family gpuscope serves starts with this.
PREFIX: Final = "gpuscope_"
# The middleware's own counters, one family per ``gpuscope.middleware.stats`` key, for an
# application that serves them itself (``stats.register``).
MIDDLEWARE_PREFIX: Final = PREFIX + "middleware_"

# Base units that gpuscope's metric names end with; OpenMetrics' ``# UNIT`` line names
# the suffix (Prometheus refuses a unit that is not one).
UNITS: Final = ("seconds", "bytes", "joules", "hertz", "watts", "celsius", "ratio")

# Batch waits live in the 100 µs range; long generations take over a minute, and the
# GenAI semantic conventions' duration buckets end at 81.92 s.
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 81.92,
)  # fmt: skip
BATCH_SIZE_BUCKETS: Final[tuple[float, ...]] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def unit_of(name: str) -> str:
    """The unit suffix of a metric name (``_total`` aside), or "" for none."""
    base = name.removesuffix("_total")
    return next((unit for unit in UNITS if base.endswith("_" + unit)), "")


@dataclass(frozen=True)
class MetricDef:
    """One metric family. ``name`` is without ``_total`` (counters get it on output);
    ``buckets`` only for histograms; ``field`` names the ``GpuReading`` attribute of a
    plain per-GPU metric (GPU side only)."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    field: str = ""

    @property
    def unit(self) -> str:
        return unit_of(self.name)

    @property
    def sample_name(self) -> str:
        """The name its samples carry (``_total`` for counters; histograms add suffixes)."""
        return self.name + "_total" if self.type is MetricType.COUNTER else self.name


def label_values(row: MetricDef, values: Mapping[str, str]) -> tuple[str, ...]:
    """``row``'s label values, taken from ``values`` by label name, in the row's order."""
    missing = [name for name in row.labels if name not in values]
    if missing:
        raise LookupError(f"{row.name} has labels {missing}, not given")
    return tuple(values[name] for name in row.labels)


LabelOrder = Callable[[tuple[str, ...]], tuple[str, ...]]


def _same(values: tuple[str, ...]) -> tuple[str, ...]:
    return values


def label_order(row: MetricDef, names: Sequence[str]) -> LabelOrder:
    """For a hot path: a function that takes values in the order of ``names`` (the row's
    labels, each once, in any order) and returns them in the row's order. Where the two
    orders agree it returns its argument as it is, so the call costs next to nothing."""
    if sorted(names) != sorted(row.labels):
        raise LookupError(f"{row.name} has labels {row.labels}, not {tuple(names)}")
    if tuple(names) == row.labels:
        return _same
    positions = [list(names).index(label) for label in row.labels]
    pick = itemgetter(*positions)
    if len(positions) == 1:  # itemgetter of one position gives the item, not a tuple
        return lambda values: (pick(values),)
    return pick
