"""The bound containers as per-slot numpy arrays: what the loop senses and acts on.

A `Fleet` owns the cgroup table (cpu.stat, cpu.max) and the ring set of the containers bound
to a target, in slot order, plus every per-slot array the tick needs: the policy's inputs and
outputs, window starts, and scratch space, so that a tick allocates nothing. It is built anew
on each membership change, carrying the previous fleet's per-container state over by name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .cgtable import LEAVE_ALONE, PERIOD_UNKNOWN, CgroupTable, Status
from .policy import Observation
from .ring import RingSet
from .state import METRICS, Target

PERIOD_USEC = 100_000
MIN_QUOTA_USEC = 1_000


def parse_cpu_max(text: str) -> tuple[int, int]:
    """'50000 100000' -> (50000, 100000); 'max 100000' -> (-1, 100000)."""
    quota, period = text.split()
    return (-1 if quota == "max" else int(quota)), int(period)


def format_cpu_max(quota: int, period: int) -> str:
    return f"{'max' if quota < 0 else quota} {period}"


class Fleet:
    """The bound containers as per-slot arrays, with their cgroup table and rings.

    Built anew on every membership change (slot order = `targets` order); the arrays that
    carry over (limits, window starts) are copied from the previous fleet by name.
    """

    def __init__(self, targets: list[Target], ring_paths: list[Path], cpus: float,
                 capacity: int, previous: Fleet | None, now: float) -> None:
        n = len(targets)
        self.names = [t.name for t in targets]
        self.table = CgroupTable([t.cgroup for t in targets])
        self.rings = RingSet(ring_paths, capacity,
                             adopt=previous.rings if previous else None)
        self.cpus = cpus
        self.target_s = np.array([t.target_s for t in targets], dtype=np.float64)
        self.metric = np.array([METRICS.index(t.metric) for t in targets], dtype=np.intp)
        self.metric_index = self.metric * n + np.arange(n)  # into the ring's stats rows
        originals = [parse_cpu_max(t.original_max) if t.original_max else (-1, PERIOD_UNKNOWN)
                     for t in targets]
        self.original_quota = np.array([q for q, _ in originals], dtype=np.int64)
        self.original_period = np.array([p for _, p in originals], dtype=np.int64)
        # Per decision window (policy inputs and outputs, shown by status).
        self.limit = np.full(n, np.nan)  # fraction of T_R; NaN: never set by us
        self.measured = np.full(n, np.nan)
        self.usage = np.zeros(n)
        self.samples = np.zeros(n, np.int64)
        self.classes = np.zeros(n, np.int8)
        self.score = np.full(n, np.nan)
        self.window_start = np.full(n, now)
        self.usage_at_window = np.zeros(n, np.uint64)
        # Per tick (status).
        self.tick_cores = np.zeros(n)
        self.throttled_ratio = np.zeros(n)
        self.usage_prev = np.zeros(n, np.uint64)
        self.periods_prev = np.zeros(n, np.uint64)
        self.throttled_prev = np.zeros(n, np.uint64)
        self.tick_time = now
        # Scratch, so that a tick allocates nothing.
        self._f = np.zeros(n)
        self._g = np.zeros(n)
        self._u = np.zeros(n, np.uint64)
        self._v = np.zeros(n, np.uint64)
        self._mask = np.zeros(n, bool)
        self.unset = np.zeros(n, bool)
        self.obs = Observation(target=self.target_s, measured=self.measured, usage=self.usage,
                               limit=self.limit)

        t = self.table
        t.sample()
        t.read_back()
        for a, b in ((self.usage_at_window, t.usage_usec), (self.usage_prev, t.usage_usec),
                     (self.periods_prev, t.nr_periods), (self.throttled_prev, t.nr_throttled)):
            np.copyto(a, b)
        t.period_usec.fill(LEAVE_ALONE)
        if previous is not None:
            self._carry_over(previous)
        # A re-adopted container (we hold its original): continue from the limit in force.
        adopted = (self.original_period != PERIOD_UNKNOWN) & np.isnan(self.limit)
        adopted &= t.max_quota_usec >= 0
        if adopted.any():
            self.limit[adopted] = (t.max_quota_usec[adopted] / t.max_period_usec[adopted]
                                   / cpus)
            self._request(adopted)
            t.last_quota_usec[adopted] = t.quota_usec[adopted]
            t.last_period_usec[adopted] = t.period_usec[adopted]

    def _carry_over(self, previous: Fleet) -> None:
        old = {name: i for i, name in enumerate(previous.names)}
        pairs = [(i, old[name]) for i, name in enumerate(self.names) if name in old]
        if not pairs:
            return
        new_i, old_i = (np.array(x, dtype=np.intp) for x in zip(*pairs, strict=True))
        for attr in ("limit", "measured", "usage", "samples", "classes", "score",
                     "window_start", "usage_at_window", "tick_cores", "throttled_ratio"):
            getattr(self, attr)[new_i] = getattr(previous, attr)[old_i]
        for attr in ("quota_usec", "period_usec", "last_quota_usec", "last_period_usec"):
            getattr(self.table, attr)[new_i] = getattr(previous.table, attr)[old_i]

    def __len__(self) -> int:
        return len(self.names)

    def _request(self, mask: np.ndarray | None = None) -> None:
        """cpu.max request from the limits: quota = max(1 ms, L·T_R·period); slots whose
        limit we never set are left alone."""
        f, t = self._f, self.table
        np.multiply(self.limit, self.cpus * PERIOD_USEC, out=f)
        np.rint(f, out=f)
        np.maximum(f, MIN_QUOTA_USEC, out=f)  # NaN (never set) stays NaN
        np.isfinite(f, out=self._mask)
        if mask is not None:
            np.logical_and(self._mask, mask, out=self._mask)
        np.copyto(t.quota_usec, f, where=self._mask, casting="unsafe")
        np.copyto(t.period_usec, PERIOD_USEC, where=self._mask)

    def sense(self, now: float) -> None:
        """Sample cpu.stat and drain the rings; per-tick usage and throttling for status."""
        t = self.table
        t.sample()
        self.rings.drain()
        elapsed = max(now - self.tick_time, 1e-6)
        np.subtract(t.usage_usec, self.usage_prev, out=self._u)
        np.multiply(self._u, 1e-6 / elapsed, out=self.tick_cores)
        np.subtract(t.nr_throttled, self.throttled_prev, out=self._u)
        np.subtract(t.nr_periods, self.periods_prev, out=self._v)
        np.maximum(self._v, 1, out=self._v)
        np.divide(self._u, self._v, out=self.throttled_ratio)
        np.copyto(self.usage_prev, t.usage_usec)
        np.copyto(self.periods_prev, t.nr_periods)
        np.copyto(self.throttled_prev, t.nr_throttled)
        self.tick_time = now

    def observe_window(self, now: float) -> None:
        """Close the decision window: latency statistic, samples and CPU usage share."""
        w = self.rings.take_window()
        np.take(self.rings.stats.ravel(), self.metric_index, out=self.measured)
        np.copyto(self.samples, w.count)
        np.subtract(self.table.usage_usec, self.usage_at_window, out=self._u)
        np.subtract(now, self.window_start, out=self._g)
        np.fmax(self._g, 1e-3, out=self._g)
        np.multiply(self._g, 1e6 * self.cpus, out=self._g)
        np.divide(self._u, self._g, out=self.usage)
        np.copyto(self.usage_at_window, self.table.usage_usec)
        self.window_start.fill(now)

    def any_gone(self) -> bool:
        """Whether the last sample found a cgroup removed."""
        np.equal(self.table.status, Status.GONE, out=self._mask)
        return bool(self._mask.any())

    def first_writes(self) -> np.ndarray:
        """Slots about to be written for the first time (their original not yet saved);
        valid until the next call that uses the scratch mask."""
        np.not_equal(self.table.period_usec, LEAVE_ALONE, out=self._mask)
        np.equal(self.original_period, PERIOD_UNKNOWN, out=self.unset)
        np.logical_and(self._mask, self.unset, out=self._mask)
        return self._mask

    def close(self) -> None:
        self.table.close()
        self.rings.close()
