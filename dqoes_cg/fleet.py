"""The bound containers as per-slot numpy arrays: what the sense step measures, and the
policy's view of it.

A `Fleet` holds the cgroup table (cpu.stat) and the ring set of the containers bound to a
target, in slot order, and every per-slot array the sense step and the policy's inputs need,
so that a tick allocates nothing. It is built anew on each membership change, taking over
the previous fleet's open files and per-container state by name.

The latencies of a target that names a Prometheus histogram instead of a ring come from
the scraper (scrape.py), which puts the window's rows into the ring set's window arrays
before they are read: the rest of the window is the same for both.

A training job's interval runs from its last report before the window (else its first in
the window) to its last in the window: the reports carry their own times, so the progress
between two reports is exact however the windows fall.

cpu.pressure (how long each container waited for a CPU over the window) is given to the
policy only for the containers whose pressure it said it will use (`Decision.pressure`;
every one until it says): read at each window's end for those it asked for over that window
(in the call that reads every container's stalls, below), and at its decision for those it
asks for over the next one that were not read then, so that each
window's wait is the difference of two readings at its own ends. A container not read at
either end waited an unknown time by choice (+inf, which the policy counts as having
waited); one whose file could not be read, an unknown time (NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .cgtable import PSI_RESOURCES, CgroupTable, Status
from .membership.objective import TRAINING, Objective, Target
from .policy import Cls, Decision, Observation
from .ring import STATS, RingSet, WindowStats
from .scrape import Scraper

# numpy compares an array with a plain int several times faster than with an IntEnum member
OK, GONE, SKIPPED = int(Status.OK), int(Status.GONE), int(Status.SKIPPED)


def carry_index(names: Sequence[str], previous: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(new slots, old slots) of the names that `previous` also had: what a table rebuilt
    for `names` carries over from the one it replaces."""
    old = {name: j for j, name in enumerate(previous)}
    pairs = [(i, old[name]) for i, name in enumerate(names) if name in old]
    if not pairs:
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    new_i, old_i = zip(*pairs, strict=True)
    return np.array(new_i, np.intp), np.array(old_i, np.intp)


class Fleet:
    """Per-slot arrays of the bound targets (slot order = `targets` order)."""

    def __init__(self, targets: list[Target], table: CgroupTable, rings: RingSet,
                 cpus: float, limit: np.ndarray, previous: Fleet | None, now: float,
                 scraper: Scraper | None = None) -> None:
        n = len(targets)
        self.scraper = scraper
        self.names = [t.name for t in targets]
        self.slot = {name: i for i, name in enumerate(self.names)}
        self.table = table
        self.rings = rings
        self.cpus = cpus
        self.training = np.array([t.kind == TRAINING for t in targets], dtype=bool)
        self._any_training = bool(self.training.any())
        self.target_s = np.array([np.nan if t.target_s is None else t.target_s
                                  for t in targets], dtype=np.float64)
        self.metric = np.array([metric_row(t.metric) for t in targets], dtype=np.intp)
        self.metric_index = self.metric * n + np.arange(n)  # into the rings' stats rows
        # Per decision window (the policy's inputs and outputs, shown by status).
        self.measured = np.full(n, np.nan)
        self.usage = np.zeros(n)
        self.samples = np.zeros(n, np.int64)
        self.rate = np.full(n, np.nan)  # requests per second
        self.classes = np.full(n, Cls.IDLE, np.int8)
        self.score = np.full(n, np.nan)
        self.window_start = np.full(n, now)
        self.usage_at_window = np.zeros(n, np.uint64)
        self.waited = np.full(n, np.nan)
        self.waited_at_window = np.zeros(n, np.uint64)
        # the Status of that reading: OK, SKIPPED (not read) or why it failed
        self.pressure_at_window = np.full(n, Status.ERROR, np.int32)
        self.pressure_wanted = np.ones(n, bool)  # read at this window's end
        # What slows it over the window, a row per PSI_RESOURCES: the share of the window
        # in which some task stalled (NaN: unknown), the kernel's avg10 (percent); the
        # share of CFS periods throttled
        rows = len(PSI_RESOURCES)
        self.stall_share = np.full((rows, n), np.nan)
        self.stall_avg10 = np.full((rows, n), np.nan)
        self.stall_at_window = np.zeros((rows, n), np.uint64)
        self.stall_ok_at_window = np.zeros((rows, n), bool)
        self.throttled_window = np.full(n, np.nan)
        self.periods_at_window = np.zeros(n, np.uint64)
        self.throttled_at_window = np.zeros(n, np.uint64)
        # Training jobs: the latest report (value, and time in s), kept across windows, and
        # the interval of the last window (the policy's inputs).
        self.evaluation = np.full(n, np.nan)
        self.evaluated_at = np.full(n, np.nan)
        self.eval_prev = np.full(n, np.nan)
        self.eval_prev_at = np.full(n, np.nan)
        self.eval_last = np.full(n, np.nan)
        self.eval_last_at = np.full(n, np.nan)
        # Per tick (status).
        self.tick_cores = np.zeros(n)
        self.throttled_ratio = np.zeros(n)
        self.usage_prev = np.zeros(n, np.uint64)
        self.periods_prev = np.zeros(n, np.uint64)
        self.throttled_prev = np.zeros(n, np.uint64)
        self.tick_time = now
        self.gone = np.zeros(n, bool)
        # Scratch, so that a tick allocates nothing.
        self._g = np.zeros(n)
        self._u = np.zeros(n, np.uint64)
        self._v = np.zeros(n, np.uint64)
        self._reported = np.zeros(n, bool)
        self._first = np.zeros(n, bool)
        self._read = np.zeros(n, bool)
        self._unknown = np.zeros(n, bool)
        self._skipped = np.zeros(n, bool)
        self._everyone = np.ones(n, bool)
        self._window_s = np.zeros(n)
        self._stall_u = np.zeros((rows, n), np.uint64)
        self._stall_ok = np.zeros((rows, n), bool)
        self._stall_bad = np.zeros((rows, n), bool)
        self.obs = Observation(target=self.target_s, measured=self.measured, usage=self.usage,
                               limit=limit, waited=self.waited, rate=self.rate,
                               cpus=cpus, training=self.training,
                               classes=self.classes,
                               eval_prev=self.eval_prev, eval_prev_at=self.eval_prev_at,
                               eval_last=self.eval_last, eval_last_at=self.eval_last_at)

        table.sample()
        for a in (self.usage_at_window, self.usage_prev):
            np.copyto(a, table.usage_usec)
        for a in (self.periods_prev, self.periods_at_window):
            np.copyto(a, table.nr_periods)
        for a in (self.throttled_prev, self.throttled_at_window):
            np.copyto(a, table.nr_throttled)
        table.pressure_wanted.fill(True)
        table.pressure(stalls=True)
        np.copyto(self.waited_at_window, table.waited_usec)
        np.copyto(self.pressure_at_window, table.pressure_status)
        np.copyto(self.stall_at_window, table.stall_usec)
        np.equal(table.stall_status, OK, out=self.stall_ok_at_window)
        self.carried = np.full(n, -1, np.intp)  # each slot's slot in `previous`; -1: joined
        if previous is not None:
            new, old = carry_index(self.names, previous.names)
            self.carried[new] = old
            for attr in ("measured", "usage", "samples", "rate", "classes", "score", "window_start",
                         "usage_at_window", "waited_at_window", "pressure_at_window",
                         "pressure_wanted", "stall_share", "stall_avg10", "stall_at_window",
                         "stall_ok_at_window", "throttled_window", "periods_at_window",
                         "throttled_at_window",
                         "tick_cores", "throttled_ratio", "evaluation", "evaluated_at"):
                getattr(self, attr)[..., new] = getattr(previous, attr)[..., old]

    def __len__(self) -> int:
        return len(self.names)

    def set_target(self, name: str, objective: Objective) -> None:
        """A bound container's objective (or kind) changed."""
        i, o = self.slot[name], objective
        self.training[i] = o.kind == TRAINING
        self._any_training = bool(self.training.any())
        self.target_s[i] = np.nan if o.target_s is None else o.target_s
        self.metric[i] = metric_row(o.metric)
        self.metric_index[i] = self.metric[i] * len(self) + i

    def sense(self, now: float) -> bool:
        """Sample cpu.stat and drain the rings; per-tick usage and throttling for status.
        Returns whether a cgroup was found removed (flagged in `gone`)."""
        t = self.table
        ok = t.sample()
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
        if ok == len(self):  # the usual case: every cpu.stat read, none gone
            self.gone.fill(False)
            return False
        np.equal(t.status, GONE, out=self.gone)
        return bool(self.gone.any())

    def observe_window(self, now: float) -> Observation:
        """Close the decision window: each container's latency statistic, request count
        and rate, and CPU usage share over it, and each training job's interval of reports."""
        w = self.rings.take_window()
        if self.scraper is not None:
            self.scraper.fill(w.count, self.rings.stats)
        np.take(self.rings.stats.ravel(), self.metric_index, out=self.measured)
        if self._any_training:
            np.putmask(self.measured, self.training, np.nan)
        np.copyto(self.samples, w.count)
        self._reports(w)
        np.subtract(self.table.usage_usec, self.usage_at_window, out=self._u)
        np.subtract(now, self.window_start, out=self._window_s)
        np.fmax(self._window_s, 1e-3, out=self._window_s)
        np.divide(self.samples, self._window_s, out=self.rate)
        np.multiply(self._window_s, 1e6 * self.cpus, out=self._g)
        np.divide(self._u, self._g, out=self.usage)
        np.copyto(self.usage_at_window, self.table.usage_usec)
        self._waited()
        self._slowed()
        self.window_start.fill(now)
        return self.obs

    def _slowed(self) -> None:
        """What slowed each container over the window (after `_waited`'s read of the
        stalls): each pressure file's stalled share of the window and avg10, and the share
        of CFS periods throttled. The readings start the next window where they are OK."""
        t, ok, bad, u = self.table, self._stall_ok, self._stall_bad, self._stall_u
        np.equal(t.stall_status, OK, out=ok)
        np.logical_not(ok, out=bad)
        np.subtract(t.stall_usec, self.stall_at_window, out=u)
        np.multiply(self._window_s, 1e6, out=self._g)
        np.divide(u, self._g, out=self.stall_share)
        np.clip(self.stall_share, 0.0, 1.0, out=self.stall_share)  # tick jitter past 1
        np.divide(t.stall_avg10_centi, 100.0, out=self.stall_avg10)
        np.putmask(self.stall_avg10, bad, np.nan)
        np.logical_and(ok, self.stall_ok_at_window, out=bad)
        np.logical_not(bad, out=bad)
        np.putmask(self.stall_share, bad, np.nan)
        np.putmask(self.stall_at_window, ok, t.stall_usec)
        np.copyto(self.stall_ok_at_window, ok)
        np.subtract(t.nr_throttled, self.throttled_at_window, out=self._u)
        np.subtract(t.nr_periods, self.periods_at_window, out=self._v)
        np.maximum(self._v, 1, out=self._v)
        np.divide(self._u, self._v, out=self.throttled_window)
        np.copyto(self.throttled_at_window, t.nr_throttled)
        np.copyto(self.periods_at_window, t.nr_periods)

    def _waited(self) -> None:
        """The CPU each container waited for over the window (its pressure), in the units
        of usage (self._g holds the window's CPU time): +inf where either end was not read
        (not wanted), else NaN where either end is unknown. The readings at its end, where
        wanted, start the next window."""
        t, status, start = self.table, self.table.pressure_status, self.pressure_at_window
        read, unknown, skipped = self._read, self._unknown, self._skipped
        np.copyto(t.pressure_wanted, self.pressure_wanted)
        t.pressure(stalls=True)
        np.subtract(t.waited_usec, self.waited_at_window, out=self._u)
        np.divide(self._u, self._g, out=self.waited)
        np.equal(status, OK, out=read)
        np.equal(start, OK, out=unknown)
        np.logical_and(unknown, read, out=unknown)
        np.logical_not(unknown, out=unknown)
        np.putmask(self.waited, unknown, np.nan)
        np.equal(status, SKIPPED, out=skipped)
        np.equal(start, SKIPPED, out=unknown)
        np.logical_or(skipped, unknown, out=skipped)
        np.putmask(self.waited, skipped, np.inf)
        np.putmask(self.waited_at_window, read, t.waited_usec)
        np.copyto(start, status)

    def _want_pressure(self, wanted: np.ndarray | None) -> None:
        """The containers whose pressure the policy will use over the next window (all if
        None): those among them not read at this window's end are read now."""
        t, extra = self.table, self._skipped
        if wanted is None:
            wanted = self._everyone
        np.equal(self.pressure_at_window, SKIPPED, out=extra)
        np.logical_and(extra, wanted, out=extra)
        np.copyto(self.pressure_wanted, wanted)
        if not extra.any():
            return
        np.copyto(t.pressure_wanted, extra)
        t.pressure()
        np.putmask(self.pressure_at_window, extra, t.pressure_status)
        np.equal(t.pressure_status, OK, out=extra)
        np.putmask(self.waited_at_window, extra, t.waited_usec)

    def _reports(self, w: WindowStats) -> None:
        """The interval of each training job's reports: from its last before the window
        (else its first in it) to its last in it; NaN where it has none."""
        reported, first, times = self._reported, self._first, self._g
        np.greater(w.progress, 0, out=reported)
        np.logical_and(reported, self.training, out=reported)
        np.copyto(self.eval_prev, self.evaluation)
        np.copyto(self.eval_prev_at, self.evaluated_at)
        self.eval_last.fill(np.nan)
        self.eval_last_at.fill(np.nan)
        if not reported.any():  # the usual case (always without a training job)
            return
        np.isnan(self.evaluation, out=first)  # no report before this window
        np.logical_and(first, reported, out=first)
        np.putmask(self.eval_prev, first, w.first_value)
        np.multiply(w.first_ns, 1e-9, out=times)
        np.putmask(self.eval_prev_at, first, times)
        np.putmask(self.eval_last, reported, w.last_value)
        np.multiply(w.last_ns, 1e-9, out=times)
        np.putmask(self.eval_last_at, reported, times)
        np.putmask(self.evaluation, reported, self.eval_last)
        np.putmask(self.evaluated_at, reported, self.eval_last_at)

    def record(self, decision: Decision) -> None:
        """Keep a decision's classes and scores for status, and the containers whose
        pressure it will use over the next window."""
        np.copyto(self.classes, decision.classes)
        np.copyto(self.score, decision.score)
        self._want_pressure(decision.pressure)

    def close(self) -> None:
        self.table.close()
        self.rings.close()


def metric_row(metric: str | None) -> int:
    """The row of a latency statistic in the rings' stats, found by its name there (any
    for a training job, which has no latency target)."""
    return 0 if metric is None else STATS.index(metric)
