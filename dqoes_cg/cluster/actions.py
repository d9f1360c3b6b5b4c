"""What a placement asks of the manager (view.Actions), checked against the tick's view and
carried out through Swarm after the tick.

Nodes are closed to new tasks with Swarm's availability `pause` (their tasks run on), marked
with the node label `dqoes-cluster.paused` so that the manager opens again only the nodes
it closed itself, never one an operator paused or drained.

Every action sets the nodes a service is kept off: a `node.id!=ID` placement constraint
each, which the manager alone adds and removes (it records them in the service label
`dqoes-cluster.avoid`: swarmapi.set_avoid). Why constraints on the service, and not node
labels: a constraint changed alone makes Swarm replace only the tasks on nodes that no
longer satisfy it, with the service's own rolling update (start-first: the new task runs
before the old one stops), so a move never leaves the service short of replicas and touches
no other service; a node label in a constraint would be enforced by stopping every
matching task on that node at once, of every service, and starting them again elsewhere.

A service's replicas (`scale`, pipelines' stages: scaling.py) change in the same update as
its constraints: Swarm starts the new tasks where the constraints allow, or stops tasks,
and moves none.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from ..engines.client import Engine, EngineError
from . import swarmapi
from .view import ClusterView, ServiceView

log = logging.getLogger(__name__)

QUIET_S = 60.0  # the same refusal is logged once a minute at most


@dataclass(frozen=True)
class Update:
    """One Swarm update a tick asks for: a node closed to new tasks or opened again
    (`node_id`, `paused`), or the nodes a service is kept off (`service_id`, `avoid`) and
    perhaps its replicas (`replicas`; None: unchanged)."""

    what: str  # which, to what, and why: "service web: moving its tasks off node2 (...)"
    node_id: str | None = None
    paused: bool = False
    service_id: str | None = None
    avoid: frozenset[str] = frozenset()
    replicas: int | None = None

    def apply(self, engine: Engine) -> None:
        if self.service_id is not None:
            swarmapi.update_service(engine, self.service_id, self.avoid, self.replicas)
        elif self.node_id is not None:
            swarmapi.set_paused(engine, self.node_id, self.paused)


class SwarmActions:
    """The actions of one tick (a view.Actions): the last one asked per service wins.
    `quiet` (refusal: when last logged) outlives the tick."""

    def __init__(self, view: ClusterView, now: float, quiet: dict[str, float]) -> None:
        self.view = view
        self.wanted: dict[str, tuple[frozenset[str], str]] = {}  # service: (avoid, why)
        self.paused: dict[str, tuple[bool, str]] = {}  # node: (pause it, why)
        self.scaled: dict[str, tuple[int, str]] = {}  # service: (replicas, why)
        self._now = now
        self._quiet = quiet

    def move_away(self, service_id: str, node_id: str, why: str = "") -> None:
        service = self._service(service_id, "move")
        if service is None:
            return
        refused = ("a global service runs on every node" if service.mode != "replicated" else
                   "its update order is not start-first: a move would stop a task before "
                   "its replacement runs" if not service.start_first else
                   "Swarm is updating it" if service.updating else
                   # a constraint changed while a start-first replacement starts makes Swarm
                   # keep the replacement and stop the old task at once
                   "Swarm is starting a task of it" if service.starting else None)
        if refused is not None:
            self._refuse(service, "move", refused)
            return
        node = self.view.node(node_id)
        self._want(service, self._avoided(service) | {node_id},
                   f"moving its tasks off {node.name if node else node_id}"
                   + (f" ({why})" if why else ""))

    def prefer(self, service_id: str, node_ids: Collection[str]) -> None:
        service = self._service(service_id, "prefer")
        if service is None:
            return
        running = {t.node_id for t in self.view.tasks if t.service_id == service_id}
        avoid = {n.id for n in self.view.nodes
                 if n.id not in node_ids and n.id not in running}
        self._want(service, (self._avoided(service) - set(node_ids)) | avoid,
                   "new tasks on " + ", ".join(sorted(self._names(node_ids))))

    def scale(self, service_id: str, replicas: int, why: str = "") -> None:
        service = self._service(service_id, "scale")
        if service is None:
            return
        if service.mode != "replicated" or replicas < 1:
            self._refuse(service, f"scale to {replicas}",
                         "a global service runs on every node" if service.mode != "replicated"
                         else "never below one replica")
        elif service.updating:
            self._refuse(service, f"scale to {replicas}", "Swarm is updating it")
        else:
            self.scaled[service_id] = (replicas, why or f"{replicas} replicas")

    def release(self, service_id: str) -> None:
        service = self._service(service_id, "release")
        if service is not None:
            self._want(service, frozenset(), "anywhere again")

    def close_node(self, node_id: str, why: str = "full") -> None:
        node = self.view.node(node_id)
        if node is None or node.availability != "active":
            return
        others = [n for n in self.view.nodes if n.id != node_id and n.swarm_state == "ready"
                  and n.availability == "active" and not self.paused.get(n.id, (False,))[0]]
        if others:
            self.paused[node_id] = (True, why)
        else:
            key = f"close {node_id}"
            if self._now - self._quiet.get(key, -QUIET_S) >= QUIET_S:
                self._quiet[key] = self._now
                log.warning("placement: closing node %s to new tasks refused: no other "
                            "active node would be left", node.name)

    def open_node(self, node_id: str, why: str = "") -> None:
        node = self.view.node(node_id)
        if node is None or not node.paused_by_placement:
            return
        # On any update of an active node, Swarm (its constraint enforcer) stops at once each
        # task there whose service's constraints now exclude the node: opened while a task
        # moves off it, the node would lose that task before its start-first replacement
        # runs. It opens once the task has gone.
        services = (self.view.service(t.service_id) for t in self.view.tasks
                    if t.node_id == node_id)
        if not any(node_id in self._avoided(s) for s in services if s is not None):
            self.paused[node_id] = (False, why)

    def updates(self) -> list[Update]:
        """The node and service updates asked for that change something, each once."""
        updates = []
        for nid, (paused, why) in self.paused.items():
            node = self.view.node(nid)
            what = "closing to new tasks" if paused else "opening to new tasks again"
            updates.append(Update(f"node {node.name if node else nid}: {what}"
                                  + (f" ({why})" if why else ""), node_id=nid, paused=paused))
        for sid in {**self.wanted, **self.scaled}:
            service = self.view.service(sid)
            if service is None:
                continue
            avoid, placed = self.wanted.get(sid, (frozenset(service.avoid), ""))
            replicas, scaled = self.scaled.get(sid, (None, ""))
            moves = avoid != frozenset(service.avoid)
            if replicas == service.replicas:
                replicas = None
            if moves or replicas is not None:
                why = "; ".join(w for w in (scaled if replicas is not None else "",
                                            placed if moves else "") if w)
                updates.append(Update(f"service {service.name}: {why}", service_id=sid,
                                      avoid=avoid, replicas=replicas))
        return updates

    def carry_out(self, engine: Engine) -> None:
        """Makes the updates asked for (errors are logged)."""
        for update in self.updates():
            try:
                update.apply(engine)
                log.info("placement: %s", update.what)
            except EngineError as e:
                log.warning("placement: %s: failed: %s", update.what, e)

    # ------------------------------------------------------------------------------------

    def _service(self, service_id: str, what: str) -> ServiceView | None:
        service = self.view.service(service_id)
        if service is None:
            log.warning("placement: %s: no service %s of dqoes-cg's", what, service_id)
        return service

    def _avoided(self, service: ServiceView) -> frozenset[str]:
        wanted = self.wanted.get(service.id)
        return wanted[0] if wanted else frozenset(service.avoid)

    def _want(self, service: ServiceView, avoid: Collection[str], why: str) -> None:
        usable = [n for n in self.view.nodes if n.swarm_state == "ready"
                  and n.availability == "active" and n.id not in avoid]
        if usable:
            self.wanted[service.id] = (frozenset(avoid), why)
        else:
            self._refuse(service, why, "no ready node would be left to it")

    def _names(self, node_ids: Collection[str]) -> list[str]:
        return [n.name for n in self.view.nodes if n.id in node_ids]

    def _refuse(self, service: ServiceView, what: str, why: str) -> None:
        key = f"{service.id} {what} {why}"
        if self._now - self._quiet.get(key, -QUIET_S) >= QUIET_S:
            self._quiet[key] = self._now
            log.warning("placement: service %s: %s refused: %s", service.name, what, why)
