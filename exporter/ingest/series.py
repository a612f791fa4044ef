"""Histograms and counters with a hard cap on label sets, built for the span hot path.

prometheus_client takes a lock and walks its buckets on every observation; here an
observation is a ``bisect`` into a list of per-bucket counts, plus two list stores
for the bucket's latest exemplar. All updates happen on the event loop's thread; a
scrape renders in another thread, and reads each series with ``HistogramSeries.read``,
a sequence lock: the writer bumps ``version`` before and after an update, the reader
copies and retries if the version was odd or moved. So buckets, count and sum of a
series always agree, without a lock on the hot path and without stopping the loop.

Past ``max_series`` label sets, a new label set goes to an overflow series and the
diverted observation is counted, so a sender with unbounded label values costs
bounded memory and is visible. The overflow series keeps the labels whose values the
exporter itself defines (``BOUNDED_LABELS``: ``phase``, ``direction``, ``gpu``) and
sets only the others (route, model, service, ...) to ``OVERFLOW``: per-phase and
per-direction sums stay exact however many routes a sender invents. There are at
most as many overflow series as combinations of bounded values (5 phases x GPUs).

``--max-series`` is shared by every sender, so a second cap keeps one service from
filling it with model names (which a client may choose): ``ModelCap``, shared by the
request families, admits at most ``max_models_per_service`` distinct ``model`` values per
``service``; a further one is folded into ``model="__overflow__"`` of that service (its
other labels kept) and counted apart from the ``--max-series`` overflow.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Collection, Iterator, Sequence

from gpuscope.contract import labels
from gpuscope.contract.rows import MetricDef, MetricType

OVERFLOW = "__overflow__"
# Labels whose values come from the exporter (phase names, input/output, NVML indices),
# never from a sender: kept on overflow series.
BOUNDED_LABELS: frozenset[str] = frozenset({labels.PHASE, labels.DIRECTION, labels.GPU})

# (trace_id, span_id, end time in epoch ns) of the span an exemplar points to.
SpanRef = tuple[bytes, bytes, int]

# The labels ``ModelCap`` reads: the sender's service and the model it names.
SERVICE_LABEL, MODEL_LABEL = labels.SERVICE, labels.MODEL


class ModelCap:
    """Distinct ``model`` values per ``service``, one decision for every family.

    Asked only when a family is about to create a series (never on the hot path of a
    known label set), so what it holds is bounded by the series that exist: at most one
    entry per series created, however many names a sender invents. The empty model (a
    span that names none) is always admitted and counts toward nothing.
    """

    def __init__(self, max_models_per_service: int) -> None:
        if max_models_per_service < 1:
            raise ValueError(
                f"max_models_per_service must be at least 1, got {max_models_per_service}"
            )
        self.max_models_per_service = max_models_per_service
        self._models: dict[str, set[str]] = {}

    def admit(self, service: str, model: str) -> bool:
        """Whether ``model`` may have series of its own under ``service``."""
        if not model:
            return True
        models = self._models.setdefault(service, set())
        if model in models:
            return True
        if len(models) >= self.max_models_per_service:
            return False
        models.add(model)
        return True


class _ModelFolding:
    """A family's use of the shared ``ModelCap``: where its service and model labels are,
    and how many observations it folded into ``model="__overflow__"``."""

    __slots__ = ("cap", "folded", "model", "service")

    def __init__(self, cap: ModelCap, label_names: Sequence[str]) -> None:
        self.cap = cap
        self.service = list(label_names).index(SERVICE_LABEL)
        self.model = list(label_names).index(MODEL_LABEL)
        self.folded = 0

    def fold(self, labels: tuple[str, ...]) -> tuple[str, ...]:
        """``labels``, with the model folded when its service is at the cap."""
        if self.cap.admit(labels[self.service], labels[self.model]):
            return labels
        self.folded += 1
        folded = list(labels)
        folded[self.model] = OVERFLOW
        return tuple(folded)


def _model_folding(cap: ModelCap | None, label_names: Sequence[str]) -> _ModelFolding | None:
    if cap is None or SERVICE_LABEL not in label_names or MODEL_LABEL not in label_names:
        return None
    return _ModelFolding(cap, label_names)


class HistogramSeries:
    """One label set: per-bucket (not cumulative) counts; the last slot is ``+Inf``."""

    __slots__ = ("counts", "exemplar_spans", "exemplar_values", "sum", "version")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.sum = 0.0
        self.exemplar_spans: list[SpanRef | None] = [None] * size
        self.exemplar_values = [0.0] * size
        self.version = 0  # odd while an observation is being written

    def read(self) -> tuple[list[int], float, list[SpanRef | None], list[float]]:
        """A consistent copy, safe from another thread while the loop observes."""
        while True:
            before = self.version
            copy = (
                self.counts[:],
                self.sum,
                self.exemplar_spans[:],
                self.exemplar_values[:],
            )
            if before == self.version and not before & 1:
                return copy


# The positions an overflow series copies from the diverted label set: ``(position,
# only_empty)``, ``only_empty`` for a label left out when empty (``labels.OMIT_EMPTY``).
Kept = tuple[tuple[int, bool], ...]


def overflow_key(
    label_names: Sequence[str], bounded: Collection[str]
) -> tuple[Kept, tuple[str, ...]]:
    """Positions of the kept labels, and the key with every other label ``OVERFLOW``.

    A label left out when empty (``labels.OMIT_EMPTY``: the pod) is kept where it is
    empty, so the overflow series of senders without it stay as they were; a value it
    has is folded like the others'."""
    kept = tuple(
        (i, name not in bounded)
        for i, name in enumerate(label_names)
        if name in bounded or name in labels.OMIT_EMPTY
    )
    return kept, (OVERFLOW,) * len(label_names)


def _overflow_labels(
    values: tuple[str, ...], kept: Kept, template: tuple[str, ...]
) -> tuple[str, ...]:
    if not kept:
        return template
    folded = list(template)
    for position, only_empty in kept:
        if not only_empty or not values[position]:
            folded[position] = values[position]
    return tuple(folded)


class HistogramFamily:
    """A histogram metric: label values -> series, at most ``max_series`` of them."""

    def __init__(
        self,
        name: str,
        documentation: str,
        label_names: Sequence[str],
        buckets: Sequence[float],
        max_series: int,
        bounded_labels: Collection[str] = BOUNDED_LABELS,
        model_cap: ModelCap | None = None,
    ) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"{name}: buckets must be distinct and in increasing order")
        if not all(math.isfinite(b) for b in buckets):
            raise ValueError(f"{name}: buckets must be finite (+Inf is implicit)")
        if max_series < 1:
            raise ValueError(f"{name}: max_series must be at least 1, got {max_series}")
        self.name = name
        self.documentation = documentation
        self.label_names = tuple(label_names)
        self.bounds = tuple(float(b) for b in buckets)
        self.max_series = max_series
        self.overflowed = 0
        self._series: dict[tuple[str, ...], HistogramSeries] = {}
        self._kept, self._overflow_key = overflow_key(self.label_names, bounded_labels)
        self._models = _model_folding(model_cap, self.label_names)

    @property
    def models_folded(self) -> int | None:
        """Observations folded by the model cap; None for a family without one."""
        return None if self._models is None else self._models.folded

    def observe(self, labels: tuple[str, ...], value: float, span: SpanRef) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._new_series(labels)
        index = bisect_left(self.bounds, value)
        series.version += 1
        series.counts[index] += 1
        series.sum += value
        series.exemplar_spans[index] = span
        series.exemplar_values[index] = value
        series.version += 1

    def _new_series(self, labels: tuple[str, ...]) -> HistogramSeries:
        if len(labels) != len(self.label_names):
            raise ValueError(f"{self.name}: expected labels {self.label_names}, got {labels}")
        if len(self._series) >= self.max_series:
            self.overflowed += 1
            labels = _overflow_labels(labels, self._kept, self._overflow_key)
            series = self._series.get(labels)
            if series is not None:
                return series
        elif self._models is not None:
            labels = self._models.fold(labels)
            series = self._series.get(labels)
            if series is not None:
                return series
        series = HistogramSeries(len(self.bounds) + 1)
        self._series[labels] = series
        return series

    def items(self) -> Iterator[tuple[tuple[str, ...], HistogramSeries]]:
        """Taken in one step (a C-level copy), so another thread can iterate it."""
        return iter(list(self._series.items()))

    def __len__(self) -> int:
        return len(self._series)


class CounterFamily:
    """A counter metric with capped label sets; values are floats (token counts)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        label_names: Sequence[str],
        max_series: int,
        bounded_labels: Collection[str] = BOUNDED_LABELS,
        model_cap: ModelCap | None = None,
    ) -> None:
        if max_series < 1:
            raise ValueError(f"{name}: max_series must be at least 1, got {max_series}")
        self.name = name
        self.documentation = documentation
        self.label_names = tuple(label_names)
        self.max_series = max_series
        self.overflowed = 0
        self._values: dict[tuple[str, ...], float] = {}
        self._kept, self._overflow_key = overflow_key(self.label_names, bounded_labels)
        self._models = _model_folding(model_cap, self.label_names)

    @property
    def models_folded(self) -> int | None:
        """Increments folded by the model cap; None for a family without one."""
        return None if self._models is None else self._models.folded

    def inc(self, labels: tuple[str, ...], amount: float) -> None:
        values = self._values
        if labels not in values:
            if len(labels) != len(self.label_names):
                raise ValueError(f"{self.name}: expected labels {self.label_names}, got {labels}")
            if len(values) >= self.max_series:
                self.overflowed += 1
                labels = _overflow_labels(labels, self._kept, self._overflow_key)
            elif self._models is not None:
                labels = self._models.fold(labels)
            values.setdefault(labels, 0.0)
        values[labels] += amount

    def items(self) -> Iterator[tuple[tuple[str, ...], float]]:
        """A copy taken in one step, so a scrape in another thread can iterate it."""
        return iter(list(self._values.items()))

    def __len__(self) -> int:
        return len(self._values)


def histogram_family(
    row: MetricDef, max_series: int, model_cap: ModelCap | None = None
) -> HistogramFamily:
    """The capped hot-path histogram of ``row`` (its models capped per service by
    ``model_cap`` when it has ``service`` and ``model`` labels)."""
    assert row.type is MetricType.HISTOGRAM, row.name
    return HistogramFamily(
        row.name, row.help, row.labels, row.buckets, max_series, model_cap=model_cap
    )


def counter_family(
    row: MetricDef, max_series: int, model_cap: ModelCap | None = None
) -> CounterFamily:
    """The capped hot-path counter of ``row`` (``model_cap`` as for histograms)."""
    assert row.type is MetricType.COUNTER, row.name
    return CounterFamily(row.name, row.help, row.labels, max_series, model_cap=model_cap)
