"""Small statistics for the benchmark: percentiles, medians and ratios that tolerate gaps.

Upstream: ``vllm/benchmarks/serve.py`` (``calculate_metrics``) at the pin reports percentiles with
``numpy.percentile``'s default linear interpolation; ``percentile`` here is the same rule, so a
p99 of 8 streams is close to, but below, their maximum.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear interpolation between ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None (None if there are none)."""
    present = [float(v) for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
