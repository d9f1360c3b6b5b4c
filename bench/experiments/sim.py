"""A fluid model of CFS with cpu.max caps, driving the daemon's own policy object, so that
scenarios of any size and length run in seconds.

The model
- A node has `cpus` CPUs, its budget T_R. A container is one single-threaded inference
  worker serving requests back to back: it can use one CPU at most (its demand).
- CPU: over each tick a running container gets min(its cap, its demand, its water-filling
  fair share): CFS shares the CPUs evenly among runnable containers, and what the capped
  ones leave is shared by the others (work-conserving).
- Latency: a request at a steady share of c CPUs takes its model's curve: solo/c (the
  experiments give it no correction: the factors that real.calibrate measures at a few
  quotas go to the calibration table and plot, see summary.md).
- Measurement: a window's mean latency is its length over the requests completed in it
  (the request-weighted mean of a piecewise-constant rate), NaN when fewer than one did.

The daemon is dqoes_cg.controller's loop on the simulated clock: a tick every sample
interval; a container joins when its target is set (the policy is resized, hence reset and
due at the next tick); a decision window runs from one decision to the next; a container's
first limit is the policy's (from its usage share); the policy is
dqoes_cg.policy.DQoES itself. Limits become caps of L x cpus CPUs (cpu.max rounds them to
1 us of a 100 ms period, which the model ignores).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dqoes_cg.policy import ALPHA, BETA, IV_INITIAL_S, IV_MAX_S, DQoES, Observation

DEMAND_CORES = 1.0  # a worker is one serving thread


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
    target_s: float
    arrival_s: float = 0.0


@dataclass(frozen=True)
class Node:
    """A worker: its CPU budget and its containers (a daemon of its own)."""

    cpus: float
    containers: tuple[Container, ...]


@dataclass(frozen=True)
class Params:
    """The daemon's parameters (dqoesd's options)."""

    alpha: float = ALPHA
    beta: float = BETA
    iv_initial: float = IV_INITIAL_S
    iv_max: float = IV_MAX_S
    sample_interval: float = 1.0


@dataclass
class Windows:
    """What an observer saw, one row per window: arrays (T,) and (T, n)."""

    t: np.ndarray  # window ends, s
    latency_s: np.ndarray  # mean latency in the window (NaN: no request, or not arrived)
    usage_cores: np.ndarray
    limit_cores: np.ndarray  # NaN: no limit (cpu.max "max")


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
    target = np.array([c.target_s for c in cs])
    arrival = np.array([c.arrival_s for c in cs])
    curve = [curves[c.model] for c in cs]
    policy = DQoES(params.alpha, params.beta, params.iv_initial, params.iv_max) if params \
        else None

    joined = np.zeros(n, bool)
    slots: list[int] = []  # the daemon's slot order: targets in the order they were set
    limit = np.full(n, np.nan)  # fraction of T_R; NaN: never set (no cap)
    win_start, win_cpu, win_req = np.zeros(n), np.zeros(n), np.zeros(n)  # decision window
    obs_cpu, obs_req = np.zeros(n), np.zeros(n)  # observer window
    rows: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []

    for k in range(steps):
        t = k * dt
        arriving = ~joined & (arrival <= t + 1e-9)
        if arriving.any():
            new = np.flatnonzero(arriving)
            slots += [int(i) for i in new[np.argsort(arrival[new], kind="stable")]]
            joined |= arriving
            win_start[arriving], win_cpu[arriving], win_req[arriving] = t, 0.0, 0.0
            if policy:
                policy.resize(len(slots))

        caps = np.where(np.isnan(limit), DEMAND_CORES,
                        np.minimum(limit * node.cpus, DEMAND_CORES))
        cores = water_fill(node.cpus, np.where(joined, caps, 0.0))
        rate = np.zeros(n)  # requests per second
        for i in np.flatnonzero(cores > 0):
            rate[i] = 1.0 / curve[i].latency(cores[i])
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
                   limit_cores=np.array([r[3] for r in rows]).reshape(-1, n))
