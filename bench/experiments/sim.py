"""A fluid model of CFS with cpu.max caps, driving the daemon's own policy objects (built by
name, as dqoesd builds them), so that scenarios of any size and length run in seconds.

The model
- A node has `cpus` CPUs, its budget T_R. A container is an inference worker with
  `threads` serving threads: it can use that many CPUs at most (1 for the single-threaded
  workers of lab.workload). A closed-loop worker (rate None) serves requests back to back;
  an open-loop service receives Poisson arrivals at `rate` per second (times its `rates`
  phases) and serves them first in, first out, one at a time, at the CPU it gets.
- CPU: over each tick a container demands min(its cap, its threads, each at most
  `thread_cpu` of a CPU: less than a whole one on a loaded host or an emulated CPU) if it
  serves back to
  back, and min(its cap, what its backlog and arrivals need) if open-loop. CFS shares the
  CPUs evenly among the demands up to a water level, what a capped or idle one leaves
  going to the others (work-conserving); a service serves at min(its cap, the level) while
  it is busy.
- Work: a request at a share of c CPUs takes its model's curve, solo/c times the curve's
  factor at c, times the container's load factor (1, or e.g. 2 while a load phase doubles
  its work per request), times the node's work factor then (its `slowdowns`, and with a
  `Drift` a speed that wanders for the whole node at once). A service's latency runs from
  arrival to completion, its queue included, exactly within a tick (Lindley's recursion
  in units of work).
- Packing: with `Conditions.packing`, capped single-threaded containers get less than their
  caps when those fill the node (`packing_loss`, fitted on bench/results/packing.md).
- Measurement: a closed-loop worker's window mean latency is the window's length over the
  requests completed in it (the request-weighted mean of a piecewise-constant rate), NaN
  when fewer than one did; a service's is the mean over the requests it completed in the
  window (NaN if none); with `noise`, times a log-normal scatter, independently for every
  window and observer.
- Events: a container arrives (its target is set), may leave at `departure_s` (its slot
  goes, its CPU and its queue with it), may have its target changed (`retargets`) and may
  go through load phases (`load`) and, open-loop, arrival-rate phases (`rates`); a node may
  slow down (`slowdowns`).

The daemon is dqoes_cg.controller's loop on the simulated clock: a tick every sample
interval; a container joins when its target is set and leaves when it departs (the policy
is resized with the slots it keeps, hence reset and due at the next tick); a target change
resets the policy; a decision window runs from one decision to the next; a container's
first limit is the policy's. Limits become caps of L x cpus CPUs (cpu.max rounds them to
1 us of a 100 ms period, which the model ignores). The Observation carries each container's
requests completed per second over the window (`rate`), for both kinds, and the node's
CPUs (`cpus`), as dqoesd's does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dqoes_cg.policy import (
    ALPHA,
    BETA,
    DEFAULT_POLICY,
    IV_INITIAL_S,
    IV_MAX_S,
    Observation,
    PolicyParams,
    make_policy,
)

Phases = tuple[tuple[float, float, float], ...]  # (start, end, factor): a factor in [start, end)

DEMAND_CORES = 1.0  # a worker of lab.workload is one serving thread


@dataclass(frozen=True)
class Curve:
    """Latency of one model type against its CPU share."""

    solo_s: float  # alone, with a whole CPU
    cores: tuple[float, ...] = ()  # shares (CPUs) where latency x cores / solo was measured
    factors: tuple[float, ...] = ()  # ... and its values there

    def factor(self, cores: np.ndarray | float) -> np.ndarray | float:
        """A request's cost at `cores` CPUs relative to its cost alone (1 between and beyond
        no measurements; the nearest measured value beyond the measured shares)."""
        return np.interp(cores, self.cores, self.factors) if self.cores else 1.0

    def latency(self, cores: np.ndarray) -> np.ndarray:
        """Latency (s) at `cores` CPUs (> 0)."""
        return self.solo_s / cores * self.factor(cores)


def md1_latency(service_s: np.ndarray, rate: float | np.ndarray) -> np.ndarray:
    """Mean latency (s) of an M/D/1 queue: Poisson arrivals at `rate` per second, each served
    in `service_s`; infinite when the server is busy all the time (rate x service >= 1)."""
    busy = rate * np.asarray(service_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = np.where(busy < 1.0, busy * service_s / (2.0 * (1.0 - busy)), np.inf)
    return service_s + wait


def phase_factor(phases: Phases, t: np.ndarray | float) -> np.ndarray:
    """The product of the factors of the phases under way at times t."""
    t = np.asarray(t, dtype=float)
    factor = np.ones(t.shape)
    for start, end, f in phases:
        factor[(t >= start) & (t < end)] *= f
    return factor


@dataclass(frozen=True)
class Container:
    name: str
    model: str
    target_s: float  # from its arrival
    arrival_s: float = 0.0
    departure_s: float = math.inf
    threads: float = DEMAND_CORES  # the most CPUs it can use
    retargets: tuple[tuple[float, float], ...] = ()  # (time, new target_s), in time order
    load: Phases = ()  # (start, end, work factor)
    rate: float | None = None  # open loop: mean Poisson arrivals per second; None: back to back
    rates: Phases = ()  # (start, end, arrival-rate factor): its steps and bursts
    # Each of its threads gets at most this much of a CPU: less than 1 where a loaded host
    # or an emulated CPU takes part of it, which no cpu.pressure shows (the guest: 0.85-0.9)
    thread_cpu: float = 1.0

    @property
    def open_loop(self) -> bool:
        return self.rate is not None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Container:
        """From asdict() through JSON (lists back to tuples, None back to infinity)."""
        return cls(**{**d, "departure_s": math.inf if d.get("departure_s") is None
                      else d["departure_s"],
                      "retargets": tuple(tuple(r) for r in d.get("retargets", ())),
                      "load": tuple(tuple(r) for r in d.get("load", ())),
                      "rates": tuple(tuple(r) for r in d.get("rates", ()))})

    def target_at(self, t: np.ndarray) -> np.ndarray:
        """Its target at times t (s)."""
        target = np.full(np.shape(t), self.target_s)
        for when, value in self.retargets:
            target[t >= when] = value
        return target

    def load_at(self, t: float) -> float:
        """Its work per request at time t, relative to its model's."""
        return float(phase_factor(self.load, t))

    def rate_at(self, t: float) -> float:
        """Its mean arrivals per second at time t (0 for a closed-loop worker)."""
        return 0.0 if self.rate is None else self.rate * float(phase_factor(self.rates, t))

    def present(self, t: np.ndarray) -> np.ndarray:
        """Whether it has arrived and not left at times t."""
        return (np.asarray(t) >= self.arrival_s) & (np.asarray(t) < self.departure_s)

    def events(self) -> list[float]:
        """When its target, load or arrival rate changes, or it leaves (not its arrival)."""
        return sorted({*(w for w, _ in self.retargets),
                       *(x for s, e, _ in self.load + self.rates for x in (s, e)),
                       *([self.departure_s] if math.isfinite(self.departure_s) else [])})


@dataclass(frozen=True)
class Node:
    """A worker: its CPU budget and its containers (a daemon of its own)."""

    cpus: float
    containers: tuple[Container, ...]
    slowdowns: tuple[tuple[float, float], ...] = ()  # (time, work factor from then on)

    def slowdown_at(self, t: float) -> float:
        """The work factor of every request on the node at time t from its slowdowns."""
        return float(math.prod(f for when, f in self.slowdowns if t >= when))


@dataclass(frozen=True)
class Drift:
    """A node's speed wandering for all its containers at once: the log of its work factor
    is an Ornstein-Uhlenbeck process of stationary standard deviation `spread`, correlated
    over `correlation_s` seconds (the real runs' emulated CPUs: about 9%, some five decision
    windows)."""

    spread: float = 0.09
    correlation_s: float = 50.0

    def factors(self, steps: int, dt: float, rng: np.random.Generator) -> np.ndarray:
        """The work factor of each of `steps` ticks of `dt` s, started from the stationary
        distribution."""
        keep = math.exp(-dt / self.correlation_s)
        shocks = rng.normal(0.0, self.spread * math.sqrt(1.0 - keep**2), steps)
        log = np.empty(steps)
        log[0] = rng.normal(0.0, self.spread)
        for k in range(1, steps):
            log[k] = keep * log[k - 1] + shocks[k]
        return np.exp(log)


# The packing shortfall, fitted on bench/results/packing.md (equal cpu.weight, single-
# threaded busy loops on 2 CPUs): each capped one loses PACKING_BASE, plus PACKING_UNEVEN
# times the fraction of the CPUs that must carry one such container more than the others
# (CFS balances them by count, not by cap), times (its cap / the largest)^PACKING_POWER,
# times how full the caps are past PACKING_FULL_FROM of the CPUs (0 there, 1 at all of
# them). The largest's got/cap: r1's four caps (1.0 of the CPUs, counts even) 0.97-0.98,
# fit 0.973; r3's and r4's five (0.995-1.0, one CPU carrying three) 0.86-0.88, fit
# 0.865-0.870; r4's with 8% left over (0.915) 0.94-0.98, fit 0.957. The mean got/cap over
# the five: 0.96-0.97 measured, fit 0.95-0.96; with 8% left 0.99, fit 0.986; r1's 0.99, fit
# 0.987. No loss with at most one such container per CPU.
PACKING_BASE = 0.027
PACKING_UNEVEN = 0.216
PACKING_POWER = 4.0
PACKING_FULL_FROM = 0.875


def packing_loss(caps: np.ndarray, cpus: float) -> np.ndarray:
    """The fraction of its cap that each of the capped single-threaded containers `caps`
    (CPUs) of a node of `cpus` CPUs does not get, CFS placing them by count (see above)."""
    n, m = len(caps), round(cpus)
    if n <= m:
        return np.zeros(n)
    full = min(1.0, max(0.0, (caps.sum() / cpus - PACKING_FULL_FROM) / (1 - PACKING_FULL_FROM)))
    uneven = (n % m) / m
    return (PACKING_BASE + PACKING_UNEVEN * uneven) * (caps / caps.max())**PACKING_POWER * full


@dataclass(frozen=True)
class Conditions:
    """What a real host adds to the fluid model: a drifting node speed, and the packing
    shortfall of capped single-threaded containers."""

    drift: Drift | None = None
    packing: bool = False


IDEAL = Conditions()  # the fluid model alone
# A held allocation knows the node's drift as of this long ago: a controller sees it in the
# window it decides on (dqoesd's first listener interval, IV_INITIAL_S).
KNOWN_LAG_S = IV_INITIAL_S


@dataclass(frozen=True)
class Params:
    """The daemon's parameters (dqoesd's options)."""

    policy: str = DEFAULT_POLICY
    alpha: float = ALPHA
    beta: float = BETA
    iv_initial: float = IV_INITIAL_S
    iv_max: float = IV_MAX_S
    sample_interval: float = 1.0

    def policy_params(self) -> PolicyParams:
        return PolicyParams(self.alpha, self.beta, self.iv_initial, self.iv_max)


@dataclass
class Windows:
    """What an observer saw, one row per window: arrays (T,) and (T, n)."""

    t: np.ndarray  # window ends, s
    latency_s: np.ndarray  # mean latency in the window (NaN: no request, or not arrived)
    usage_cores: np.ndarray
    limit_cores: np.ndarray  # NaN: no limit (cpu.max "max")
    decisions: np.ndarray = field(default_factory=lambda: np.zeros(0))  # policy rounds, s
    drift: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (T,) the drift's mean
    #                                                                 work factor per window


def water_level(total: float, demands: np.ndarray) -> float:
    """CFS's water level: the share L at which min(demand_i, L) adds up to `total` CPUs
    (infinite when all the demands fit)."""
    left = total
    ordered = np.sort(demands)
    for j, demand in enumerate(ordered):
        fair = left / (len(ordered) - j)
        if demand > fair:
            return fair
        left -= demand
    return math.inf


def water_fill(total: float, caps: np.ndarray) -> np.ndarray:
    """CFS's fair share of `total` CPUs among containers that can each use up to caps[i]:
    equal shares, and what a capped one leaves goes to the others."""
    return np.minimum(caps, water_level(total, caps))


def default_latency(cpus: float, containers: tuple[Container, ...] | list[Container],
                    curves: dict[str, Curve], t: float, slowdown: float = 1.0) -> np.ndarray:
    """Each container's mean latency at time t on the default platform (no caps), in the
    fluid steady state: CFS's water level over what each demands (its threads; a service,
    the CPU its arrivals need at its threads), a worker served at min(its threads, the
    level), a service too while it is busy, as an M/D/1 queue (infinite if it cannot keep
    up)."""
    def cost(c: Container) -> float:  # CPU-seconds of one request at its threads
        return float(curves[c.model].latency(c.threads)) * c.threads * c.load_at(t) * slowdown

    demand = np.array([c.rate_at(t) * cost(c) if c.open_loop else c.threads
                       for c in containers])
    level = water_level(cpus, demand)
    return np.array([md1_latency(curves[c.model].latency(min(c.threads, level))
                                 * c.load_at(t) * slowdown, c.rate_at(t))
                     for c in containers], dtype=float)


class _Queue:
    """An open-loop container's requests over a whole run, first in, first out. Positions
    are in units of work (a request's work: its model's solo latency times its load factor
    at its arrival): the server's capacity grows by speed x dt over a tick served at `speed`
    units a second, and a request arriving at position A leaves at D = max(A, the previous
    one's D) + its work (Lindley's recursion), exact within a tick whatever each tick's
    speed. A tick without work is skipped: positions only order the requests, so the
    capacity need not grow while the server is idle."""

    def __init__(self, arrivals: np.ndarray, work: np.ndarray) -> None:
        self.arrivals = arrivals  # s, in order
        self.before = np.concatenate(([0.0], np.cumsum(work)))  # work of those before each
        self.leaves = np.full(len(arrivals), np.inf)  # each one's departure position
        self.capacity = 0.0
        self.arrived = 0  # how many have arrived
        self.completed = 0

    @classmethod
    def of(cls, c: Container, solo_s: float, end: float, rng: np.random.Generator) -> _Queue:
        """Poisson arrivals at the container's rate (constant between the edges of its rate
        phases) from its arrival to its departure or `end`."""
        stop = max(c.arrival_s, min(c.departure_s, end))
        edges = sorted({c.arrival_s, stop, *(x for a, b, _ in c.rates for x in (a, b)
                                             if c.arrival_s < x < stop)})
        times = [np.sort(rng.uniform(a, b, rng.poisson(c.rate_at(a) * (b - a))))
                 for a, b in itertools.pairwise(edges)]
        arrivals = np.concatenate(times) if times else np.zeros(0)
        return cls(arrivals, solo_s * phase_factor(c.load, arrivals))

    def backlog(self) -> float:
        """Work arrived and not done."""
        return max(0.0, self.leaves[self.arrived - 1] - self.capacity) if self.arrived else 0.0

    def work_until(self, t: float) -> float:
        """Work arrived and not done by t, if none were done from now."""
        return self.backlog() + self.before[self._arrived_by(t)] - self.before[self.arrived]

    def _arrived_by(self, t: float) -> int:
        return int(np.searchsorted(self.arrivals, t, "left"))

    def serve(self, t: float, dt: float, speed: float) -> tuple[np.ndarray, float]:
        """Serve [t, t + dt) at `speed` units of work a second: the latencies of the
        requests completed in it, and the work done."""
        first, last = self.arrived, self._arrived_by(t + dt)
        backlog = self.backlog()
        if last > first:
            at = self.capacity + speed * (self.arrivals[first:last] - t)
            previous = self.leaves[first - 1] if first else 0.0
            self.leaves[first:last] = self.before[first + 1:last + 1] + np.maximum(
                previous - self.before[first],
                np.maximum.accumulate(at - self.before[first:last]))
            self.arrived = last
        start = self.capacity
        self.capacity += speed * dt
        done = self.completed + int(np.searchsorted(self.leaves[self.completed:last],
                                                    self.capacity, "right"))
        latencies = (t + (self.leaves[self.completed:done] - start) / speed
                     - self.arrivals[self.completed:done]) if done > self.completed \
            else np.zeros(0)
        self.completed = done
        arrived_work = self.before[last] - self.before[first]
        return latencies, backlog + arrived_work - self.backlog()


def simulate(node: Node, curves: dict[str, Curve], params: Params | None, duration: float,
             window: float, noise: float = 0.0, seed: int = 0,
             conditions: Conditions = IDEAL,
             held: Callable[[float, float], np.ndarray] | None = None) -> Windows:
    """Run one node for `duration` seconds with dqoesd (`params`) or without (None: the
    default platform, no limits) and observe it every `window` seconds. `noise` is the
    standard deviation of the log of every measured window latency (the daemon's and the
    observer's): the scatter of a real, emulated CPU. `seed` seeds the noise, the
    services' arrivals and the drift, each from its own stream (the same arrivals and
    drift under every policy). `held`, with no policy, sets every container's cap (CPUs,
    NaN: none) at each time t from outside, given the drift's work factor KNOWN_LAG_S
    before (an oracle's allocation: analysis.oracle_caps, analysis.real_caps)."""
    cs = node.containers
    n = len(cs)
    dt = params.sample_interval if params else min(window, 1.0)
    per_window = max(1, round(window / dt))
    steps = round(duration / dt)
    rng = np.random.default_rng(seed)
    arrival = np.array([c.arrival_s for c in cs])
    departure = np.array([c.departure_s for c in cs])
    single = np.array([c.threads <= 1.0 for c in cs])
    threads = np.array([c.threads * c.thread_cpu for c in cs])
    curve = [curves[c.model] for c in cs]
    retargets = sorted((when, i) for i, c in enumerate(cs) for when, _ in c.retargets)
    policy = make_policy(params.policy, params.policy_params()) if params else None
    queues = {i: _Queue.of(c, curve[i].solo_s, duration, np.random.default_rng([seed, 1, i]))
              for i, c in enumerate(cs) if c.open_loop}
    is_open = np.array([c.open_loop for c in cs], bool)
    # The work factor of every request on the node, tick by tick: its slowdowns, its drift.
    drift = conditions.drift.factors(steps, dt, np.random.default_rng([seed, 2])) \
        if conditions.drift else np.ones(steps)
    slowness = drift * np.array([node.slowdown_at(k * dt) for k in range(steps)], dtype=float)
    lag = round(KNOWN_LAG_S / dt)

    present = np.zeros(n, bool)
    slots: list[int] = []  # the daemon's slot order: targets in the order they were set
    target = np.array([c.target_s for c in cs])
    limit = np.full(n, np.nan)  # fraction of T_R; NaN: never set (no cap)
    # Per container over the decision window and the observer's: CPU-seconds used, requests
    # completed (a worker's fluid count) and a service's summed latencies.
    win_start, win_cpu, win_req, win_lat = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    win_wait = np.zeros(n)
    obs_cpu, obs_req, obs_lat = np.zeros(n), np.zeros(n), np.zeros(n)
    rows: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []
    decisions: list[float] = []

    for k in range(steps):
        t = k * dt
        now_present = (arrival <= t + 1e-9) & (departure > t + 1e-9)
        if (now_present != present).any():
            arriving = now_present & ~present
            new = np.flatnonzero(arriving)
            kept = [i for i in slots if now_present[i]]
            carried = [j for j, i in enumerate(slots) if now_present[i]]
            slots = kept + [int(i) for i in new[np.argsort(arrival[new], kind="stable")]]
            limit[present & ~now_present] = np.nan  # gone: its cgroup with it
            present = now_present
            win_start[arriving], win_cpu[arriving], win_req[arriving] = t, 0.0, 0.0
            win_wait[arriving] = 0.0
            win_lat[arriving] = 0.0
            if policy:
                policy.resize(len(slots), np.array(carried + [-1] * len(new), np.intp))
        while retargets and retargets[0][0] <= t + 1e-9:
            _, i = retargets.pop(0)
            target[i] = cs[i].target_at(np.array([t]))[0]
            if policy and present[i]:
                policy.reset()

        if held:
            limit = held(t, float(drift[max(k - lag, 0)])) / node.cpus
        caps = np.where(np.isnan(limit), threads, np.minimum(limit * node.cpus, threads))
        lost = np.zeros(n)  # CPU a packed container is kept from by its neighbours
        if conditions.packing:
            packed = present & single & ~np.isnan(limit)
            lost[packed] = caps[packed] * packing_loss(caps[packed], node.cpus)
            caps -= lost
        demand = np.where(present, caps, 0.0)
        for i, queue in queues.items():
            if present[i]:  # the CPU its backlog and arrivals need, served at its cap
                cost = curve[i].factor(caps[i]) * slowness[k]
                demand[i] = min(caps[i], queue.work_until(t + dt) * cost / dt)
        level = water_level(node.cpus, demand)
        cores = np.minimum(demand, level)
        done = np.zeros(n)  # requests completed (a worker's: fluid)
        latency_sum = np.zeros(n)
        for i in np.flatnonzero(cores > 0):
            if i in queues:
                busy = min(caps[i], level)  # its share while it has work
                speed = busy / (curve[i].factor(busy) * slowness[k])
                latencies, work = queues[i].serve(t, dt, speed)
                cores[i] = work / speed * busy / dt
                done[i], latency_sum[i] = len(latencies), latencies.sum()
            else:
                done[i] = dt / (curve[i].latency(cores[i]) * cs[i].load_at(t) * slowness[k])
        win_cpu += cores * dt
        # runnable but not running (cpu.pressure): what CFS's level or a packed neighbour
        # kept from what it asked, while it had work
        with np.errstate(divide="ignore", invalid="ignore"):
            busy_part = np.where(caps > 0, np.minimum(cores / caps, 1.0), 0.0)
        win_wait += (np.maximum(demand - cores, 0.0) + lost * busy_part) * dt
        win_req += done
        win_lat += latency_sum
        obs_cpu += cores * dt
        obs_req += done
        obs_lat += latency_sum
        now = t + dt

        if policy and slots and policy.due(now):
            idx = np.array(slots)
            span = now - win_start[idx]
            measured = _window_latency(span, win_req[idx], win_lat[idx], is_open[idx])
            if noise:
                measured *= rng.lognormal(0.0, noise, len(idx))
            usage = win_cpu[idx] / (span * node.cpus)
            decision = policy.decide(Observation(target[idx], measured, usage, limit[idx],
                                                 waited=win_wait[idx] / (span * node.cpus),
                                                 rate=win_req[idx] / span,
                                                 cpus=node.cpus), now)
            assert decision is not None  # it was due
            limit[idx] = decision.limits
            win_start[idx], win_cpu[idx], win_req[idx], win_lat[idx] = now, 0.0, 0.0, 0.0
            win_wait[idx] = 0.0
            decisions.append(now)

        if (k + 1) % per_window == 0:
            span = per_window * dt
            lat = _window_latency(np.full(n, span), obs_req, obs_lat, is_open)
            if noise:
                lat *= rng.lognormal(0.0, noise, n)
            rows.append((now, lat, obs_cpu / span, limit * node.cpus))
            obs_cpu[:], obs_req[:], obs_lat[:] = 0.0, 0.0, 0.0

    return Windows(t=np.array([r[0] for r in rows]),
                   latency_s=np.array([r[1] for r in rows]).reshape(-1, n),
                   usage_cores=np.array([r[2] for r in rows]).reshape(-1, n),
                   limit_cores=np.array([r[3] for r in rows]).reshape(-1, n),
                   decisions=np.array(decisions),
                   drift=drift[:len(rows) * per_window].reshape(-1, per_window).mean(axis=1))


def _window_latency(span: np.ndarray, completed: np.ndarray, latency_sum: np.ndarray,
                    is_open: np.ndarray) -> np.ndarray:
    """A window's mean latency per container: a service's mean over the requests it
    completed, a worker's window length over its (fluid) count; NaN under one request."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(is_open, latency_sum / completed, span / completed)
    return np.where(completed >= 1.0, mean, np.nan)
