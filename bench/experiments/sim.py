"""A fluid model of CFS with cpu.max caps, driving the daemon's own policy objects (built by
name, as dqoesd builds them), so that scenarios of any size and length run in seconds.

The model
- A node has `cpus` CPUs, its budget T_R. A container is an inference worker serving
  requests back to back with `threads` serving threads: it can use that many CPUs at most
  (its demand; 1 for the single-threaded workers of lab.workload).
- CPU: over each tick a running container gets min(its cap, its demand, its water-filling
  fair share): CFS shares the CPUs evenly among runnable containers, and what the capped
  ones leave is shared by the others (work-conserving).
- Latency: a request at a steady share of c CPUs takes its model's curve, solo/c, times the
  container's load factor at the time (1, or e.g. 2 while a load phase doubles its work per
  request). The experiments give the curve no correction: the factors that real.calibrate
  measures at a few quotas go to the calibration table and plot, see summary.md.
- Measurement: a window's mean latency is its length over the requests completed in it
  (the request-weighted mean of a piecewise-constant rate), NaN when fewer than one did;
  with `noise`, times a log-normal scatter, independently for every window and observer.
- Events: a container arrives (its target is set), may leave at `departure_s` (its slot
  goes and its CPU is free), may have its target changed (`retargets`) and may go through
  load phases (`load`).

The daemon is dqoes_cg.controller's loop on the simulated clock: a tick every sample
interval; a container joins when its target is set and leaves when it departs (the policy
is resized with the slots it keeps, hence reset and due at the next tick); a target change
resets the policy; a decision window runs from one decision to the next; a container's
first limit is the policy's. Limits become caps of L x cpus CPUs (cpu.max rounds them to
1 us of a 100 ms period, which the model ignores).
"""

from __future__ import annotations

import math
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

DEMAND_CORES = 1.0  # a worker of lab.workload is one serving thread


@dataclass(frozen=True)
class Curve:
    """Latency of one model type against its CPU share."""

    solo_s: float  # alone, with a whole CPU
    cores: tuple[float, ...] = ()  # shares (CPUs) where latency x cores / solo was measured
    factors: tuple[float, ...] = ()  # ... and its values there

    def latency(self, cores: np.ndarray) -> np.ndarray:
        """Latency (s) at `cores` CPUs (> 0)."""
        factor = np.interp(cores, self.cores, self.factors) if self.cores else 1.0
        return self.solo_s / cores * factor


@dataclass(frozen=True)
class Container:
    name: str
    model: str
    target_s: float  # from its arrival
    arrival_s: float = 0.0
    departure_s: float = math.inf
    threads: float = DEMAND_CORES  # the most CPUs it can use
    retargets: tuple[tuple[float, float], ...] = ()  # (time, new target_s), in time order
    load: tuple[tuple[float, float, float], ...] = ()  # (start, end, work factor)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Container:
        """From asdict() through JSON (lists back to tuples, None back to infinity)."""
        return cls(**{**d, "departure_s": math.inf if d.get("departure_s") is None
                      else d["departure_s"],
                      "retargets": tuple(tuple(r) for r in d.get("retargets", ())),
                      "load": tuple(tuple(r) for r in d.get("load", ()))})

    def target_at(self, t: np.ndarray) -> np.ndarray:
        """Its target at times t (s)."""
        target = np.full(np.shape(t), self.target_s)
        for when, value in self.retargets:
            target[t >= when] = value
        return target

    def load_at(self, t: float) -> float:
        """Its work per request at time t, relative to its model's."""
        return math.prod(f for start, end, f in self.load if start <= t < end)

    def present(self, t: np.ndarray) -> np.ndarray:
        """Whether it has arrived and not left at times t."""
        return (np.asarray(t) >= self.arrival_s) & (np.asarray(t) < self.departure_s)

    def events(self) -> list[float]:
        """When its target or load changes, or it leaves (not its arrival)."""
        return sorted({*(w for w, _ in self.retargets), *(x for s, e, _ in self.load
                                                           for x in (s, e)),
                       *([self.departure_s] if math.isfinite(self.departure_s) else [])})


@dataclass(frozen=True)
class Node:
    """A worker: its CPU budget and its containers (a daemon of its own)."""

    cpus: float
    containers: tuple[Container, ...]


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


def water_fill(total: float, caps: np.ndarray) -> np.ndarray:
    """CFS's fair share of `total` CPUs among containers that can each use up to caps[i]:
    equal shares, and what a capped one leaves goes to the others."""
    alloc = np.zeros_like(caps)
    left = total
    order = np.argsort(caps)
    for j, i in enumerate(order):
        alloc[i] = min(caps[i], left / (len(order) - j))
        left -= alloc[i]
    return alloc


def simulate(node: Node, curves: dict[str, Curve], params: Params | None, duration: float,
             window: float, noise: float = 0.0, seed: int = 0) -> Windows:
    """Run one node for `duration` seconds with dqoesd (`params`) or without (None: the
    default platform, no limits) and observe it every `window` seconds. `noise` is the
    standard deviation of the log of every measured window latency (the daemon's and the
    observer's): the scatter of a real, emulated CPU."""
    cs = node.containers
    n = len(cs)
    dt = params.sample_interval if params else min(window, 1.0)
    per_window = max(1, round(window / dt))
    steps = round(duration / dt)
    rng = np.random.default_rng(seed)
    arrival = np.array([c.arrival_s for c in cs])
    departure = np.array([c.departure_s for c in cs])
    threads = np.array([c.threads for c in cs])
    curve = [curves[c.model] for c in cs]
    retargets = sorted((when, i) for i, c in enumerate(cs) for when, _ in c.retargets)
    policy = make_policy(params.policy, params.policy_params()) if params else None

    present = np.zeros(n, bool)
    slots: list[int] = []  # the daemon's slot order: targets in the order they were set
    target = np.array([c.target_s for c in cs])
    limit = np.full(n, np.nan)  # fraction of T_R; NaN: never set (no cap)
    win_start, win_cpu, win_req = np.zeros(n), np.zeros(n), np.zeros(n)  # decision window
    obs_cpu, obs_req = np.zeros(n), np.zeros(n)  # observer window
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
            if policy:
                policy.resize(len(slots), np.array(carried + [-1] * len(new), np.intp))
        while retargets and retargets[0][0] <= t + 1e-9:
            _, i = retargets.pop(0)
            target[i] = cs[i].target_at(np.array([t]))[0]
            if policy and present[i]:
                policy.reset()

        caps = np.where(np.isnan(limit), threads, np.minimum(limit * node.cpus, threads))
        cores = water_fill(node.cpus, np.where(present, caps, 0.0))
        rate = np.zeros(n)  # requests per second
        for i in np.flatnonzero(cores > 0):
            rate[i] = 1.0 / (curve[i].latency(cores[i]) * cs[i].load_at(t))
        win_cpu += cores * dt
        win_req += rate * dt
        obs_cpu += cores * dt
        obs_req += rate * dt
        now = t + dt

        if policy and slots and policy.due(now):
            idx = np.array(slots)
            span = now - win_start[idx]
            measured = np.full(len(idx), np.nan)
            done = win_req[idx] >= 1.0
            measured[done] = span[done] / win_req[idx][done]
            if noise:
                measured *= rng.lognormal(0.0, noise, len(idx))
            usage = win_cpu[idx] / (span * node.cpus)
            decision = policy.decide(Observation(target[idx], measured, usage, limit[idx]),
                                     now)
            assert decision is not None  # it was due
            limit[idx] = decision.limits
            win_start[idx], win_cpu[idx], win_req[idx] = now, 0.0, 0.0
            decisions.append(now)

        if (k + 1) % per_window == 0:
            span = per_window * dt
            lat = np.where(obs_req >= 1.0, span / np.maximum(obs_req, 1e-12), np.nan)
            if noise:
                lat *= rng.lognormal(0.0, noise, n)
            rows.append((now, lat, obs_cpu / span, limit * node.cpus))
            obs_cpu[:], obs_req[:] = 0.0, 0.0

    return Windows(t=np.array([r[0] for r in rows]),
                   latency_s=np.array([r[1] for r in rows]).reshape(-1, n),
                   usage_cores=np.array([r[2] for r in rows]).reshape(-1, n),
                   limit_cores=np.array([r[3] for r in rows]).reshape(-1, n),
                   decisions=np.array(decisions))
