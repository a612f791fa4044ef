"""Percentiles of measured samples and of Prometheus histograms, free of I/O.

``percentile`` interpolates linearly between order statistics (NumPy's default,
``statistics.quantiles(method="inclusive")``), so P50 of 1..100 is 50.5.
``histogram_quantile`` is Prometheus's function of the same name: the quantile is
interpolated inside the bucket that holds it, and a quantile that falls in the
``+Inf`` bucket is the largest finite bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``; None when there are none."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be between 0 and 100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def histogram_quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Quantile ``q`` (0-1) of a histogram given as ``{upper bound: cumulative count}``.

    The bounds include ``math.inf``; None when the histogram is empty.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be between 0 and 1, got {q}")
    bounds = sorted(cumulative)
    if not bounds or not math.isinf(bounds[-1]):
        raise ValueError("a histogram needs a +Inf bucket")
    total = cumulative[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    previous_bound, previous_count = 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank and count > previous_count:
            if math.isinf(bound):
                return previous_bound  # Prometheus: the largest finite bound
            inside = (rank - previous_count) / (count - previous_count)
            return previous_bound + (bound - previous_bound) * inside
        previous_bound, previous_count = bound, count
    return previous_bound


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
