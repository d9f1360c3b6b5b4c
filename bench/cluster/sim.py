"""The cluster in the simulator: nodes stepped in lockstep, each the fluid model of CFS with
cpu.max caps of bench/experiments/sim.py driving a per-node policy chosen by name (its own
daemon), tasks placed as Swarm would and moved by QoE-aware placement
(dqoes_cg.cluster.placement) between them.

Each node is the model of bench/experiments/sim.py: a tick every sample interval, each
running container gets min(its cap, one CPU, its water-filling fair share) and serves at its
model's latency at that share; the daemon's loop decides when its policy is due, over the
window since its last decision, with the containers' first limits the policy's. Unlike
sim.simulate, containers come and go at any time (a move is a departure here and an arrival
there), so each node is an object stepped by the cluster's clock.

The three ways (the paper's cluster experiment and its future work):
- `default`: Swarm places each arriving task on the active node with the fewest tasks
  (spread by count), no daemon: CFS's even share;
- `per-node`: the same placement, a daemon with the policy on every node;
- `placement`: the daemons, and dqoes_cg.cluster.placement every `placement_every_s`, given the view
  a manager would build from the daemons' status (class, measured, usage, limit per task):
  nodes it pauses get no new task; a move takes `move_s` (Swarm starts the new task, then
  stops the old one: start-first), after which the container serves on its new node, where
  its daemon takes it as a newcomer.
"""

from __future__ import annotations

import inspect
import math

import numpy as np

from bench.experiments.sim import DEMAND_CORES, Container, Curve, Params, water_fill
from dqoes_cg.cluster.placement import (
    Availability,
    ClusterView,
    Move,
    NodeView,
    Placement,
    PlacementParams,
    ServiceView,
    TaskView,
)
from dqoes_cg.policy import Cls, Observation, Policy, PolicyParams, make_policy

from .run import ClusterRun, Moved

WAYS = ("default", "per-node", "placement")
CLASS_NAMES = {Cls.IDLE: "idle", Cls.G: "G", Cls.S: "S", Cls.B: "B"}
MOVE_S = 15.0  # a move on the testbed's Swarm: 11 to 18 s (lab/guest/README.md)
PLACEMENT_EVERY_S = 5.0


class NodeSim:
    """One node: its CPUs, the containers on it now, and its daemon (None: the default
    platform)."""

    def __init__(self, name: str, cpus: float, policy: Policy | None, params: Params,
                 curves: dict[str, Curve], noise: float, seed: int) -> None:
        self.name = name
        self.cpus = cpus
        self.policy = policy
        self.params = params
        self.curves = curves
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.slots: list[int] = []  # container indices, in the order they joined
        self.containers: dict[int, Container] = {}
        self.limit: dict[int, float] = {}  # fraction of T_R; NaN: never set
        self.win: dict[int, list[float]] = {}  # [start, cpu s, requests] since last decision
        self.cls: dict[int, str] = {}  # class at the last decision ("pending" before one)
        self.measured: dict[int, float] = {}  # metric over the last decision window
        self.usage: dict[int, float] = {}  # CPUs over the last decision window
        self.paused = False

    def join(self, i: int, c: Container, now: float) -> None:
        self._resize([*self.slots, i])
        self.containers[i] = c
        self.limit[i] = math.nan
        self.win[i] = [now, 0.0, 0.0]
        self.cls[i] = "pending"

    def leave(self, i: int) -> None:
        self._resize([j for j in self.slots if j != i])
        for table in (self.containers, self.limit, self.win, self.cls, self.measured,
                      self.usage):
            table.pop(i, None)

    def _resize(self, slots: list[int]) -> None:
        if self.policy is not None:
            carried = np.array([self.slots.index(j) if j in self.slots else -1 for j in slots],
                               np.intp)
            _resize(self.policy, len(slots), carried)
        self.slots = slots

    def step(self, now: float, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """One tick ending at `now`: (CPUs, requests) of each container in slot order."""
        if not self.slots:
            return np.zeros(0), np.zeros(0)
        limits = np.array([self.limit[i] for i in self.slots])
        caps = np.where(np.isnan(limits), DEMAND_CORES,
                        np.minimum(limits * self.cpus, DEMAND_CORES))
        cores = water_fill(self.cpus, caps)
        requests = np.array([dt / self.curves[self.containers[i].model].latency(x) if x > 0
                             else 0.0 for i, x in zip(self.slots, cores, strict=True)])
        for i, x, r in zip(self.slots, cores, requests, strict=True):
            self.win[i][1] += x * dt
            self.win[i][2] += r
        if self.policy is not None and self.policy.due(now):
            self._decide(now)
        return cores, requests

    def _decide(self, now: float) -> None:
        idx = self.slots
        span = np.array([now - self.win[i][0] for i in idx])
        cpu = np.array([self.win[i][1] for i in idx])
        req = np.array([self.win[i][2] for i in idx])
        measured = np.full(len(idx), np.nan)
        done = req >= 1.0
        measured[done] = span[done] / req[done]
        if self.noise:
            measured *= self.rng.lognormal(0.0, self.noise, len(idx))
        usage = cpu / (np.maximum(span, 1e-9) * self.cpus)
        target = np.array([self.containers[i].target_s for i in idx])
        limit = np.array([self.limit[i] for i in idx])
        assert self.policy is not None
        decision = self.policy.decide(Observation(target, measured, usage, limit), now)
        assert decision is not None  # it was due
        for k, i in enumerate(idx):
            self.limit[i] = float(decision.limits[k])
            self.cls[i] = CLASS_NAMES[Cls(int(decision.classes[k]))]
            self.measured[i] = float(measured[k])
            self.usage[i] = float(usage[k] * self.cpus)
            self.win[i] = [now, 0.0, 0.0]


def _resize(policy: Policy, n: int, carried: np.ndarray) -> None:
    """policy.resize, telling a policy that keeps memory per container which slots carried
    over (`carried[i]`: the old slot of new slot i, -1 for a newcomer)."""
    if len(inspect.signature(policy.resize).parameters) > 1:
        policy.resize(n, carried)  # type: ignore[call-arg]
    else:
        policy.resize(n)


def simulate_cluster(containers: list[Container], cpus: list[float],
                     curves: dict[str, Curve], way: str, policy: str | None,
                     params: Params, duration: float, window: float,
                     placement: PlacementParams | None = None, noise: float = 0.0,
                     move_s: float = MOVE_S, placement_every_s: float = PLACEMENT_EVERY_S,
                     ) -> ClusterRun:
    """Run the containers (arriving at their arrival times) on nodes of `cpus` CPUs, one of
    the WAYS, for `duration` seconds; observe every `window` seconds."""
    if way not in WAYS:
        raise ValueError(f"unknown way {way!r} (one of {', '.join(WAYS)})")
    daemons = way != "default"
    if daemons and policy is None:
        raise ValueError(f"the {way} way needs a per-node policy")
    policy_params = PolicyParams(params.alpha, params.beta, params.iv_initial, params.iv_max)
    nodes = [NodeSim(f"node{k + 1}", c, make_policy(policy, policy_params) if daemons
                     else None, params, curves, noise, seed=k)  # type: ignore[arg-type]
             for k, c in enumerate(cpus)]
    decider = Placement(placement) if way == "placement" else None
    n = len(containers)
    dt = params.sample_interval
    steps = round(duration / dt)
    per_window = max(1, round(window / dt))
    every = max(1, round(placement_every_s / dt))
    arrivals = sorted(range(n), key=lambda i: containers[i].arrival_s)
    where = np.full(n, -1)  # the node each container serves on
    landing: list[tuple[float, int, int]] = []  # (when, container, destination)
    obs_req = np.zeros(n)
    rows: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []
    moves: list[tuple[float, Move]] = []
    names = {node.name: k for k, node in enumerate(nodes)}

    for step in range(steps):
        t = step * dt
        while arrivals and containers[arrivals[0]].arrival_s <= t + 1e-9:
            i = arrivals.pop(0)
            open_nodes = [k for k, node in enumerate(nodes) if not node.paused] or \
                list(range(len(nodes)))
            k = min(open_nodes, key=lambda k: (len(nodes[k].slots), k))
            nodes[k].join(i, containers[i], t)
            where[i] = k
        for when, i, k in [x for x in landing if x[0] <= t + 1e-9]:
            landing.remove((when, i, k))
            nodes[where[i]].leave(i)
            nodes[k].join(i, containers[i], t)
            where[i] = k
        now = t + dt
        for node in nodes:
            slots = list(node.slots)
            _, requests = node.step(now, dt)
            obs_req[slots] += requests
        if decider is not None and (step + 1) % every == 0:
            plan = decider.plan(_view(now, nodes, containers, where))
            for name in plan.pause:
                nodes[names[name]].paused = True
            for name in plan.resume:
                nodes[names[name]].paused = False
            for move in plan.moves:
                i = int(move.service.removeprefix("c"))
                landing.append((now + move_s, i, names[move.destination]))
                moves.append((now, move))
        if (step + 1) % per_window == 0:
            span = per_window * dt
            lat = np.where(obs_req >= 1.0, span / np.maximum(obs_req, 1e-12), np.nan)
            if noise:
                lat *= np.random.default_rng(step).lognormal(0.0, noise, n)
            rows.append((now, lat, where.copy(), np.array([nd.paused for nd in nodes])))
            obs_req[:] = 0.0

    return ClusterRun(way, policy, "sim", list(cpus), list(containers),
                      np.array([r[0] for r in rows]),
                      np.array([r[1] for r in rows]).reshape(-1, n),
                      np.array([r[2] for r in rows]).reshape(-1, n),
                      np.array([r[3] for r in rows]).reshape(-1, len(nodes)),
                      [Moved(when, m.service, m.source, m.destination) for when, m in moves])


def _view(now: float, nodes: list[NodeSim], containers: list[Container],
          where: np.ndarray) -> ClusterView:
    """What a manager would see: each node's daemon status, one service per container."""
    tasks = []
    for node in nodes:
        for i in node.slots:
            tasks.append(TaskView(
                id=f"c{i}@{node.name}", service=f"c{i}", node=node.name, cls=node.cls[i],
                target_s=containers[i].target_s, measured_s=_finite(node.measured.get(i)),
                usage_cores=_finite(node.usage.get(i)),
                limit_cores=_finite(node.limit[i] * node.cpus), max_cores=DEMAND_CORES))
    services = tuple(ServiceView(f"c{i}", replicas=1, running=1)
                     for i in range(len(containers)) if where[i] >= 0)
    return ClusterView(now, tuple(NodeView(
        node.name, node.cpus, availability=Availability.PAUSE if node.paused
        else Availability.ACTIVE, paused_by_placement=node.paused) for node in nodes),
        tuple(tasks), services)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
