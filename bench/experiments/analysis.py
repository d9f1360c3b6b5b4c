"""What a run achieved, what any run could achieve (the oracle), and how closely the
simulator follows the real kernel."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import numpy as np

from dqoes_cg.policy import Cls, classify

from .sim import Curve, Node, water_fill
from .trace import Run

TAIL = 0.15  # the last 15% of a run (or of a phase) is its converged state
MIN_WINDOWS = 6  # ... and at least this many windows of a short phase
_GRID = np.geomspace(1e-4, 1.0, 40001)  # fractions of its most at which the oracle looks


def settled_time(node: Node) -> float:
    """A time after every arrival and every event of the node: its final state."""
    return max([c.arrival_s for c in node.containers] +
               [e for c in node.containers for e in c.events()], default=0.0) + 1.0


def oracle(node: Node, curves: dict[str, Curve], alpha: float = 0.10,
           at: float | None = None) -> int:
    """The most containers of `node` that can be in S at once, at time `at` (default: once
    every event has passed), whatever the algorithm: each one in S needs a share whose
    latency (its model's, times its load factor then) is within alpha of its target then,
    at most what it can use (its threads), and is held at the least such share lo_i, under
    the floor if its band is (as admit holds its admitted containers at their need); every
    other one keeps at least the floor 1/(2n) of the budget (as the policies' limits do), n
    counting the containers present; and all of it fits in the node's CPUs. Cheapest extra
    share over the floor first, lo_i - floor, negative for a need under the floor (optimal:
    each container counts one)."""
    t = settled_time(node) if at is None else at
    present = [c for c in node.containers if c.present(t)]
    n = len(present)
    if n == 0:
        return 0
    floor = node.cpus / (2 * n)
    extras = []
    for c in present:
        most = min(c.threads, node.cpus)
        cores = _GRID * most
        latency = curves[c.model].latency(cores) * c.load_at(t)
        target = float(c.target_at(np.array([t]))[0])
        ok = np.abs(target - latency) <= alpha * target
        if ok.any():
            extras.append(float(cores[ok].min()) - floor)
    used = floor * n
    count = 0
    for extra in sorted(extras):
        if used + extra > node.cpus + 1e-9:
            break
        used += extra
        count += 1
    return count


def default_satisfied(node: Node, curves: dict[str, Curve], alpha: float = 0.10) -> int:
    """How many are in S on the default platform once all have arrived: even share (what
    each can use, the rest shared by the others)."""
    t = settled_time(node)
    cs = [c for c in node.containers if c.present(t)]
    cores = water_fill(node.cpus, np.array([c.threads for c in cs]))
    latency = np.array([curves[c.model].latency(x) * c.load_at(t)
                        for c, x in zip(cs, cores, strict=True)])
    targets = [float(c.target_at(np.array([t]))[0]) for c in cs]
    return int((classify(targets, latency, alpha) == Cls.S).sum())


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
                       np.nanmedian(run.latency_s[tail] / run.targets[tail], axis=0))


def reached(t: np.ndarray, satisfied: np.ndarray, level: int,
            hold: float | None = None) -> float | None:
    """The first time from which |S| stays at `level` or above for most (the median) of
    the following `hold` seconds (default: the TAIL of the run): when a noisy run got
    there, not a passing touch."""
    hold = t[-1] * TAIL if hold is None else hold
    for k in np.flatnonzero(satisfied >= level):
        ahead = satisfied[(t >= t[k]) & (t <= t[k] + hold)]
        if np.percentile(ahead, 50, method="lower") >= level:
            return float(t[k])
    return None


@dataclass(frozen=True)
class Phase:
    """One stretch of a run between changes (the last arrival, then each target change,
    load change or departure): what was possible in it and what the run got."""

    start: float
    end: float
    oracle: list[int]  # per node
    final: list[int]  # per node: median |S| over the phase's tail
    final_s: int  # all nodes: median of the total |S| over the phase's tail
    reached_s: float | None  # seconds from the start until the total first held final_s
    rounds: int | None  # policy rounds by then (the most of any node)

    @property
    def oracle_s(self) -> int:
        return sum(self.oracle)


def phases(nodes: list[Node], end: float) -> list[tuple[float, float]]:
    """The phases of a run that ends at `end`: from the last arrival to the first change,
    from there to the next, ... to the end."""
    cs = [c for nd in nodes for c in nd.containers]
    start = max((c.arrival_s for c in cs), default=0.0)
    if start >= end:  # a run shorter than its arrivals (a quick one): judged as a whole
        return [(0.0, end)]
    events = sorted({e for c in cs for e in c.events() if start < e < end})
    bounds = [start, *events, end]
    return list(itertools.pairwise(bounds))


def phase_outcomes(run: Run, curves: dict[str, Curve], alpha: float = 0.10) -> list[Phase]:
    """Each phase of the run against the oracle of its state."""
    by_node = [run.satisfied(alpha, node=k) for k in range(len(run.nodes))]
    total = np.sum(by_node, axis=0)
    step = float(run.t[1] - run.t[0]) if len(run.t) > 1 else 1.0
    out = []
    for a, b in phases(run.nodes, float(run.t[-1])):
        inside = (run.t > a) & (run.t <= b + 1e-9)
        if not inside.any():
            continue
        hold = max(TAIL * (b - a), MIN_WINDOWS * step)
        tail = inside & (run.t > b - hold)
        final = int(np.percentile(total[tail], 50, method="lower"))
        when = reached(run.t[inside], total[inside], final, hold)
        rounds = None if when is None or not any(run.decisions) else max(
            int(np.count_nonzero((np.array(d) > a) & (np.array(d) <= when)))
            for d in run.decisions)
        out.append(Phase(a, b, [oracle(nd, curves, alpha, at=(a + b) / 2) for nd in run.nodes],
                         [int(np.percentile(sat[tail], 50, method="lower")) for sat in by_node],
                         final, None if when is None else when - a, rounds))
    return out


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
            even = water_fill(node.cpus, np.array([c.threads for c in node.containers]))
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
