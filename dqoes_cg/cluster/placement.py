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
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping, Sequence
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
    starting: int = 0  # its tasks Swarm wants running that do not run yet


@dataclass(frozen=True)
class ClusterView:
    now: float  # seconds, monotonic
    nodes: tuple[NodeView, ...]
    tasks: tuple[TaskView, ...]
    services: tuple[ServiceView, ...]
    # The same tasks by node name, each node's in the order of `tasks`, when the caller
    # keeps them so: a node's group that is the very object of the last tick is taken as
    # unchanged without a look at its tasks. None: grouped from `tasks`.
    by_node: Mapping[str, Sequence[TaskView]] | None = field(default=None, compare=False,
                                                             repr=False)

    def groups(self) -> Mapping[str, Sequence[TaskView]]:
        """The tasks by node name."""
        if self.by_node is not None:
            return self.by_node
        groups: dict[str, list[TaskView]] = {}
        for task in self.tasks:
            groups.setdefault(task.node, []).append(task)
        return groups


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
    unmoved: dict[str, str] = field(default_factory=dict)  # task id: why a task stuck past
    #                                                        the settle time does not move

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


@dataclass
class _NodeState:
    """What the decision worked out of one node: made again only when the node, its tasks
    or one of their needs changed (or the expected need, for a node with a task at it)."""

    view: NodeView
    loads: list[Load]  # its tasks, in their order
    admits: set[str]  # the keys of those it admits
    stuck: list[TaskView]  # its tasks out of S that it does not admit
    at_expected: bool  # a task of it counts at the expected need (or the even share)
    could: dict[float, bool] = field(default_factory=dict)  # need: takes a newcomer of it


class Placement:
    """The placement decision, tick by tick: `plan(view)`. It keeps what hysteresis needs
    (smoothed needs, since when each task is stuck and each node roomy, the moves made)
    and nothing Swarm does not also show: after a restart it starts afresh, cautious.

    A tick does the work of what changed since the last one: a node's group of tasks that
    is the same object, or equal, is not looked into; a need is smoothed again only while
    its exponential average still moves (the same average, step by step, as over every
    task: at a fixed point a step changes nothing); a node's loads, what it admits and its
    stuck tasks are made again only when the node, its tasks or their needs changed; the
    candidates to move are the stuck tasks, and one that found no destination is not
    looked at again until a node changed or the nodes busy with moves did."""

    def __init__(self, params: PlacementParams | None = None) -> None:
        self.params = params or PlacementParams()
        self._log_need: dict[str, float] = {}  # task id: smoothed log need
        self._sorted_needs: list[float] = []  # the values of _log_need, sorted (median)
        self._raw: dict[str, float] = {}  # task id: its latest log need, when it has one
        self._moving: set[str] = set()  # task ids whose smoothed need may still move
        self._groups: dict[str, tuple[Sequence[TaskView], tuple[TaskView, ...]]] = {}
        #                                 node name: its group as given, and its tasks
        self._where: dict[str, str] = {}  # task id: its node's name
        self._placed: dict[tuple[str, str], set[str]] = {}  # (service, node): task ids
        self._nodes: dict[str, _NodeState] = {}  # by name, for the nodes of the view
        self._expected: float | None = None  # the expected need the states were made with
        self._generation = 0  # moves on whenever a node's state is made again or dropped
        self._fruitless: dict[str, tuple[tuple[int, frozenset[str]], str]] = {}  # task id:
        #               the generation and busy nodes at which it found no destination, why
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
        nodes = {n.name: n for n in view.nodes}
        services = {s.name: s for s in view.services}
        changed = self._take(view.groups())
        changed |= self._smooth()
        self._refresh(nodes, changed)
        self._land(view, services, plan)

        stuck = self._find_stuck(view.now)
        busy = {n for f in self._flights.values() for n in (f.move.source, f.move.destination)}
        moved: dict[str, list[Load]] = {}  # node name: its loads once this tick's moves made
        while self._recent and self._recent[0] <= view.now - 60.0:
            self._recent.popleft()
        for task in sorted(stuck, key=lambda t: (self._need(t) or 0.0, t.id)):
            if len(self._recent) >= p.max_moves_per_minute:
                break
            if view.now - self._stuck_since[task.id] < p.settle_s or task.node in busy:
                continue
            move = self._destination(task, view, nodes, services, busy)
            if isinstance(move, str):
                plan.unmoved[task.id] = move
                continue
            plan.moves.append(move)
            self._flights[move.service] = _Flight(move, view.now)
            self._moved_at[move.service] = view.now
            self._recent.append(view.now)
            self.moves_made += 1
            busy |= {move.source, move.destination}
            keys = self._placed.get((move.service, move.source), set())
            source = moved.get(move.source, self._nodes[move.source].loads)
            movers = [ld for ld in source if ld.key in keys]
            moved[move.source] = [ld for ld in source if ld not in movers]
            moved[move.destination] = moved.get(
                move.destination, self._nodes[move.destination].loads) + movers

        self._open_or_close(view, nodes, moved, plan)
        return plan

    # -- what changed ------------------------------------------------------------------------

    def _take(self, groups: Mapping[str, Sequence[TaskView]]) -> set[str]:
        """Takes the nodes' groups of tasks that changed; the names of those nodes. A task
        gone from every group is forgotten."""
        changed: set[str] = set()
        left: dict[str, str] = {}  # task id: the node whose group it left
        for name, group in groups.items():
            known = self._groups.get(name)
            if known is not None and known[0] is group:
                continue
            tasks = tuple(group)
            self._groups[name] = group, tasks
            if known is not None and known[1] == tasks:
                continue
            changed.add(name)
            ids = {t.id for t in tasks}
            for t in known[1] if known is not None else ():
                self._unplace(t, name)
                if t.id not in ids:
                    left[t.id] = name
            for t in tasks:
                self._placed.setdefault((t.service, name), set()).add(t.id)
                self._where[t.id] = name
                need = raw_need(t)
                if need is None:
                    self._raw.pop(t.id, None)
                else:
                    self._raw[t.id] = math.log(need)
                    self._moving.add(t.id)
        for name in self._groups.keys() - groups.keys():
            changed.add(name)
            for t in self._groups.pop(name)[1]:
                self._unplace(t, name)
                left[t.id] = name
        for task_id, name in left.items():
            if self._where.get(task_id) == name:  # in no other node's group
                self._forget(task_id)
        return changed

    def _unplace(self, task: TaskView, node: str) -> None:
        ids = self._placed.get((task.service, node))
        if ids is not None:
            ids.discard(task.id)
            if not ids:
                del self._placed[task.service, node]

    def _forget(self, task_id: str) -> None:
        del self._where[task_id]
        self._set_need(task_id, None)
        self._raw.pop(task_id, None)
        self._moving.discard(task_id)
        self._fruitless.pop(task_id, None)
        self._stuck_since.pop(task_id, None)
        self._free_since.pop(task_id, None)

    # -- needs ------------------------------------------------------------------------------

    def _smooth(self) -> set[str]:
        """One step of each moving need's exponential average; the names of the nodes
        whose needs moved."""
        g = self.params.smoothing
        moved = set()
        for task_id in list(self._moving):
            x = self._raw.get(task_id)
            last = self._log_need.get(task_id)
            new = x if last is None or x is None else last + g * (x - last)
            if new is None or new == last:  # no need, or a fixed point: further steps
                self._moving.discard(task_id)  # change nothing
                continue
            self._set_need(task_id, new)
            moved.add(self._where[task_id])
        return moved

    def _set_need(self, task_id: str, log_need: float | None) -> None:
        last = self._log_need.pop(task_id, None)
        if last is not None:
            del self._sorted_needs[bisect_left(self._sorted_needs, last)]
        if log_need is not None:
            self._log_need[task_id] = log_need
            insort(self._sorted_needs, log_need)

    def _need(self, task: TaskView) -> float | None:
        return self.need_of(task.id)

    def expected_need(self) -> float | None:
        """The need of a task not measured yet: the median of the known ones."""
        values, n = self._sorted_needs, len(self._sorted_needs)
        if not n:
            return None
        middle = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
        return math.exp(middle)

    def _refresh(self, nodes: dict[str, NodeView], changed: set[str]) -> None:
        """Makes again the state of each node that changed."""
        expected = self.expected_need()
        expected_moved = expected != self._expected
        self._expected = expected
        for name, node in nodes.items():
            state = self._nodes.get(name)
            if (state is None or name in changed or state.view != node
                    or (expected_moved and state.at_expected)):
                self._nodes[name] = self._state(node, expected)
                self._generation += 1
            elif expected_moved:
                state.could.clear()
        for name in self._nodes.keys() - nodes.keys():
            del self._nodes[name]
            self._generation += 1

    def _state(self, node: NodeView, expected: float | None) -> _NodeState:
        """The node's tasks as loads (unknown needs at the expected need, or at the node's
        even share when nothing is known), what it admits and which are stuck."""
        tasks = self._groups.get(node.name, ((), ()))[1]
        budget = node.budget_cpus
        even = budget / max(len(tasks), 1)
        loads = [Load(t.id, self._need(t) or expected or even,
                      t.max_cores if t.max_cores is not None else budget) for t in tasks]
        admits = admitted(budget, loads, self.params.alpha)
        stuck = [t for t in tasks if node.ready and t.cls in ("B", "G")
                 and t.id in self._log_need and t.id not in admits]
        return _NodeState(node, loads, admits, stuck,
                          any(t.id not in self._log_need for t in tasks))

    # -- moves ------------------------------------------------------------------------------

    def _find_stuck(self, now: float) -> list[TaskView]:
        """Tasks out of S that their node does not admit (and since when, in
        _stuck_since)."""
        stuck = [t for state in self._nodes.values() for t in state.stuck]
        for task in stuck:
            self._stuck_since.setdefault(task.id, now)
            self._free_since.pop(task.id, None)
        now_stuck = {t.id for t in stuck}
        for task_id in [k for k in self._stuck_since if k not in now_stuck]:
            # A window of a few requests can put a task in S, or its need under what
            # its node could hold, for a tick: its clock restarts only once it has been
            # out of it for half the settle time.
            free = self._free_since.setdefault(task_id, now)
            if now - free >= self.params.settle_s / 2:
                del self._stuck_since[task_id], self._free_since[task_id]
        return stuck

    def _destination(self, task: TaskView, view: ClusterView, nodes: dict[str, NodeView],
                     services: dict[str, ServiceView], busy: set[str]) -> Move | str:
        """Where the task's service moves from its node, or why it does not."""
        p = self.params
        service = services.get(task.service)
        if service is None or service.replicas is None:
            return "not a replicated service with a start-first update"
        if service.updating or service.running < service.replicas:
            return "its service is updating or runs fewer tasks than it asks for"
        if task.service in self._flights:
            return "its service is moving"
        if view.now - self._moved_at.get(task.service, -math.inf) < p.hold_s:
            return "its service moved within the hold time"
        # What follows depends on the nodes' states and the busy ones alone (a node moved
        # to or from this tick is busy, so never looked at).
        tried = (self._generation, frozenset(busy))
        fruitless = self._fruitless.get(task.id)
        if fruitless is not None and fruitless[0] == tried:
            return fruitless[1]
        keys = self._placed.get((task.service, task.node), set())
        source = self._nodes[task.node]
        movers = [ld for ld in source.loads if ld.key in keys]
        staying = [ld for ld in source.loads if ld.key not in keys]
        before_src = len(source.admits)
        after_src = len(admitted(source.view.budget_cpus, staying, p.alpha))
        best: tuple[float, str] | None = None
        for node in nodes.values():
            if (node.name == task.node or node.name in busy or not node.ready
                    or node.availability is not Availability.ACTIVE):
                continue
            here = self._nodes[node.name]
            if not all(takes(node.budget_cpus, here.loads, m, p.alpha, p.margin)
                       for m in movers):
                continue
            after = here.loads + movers
            gain = (after_src + len(admitted(node.budget_cpus, after, p.alpha))) - \
                (before_src + len(here.admits))
            if gain < 1:
                continue
            left = room(node.budget_cpus, after, p.alpha)
            if best is None or left > best[0]:
                best = (left, node.name)
        if best is None:
            # No figure in it: the need moves a little every tick, why it does not move not.
            why = (f"no node has room for its need with {p.margin:.0%} to spare, or would "
                   "hold more in S with it")
            self._fruitless[task.id] = tried, why
            return why
        return Move(task.service, task.node, best[1], sum(m.need for m in movers), best[0])

    def _land(self, view: ClusterView, services: dict[str, ServiceView], plan: Plan) -> None:
        """Moves that are done (no task of the service left on the source, all running, none
        starting, no update rolling) or timed out are settled. Not before its replacement
        runs: Swarm answers a service update made while a start-first replacement starts by
        keeping the replacement and stopping the old task at once (none ran for 6-27 s of a
        move when its constraint was lifted then)."""
        for name, flight in list(self._flights.items()):
            service = services.get(name)
            done = service is None or (
                not service.updating and not service.starting and service.replicas is not None
                and service.running >= service.replicas
                and (name, flight.move.source) not in self._placed)
            if done or view.now - flight.since > self.params.move_timeout_s:
                plan.settled.append(name)
                del self._flights[name]

    def need_of(self, task_id: str) -> float | None:
        """That task's smoothed need (CPUs; None: not known)."""
        x = self._log_need.get(task_id)
        return None if x is None else math.exp(x)

    def node_of(self, task_id: str) -> str | None:
        """The node of that task in the last view (None: not in it)."""
        return self._where.get(task_id)

    @property
    def stuck_since(self) -> dict[str, float]:
        """Since when each stuck task (by ID) has been stuck: a copy."""
        return dict(self._stuck_since)

    @property
    def in_flight(self) -> list[Move]:
        return [f.move for f in self._flights.values()]

    # -- new tasks --------------------------------------------------------------------------

    def _open_or_close(self, view: ClusterView, nodes: dict[str, NodeView],
                       moved: dict[str, list[Load]], plan: Plan) -> None:
        p = self.params
        expected = self._expected
        ours = [n for n in nodes.values() if n.ready and (
            n.availability is Availability.ACTIVE
            or (n.availability is Availability.PAUSE and n.paused_by_placement))]
        if expected is None or not ours:
            return

        def loads(node: NodeView) -> list[Load]:
            return moved.get(node.name, self._nodes[node.name].loads)

        def could_take(node: NodeView, need: float) -> bool:
            if node.name in moved:
                return takes(node.budget_cpus, moved[node.name],
                             Load("", need, node.budget_cpus), p.alpha)
            could = self._nodes[node.name].could
            if need not in could:
                could[need] = takes(node.budget_cpus, loads(node),
                                    Load("", need, node.budget_cpus), p.alpha)
            return could[need]

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
            roomiest = max(ours, key=lambda n: room(n.budget_cpus, loads(n), p.alpha))
            if roomiest.name in plan.pause:
                plan.pause.remove(roomiest.name)
            else:
                plan.resume.append(roomiest.name)
            self._toggled[roomiest.name] = view.now
