"""The model-based scaler (scaler.py) in the manager: each managed pipeline's stages as the
scaler reads them, from the tick's view, and its decisions as the manager's actions.

A stage's replicas, work per request, rate and share are its pipeline view's. The CPU one of
its replicas can have on a node is what the node's dqoesd budget leaves after the node's
other managed containers (budget - used + the stage's own usage there, over the last tick),
shared by its replicas there; a node counts only while it is reachable and every one of the
stage's tasks there is reported. A node with room for a new replica is a ready, active,
reachable node the stage does not run on, with its spare CPU. A stage is busy while Swarm
updates its service or runs another number of its tasks than it asks for (a scale or a move
in flight: start-first, a move runs one more for a while).

Decisions become actions: a scale is `scale` (with `prefer` to the nodes with room: the
service's placement constraints, Swarm's spread placing the new tasks among those nodes); a
move is `prefer` the nodes with room then `move_away` from the slow one (Swarm's start-first
rolling update: never fewer tasks running than asked); once a steered stage is placed,
`release` lifts its constraints (its tasks stay where they are).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from .scaler import PipelineLoad, Scaler, ScalerParams, StageLoad
from .view import Actions, ClusterView, PipelineView, ServiceView

log = logging.getLogger(__name__)


def pipeline_loads(view: ClusterView) -> list[PipelineLoad]:
    """The managed pipelines of the view, as the scaler reads them."""
    return [PipelineLoad(p.name, _stages(view, p), p.feasible)
            for p in view.pipelines if p.error is None]


def _stages(view: ClusterView, pipeline: PipelineView) -> tuple[StageLoad, ...]:
    stages = []
    for st in pipeline.stages:
        service = view.service(st.service_id)
        tasks = view.tasks_of(st.service_id)
        on_node: dict[str, list[float | None]] = defaultdict(list)
        for t in tasks:
            if t.state == "running" and t.node_id:
                on_node[t.node_id].append(t.cpu_usage_cores)
        replica_cpus = {}
        for node_id, usages in on_node.items():
            node = view.node(node_id)
            if node is None or not node.reachable or node.budget_cpus is None \
                    or node.used_cpus is None or any(u is None for u in usages):
                continue
            own = sum(u for u in usages if u is not None)
            replica_cpus[node_id] = max(0.0, node.budget_cpus - node.used_cpus + own) \
                / len(usages)
        room = {n.id: n.spare_cpus for n in view.nodes
                if n.reachable and n.swarm_state == "ready" and n.availability == "active"
                and n.spare_cpus is not None and n.id not in on_node}
        stages.append(StageLoad(st.service_id, st.name,
                                service.replicas if service and service.mode == "replicated"
                                else None, st.work_s, st.rate_hz, st.target_s, replica_cpus,
                                room, busy(service), st.measured_s))
    return tuple(stages)


def busy(service: ServiceView | None) -> str | None:
    """Why Swarm is not done with the service (a scale or a move in flight), or None."""
    if service is None:
        return "not in Swarm's list"
    if service.updating:
        return "Swarm is updating it"
    if service.replicas is not None and service.running != service.replicas:
        return f"{service.running} of its {service.replicas} tasks running"
    return None


class ModelScaling:
    """The model-based scaler, tick by tick (the manager's `scaling`)."""

    def __init__(self, params: ScalerParams | None = None) -> None:
        self.scaler = Scaler(params or ScalerParams())

    def tick(self, view: ClusterView, now: float, actions: Actions) -> None:
        plan = self.scaler.plan(now, pipeline_loads(view))
        for d in plan.decisions:
            why = f"pipeline {d.pipeline}: {d.why}"
            log.info("scaler: stage %s of %s", d.stage, why)
            if d.prefer:
                actions.prefer(d.service_id, d.prefer)
            if d.move_from is not None:
                actions.move_away(d.service_id, d.move_from, why)
            else:
                actions.scale(d.service_id, d.replicas, why)
        for service_id in plan.settled:
            actions.release(service_id)
