"""A pipeline on a few nodes under random interference, in the model's world, for training
and judging Darly's agent (dqoes_cg.cluster.darly) against the model-based scaler
(dqoes_cg.cluster.scaler) and fixed deployments.

The pipeline is the paper's video analytics (Fig. 1): framer -> face-detector ->
face-analyzer and object-recognition -> uploader; a request fans out to both middle stages
and is answered when its last branch is, so La is the longest path's latency. Requests
arrive open-loop (Poisson, at a rate that jumps at random). Each stage's replicas share its
requests evenly (Swarm's load balancing).

A node j has `cpus` CPUs at `speed` (heterogeneity); the interference injector takes a share
i_j of them (0, 25, 50 or 75%, changed at random times, as in the paper's section II), which
also slows what runs beside it, non-linearly (cache and memory: work takes 1 + SLOWDOWN i^2
times longer). A replica there gets what the node has left after the other replicas' demand,
at most one CPU; with c that CPU and s' its work at the node's pace, it answers in
s' / (c - λ s' / r) (M/M/1-like, as split.py and scaler.py assume); past RHO_MAX of c its
queue grows over the window instead, and so does its latency (`replica_latency`).

One step is a decision window (STEP_S): the scheduler acts, the interference may change,
the window's arrivals are drawn, and its latencies measured (with multiplicative noise).

Several pipelines may share the nodes (bench/cluster/pipelines_at_scale.py): each is a
PipelineEnv whose `neighbours` are the others, all with the same nodes and levels; a node's
CPU and Swarm's spread then count every pipeline's replicas there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dqoes_cg.cluster.darly import (
    K1,
    K2,
    K3,
    Action,
    ActionSpace,
    Observation,
    custom_candidates,
    move_source,
    reward,
)

STAGES = ("framer", "face-detector", "face-analyzer", "object-recognition", "uploader")
WORK_S = (0.030, 0.120, 0.080, 0.100, 0.020)  # CPU-seconds a request at speed 1
PATHS = ((0, 1, 2, 4), (0, 1, 3, 4))
NODE_CPUS = (4.0, 4.0, 2.0, 2.0)
NODE_SPEED = (1.0, 0.85, 1.15, 0.9)  # up to 34% apart, as the paper measured
LEVELS = (0.0, 0.25, 0.5, 0.75)  # the injector's share of a node
LEVEL_ODDS = (0.4, 0.3, 0.2, 0.1)  # how often each is drawn
SLOWDOWN = 1.0  # at 75%: work 56% slower (the paper: up to 57.6%)
RATE_HZ = (4.0, 9.0)  # an episode's rate jumps within this range
STEP_S = 10.0
MAX_REPLICAS = 6


RHO_MAX = 0.95


def replica_latency(work_s: float, load: float, cpus: float) -> float:
    """A replica's mean latency over a window: M/M/1-like below RHO_MAX, else that plus
    the mean wait behind a backlog growing at (rho - 1) windows' work a window."""
    if cpus <= 0.0:
        return math.inf
    rho = load / cpus
    if rho < RHO_MAX:
        return work_s / (cpus - load)
    return work_s / (cpus * (1.0 - RHO_MAX)) + max(rho - 1.0, 0.0) * STEP_S / 2.0


@dataclass(frozen=True)
class EnvParams:
    target_s: float = 1.0  # Lt
    node_cpus: tuple[float, ...] = NODE_CPUS
    node_speed: tuple[float, ...] = NODE_SPEED
    work_s: tuple[float, ...] = WORK_S
    paths: tuple[tuple[int, ...], ...] = PATHS
    rate_hz: tuple[float, float] = RATE_HZ
    interference_change: float = 0.1  # chance a node's level changes, per step
    rate_change: float = 0.05  # chance the rate jumps, per step
    noise: float = 0.05  # lognormal sigma of the measurements
    max_replicas: int = MAX_REPLICAS
    k: tuple[float, float, float] = (K1, K2, K3)  # Eq. 1's constants


@dataclass
class PipelineEnv:
    """The simulated pipeline: `placement[stage][node]` replicas, the nodes' interference."""

    params: EnvParams = field(default_factory=EnvParams)
    seed: int = 0

    def __post_init__(self) -> None:
        p = self.params
        self.stages, self.nodes = len(p.work_s), len(p.node_cpus)
        self.rng = np.random.default_rng(self.seed)
        self.placement = np.zeros((self.stages, self.nodes), dtype=np.int64)
        self.level = np.zeros(self.nodes)
        self.rate = 0.0
        self.obs: Observation | None = None
        self.neighbours: list[PipelineEnv] = []  # other pipelines on the same nodes

    # --- the episode ---------------------------------------------------------------------

    def reset(self, replicas: Sequence[int] | None = None) -> Observation:
        """A new episode: `replicas` a stage (one by default) spread over the nodes, the
        interference and rate drawn afresh."""
        self.deploy(replicas)
        self.level = self.rng.choice(LEVELS, size=self.nodes, p=LEVEL_ODDS)
        self.rate = float(self.rng.uniform(*self.params.rate_hz))
        self.obs = self._measure()
        return self.obs

    def deploy(self, replicas: Sequence[int] | None = None) -> None:
        """`replicas` a stage (one by default) and nothing else, spread over the nodes."""
        self.placement[:] = 0
        for stage, count in enumerate(replicas or [1] * self.stages):
            for _ in range(count):
                self.placement[stage, self.spread_node(stage)] += 1

    def step(self, action: Action, space: ActionSpace) -> tuple[Observation, float]:
        """Carries out `action` (refused ones do nothing), moves a window on: the new
        observation and Eq. 1's reward."""
        assert self.obs is not None, "reset first"
        self.apply(action, space.scheduler)
        return self.advance()

    def advance(self) -> tuple[Observation, float]:
        """A window on from the present deployment: the observation and its reward."""
        p = self.params
        change = self.rng.random(self.nodes) < p.interference_change
        drawn = self.rng.choice(LEVELS, size=self.nodes, p=LEVEL_ODDS)
        self.level = np.where(change, drawn, self.level)
        if self.rng.random() < p.rate_change:
            self.rate = float(self.rng.uniform(*p.rate_hz))
        return self.measure(), self.reward()

    def measure(self) -> Observation:
        """The window at the present levels and rate: its arrivals drawn, its latencies
        measured (kept as `obs`)."""
        self.obs = self._measure()
        return self.obs

    def reward(self) -> float:
        assert self.obs is not None
        return reward(self.obs.latency_s, self.params.target_s, self.servers(),
                      self.replicas(), self.nodes, self.stages, *self.params.k)

    def servers(self) -> int:
        return int(np.count_nonzero(self.placement.sum(axis=0)))

    def replicas(self) -> int:
        return int(self.placement.sum())

    # --- actions -------------------------------------------------------------------------

    def apply(self, action: Action, scheduler: str) -> bool:
        """Carries out `action` unless a limit refuses it (False)."""
        assert self.obs is not None
        s = action.stage
        if action.kind == "none":
            return False
        count = int(self.placement[s].sum())
        if action.kind == "out":
            if count >= self.params.max_replicas:
                return False
            node = action.destination if action.destination is not None \
                else self.profile_node(s) if scheduler == "profile" else self.spread_node(s)
            self.placement[s, node] += 1
            return True
        source = move_source(self.obs, s) if action.source is None else action.source
        if source is None or self.placement[s, source] == 0:
            return False
        if action.kind == "in":
            if count <= 1:
                return False
            self.placement[s, source] -= 1
            return True
        destination = self.destination(action, scheduler, source)
        if destination is None or destination == source:
            return False
        self.placement[s, source] -= 1
        self.placement[s, destination] += 1
        return True

    def destination(self, action: Action, scheduler: str, source: int) -> int | None:
        assert self.obs is not None
        s = action.stage
        if scheduler == "fullmap":
            return action.destination
        if scheduler == "custom":
            candidates = custom_candidates(self.obs, s)
            rank = action.destination
            return candidates[rank] if rank is not None and rank < len(candidates) else None
        if scheduler == "swarm":
            return self.spread_node(s, leaving=source)
        return self.profile_node(s, leaving=source)

    def spread_node(self, stage: int, leaving: int | None = None,
                    among: Sequence[int] | None = None) -> int:
        """Swarm's spread: the node with fewest of the stage's tasks, then fewest tasks
        (blind to interference and speed), never the one a task leaves; only `among` those
        nodes when given (a placement constraint)."""
        order = [n for n in range(self.nodes) if n != leaving]
        if among is not None:
            order = [n for n in order if n in among] or order  # none of them: anywhere
        tasks = self.tasks()
        return min(order, key=lambda n: (self.placement[stage, n], tasks[n], n))

    def swarm_scale(self, stage: int, count: int, among: Sequence[int] | None = None) -> None:
        """Swarm scaling the stage's service to `count` tasks: new ones spread (`among` those
        nodes when given), removed ones taken from the nodes with most of its tasks, then
        most tasks (swarmkit's scale-down keeps the service balanced)."""
        while self.placement[stage].sum() < count:
            self.placement[stage, self.spread_node(stage, among=among)] += 1
        while self.placement[stage].sum() > max(count, 1):
            tasks = self.tasks()
            on = np.nonzero(self.placement[stage])[0]
            self.placement[stage, max(on, key=lambda n: (self.placement[stage, n], tasks[n],
                                                           -n))] -= 1

    def swarm_move(self, stage: int, node: int, among: Sequence[int] | None = None) -> None:
        """The stage's tasks on `node` rescheduled by Swarm off it (a node.id!= constraint),
        spread over the others (`among` those when given)."""
        while self.placement[stage, node] > 0:
            self.placement[stage, node] -= 1
            self.placement[stage, self.spread_node(stage, leaving=node, among=among)] += 1

    def tasks(self) -> np.ndarray:
        """Every pipeline's replicas on each node."""
        return self.placement.sum(axis=0) + sum(
            (o.placement.sum(axis=0) for o in self.neighbours), np.zeros(self.nodes, np.int64))

    def profile_node(self, stage: int, leaving: int | None = None) -> int:
        """The offline profile's choice: the node where a replica of the stage would
        answer soonest, by the profiled pace of each node at its present interference level
        and the CPU its present tasks leave (the profile knows speed and slowdown, not the
        load to come)."""
        order = [n for n in range(self.nodes) if n != leaving]
        demand = self._node_demand()

        def latency(n: int) -> float:
            pace = self._pace(n)
            left = self.params.node_cpus[n] * (1.0 - self.level[n]) - demand[n]
            cpus = min(1.0, max(left, 0.0))
            work = self.params.work_s[stage] / pace
            share = self.rate * work / (self.placement[stage].sum() + 1)
            return work / (cpus - share) if cpus > share else math.inf

        return min(order, key=lambda n: (latency(n), n))

    # --- the model -----------------------------------------------------------------------

    def _pace(self, node: int) -> float:
        return self.params.node_speed[node] / (1.0 + SLOWDOWN * self.level[node] ** 2)

    def _demand(self) -> np.ndarray:
        """CPUs each stage's replicas use on each node (their work at the node's pace x
        their rate), stages x nodes."""
        p = self.params
        paces = np.array([self._pace(n) for n in range(self.nodes)])
        per_replica = self.rate / self.placement.sum(axis=1, keepdims=True) \
            * np.asarray(p.work_s)[:, None] / paces[None, :]
        return self.placement * per_replica

    def _node_demand(self) -> np.ndarray:
        """CPUs every pipeline's replicas use on each node."""
        return self._demand().sum(axis=0) + sum(
            (o._demand().sum(axis=0) for o in self.neighbours), np.zeros(self.nodes))

    def _replica_cpus(self) -> np.ndarray:
        """The CPU (at speed 1: scaler.py's units) a replica of each stage has on each node
        (stages x nodes; 0 where it does not run)."""
        p = self.params
        demand = self._demand()
        paces = np.array([self._pace(n) for n in range(self.nodes)])
        left = np.asarray(p.node_cpus) * (1.0 - self.level) - self._node_demand()
        mine = np.maximum(left[None, :] + demand, 0.0) / np.maximum(self.placement, 1)
        return np.where(self.placement > 0, np.minimum(mine, 1.0) * paces[None, :], 0.0)

    def replica_cpus(self, stage: int) -> dict[int, float]:
        """Node: the CPU (at speed 1) a replica of `stage` has there."""
        cpus = self._replica_cpus()[stage]
        return {int(n): float(cpus[n]) for n in np.nonzero(self.placement[stage])[0]}

    def room_cpus(self, stage: int) -> dict[int, float]:
        """Node the stage does not run on: the CPU (at speed 1) a new replica could have."""
        p = self.params
        demand = self._node_demand()
        return {n: min(1.0, max(p.node_cpus[n] * (1.0 - self.level[n]) - demand[n], 0.0))
                * self._pace(n) for n in range(self.nodes) if self.placement[stage, n] == 0}

    def _measure(self) -> Observation:
        p = self.params
        arrived = self.rng.poisson(self.rate * STEP_S) / STEP_S
        demand = self._node_demand()
        cpus = self._replica_cpus()
        replicas = self.placement.sum(axis=1)
        noise = self.rng.lognormal(0.0, p.noise, size=self.stages)
        stage_latency, throttled = [], []
        for s in range(self.stages):
            load = arrived * p.work_s[s] / replicas[s]  # CPU-seconds a second at speed 1
            on = np.nonzero(self.placement[s])[0]
            lat = [replica_latency(p.work_s[s], load, float(cpus[s, n])) for n in on]
            counts = self.placement[s, on]
            stage_latency.append(float(np.dot(counts, lat)) / replicas[s] * float(noise[s]))
            busy = [min(load / cpus[s, n], 1.0) if cpus[s, n] > 0 else 1.0 for n in on]
            throttled.append(float(np.dot(counts, busy)) / replicas[s])
        latency = max(sum(stage_latency[s] for s in path) for path in p.paths)
        pressure = np.clip(self.level * (0.5 + 0.5 * np.minimum(
            demand / np.maximum(np.asarray(p.node_cpus) * (1.0 - self.level), 1e-9), 1.0)),
            0.0, 1.0)
        usage = (demand + self.level * np.asarray(p.node_cpus)) / np.asarray(p.node_cpus)
        return Observation(latency, p.target_s, tuple(stage_latency), tuple(throttled),
                           tuple(tuple(int(x) for x in row) for row in self.placement),
                           tuple(float(x) for x in pressure), tuple(float(x) for x in usage),
                           p.max_replicas)
