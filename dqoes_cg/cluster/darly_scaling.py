"""Darly's agent (darly.py) in the manager (`dqoes-manager --scheduler fullmap|custom|swarm|
profile`): each managed pipeline's observation from the tick's view, the agent's action as
the manager's actions, within the model-based scaler's limits.

The observation: La and Lt are the pipeline view's (its measured mean along its longest path,
its target), each stage's latency its view's; a stage's throttling is its tasks' mean; the
nodes are the ready, reachable ones by ID, each with its CPU pressure and its managed
containers' usage over its dqoesd budget. A pipeline is evaluated every `interval_s` while
every stage is measured. The agent is one per pipeline, sized by its stages and nodes; its
weights are loaded from, and saved every `save_s` to, `weights_dir`/darly-PIPELINE.npz (a
file for another size, or not valid, is logged and the agent starts afresh).

The agent learns online from each evaluation's reward (Eq. 1) unless `learn` is off, and
explores (epsilon-greedy) only when `explore` is on. Its action is refused (nothing is done)
when: the stage's service is not a replicated one, Swarm is updating it or runs another
number of its tasks than it asks (an action in flight), it was acted on less than `hold_s`
ago, the pipeline had `max_actions_per_minute` actions in the last minute, a scale in would
leave it no replica or a scale out more than `max_replicas`, or a move would leave or enter
a node that is not active (paused or drained by an operator: untouched) or its destination
is not a ready, reachable node. An action is judged once its stage settled and its hold is
over (the pipeline waits meanwhile): when the quotient La/Lt got worse and is over 1, it is
undone (a scale reversed; a moved replica sent back), once.

Destinations of a move: fullmap and custom, the agent's; swarm, Swarm's own spread (the
tasks are only moved off their node); profile, the node where the stage's tasks answered
fastest so far (the profile it keeps of each stage on each node, then the least pressured).
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .darly import (
    Action,
    ActionSpace,
    Agent,
    AgentParams,
    Observation,
    custom_candidates,
    feature_count,
    features,
    move_source,
    reward,
)
from .scaling import busy
from .view import Actions, ClusterView, NodeView, PipelineView, ServiceView

log = logging.getLogger(__name__)

UNIT_S = 60.0  # the actions cap's window
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a pipeline name in a file name
PROFILE_WEIGHT = 0.3  # of a new latency in a stage's profile on a node


@dataclass(frozen=True)
class DarlyParams:
    scheduler: str = "custom"
    interval_s: float = 10.0  # a pipeline's decision window (the simulator's)
    hold_s: float = 30.0  # a stage acted on is left alone this long
    max_actions_per_minute: int = 2  # per pipeline
    max_replicas: int = 32
    learn: bool = True
    explore: bool = False
    weights_dir: Path | None = None
    save_s: float = 300.0
    seed: int = 0


@dataclass(frozen=True)
class _Undo:
    """An action to judge, and what undoing it needs."""

    service_id: str
    kind: str  # out, in, move
    source: str = ""  # a move's: the node its replica left
    nodes: frozenset[str] = frozenset()  # a move's: where the stage ran before it


@dataclass
class _Pipeline:
    """One pipeline's agent and its memory from one evaluation to the next."""

    agent: Agent
    space: ActionSpace
    nodes: tuple[str, ...]  # its layout: node IDs, in the state's order
    evaluated: float = -math.inf
    saved: float = -math.inf
    state: np.ndarray | None = None
    action: int = 0
    quotient: float = math.nan  # before the last action
    undo: _Undo | None = None  # the last action, until judged
    actions: list[float] = field(default_factory=list)


class DarlyScaling:
    """The learned scheduler, tick by tick (the manager's `scaling`)."""

    def __init__(self, params: DarlyParams | None = None) -> None:
        self.params = params or DarlyParams()
        ActionSpace(self.params.scheduler, 1, 1)  # refuses an unknown scheduler now
        self.pipelines: dict[str, _Pipeline] = {}
        self.acted: dict[str, float] = {}  # stage service: its last action, when
        self.steered: set[str] = set()  # stages whose constraints a move set
        self.profile: dict[tuple[str, str], float] = {}  # (stage, node): its latency there

    def tick(self, view: ClusterView, now: float, actions: Actions) -> None:
        self._release(view, now, actions)
        for p in view.pipelines:
            if p.error is None:
                self._evaluate(view, p, now, actions)

    # --- one pipeline --------------------------------------------------------------------

    def _evaluate(self, view: ClusterView, p: PipelineView, now: float,
                  actions: Actions) -> None:
        nodes = tuple(n.id for n in view.nodes if n.reachable and n.swarm_state == "ready")
        obs = self._observe(view, p, nodes)
        if obs is None:
            return
        mine = self._agent(p, nodes)
        if now - mine.evaluated < self.params.interval_s:
            return
        mine.evaluated = now
        state = features(obs)
        quotient = obs.latency_s / obs.target_s
        undo = mine.undo
        if undo is not None:  # judged once its stage settled and its windows saw it
            service = view.service(undo.service_id)
            if service is not None and self._in_flight(undo.service_id, service, now):
                return
            mine.undo = None
        if mine.state is not None and self.params.learn:
            servers = sum(1 for i in range(len(nodes)) if any(r[i] for r in obs.placement))
            replicas = sum(sum(row) for row in obs.placement)
            mine.agent.remember(mine.state, mine.action,
                                reward(obs.latency_s, obs.target_s, max(servers, 1),
                                       max(replicas, 1), len(nodes), len(p.stages)),
                                state, False)
            mine.agent.learn()
        mine.actions = [t for t in mine.actions if now - t < UNIT_S]
        if undo is not None and quotient > max(1.0, mine.quotient):
            self._undo(view, p, mine, undo, now, actions, quotient)
            mine.state = None  # what follows an undo is not the agent's doing
        else:
            mine.state = state
            mine.action = mine.agent.act(state, explore=self.params.explore)
            mine.quotient = quotient
            self._carry_out(view, p, obs, mine, mine.space.decode(mine.action), now, actions)
        self._save(p.name, mine, now)

    def _observe(self, view: ClusterView, p: PipelineView, nodes: tuple[str, ...]
                 ) -> Observation | None:
        """None while the pipeline or a stage is not measured, or it has no node."""
        if not nodes or p.target_s is None or p.measured_s is None or not p.stages:
            return None
        latency = [st.measured_s for st in p.stages]
        if any(v is None or not math.isfinite(v) or v < 0 for v in latency) or \
                not math.isfinite(p.measured_s):
            return None
        index = {n: i for i, n in enumerate(nodes)}
        placement, throttled = [], []
        for st in p.stages:
            row = [0] * len(nodes)
            ratios = []
            for t in view.tasks_of(st.service_id):
                if t.state == "running":
                    if t.node_id in index:
                        row[index[t.node_id]] += 1
                    if t.throttled is not None:
                        ratios.append(t.throttled)
                    self._profile(st.service_id, t.node_id, t.mean_s)
            placement.append(tuple(row))
            throttled.append(sum(ratios) / len(ratios) if ratios else 0.0)
        views = [view.node(n) for n in nodes]
        return Observation(
            p.measured_s, p.target_s, tuple(v for v in latency if v is not None),
            tuple(throttled), tuple(placement),
            tuple(_finite(n.cpu_pressure) if n else 0.0 for n in views),
            tuple(_usage(n) for n in views), self.params.max_replicas)

    def _profile(self, service_id: str, node_id: str, latency_s: float | None) -> None:
        if latency_s is None or not math.isfinite(latency_s) or latency_s < 0:
            return
        key = (service_id, node_id)
        old = self.profile.get(key)
        self.profile[key] = latency_s if old is None else \
            old + PROFILE_WEIGHT * (latency_s - old)

    def _agent(self, p: PipelineView, nodes: tuple[str, ...]) -> _Pipeline:
        mine = self.pipelines.get(p.name)
        if mine is not None and mine.nodes == nodes and \
                mine.space.stages == len(p.stages):
            return mine
        space = ActionSpace(self.params.scheduler, len(p.stages), len(nodes))
        agent = Agent(feature_count(len(p.stages), len(nodes)), space.size, AgentParams(),
                      seed=self.params.seed)
        path = self._path(p.name)
        if path is not None and path.exists():
            try:
                agent.load(path)
                log.info("darly: pipeline %s: weights from %s", p.name, path)
            except ValueError as e:
                log.warning("darly: pipeline %s: starting afresh: %s", p.name, e)
        mine = self.pipelines[p.name] = _Pipeline(agent, space, nodes)
        return mine

    def _path(self, name: str) -> Path | None:
        d = self.params.weights_dir
        return d / f"darly-{name}.npz" if d is not None and SAFE_NAME.fullmatch(name) \
            else None

    def _save(self, name: str, mine: _Pipeline, now: float) -> None:
        path = self._path(name)
        if path is None or now - mine.saved < self.params.save_s or not self.params.learn:
            return
        mine.saved = now
        partial = path.with_suffix(".partial")
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            mine.agent.save(partial)
            os.replace(partial, path)
        except OSError as e:
            log.warning("darly: pipeline %s: weights not saved: %s", name, e)

    # --- actions -------------------------------------------------------------------------

    def _carry_out(self, view: ClusterView, p: PipelineView, obs: Observation,
                   mine: _Pipeline, action: Action, now: float, actions: Actions) -> None:
        if action.kind == "none":
            return
        stage = p.stages[action.stage]
        sid = stage.service_id
        service = view.service(sid)
        why = self._refused(service, sid, mine, now)
        if why is not None:
            log.debug("darly: pipeline %s: %s of %s refused: %s", p.name, action.kind,
                      stage.name, why)
            return
        assert service is not None and service.replicas is not None  # _refused checked
        asked = service.replicas
        figures = f"La/Lt {obs.latency_s / obs.target_s:.2f}, {self.params.scheduler}"
        if action.kind in ("out", "in"):
            wanted = asked + (1 if action.kind == "out" else -1)
            if not 1 <= wanted <= self.params.max_replicas:
                return
            actions.scale(sid, wanted, f"pipeline {p.name}: darly scaling {action.kind} "
                                       f"{asked} -> {wanted} ({figures})")
            mine.undo = _Undo(sid, action.kind)
        else:
            source_index = move_source(obs, action.stage)
            if source_index is None:
                return
            source = mine.nodes[source_index]
            destination = self._destination(view, obs, mine, action, sid)
            if not _active(view.node(source)) or (destination is not None and (
                    destination == source or not _active(view.node(destination)))):
                return  # an operator's paused or drained node is left alone
            if destination is not None:
                actions.prefer(sid, (destination,))
                self.steered.add(sid)
            actions.move_away(sid, source, f"pipeline {p.name}: darly moving a replica "
                                           f"({figures})")
            mine.undo = _Undo(sid, "move", source, frozenset(
                t.node_id for t in view.tasks_of(sid) if t.state == "running"))
        self.acted[sid] = now
        mine.actions.append(now)

    def _destination(self, view: ClusterView, obs: Observation, mine: _Pipeline,
                     action: Action, service_id: str) -> str | None:
        """The node a moved replica goes to (None: Swarm's choice)."""
        scheduler = self.params.scheduler
        if scheduler == "fullmap":
            return mine.nodes[action.destination] if action.destination is not None else None
        if scheduler == "custom":
            candidates = custom_candidates(obs, action.stage)
            rank = action.destination
            return mine.nodes[candidates[rank]] \
                if rank is not None and rank < len(candidates) else None
        if scheduler == "swarm":
            return None
        free = [n for i, n in enumerate(mine.nodes) if obs.placement[action.stage][i] == 0
                and _active(view.node(n))]
        if not free:
            return None
        return min(free, key=lambda n: (self.profile.get((service_id, n), math.inf),
                                        obs.pressure[mine.nodes.index(n)], n))

    def _in_flight(self, sid: str, service: ServiceView, now: float) -> bool:
        """Swarm is carrying out an action on the stage, or its hold is not over."""
        return busy(service) is not None or \
            now - self.acted.get(sid, -math.inf) < self.params.hold_s

    def _refused(self, service: ServiceView | None, sid: str, mine: _Pipeline,
                 now: float) -> str | None:
        if service is None or service.mode != "replicated" or service.replicas is None:
            return "not a replicated service of Swarm's"
        if self._in_flight(sid, service, now):
            return "an action in flight, or acted on less than the hold ago"
        if len(mine.actions) >= self.params.max_actions_per_minute:
            return "the actions per minute are spent"
        return None

    def _undo(self, view: ClusterView, p: PipelineView, mine: _Pipeline, undo: _Undo,
              now: float, actions: Actions, quotient: float) -> None:
        """Reverses the last action (a scale; a move: the replica back to its node)."""
        service = view.service(undo.service_id)
        if self._refused(service, undo.service_id, mine, now) is not None:
            return
        assert service is not None and service.replicas is not None
        why = f"pipeline {p.name}: darly undoing its {undo.kind} (La/Lt " \
              f"{mine.quotient:.2f} -> {quotient:.2f})"
        if undo.kind in ("out", "in"):
            wanted = service.replicas + (-1 if undo.kind == "out" else 1)
            if not 1 <= wanted <= self.params.max_replicas:
                return
            actions.scale(undo.service_id, wanted, why)
        else:
            now_on = {t.node_id for t in view.tasks_of(undo.service_id)
                      if t.state == "running"}
            arrived = sorted(now_on - undo.nodes)
            if len(arrived) != 1 or not _active(view.node(undo.source)) \
                    or not _active(view.node(arrived[0])):
                return
            actions.prefer(undo.service_id, (undo.source,))
            actions.move_away(undo.service_id, arrived[0], why)
            self.steered.add(undo.service_id)
        log.info("darly: %s", why)
        self.acted[undo.service_id] = now
        mine.actions.append(now)

    def _release(self, view: ClusterView, now: float, actions: Actions) -> None:
        """Lifts the constraints of a moved stage once its tasks run and its hold is over."""
        for sid in sorted(self.steered):
            service = view.service(sid)
            if service is None:
                self.steered.discard(sid)
            elif not self._in_flight(sid, service, now):
                self.steered.discard(sid)
                actions.release(sid)


def _finite(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else 0.0


def _usage(node: NodeView | None) -> float:
    if node is None or node.budget_cpus is None or node.used_cpus is None \
            or node.budget_cpus <= 0:
        return 0.0
    return _finite(node.used_cpus / node.budget_cpus)


def _active(node: NodeView | None) -> bool:
    return node is not None and node.availability == "active" and node.reachable \
        and node.swarm_state == "ready"
