"""A window's latency statistics from two readings of a Prometheus histogram (sense).

A histogram exported by a service counts its requests cumulatively per bucket (`le`, an
upper bound) since the service started; the difference of two readings is the window
between them: its count (of the +Inf bucket), its mean (the difference of the sums over
the count, exact) and its percentiles, found in their bucket and interpolated linearly
within it (from the bucket below's bound, or 0 for the first one), so off by at most the
bucket's width: that width is the statistic's stated error. A percentile or maximum in the
+Inf bucket is the largest finite bound, with an infinite error. A reading whose counts
went back (the service restarted) or whose buckets changed starts over: the next window
is measured from it, and this one has no reading.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ring import STATS

QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
"""The percentile rows of STATS, by their quantile."""
_Q_ROWS = np.array([STATS.index(name) for name in QUANTILES], np.intp)
_Q = np.array(list(QUANTILES.values()))
MEAN, MAX = STATS.index("mean"), STATS.index("max")


@dataclass(frozen=True, eq=False)
class Reading:
    """One reading of a histogram, its label sets added up: cumulative counts at each
    upper bound (ascending, the last +inf), the count and the sum of the observations."""

    bounds: np.ndarray
    cumulative: np.ndarray
    count: float
    sum: float


@dataclass(frozen=True, eq=False)
class Window:
    """The requests between two readings: their count, and per row of STATS their
    statistic (seconds; NaN without requests) and its error bound (seconds)."""

    count: int
    stats: np.ndarray
    error: np.ndarray


def window(before: Reading, after: Reading) -> Window | None:
    """The window from `before` to `after`; None if `after` starts over (the counters went
    back, or the buckets changed)."""
    if not np.array_equal(before.bounds, after.bounds):
        return None
    delta = after.cumulative - before.cumulative
    count = float(delta[-1])
    if after.count < before.count or after.sum < before.sum or (delta < 0).any():
        return None
    stats, error = np.full(len(STATS), np.nan), np.full(len(STATS), np.nan)
    if count <= 0:
        return Window(0, stats, error)
    stats[MEAN], error[MEAN] = (after.sum - before.sum) / count, 0.0
    bounds = after.bounds
    lower = np.concatenate(([min(0.0, bounds[0])], bounds[:-1]))
    below = np.concatenate(([0.0], delta[:-1]))
    ranks = _Q * count
    at = np.searchsorted(delta, ranks, side="left")  # the first bucket holding that rank
    inside = delta[at] - below[at]
    upper = bounds[at]
    finite = np.isfinite(upper)
    share = np.divide(ranks - below[at], inside, out=np.ones_like(ranks), where=inside > 0)
    stats[_Q_ROWS] = np.where(finite, lower[at] + (upper - lower[at]) * share, lower[at])
    error[_Q_ROWS] = upper - lower[at]
    top = int(np.searchsorted(delta, count, side="left"))  # the highest non-empty bucket
    stats[MAX] = bounds[top] if np.isfinite(bounds[top]) else lower[top]
    error[MAX] = bounds[top] - lower[top]
    return Window(round(count), stats, error)
