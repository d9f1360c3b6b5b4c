"""A pipeline stage's measurements, from its tasks' reports, and their mean over the last
SMOOTH_S for its split and its scaling (pure; the manager keeps one StageHistory).

A node's window is a second or two: a stage at half a request a second sees none in a third
of them, and one window's rate reads 0 to 2.5 requests a second for a load of 1.2. The split
and the scaler act on tens of seconds (the scaler holds a stage it acted on 30 s), so they
read each stage's rate as the mean of its windows' over SMOOTH_S (a window without a request
counts, as a zero) and its work per request as the CPU over those windows' requests, once
they are MIN_REQUESTS or more (a stage's first requests, a new replica's, cost up to three
times the rest: its model warming up); its latencies stay the last window's, as the nodes
report them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from .view import TaskView

SMOOTH_S = 30.0  # a stage's rate and work: their mean over this long
MIN_REQUESTS = 10  # a stage's work per request is taken from this many requests at least


@dataclass(frozen=True)
class StageMeasure:
    """A stage's measurements over its tasks' reports (None: no task measured it)."""

    work_s: float | None  # CPU-seconds per request
    rate_hz: float | None  # requests a second, all its tasks together
    measured_s: float | None  # latency in its target's metric, the mean over its tasks
    mean_s: float | None  # mean latency, over its tasks
    p95_s: float | None  # p95 latency, the mean over its tasks


def stage_measurements(tasks: list[TaskView]) -> StageMeasure:
    """The stage's last windows, over its tasks. Its work is the CPU of the tasks that
    served requests over their requests: a replica that served none is starting (its
    imports and its model: seconds of CPU on an emulated one, which the first split after
    a scale-out read as the stage's work ten times over) or idle."""
    rates = [t.rate_hz for t in tasks if t.rate_hz is not None]
    serving = [t for t in tasks if t.rate_hz]
    used = [t.window_usage_cores for t in serving if t.window_usage_cores is not None]
    rate = sum(rates) if rates else None
    return StageMeasure(sum(used) / rate if rate and len(used) == len(serving) else None, rate,
                        _mean([t.measured_s for t in tasks]), _mean([t.mean_s for t in tasks]),
                        _mean([t.p95_s for t in tasks]))


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def critical_sum(paths: tuple[tuple[int, ...], ...], values: list[float | None]
                 ) -> float | None:
    """The largest sum of `values` along a path; None if any value is unknown."""
    if any(v is None for v in values):
        return None
    return max(sum(values[i] or 0.0 for i in path) for path in paths)


@dataclass
class StageHistory:
    """Each stage's (service ID) windows over the last SMOOTH_S: when, rate, work."""

    span_s: float = SMOOTH_S
    windows: dict[str, deque[tuple[float, float, float | None]]] = field(default_factory=dict)

    def smoothed(self, now: float, measures: dict[str, StageMeasure]) -> dict[str, StageMeasure]:
        """`measures` (each stage's last windows, taken at `now`) with their rate and work
        over the last span_s; the stages not in `measures` are forgotten."""
        self.windows = {k: v for k, v in self.windows.items() if k in measures}
        out = {}
        for service_id, m in measures.items():
            kept = self.windows.setdefault(service_id, deque())
            if m.rate_hz is not None:
                kept.append((now, m.rate_hz, m.work_s))
            while kept and now - kept[0][0] > self.span_s:
                kept.popleft()
            rates = [rate for _, rate, _ in kept]
            mean_rate = sum(rates) / len(rates) if rates else None
            served = [(rate, work) for _, rate, work in kept if rate > 0 and work is not None]
            weight = sum(rate for rate, _ in served)
            seen = (mean_rate or 0.0) * (now - kept[0][0]) if kept else 0.0
            out[service_id] = replace(
                m, rate_hz=mean_rate,
                work_s=sum(rate * work for rate, work in served) / weight
                if weight and seen >= MIN_REQUESTS else None)
        return out
