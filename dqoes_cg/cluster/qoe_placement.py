"""QoE-aware placement in the manager (`dqoes-manager --placement qoe`): the decision of
placement.py on the manager's view, carried out with the manager's actions.

Each tick the cluster view becomes the decision's view (nodes and services by Swarm ID; a
node counts as ready while it is reachable, with the budget its dqoesd reported; only the
tasks an accepted report covers). A move of a service's tasks from node A to node B is
`prefer(service, [B])` then `move_away(service, A)`: the service is kept off every node
but B and those where its other tasks run, so Swarm's start-first rolling update replaces
its tasks on A with tasks on B, and the service never runs fewer replicas than it asks for.
Once the decision has the move settled (the tasks left A, or it gave up), `release` lifts
the constraints: the tasks stay where they are, and new ones may go anywhere again.

Hysteresis and the cap are the decision's (PlacementParams: a task stuck for settle_s, at
most max_moves_per_minute, a moved service held for hold_s). Only replicated services with
a start-first update order are moved.

New tasks: a node that could not take a task of the cluster's expected need is closed to
new tasks (`close_node`: Swarm's availability pause, its tasks run on), and opened again
(`open_node`) once it could take one and a half times that need for settle_s; when every
node is full none stays closed (Swarm spreads), and one always stays open.
"""

from __future__ import annotations

import logging

from . import placement as decision
from .view import Actions, ClusterView

log = logging.getLogger(__name__)

REPORTED = ("G", "S", "B", "idle", "pending")


def decision_view(view: ClusterView, now: float) -> decision.ClusterView:
    """The manager's view as the decision reads it (nodes and services by their IDs)."""
    nodes = tuple(
        decision.NodeView(n.id, n.budget_cpus, ready=n.reachable,
                          availability=decision.Availability(n.availability),
                          paused_by_placement=n.paused_by_placement)
        for n in view.nodes if n.budget_cpus is not None
        and n.availability in tuple(decision.Availability))
    tasks = tuple(
        decision.TaskView(t.id, t.service_id, t.node_id, t.cls, t.target_s, t.measured_s,
                          t.cpu_usage_cores, t.cpu_limit_cores)
        for t in view.tasks if t.cls in REPORTED)
    services = tuple(
        decision.ServiceView(s.id, s.replicas if s.mode == "replicated" and s.start_first
                             else None, s.running, s.updating)
        for s in view.services)
    return decision.ClusterView(now, nodes, tasks, services)


class QoEPlacement:
    """A view.Placement: the QoE-aware decision, tick by tick."""

    def __init__(self, params: decision.PlacementParams | None = None) -> None:
        self.decision = decision.Placement(params)

    def tick(self, view: ClusterView, now: float, actions: Actions) -> None:
        before = self.decision.stuck_since
        plan = self.decision.plan(decision_view(view, now))
        self._log_stuck(view, before, now)
        for move in plan.moves:
            log.info("placement: service %s: its tasks on node %s move to node %s (need "
                     "%.2f CPUs, %.2f left there)", move.service, move.source,
                     move.destination, move.need_cores, move.room_cores)
            actions.prefer(move.service, [move.destination])
            destination = view.node(move.destination)
            actions.move_away(move.service, move.source,
                              f"to {destination.name if destination else move.destination}: "
                              f"stuck out of S, needs {move.need_cores:.2f} CPUs, "
                              f"{move.room_cores:.2f} left there")
        for service_id in plan.settled:
            actions.release(service_id)
        need = self.decision.expected_need()
        for node_id in plan.pause:
            actions.close_node(node_id, "full: no room for a new task" if need is None else
                               f"full: no room for a new task of {need:.2f} CPUs")
        for node_id in plan.resume:
            actions.open_node(node_id, "room again")

    def _log_stuck(self, view: ClusterView, before: dict[str, float], now: float) -> None:
        """A line when a task becomes stuck and when it stops being: how long a move waits,
        and on what, can be read from the log."""
        after = self.decision.stuck_since
        for task in view.tasks:
            if task.id in after and task.id not in before:
                log.info("placement: task %s of service %s on node %s stuck (class %s, "
                         "%s against %s): its node cannot hold it in S beside the others",
                         task.id[:12], task.service, task.node, task.cls,
                         _ms(task.measured_s), _ms(task.target_s))
            elif task.id in before and task.id not in after:
                log.info("placement: task %s of service %s on node %s no longer stuck after "
                         "%.0f s (class %s)", task.id[:12], task.service, task.node,
                         now - before[task.id], task.cls)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"
