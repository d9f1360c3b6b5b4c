"""What a run achieved, what any run could achieve (the oracle), and how closely the
simulator follows the real kernel."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from dqoes_cg.policy import Cls, classify

from .sim import DEMAND_CORES, Curve, Node, water_fill
from .trace import Run

TAIL = 0.15  # the last 15% of a run is its converged state
_GRID = np.geomspace(1e-3, 1.0, 20001)  # CPU shares at which the oracle looks


def oracle(node: Node, curves: dict[str, Curve], alpha: float = 0.10) -> int:
    """The most containers of `node` that can be in S at once, whatever the algorithm:
    each one in S needs a share whose latency is within alpha of its target, every other
    one keeps at least the floor 1/(2n) of the budget (as DQoES's limits do), and all of it
    fits in the node's CPUs. Cheapest extra share over the floor first (optimal: each
    container counts one)."""
    n = len(node.containers)
    floor = node.cpus / (2 * n)
    extras = []
    for c in node.containers:
        cores = _GRID[:np.searchsorted(_GRID, min(DEMAND_CORES, node.cpus), side="right")]
        latency = curves[c.model].latency(cores)
        ok = (np.abs(c.target_s - latency) <= alpha * c.target_s) & (cores >= floor)
        if ok.any():
            extras.append(cores[ok].min() - floor)
    used = floor * n
    count = 0
    for extra in sorted(extras):
        if used + extra > node.cpus + 1e-9:
            break
        used += extra
        count += 1
    return count


def default_satisfied(node: Node, curves: dict[str, Curve], alpha: float = 0.10) -> int:
    """How many are in S on the default platform once all have arrived: even share."""
    cs = node.containers
    cores = water_fill(node.cpus, np.full(len(cs), DEMAND_CORES))
    latency = np.array([curves[c.model].latency(x) for c, x in zip(cs, cores, strict=True)])
    return int((classify([c.target_s for c in cs], latency, alpha) == Cls.S).sum())


@dataclass(frozen=True)
class Outcome:
    final_s: int  # |S| in the converged state (median over the tail)
    reached_s: float | None  # when |S| first held that level (s), None if never
    shares: np.ndarray  # converged CPU use per container (CPUs, mean over the tail)
    median_latency_ratio: np.ndarray  # converged latency / target per container


def outcome(run: Run, alpha: float = 0.10) -> Outcome:
    satisfied = run.satisfied(alpha)
    tail = run.t >= run.t[-1] * (1 - TAIL)
    final = int(np.percentile(satisfied[tail], 50, method="lower"))
    with warnings.catch_warnings():  # a container that never arrived: NaN, said once
        warnings.simplefilter("ignore", RuntimeWarning)
        return Outcome(final, reached(run.t, satisfied, final),
                       np.nanmean(run.usage_cores[tail], axis=0),
                       np.nanmedian(run.latency_s[tail], axis=0) / run.targets)


def reached(t: np.ndarray, satisfied: np.ndarray, level: int) -> float | None:
    """The first time from which |S| stays at `level` or above for most (the median) of
    the following TAIL of the run: when a noisy run got there, not a passing touch."""
    hold = t[-1] * TAIL
    for k in np.flatnonzero(satisfied >= level):
        ahead = satisfied[(t >= t[k]) & (t <= t[k] + hold)]
        if np.percentile(ahead, 50, method="lower") >= level:
            return float(t[k])
    return None


def scatter(run: Run) -> float:
    """How much a run's window latencies scatter around each container's converged one:
    the median over containers of the standard deviation of log latency over the tail."""
    tail = run.t >= run.t[-1] * (1 - TAIL)
    logs = np.log(run.latency_s[tail])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmedian(np.nanstd(logs, axis=0)))


def settled_latency(run: Run) -> np.ndarray:
    """Each container's latency once all have arrived (median of the windows from 4 s
    after the last arrival)."""
    last = max(c.arrival_s for c in run.containers)
    settled = run.t >= min(last + 4.0, run.t[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(run.latency_s[settled], axis=0)


def matched_curves(curves: dict[str, Curve], default: Run) -> dict[str, Curve]:
    """The curves scaled so that each model's latency at the even share is what the real
    default run measured (median over its containers of that model): the same shape, at
    the speed the emulated CPUs had then."""
    measured = settled_latency(default)
    matched = dict(curves)
    for model in {c.model for c in default.containers}:
        ratios = []
        for node in default.nodes:
            even = water_fill(node.cpus, np.full(len(node.containers), DEMAND_CORES))
            ratios += [measured[default.containers.index(c)] / curves[model].latency(x)
                       for c, x in zip(node.containers, even, strict=True)
                       if c.model == model]
        c = curves[model]
        matched[model] = Curve(c.solo_s * float(np.nanmedian(ratios)))
    return matched


@dataclass(frozen=True)
class Agreement:
    """Simulated against real, for one scenario and mode."""

    real_s: int
    sim_s: int
    share_error: float  # mean |sim - real| converged CPU share, CPUs

    def within(self, s_tolerance: int, share_tolerance: float) -> bool:
        return abs(self.sim_s - self.real_s) <= s_tolerance and \
            self.share_error <= share_tolerance


def agreement(real: Run, sim: Run, alpha: float = 0.10) -> Agreement:
    r, s = outcome(real, alpha), outcome(sim, alpha)
    return Agreement(r.final_s, s.final_s, float(np.nanmean(np.abs(s.shares - r.shares))))
