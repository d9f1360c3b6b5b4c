"""The report interval the manager asks of the nodes' agents: back-pressure.

The manager is one Python process, so it has one core at most (the GIL) for the reports of
every node and for its ticks. Agents that report faster than it can take them would queue
their reports in its connections, and every answer, view and decision would wait behind
them; instead the manager measures what a report costs it and what its ticks take, and asks
for the interval at which the reports of all its nodes fit in the share of a core left
(SHARE_CORES less the ticks'), never shorter than the agents' own interval, never longer
than MAX_INTERVAL_S. The host may give the process less than that core (other work on it):
a tick that starts more than LATE_S after its time shows the process is behind, whatever
the model says, and the interval stretches by STRETCH_LATE. It comes back by at most SHRINK
a tick. Each acknowledgement carries it; agents wait that long before their next report,
and come back to their own interval when the manager asks for it again.
"""

from __future__ import annotations

from dataclasses import dataclass

BASE_INTERVAL_S = 1.0  # the agents' own (agent.REPORT_INTERVAL_S)
MAX_INTERVAL_S = 10.0  # a node's view is at most so old, plus a tick
SHARE_CORES = 0.6  # of the one core: the rest for `cluster status` and bursts
MIN_REPORTS_SHARE = 0.1  # the reports' share when the ticks take more
SMOOTHING = 0.3  # weight of the newest window in the averages
STRETCH, SHRINK = 1.1, 0.8  # the interval asked changes when the one needed passes these
LATE_S = 0.2  # a tick that starts later than this waited for the CPU
STRETCH_LATE = 1.25


@dataclass
class Pace:
    """Works out the interval to ask from the manager's CPU time, window by window."""

    base_s: float = BASE_INTERVAL_S
    max_s: float = MAX_INTERVAL_S
    share_cores: float = SHARE_CORES
    interval_s: float = BASE_INTERVAL_S  # the one asked now
    report_cpu_s: float | None = None  # what a report costs, smoothed
    tick_cores: float | None = None  # the ticks' share of a core, smoothed

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            raise ValueError("the interval's bounds must be 0 < base <= max")
        self.interval_s = self.base_s

    def update(self, wall_s: float, cpu_s: float, tick_cpu_s: float, reports: int,
               nodes: int, late_s: float = 0.0) -> float:
        """The interval to ask after a window of `wall_s` seconds in which the process
        used `cpu_s` CPU-seconds (`tick_cpu_s` of them in its ticks) and took `reports`
        reports, with `nodes` agents connected, its tick starting `late_s` late."""
        if wall_s <= 0:
            return self.interval_s
        self.tick_cores = _smooth(self.tick_cores, tick_cpu_s / wall_s)
        if reports > 0:
            self.report_cpu_s = _smooth(self.report_cpu_s,
                                        max(0.0, cpu_s - tick_cpu_s) / reports)
        if self.report_cpu_s is None:
            return self.interval_s
        room = max(self.share_cores - self.tick_cores, MIN_REPORTS_SHARE)
        needed = nodes * self.report_cpu_s / room
        if late_s > LATE_S:
            needed = max(needed, STRETCH_LATE * self.interval_s)
        if needed > STRETCH * self.interval_s:
            self.interval_s = min(needed, self.max_s)
        elif needed < SHRINK * self.interval_s:
            self.interval_s = max(needed, SHRINK * self.interval_s, self.base_s)
        return self.interval_s

    def asked(self) -> float | None:
        """The interval an acknowledgement asks for (None: the agents' own)."""
        return self.interval_s if self.interval_s > self.base_s else None

    def node_timeout(self, timeout_s: float) -> float:
        """A node's report is late after `timeout_s` at its own interval; at a longer one
        asked, after three of them."""
        return max(timeout_s, 3 * self.interval_s)


def _smooth(average: float | None, value: float) -> float:
    return value if average is None else (1 - SMOOTHING) * average + SMOOTHING * value
