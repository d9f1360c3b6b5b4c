"""QoE-aware placement on a Swarm: from the cluster's view of one tick, which nodes to close
to new tasks and which services to move to another node. Pure: it reads a `ClusterView` and
returns a `Plan`; the manager carries a plan out (qoe_placement.py).

What a node can give
--------------------
A worker serving requests back to back at c CPUs takes p = w / c, so its usage times its
latency, w = r·p, is its work per request at any share, and w / o is the share (CPUs) at
which it meets its target o: its *need*. Needs are smoothed per task (an exponential
average of log w/o). On a node of budget B with n tasks, every task not in S keeps at least
the floor f = B/(2n), as the per-node policies do, and one in S is held at its need, under
the floor if its need is there; a task can be in S when its band reaches what it can use
(need/(1 + alpha) <= its most CPUs), and it then costs need - f beyond its floor (negative
under the floor: it frees CPU for the others).
The node *admits* the cheapest of those while their costs fit in B - n·f = B/2: the most of
its tasks that could be in S at once, whatever the per-node policy (the per-node oracle of
bench/experiments, on measured needs). A task whose need is not known yet (no window
measured) counts at the cluster's expected need: the median of the known ones.

Moves
-----
A task is *stuck* when its daemon classes it out of S and its node does not admit it: the
node has nothing left to give it without taking from others. A task stuck for `settle_s`
(out of it for less than half of that at a time: a window of few requests flips a class
for a tick) moves (its service's tasks on that node, through Swarm) to the node where it gains the
most: one that has room for it without displacing any task it admits now, keeps `margin` of
the mover's need to spare, and has the most room left. The move must raise the number
admitted on the two nodes together. Cheapest needs move first (each counts one).
Limits: `max_moves_per_minute` over the cluster; a moved service stays put for `hold_s`; one
move in flight per node (as source or destination) and per service; only replicated
services whose running tasks are all there and that Swarm is not updating; never a task of
a node that is not Ready, never onto one the operator paused or drained.

New tasks
---------
Swarm's scheduler places new tasks by count on active nodes. A node that could not admit a
new task of the expected need is *full*: it is paused (Swarm's `availability=pause`: its
tasks run on, no new one is scheduled there) at once, and made active again once it could
admit one of `resume_factor` times the expected need for `settle_s`: the gap between the two
thresholds and the wait are the hysteresis, and a node is paused or resumed at most once per
`settle_s`. When every node is full, none is kept paused: new tasks are then spread by count,
as Swarm would, rather than piled on one node. Placement pauses and resumes only nodes it
paused itself, and always leaves a node active.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

ALPHA = 0.10  # the per-node policies' tolerance band


class Availability(StrEnum):
    """A node's availability, as Swarm has it."""

    ACTIVE = "active"
    PAUSE = "pause"
    DRAIN = "drain"


@dataclass(frozen=True)
class NodeView:
    """A Swarm node as the manager sees it this tick."""

    name: str
    budget_cpus: float  # what its containers may use together (its dqoesd's --cpus)
    ready: bool = True  # Ready to the Swarm managers, and its dqoesd reporting
    availability: Availability = Availability.ACTIVE
    paused_by_placement: bool = False  # its pause is placement's (not the operator's)


@dataclass(frozen=True)
class TaskView:
    """A running task, as its node's dqoesd reports it."""

    id: str
    service: str
    node: str
    cls: str  # G, S, B, idle, pending
    target_s: float | None
    measured_s: float | None  # its metric over the last decision window
    usage_cores: float | None  # CPU it used over the last tick (or window)
    limit_cores: float | None = None  # its cpu.max, None: none
    max_cores: float | None = None  # the most CPU it can use, when known


@dataclass(frozen=True)
class ServiceView:
    name: str
    replicas: int | None  # what it asks for; None: a global service (never moved)
    running: int  # tasks running now
    updating: bool = False  # Swarm is rolling an update of it


@dataclass(frozen=True)
class ClusterView:
    now: float  # seconds, monotonic
    nodes: tuple[NodeView, ...]
    tasks: tuple[TaskView, ...]
    services: tuple[ServiceView, ...]


@dataclass(frozen=True)
class Move:
    """Move the service's tasks on `source` to `destination` (start-first: never fewer
    running than it asks for)."""

    service: str
    source: str
    destination: str
    need_cores: float  # the mover's estimated need
    room_cores: float  # what the destination has left after it


@dataclass
class Plan:
    """One tick's actions."""

    moves: list[Move] = field(default_factory=list)
    pause: list[str] = field(default_factory=list)  # nodes to close to new tasks
    resume: list[str] = field(default_factory=list)  # nodes to open again
    settled: list[str] = field(default_factory=list)  # services whose move is done (or
    #                                                    given up): give them back their
    #                                                    own placement

    def __bool__(self) -> bool:
        return bool(self.moves or self.pause or self.resume or self.settled)


@dataclass(frozen=True)
class PlacementParams:
    alpha: float = ALPHA
    settle_s: float = 60.0  # stuck this long before a move; roomy this long before a resume
    hold_s: float = 600.0  # a moved service is not moved again within this
    max_moves_per_minute: int = 2
    margin: float = 0.10  # of the mover's need, left spare on its destination
    resume_factor: float = 1.5  # a paused node reopens when it could take this x the expected
    move_timeout_s: float = 300.0  # a move not done by then is given up (settled)
    smoothing: float = 0.3  # gain of the exponential average of each task's log need

    def __post_init__(self) -> None:
        if self.max_moves_per_minute < 0 or self.settle_s < 0 or self.hold_s < 0:
            raise ValueError("settle_s, hold_s and max_moves_per_minute must be >= 0")
        if not 0.0 < self.smoothing <= 1.0 or self.resume_factor < 1.0 or self.margin < 0:
            raise ValueError("need 0 < smoothing <= 1, resume_factor >= 1, margin >= 0")


# --- what a node can give (pure functions) -------------------------------------------------


def raw_need(task: TaskView) -> float | None:
    """usage x measured / target (CPUs), or None when any is missing or not positive."""
    values = (task.usage_cores, task.measured_s, task.target_s)
    if any(v is None or not math.isfinite(v) or v <= 0.0 for v in values):
        return None
    return task.usage_cores * task.measured_s / task.target_s  # type: ignore[operator]


@dataclass(frozen=True)
class Load:
    """A task as the admission sees it."""

    key: str
    need: float  # CPUs
    most: float  # the most CPUs it can use


def admitted(budget: float, loads: list[Load], alpha: float) -> set[str]:
    """The keys of the most loads a node of `budget` CPUs could hold in S at once, each
    other one at the floor budget/(2n): cheapest cost over the floor first."""
    if not loads:
        return set()
    floor = budget / (2 * len(loads))
    costs = []
    for load in loads:
        most = min(load.most, budget)
        if load.need / (1.0 + alpha) <= most:
            costs.append((min(load.need, most) - floor, load.key))
    left = budget / 2.0
    chosen = set()
    for cost, key in sorted(costs):  # the negative costs first: they only free CPU
        if cost > left + 1e-12:
            break
        left -= cost
        chosen.add(key)
    return chosen


def room(budget: float, loads: list[Load], alpha: float) -> float:
    """What the node has left over its floors once it holds its admitted loads (CPUs)."""
    if not loads:
        return budget / 2.0
    floor = budget / (2 * len(loads))
    keep = admitted(budget, loads, alpha)
    return budget / 2.0 - sum(min(load.need, load.most, budget) - floor
                              for load in loads if load.key in keep)


def takes(budget: float, loads: list[Load], newcomer: Load, alpha: float,
          margin: float = 0.0) -> bool:
    """Whether the node has room for `newcomer` beside `loads` without displacing any load
    it admits now, with `margin` x its need left over."""
    before = admitted(budget, loads, alpha)
    after_loads = [*loads, newcomer]
    after = admitted(budget, after_loads, alpha)
    return newcomer.key in after and before <= after and \
        room(budget, after_loads, alpha) >= margin * newcomer.need - 1e-12


# --- the decision ---------------------------------------------------------------------------


@dataclass
class _Flight:
    move: Move
    since: float


class Placement:
    """The placement decision, tick by tick: `plan(view)`. It keeps what hysteresis needs
    (smoothed needs, since when each task is stuck and each node roomy, the moves made)
    and nothing Swarm does not also show: after a restart it starts afresh, cautious."""

    def __init__(self, params: PlacementParams | None = None) -> None:
        self.params = params or PlacementParams()
        self._log_need: dict[str, float] = {}  # task id: smoothed log need
        self._stuck_since: dict[str, float] = {}  # task id
        self._free_since: dict[str, float] = {}  # task id: out of stuck since, for a while
        self._roomy_since: dict[str, float] = {}  # paused node name
        self._toggled: dict[str, float] = {}  # node name: when placement last paused or
        #                                       resumed it
        self._moved_at: dict[str, float] = {}  # service: when its last move started
        self._recent: deque[float] = deque()  # when each move of the last minute started
        self._flights: dict[str, _Flight] = {}  # service: its move in flight
        self.moves_made = 0

    def plan(self, view: ClusterView) -> Plan:
        p = self.params
        plan = Plan()
        self._smooth(view)
        nodes = {n.name: n for n in view.nodes}
        services = {s.name: s for s in view.services}
        loads = self._loads(view, nodes)
        self._land(view, services, plan)

        stuck = self._find_stuck(view, nodes, loads)
        busy = {n for f in self._flights.values() for n in (f.move.source, f.move.destination)}
        while self._recent and self._recent[0] <= view.now - 60.0:
            self._recent.popleft()
        for task in sorted(stuck, key=lambda t: self._need(t) or 0.0):
            if len(self._recent) >= p.max_moves_per_minute:
                break
            if view.now - self._stuck_since[task.id] < p.settle_s or task.node in busy:
                continue
            move = self._destination(task, view, nodes, services, loads, busy)
            if move is None:
                continue
            plan.moves.append(move)
            self._flights[move.service] = _Flight(move, view.now)
            self._moved_at[move.service] = view.now
            self._recent.append(view.now)
            self.moves_made += 1
            busy |= {move.source, move.destination}
            movers = [ld for ld in loads[move.source] if ld.key in _task_keys(
                view, move.service, move.source)]
            loads[move.source] = [ld for ld in loads[move.source] if ld not in movers]
            loads[move.destination] = loads[move.destination] + movers

        self._open_or_close(view, nodes, loads, plan)
        return plan

    # -- needs ------------------------------------------------------------------------------

    def _smooth(self, view: ClusterView) -> None:
        g = self.params.smoothing
        seen = set()
        for task in view.tasks:
            seen.add(task.id)
            need = raw_need(task)
            if need is None:
                continue
            last = self._log_need.get(task.id)
            x = math.log(need)
            self._log_need[task.id] = x if last is None else last + g * (x - last)
        for gone in self._log_need.keys() - seen:
            del self._log_need[gone]
        for since in (self._stuck_since, self._free_since):
            for gone in since.keys() - seen:
                del since[gone]

    def _need(self, task: TaskView) -> float | None:
        x = self._log_need.get(task.id)
        return None if x is None else math.exp(x)

    def expected_need(self) -> float | None:
        """The need of a task not measured yet: the median of the known ones."""
        if not self._log_need:
            return None
        return math.exp(statistics.median(self._log_need.values()))

    def _loads(self, view: ClusterView, nodes: dict[str, NodeView]) -> dict[str, list[Load]]:
        """Each node's tasks as loads (unknown needs at the expected need, or at the node's
        even share when nothing is known)."""
        expected = self.expected_need()
        by_node: dict[str, list[TaskView]] = {name: [] for name in nodes}
        for task in view.tasks:
            if task.node in by_node:
                by_node[task.node].append(task)
        loads = {}
        for name, tasks in by_node.items():
            budget = nodes[name].budget_cpus
            even = budget / max(len(tasks), 1)
            loads[name] = [Load(t.id, self._need(t) or expected or even,
                                t.max_cores if t.max_cores is not None else budget)
                           for t in tasks]
        return loads

    # -- moves ------------------------------------------------------------------------------

    def _find_stuck(self, view: ClusterView, nodes: dict[str, NodeView],
                    loads: dict[str, list[Load]]) -> list[TaskView]:
        """Tasks out of S that their node does not admit (and since when, in
        _stuck_since)."""
        admits = {name: admitted(nodes[name].budget_cpus, ls, self.params.alpha)
                  for name, ls in loads.items()}
        stuck = []
        for task in view.tasks:
            node = nodes.get(task.node)
            if (node is not None and node.ready and task.cls in ("B", "G")
                    and self._need(task) is not None and task.id not in admits[task.node]):
                self._stuck_since.setdefault(task.id, view.now)
                self._free_since.pop(task.id, None)
                stuck.append(task)
            elif task.id in self._stuck_since:
                # A window of a few requests can put a task in S, or its need under what
                # its node could hold, for a tick: its clock restarts only once it has been
                # out of it for half the settle time.
                free = self._free_since.setdefault(task.id, view.now)
                if view.now - free >= self.params.settle_s / 2:
                    del self._stuck_since[task.id], self._free_since[task.id]
        return stuck

    def _destination(self, task: TaskView, view: ClusterView, nodes: dict[str, NodeView],
                     services: dict[str, ServiceView], loads: dict[str, list[Load]],
                     busy: set[str]) -> Move | None:
        p = self.params
        service = services.get(task.service)
        if (service is None or service.replicas is None or service.updating
                or service.running < service.replicas or task.service in self._flights
                or view.now - self._moved_at.get(task.service, -math.inf) < p.hold_s):
            return None
        keys = _task_keys(view, task.service, task.node)
        movers = [ld for ld in loads[task.node] if ld.key in keys]
        staying = [ld for ld in loads[task.node] if ld.key not in keys]
        source = nodes[task.node]
        before_src = len(admitted(source.budget_cpus, loads[task.node], p.alpha))
        after_src = len(admitted(source.budget_cpus, staying, p.alpha))
        best: tuple[float, str] | None = None
        for node in nodes.values():
            if (node.name == task.node or node.name in busy or not node.ready
                    or node.availability is not Availability.ACTIVE):
                continue
            here = loads[node.name]
            if not all(takes(node.budget_cpus, here, m, p.alpha, p.margin) for m in movers):
                continue
            after = here + movers
            gain = (after_src + len(admitted(node.budget_cpus, after, p.alpha))) - \
                (before_src + len(admitted(node.budget_cpus, here, p.alpha)))
            if gain < 1:
                continue
            left = room(node.budget_cpus, after, p.alpha)
            if best is None or left > best[0]:
                best = (left, node.name)
        if best is None:
            return None
        return Move(task.service, task.node, best[1], sum(m.need for m in movers), best[0])

    def _land(self, view: ClusterView, services: dict[str, ServiceView], plan: Plan) -> None:
        """Moves that are done (no task of the service left on the source, all running, no
        update rolling) or timed out are settled."""
        for name, flight in list(self._flights.items()):
            service = services.get(name)
            done = service is None or (
                not service.updating and service.replicas is not None
                and service.running >= service.replicas
                and not _task_keys(view, name, flight.move.source))
            if done or view.now - flight.since > self.params.move_timeout_s:
                plan.settled.append(name)
                del self._flights[name]

    @property
    def stuck_since(self) -> dict[str, float]:
        """Since when each stuck task (by ID) has been stuck: a copy."""
        return dict(self._stuck_since)

    @property
    def in_flight(self) -> list[Move]:
        return [f.move for f in self._flights.values()]

    # -- new tasks --------------------------------------------------------------------------

    def _open_or_close(self, view: ClusterView, nodes: dict[str, NodeView],
                       loads: dict[str, list[Load]], plan: Plan) -> None:
        p = self.params
        expected = self.expected_need()
        ours = [n for n in nodes.values() if n.ready and (
            n.availability is Availability.ACTIVE
            or (n.availability is Availability.PAUSE and n.paused_by_placement))]
        if expected is None or not ours:
            return

        def could_take(node: NodeView, need: float) -> bool:
            return takes(node.budget_cpus, loads[node.name], Load("", need, node.budget_cpus),
                         p.alpha)

        def may_toggle(node: NodeView) -> bool:
            return view.now - self._toggled.get(node.name, -math.inf) >= p.settle_s

        full = {n.name for n in ours if not could_take(n, expected)}
        everything_full = len(full) == len(ours)
        for node in ours:
            if node.availability is Availability.ACTIVE:
                if node.name in full and not everything_full and may_toggle(node):
                    plan.pause.append(node.name)
                    self._toggled[node.name] = view.now
                continue
            roomy = could_take(node, expected * p.resume_factor)
            if roomy:
                self._roomy_since.setdefault(node.name, view.now)
            else:
                self._roomy_since.pop(node.name, None)
            long_roomy = roomy and view.now - self._roomy_since[node.name] >= p.settle_s
            if (long_roomy or everything_full) and may_toggle(node):
                plan.resume.append(node.name)
                self._toggled[node.name] = view.now
                self._roomy_since.pop(node.name, None)
        active = {n.name for n in ours if n.availability is Availability.ACTIVE}
        if not (active - set(plan.pause)) | set(plan.resume):  # new tasks must go somewhere
            roomiest = max(ours, key=lambda n: room(n.budget_cpus, loads[n.name], p.alpha))
            if roomiest.name in plan.pause:
                plan.pause.remove(roomiest.name)
            else:
                plan.resume.append(roomiest.name)
            self._toggled[roomiest.name] = view.now


def _task_keys(view: ClusterView, service: str, node: str) -> set[str]:
    return {t.id for t in view.tasks if t.service == service and t.node == node}
