"""How much of a pipeline's end-to-end target its split gives out to the stages (pure; the
manager keeps one PipelineBudget a pipeline and splits its `budget_s`).

Each node holds a stage at its share, within its band, and a stage held at its share is at it
on average: the stages' latencies summed along the pipeline, and so its end-to-end window,
then sit at the target and miss it half the time. What an end-to-end window scatters by is
the pipeline's own (a window's mean of ten to thirty requests, a hog raised before the
node's controller answers it, a step of the load), so it is measured, not assumed: the
budget follows the pipeline's measured end-to-end latency (its stages' summed along its
longest path) to hold it at GOAL of the target. Above GOAL the budget shrinks by that ratio
(at most SHRINK at a time); below GOAL x (1 - BAND) it grows back (at most GROW at a time),
so that a pipeline given room keeps it a while; within [LEAST, CEILING] of the target.
CEILING is the per-node band's slow edge: a node holds a stage in S up to (1 + alpha) times
its share. It moves on what was measured since it last moved, once that spans SETTLE_S (the
nodes answer a new share within seconds), over at most the last WINDOW_S.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .placement import ALPHA

GOAL = 0.75  # of the target: where the pipeline's measured end-to-end latency is held
BAND = 0.15  # below GOAL by this much (relative), the budget grows back
SHRINK = 0.25  # the most the budget shrinks (relative) a split
GROW = 0.05  # the most it grows a split
LEAST = 0.3  # of the target: the smallest budget
CEILING = 1.0 / (1.0 + ALPHA)  # of the target: the largest (and the first) budget
WINDOW_S = 20.0  # the measured end-to-end latency: its mean over this long at most
SETTLE_S = 10.0  # and this long at least, since the budget last moved


@dataclass
class PipelineBudget:
    """One pipeline's budget, as a fraction of its target, and its recent measurements."""

    fraction: float = CEILING
    measured: deque[tuple[float, float]] = field(default_factory=deque)  # (when, seconds)

    def observe(self, now: float, measured_s: float | None) -> None:
        """The pipeline's end-to-end latency as measured at `now` (None: a stage unmeasured)."""
        if measured_s is not None:
            self.measured.append((now, measured_s))
        while self.measured and now - self.measured[0][0] > WINDOW_S:
            self.measured.popleft()

    def budget_s(self, target_s: float) -> float:
        """The budget to split now: moved by what was measured since it last moved, once
        that spans SETTLE_S."""
        if self.measured and self.measured[-1][0] - self.measured[0][0] >= SETTLE_S:
            mean = sum(s for _, s in self.measured) / len(self.measured)
            goal = GOAL * target_s
            before = self.fraction
            if mean > goal:
                self.fraction *= max(1.0 - SHRINK, goal / mean)
            elif mean < goal * (1.0 - BAND):
                self.fraction *= min(1.0 + GROW, goal * (1.0 - BAND) / mean)
            self.fraction = min(CEILING, max(LEAST, self.fraction))
            if self.fraction != before:
                self.measured.clear()  # what it measured was under the budget it had
        return self.fraction * target_s
