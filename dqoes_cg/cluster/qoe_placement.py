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
from collections.abc import Sequence
from itertools import chain

from . import placement as decision
from .view import Actions, ClusterView, TaskView

log = logging.getLogger(__name__)

REPORTED = ("G", "S", "B", "idle", "pending")


class DecisionViews:
    """The manager's views as the decision reads them (nodes and services by their IDs),
    view after view: a node's tasks are made again only when the manager made them again
    (a new list in the view's `by_node`), and are then the same object for the decision,
    which follows what changed the same way."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[Sequence[TaskView], tuple[decision.TaskView, ...]]] = {}

    def of(self, view: ClusterView, now: float) -> decision.ClusterView:
        nodes = tuple(
            decision.NodeView(n.id, n.budget_cpus, ready=n.reachable,
                              availability=decision.Availability(n.availability),
                              paused_by_placement=n.paused_by_placement)
            for n in view.nodes if n.budget_cpus is not None
            and n.availability in tuple(decision.Availability))
        groups = view.task_groups()
        made = {}
        for node_id, tasks in groups.items():
            known = self._made.get(node_id)
            if known is None or known[0] is not tasks:
                known = tasks, tuple(
                    decision.TaskView(t.id, t.service_id, t.node_id, t.cls, t.target_s,
                                      t.measured_s, t.cpu_usage_cores, t.cpu_limit_cores)
                    for t in tasks if t.cls in REPORTED)
            made[node_id] = known
        self._made = made
        services = tuple(
            decision.ServiceView(s.id, s.replicas if s.mode == "replicated" and s.start_first
                                 else None, s.running, s.updating, s.starting)
            for s in view.services)
        by_node = {node_id: converted for node_id, (_, converted) in made.items()}
        return decision.ClusterView(now, nodes, tuple(chain.from_iterable(by_node.values())),
                                    services, by_node)


class QoEPlacement:
    """A view.Placement: the QoE-aware decision, tick by tick."""

    def __init__(self, params: decision.PlacementParams | None = None) -> None:
        self.decision = decision.Placement(params)
        self._views = DecisionViews()
        self._unmoved: dict[str, str] = {}  # task id: why it does not move, as last logged

    def tick(self, view: ClusterView, now: float, actions: Actions) -> None:
        before = self.decision.stuck_since
        plan = self.decision.plan(self._views.of(view, now))
        self._log_stuck(view, before, now)
        self._log_unmoved(view, plan.unmoved)
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
        for task_id in sorted(after.keys() ^ before.keys()):
            task = self._task(view, task_id)
            if task is None:  # gone from the view
                continue
            if task_id in after:
                log.info("placement: task %s of service %s on node %s stuck (class %s, "
                         "%s against %s): its node cannot hold it in S beside the others",
                         task.id[:12], task.service, task.node, task.cls,
                         _ms(task.measured_s), _ms(task.target_s))
            else:
                log.info("placement: task %s of service %s on node %s no longer stuck after "
                         "%.0f s (class %s)", task.id[:12], task.service, task.node,
                         now - before[task_id], task.cls)


    def _log_unmoved(self, view: ClusterView, unmoved: dict[str, str]) -> None:
        """A line when a task stuck past the settle time does not move, and when why
        changes (not when its need, which the line shows, moves): a task can be stuck for
        good (its need fits no node), and say so."""
        for task_id, why in unmoved.items():
            task = self._task(view, task_id) if self._unmoved.get(task_id) != why else None
            if task is not None:
                need = self.decision.need_of(task_id)
                log.info("placement: task %s of service %s on node %s stuck (need %s), not "
                         "moved: %s", task.id[:12], task.service, task.node,
                         "unknown" if need is None else f"{need:.2f} CPUs", why)
        self._unmoved = dict(unmoved)

    def _task(self, view: ClusterView, task_id: str) -> TaskView | None:
        """The task of that ID in the view, None: gone. Among its node's tasks: a pass over
        all of them only for one the decision no longer has (not reported, or gone)."""
        return next((t for t in view.task_groups().get(
            self.decision.node_of(task_id) or "", ()) if t.id == task_id), None) \
            or view.task(task_id)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"
