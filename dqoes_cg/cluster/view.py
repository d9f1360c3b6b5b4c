"""The cluster view: what the manager knows of the Swarm and its QoE, built once per manager
tick in one place (manager.py), shown by `dqoesctl cluster status` (as JSON with `--json`),
and given to placement. Placement is the seam between the manager and a placement policy:

    class MyPlacement:                              # a Placement
        def tick(self, view: ClusterView, now: float, actions: Actions) -> None:
            for task in view.tasks:
                node = view.node(task.node_id)
                if task.cls == "B" and node.spare_cpus == 0 and not view.service(
                        task.service_id).updating:
                    actions.move_away(task.service_id, task.node_id)

Every manager tick (1 s by default), after the manager has read Swarm's nodes, services
and tasks and judged the nodes' reports, it builds a `ClusterView` and calls the placement
chosen with `dqoes-manager --placement NAME` (`PLACEMENTS` in manager.py) with it, the
manager's monotonic clock, and `Actions`. A placement is pure logic: it reads the view, keeps
whatever memory it needs (hysteresis, moves per minute) and calls the actions; the manager
carries them out through Swarm's API after the tick, one service update per service at most.

The view (frozen dataclasses; lists sorted by name, node, slot):
- `nodes`: every Swarm node: its Swarm state, whether dqoes-cg reaches it (`reachable`: its
  agent reports in time, its engine and dqoesd answer, and Swarm has it ready; else `reason`
  says why), its CPU budget (dqoesd's T_R), the CPU its managed containers used over the
  last tick (`used_cpus`) and what is left (`spare_cpus`), and its tasks' classes (G, S, B,
  idle, pending: counted only while it is reachable).
- `services`: every service whose labels concern dqoes-cg (a `dqoes.` label of its own or of
  its tasks' containers): its target (or `error`: why its labels are refused), replicas,
  whether Swarm is rolling an update through it (`updating`: a move in progress), whether its
  update order is start-first (the only services the manager moves), and the nodes it is
  kept off (`avoid`).
- `tasks`: the running tasks of those services (desired state running), each with the
  measurements its node reported about its container (class, target, measured, limit,
  usage). `cls` is "unknown" (with `reason`) when no accepted report covers it: its node is
  unreachable, or has not reported it yet. Only a task in S on a reachable node counts as
  satisfied.
- `pipelines`: each pipeline its stages' labels declare (pipelines.py): its end-to-end target
  and an estimate of the measured one, and per stage its share of the target (split.py),
  replicas, nodes and classes; a refused one with its reason.

Actions (what a placement may ask; each is a Swarm service or node update, see actions.py):
- `move_away(service_id, node_id)`: the service's tasks on that node move to other nodes,
  and new ones stay off it until `release`. Swarm's rolling update replaces each such task
  with its update order, start-first: the new task runs before the old one stops, so the
  service never runs fewer replicas than it asks for. Refused (logged, nothing done) for a
  global service, a service whose update order is not start-first, one already updating,
  or when no other ready node would be left to it.
- `prefer(service_id, node_ids)`: new tasks of the service (a scale-up, a replacement) land
  on these nodes; the tasks it runs elsewhere stay where they are.
- `release(service_id)`: the service may go anywhere again; no task moves.
- `scale(service_id, replicas)`: Swarm runs that many tasks of the service (new ones where
  `prefer` steers them). Refused for a global service, below one, or while Swarm is
  updating the service.
- `close_node(node_id)`: Swarm schedules no new task on the node (availability pause,
  marked as the manager's); its tasks run on. Refused for a node that is not active, or
  when no other active ready node would be left.
- `open_node(node_id)`: a node the manager paused is active again (a node an operator
  paused or drained is left alone), once no task moving off it runs there: Swarm stops
  such a task at once when its node is updated while active.
`move_away`, `scale`, `close_node` and `open_node` take a `why` too, shown with the update.

A manager that only recommends (`dqoes-manager --recommend`, `dqoesctl cluster recommend`)
makes none of these updates: the view says so (`acting` false) and lists the updates its
placement asked for recently (`recommended`, each with when it was last asked).

Fields are only ever added; `from_json` ignores the fields it does not know.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Protocol

from ..status import known_fields

TASK_CLASSES = ("G", "S", "B", "idle", "pending", "unknown")
"""A task's class: the policy's on its node (G, S, B, idle: no request in the last window,
pending: no cgroup yet), or unknown (no accepted report about it)."""


@dataclass(frozen=True, slots=True)  # no __dict__: 100,000 of them at a time
class NodeView:
    id: str  # Swarm's node ID: the CN of its certificate
    name: str  # its hostname
    role: str  # manager, worker
    swarm_state: str  # Swarm's: ready, down, unknown, disconnected
    availability: str  # active, pause, drain
    reachable: bool
    reason: str | None  # why it is not reachable
    budget_cpus: float | None  # dqoesd's T_R; None until it reported
    used_cpus: float | None  # by the containers its dqoesd manages, over the last tick
    spare_cpus: float | None  # budget - used, at least 0
    G: int = 0
    S: int = 0
    B: int = 0
    idle: int = 0
    pending: int = 0
    refused: int = 0  # claims about containers it does not run, refused since the start
    report_age_s: float | None = None  # since its agent's last report
    paused_by_placement: bool = False  # availability pause is the manager's (close_node)
    cpu_pressure: float | None = None  # share of its last window its tasks stalled on CPU


@dataclass(frozen=True)
class ServiceView:
    id: str
    name: str
    mode: str  # replicated, global
    replicas: int | None  # asked for (None: global)
    running: int  # tasks running now
    target_s: float | None  # from its labels (None: none, or refused)
    metric: str | None
    error: str | None  # why its dqoes. labels are refused
    updating: bool  # Swarm is rolling an update through its tasks
    start_first: bool  # its update order: a new task runs before the old one stops
    avoid: tuple[str, ...] = ()  # node IDs the manager keeps its tasks off
    starting: int = 0  # its tasks Swarm wants running that do not run yet


@dataclass(frozen=True, slots=True)  # no __dict__: 100,000 of them at a time
class TaskView:
    id: str  # Swarm's task ID
    service_id: str
    service: str
    slot: int | None  # None for a global service's task
    node_id: str
    node: str
    container_id: str  # "" until the task has a container
    state: str  # Swarm's observed state: assigned, starting, running, ...
    cls: str  # one of TASK_CLASSES (JSON: "class")
    target_s: float | None  # what its node's dqoesd pursues (None: unknown)
    metric: str | None
    measured_s: float | None
    cpu_limit_cores: float | None  # None: no limit, or unknown
    cpu_usage_cores: float | None
    samples: int | None
    reason: str | None = None  # why it is unknown
    rate_hz: float | None = None  # requests a second over its node's last window
    window_usage_cores: float | None = None  # CPUs it used over that window
    mean_s: float | None = None  # its latency over that window, whatever its metric
    p95_s: float | None = None
    throttled: float | None = None  # share of its CPU periods at its limit, last window


@dataclass(frozen=True)
class StageView:
    """One stage (a service) of a pipeline."""

    service_id: str
    name: str
    next: tuple[str, ...]  # the stages it feeds, by name
    target_s: float | None  # its share of the end-to-end target, pushed as its dqoes.target
    replicas: int  # its tasks running now
    nodes: tuple[str, ...]  # where they run (hostnames)
    classes: tuple[str, ...]  # its tasks' (TASK_CLASSES), in the order of the tasks
    measured_s: float | None  # the mean over its measured tasks, in the pipeline's metric
    work_s: float | None  # CPU-seconds per request (window usage / rate, over its tasks)
    rate_hz: float | None  # requests a second, over its tasks
    asked: int | None = None  # the replicas its service asks for (None: global, or unknown)


@dataclass(frozen=True)
class PipelineView:
    """A pipeline declared by its stages' labels (pipelines.py), or refused (`error`)."""

    name: str
    target_s: float | None  # end to end (None: refused)
    metric: str | None
    # Estimates from the stages' latencies (None until every stage is measured): in the
    # target's metric, mean and p95, each summed along the path where that sum is largest
    measured_s: float | None
    mean_s: float | None
    p95_s: float | None
    feasible: bool  # the stages' floors fit in the target on every path (split.py)
    stages: tuple[StageView, ...]  # in topological order
    error: str | None = None  # why it is refused and left unmanaged


@dataclass(frozen=True)
class Recommendation:
    """An update placement asked for and a recommending manager did not make."""

    time_unix: float  # when it was last asked
    what: str  # which node or service, to what, and why


@dataclass(frozen=True)
class ClusterView:
    time_unix: float
    manager: str  # the node ID of the manager that built it
    swarm_error: str | None  # Swarm's API did not answer: the view is the last one known
    nodes: list[NodeView]
    services: list[ServiceView]
    tasks: list[TaskView]
    acting: bool = True  # False: placement's updates are recommended, not made
    recommended: tuple[Recommendation, ...] = ()  # while not acting, the latest first
    pipelines: tuple[PipelineView, ...] = ()  # by name
    # The tasks by node ID, each node's in the order of `tasks`, as the manager made them:
    # a node's list is the same object from view to view while its tasks are not made
    # again, so a policy can follow what changed (placement does). Not in the JSON.
    by_node: Mapping[str, Sequence[TaskView]] | None = field(default=None, compare=False,
                                                             repr=False)

    # Lookups by ID, each indexed once per view: a policy asks them in loops over the nodes
    # or the tasks, and a pass over the list each time would cost nodes x tasks.
    def node(self, node_id: str) -> NodeView | None:
        return self._nodes_by_id.get(node_id)

    def service(self, service_id: str) -> ServiceView | None:
        return self._services_by_id.get(service_id)

    def tasks_on(self, node_id: str) -> list[TaskView]:
        return list(self._tasks_by_node.get(node_id, ()))

    def tasks_of(self, service_id: str) -> list[TaskView]:
        return list(self._tasks_by_service.get(service_id, ()))

    @cached_property
    def _nodes_by_id(self) -> dict[str, NodeView]:
        return {n.id: n for n in reversed(self.nodes)}  # the first of an ID wins

    @cached_property
    def _services_by_id(self) -> dict[str, ServiceView]:
        return {s.id: s for s in reversed(self.services)}

    def task(self, task_id: str) -> TaskView | None:
        """The task of that ID (indexed at the first call: a pass over the tasks)."""
        return self._tasks_by_id.get(task_id)

    def task_groups(self) -> Mapping[str, Sequence[TaskView]]:
        """The tasks by node ID (not to be changed)."""
        return self._tasks_by_node

    @cached_property
    def _tasks_by_id(self) -> dict[str, TaskView]:
        return {t.id: t for t in reversed(self.tasks)}

    @cached_property
    def _tasks_by_node(self) -> Mapping[str, Sequence[TaskView]]:
        if self.by_node is not None:
            return self.by_node
        return _grouped(self.tasks, lambda t: t.node_id)

    @cached_property
    def _tasks_by_service(self) -> dict[str, list[TaskView]]:
        return _grouped(self.tasks, lambda t: t.service_id)

    def satisfied(self) -> int:
        """|S|: the tasks in S on reachable nodes."""
        return sum(n.S for n in self.nodes if n.reachable)

    def to_json(self, with_tasks: bool = True) -> dict[str, Any]:
        """The view as JSON; `with_tasks` False: its "tasks" empty, for a caller that
        encodes them itself (task_json)."""
        # The tasks field by field: asdict's deep copy of 100,000 of them took seconds.
        doc = asdict(replace(self, tasks=[], by_node=None))
        del doc["by_node"]
        if with_tasks:
            doc["tasks"] = [task_json(t) for t in self.tasks]
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ClusterView:
        return cls(doc["time_unix"], doc["manager"], doc.get("swarm_error"),
                   [known_fields(NodeView, n) for n in doc["nodes"]],
                   [known_fields(ServiceView, {**s, "avoid": tuple(s.get("avoid", ()))})
                    for s in doc["services"]],
                   [known_fields(TaskView, {**t, "cls": t["class"]}) for t in doc["tasks"]],
                   doc.get("acting", True) is not False,
                   tuple(known_fields(Recommendation, r) for r in doc.get("recommended", ())),
                   tuple(_pipeline(p) for p in doc.get("pipelines", ())))


_TASK_FIELDS = tuple(f.name for f in fields(TaskView) if f.name not in ("id", "cls"))


def task_json(t: TaskView) -> dict[str, Any]:
    """A task as the view's JSON has it."""
    return {"id": t.id, "class": t.cls, **{name: getattr(t, name) for name in _TASK_FIELDS}}


def _pipeline(doc: dict[str, Any]) -> PipelineView:
    stages = tuple(known_fields(StageView, {**st, "next": tuple(st["next"]),
                                            "nodes": tuple(st["nodes"]),
                                            "classes": tuple(st["classes"])})
                   for st in doc["stages"])
    return known_fields(PipelineView, {**doc, "stages": stages})


class Actions(Protocol):
    """What a placement may ask of the manager (carried out after the tick)."""

    def move_away(self, service_id: str, node_id: str, why: str = "") -> None: ...

    def prefer(self, service_id: str, node_ids: Collection[str]) -> None: ...

    def release(self, service_id: str) -> None: ...

    def scale(self, service_id: str, replicas: int, why: str = "") -> None: ...

    def close_node(self, node_id: str, why: str = "full") -> None: ...

    def open_node(self, node_id: str, why: str = "") -> None: ...


class Placement(Protocol):
    """A placement policy (see the module's doc)."""

    def tick(self, view: ClusterView, now: float, actions: Actions) -> None: ...


def _grouped(tasks: list[TaskView], key: Callable[[TaskView], str]) -> dict[str, list[TaskView]]:
    """The tasks by key, in their order."""
    groups: dict[str, list[TaskView]] = {}
    for t in tasks:
        groups.setdefault(key(t), []).append(t)
    return groups
