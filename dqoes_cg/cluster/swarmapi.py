"""Swarm as a manager's engine shows it: its nodes, its services and their tasks, read
through the Engine API (engine.py) into small typed records, and the writes the cluster
makes: a service's placement constraints and replicas, a node's availability.

SwarmReader reads it tick after tick doing the work of what changed only: the task list
(every task of every service: nodes x tasks a node) is read again only when something may
have changed it, and an object whose version (Swarm's Version.Index) is the one read before
is not parsed again.

What Swarm answers was written by whoever created the services (names, labels): it is kept
bounded and judged where it is used (membership/labels.py); an entry that is not what Swarm's API
documents is skipped.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from ..engines.client import Engine, EngineError, parse_labels
from ..membership.labels import PIPELINE_KEYS, effective, objective, ours
from ..membership.objective import Objective

log = logging.getLogger(__name__)

AVOID_LABEL = "dqoes-cluster.avoid"  # a service label: the node IDs the manager keeps it off
AVOID_CONSTRAINT = "node.id!={}"
PAUSED_LABEL = "dqoes-cluster.paused"  # a node label: placement paused it (not an operator)
UPDATE_ATTEMPTS = 3  # a service update that raced another one is tried again
TASKS_REFRESH_S = 15.0  # the task list is read at least so often


@dataclass(frozen=True)
class SwarmNode:
    id: str
    hostname: str
    role: str  # manager, worker
    state: str  # ready, down, unknown, disconnected
    availability: str  # active, pause, drain
    address: str
    paused_by_us: bool = False  # paused by the manager's placement (PAUSED_LABEL)


@dataclass(frozen=True)
class SwarmService:
    id: str
    name: str
    mode: str  # replicated, global
    replicas: int | None
    labels: dict[str, str]  # its dqoes. service labels but a pipeline's (what nodes get)
    objective: Objective | None  # what its labels and its containers' labels ask
    error: str | None  # why they are refused
    updating: bool
    start_first: bool
    avoid: tuple[str, ...]  # node IDs the manager keeps it off (AVOID_LABEL)
    pipeline: dict[str, str] = field(default_factory=dict)  # its labels of PIPELINE_KEYS

    @property
    def concerns_us(self) -> bool:
        return self.objective is not None or self.error is not None or bool(self.pipeline)


@dataclass(frozen=True, slots=True)  # no __dict__: 100,000 of them at a time
class SwarmTask:
    id: str
    service_id: str
    node_id: str  # "" while unassigned
    slot: int | None
    state: str  # observed
    desired_state: str
    container_id: str  # "" until it has a container


@dataclass(frozen=True)
class Snapshot:
    """Swarm at one moment."""

    nodes: dict[str, SwarmNode] = field(default_factory=dict)
    services: dict[str, SwarmService] = field(default_factory=dict)
    tasks: list[SwarmTask] = field(default_factory=list)

    def container_node(self) -> dict[str, str]:
        """Every task container Swarm knows of (ended tasks' too) -> its node's ID."""
        return {t.container_id: t.node_id for t in self.tasks if t.container_id}


def read(engine: Engine) -> Snapshot:
    """Swarm now; EngineError if the engine does not answer or is no Swarm manager."""
    return SwarmReader(engine).read(0.0)


class SwarmReader:
    """Swarm's snapshot, read again on each `read` with the work of what changed: nodes and
    services are listed every time (a document each); the task list only when something
    may have changed it: a node or a service was added, removed or changed (its version),
    the caller asks (`tasks_wanted`: a node reported a container the last list lacks), a
    service of ours is converging (updating, or running another number of tasks than it
    asks for: a move, a scale, a task starting), or TASKS_REFRESH_S passed. (Swarm emits no
    event for a task.) An object whose version is the one parsed before is not parsed
    again; documents without a version (an older engine) are parsed, and the task list
    read, every time. While nothing changed, `read` returns the same Snapshot object."""

    def __init__(self, engine: Engine, refresh_s: float = TASKS_REFRESH_S) -> None:
        self.engine = engine
        self.refresh_s = refresh_s
        self.snapshot = Snapshot()
        self._parsed: dict[str, dict[str, tuple[int | None, Any]]] = {
            "/nodes": {}, "/services": {}, "/tasks": {}}
        self._versioned: dict[str, bool] = {"/tasks": False}
        self._tasks_read_at = -math.inf
        self._converging = True

    def read(self, now: float, tasks_wanted: bool = False) -> Snapshot:
        """Swarm now (`now`: monotonic); EngineError if the engine does not answer or is no
        Swarm manager (nothing read is kept then)."""
        nodes, nodes_changed = self._list("/nodes", parse_node)
        services, services_changed = self._list("/services", parse_service)
        before = self.snapshot
        tasks, tasks_changed = before.tasks, False
        if (nodes_changed or services_changed or tasks_wanted or self._converging
                or not self._versioned["/tasks"] or now - self._tasks_read_at >= self.refresh_s):
            by_id, tasks_changed = self._list("/tasks", parse_task)
            tasks = list(by_id.values()) if tasks_changed else before.tasks
            self._tasks_read_at = now
        if nodes_changed or services_changed or tasks_changed:
            self.snapshot = Snapshot(nodes if nodes_changed else before.nodes,
                                     services if services_changed else before.services,
                                     tasks)
            self._converging = converging(self.snapshot)
        return self.snapshot

    def _list(self, path: str, parse: Callable[[Any], Any]) -> tuple[dict[str, Any], bool]:
        """The listing's objects by ID, parsed again only where their version moved; and
        whether they differ from the last listing's."""
        parsed, fresh = self._parsed[path], {}
        changed, versioned = False, True
        for doc in _listing(self.engine, path):
            version, oid = _version(doc), doc.get("ID") if isinstance(doc, dict) else None
            known = parsed.get(oid) if version is not None and isinstance(oid, str) else None
            if known is not None and known[0] == version:
                fresh[known[1].id] = known
                continue
            versioned &= version is not None
            item = parse(doc)
            if item is not None:
                fresh[item.id] = (version, item)
                changed = True
        self._parsed[path] = fresh
        self._versioned[path] = versioned
        return {oid: item for oid, (_, item) in fresh.items()}, \
            changed or len(fresh) != len(parsed)


def starting(task: SwarmTask) -> bool:
    """Whether Swarm wants `task` running and it does not run yet (a start-first
    replacement is created wanted "ready", then "running", beside the task it replaces)."""
    return task.desired_state in ("ready", "running") and task.state != "running"


def converging(snapshot: Snapshot) -> bool:
    """Whether Swarm is still changing a service of ours: rolling an update through it,
    starting a task of it, or running another number of its tasks than it asks for."""
    running = Counter(t.service_id for t in snapshot.tasks
                      if t.state == "running" and t.desired_state == "running")
    started = {t.service_id for t in snapshot.tasks if starting(t)}
    return any(s.updating or s.id in started
               or (s.replicas is not None and running[s.id] != s.replicas)
               for s in snapshot.services.values() if s.concerns_us)


def _version(doc: Any) -> int | None:
    """An object's Version.Index, if it has one."""
    try:
        index = doc["Version"]["Index"]
    except (KeyError, TypeError):
        return None
    return index if isinstance(index, int) else None


def _listing(engine: Engine, path: str) -> list[Any]:
    listing = engine.get(path)
    if not isinstance(listing, list):
        raise EngineError(f"{engine}: GET {path} answered no list")
    return listing


def parse_node(doc: Any) -> SwarmNode | None:
    try:
        spec, status = doc["Spec"], doc["Status"]
        availability = _str(spec["Availability"])
        return SwarmNode(_str(doc["ID"]), _str(doc["Description"]["Hostname"]),
                         _str(spec["Role"]), _str(status["State"]), availability,
                         _str(status.get("Addr", "")), availability == "pause"
                         and PAUSED_LABEL in parse_labels(spec.get("Labels"), (PAUSED_LABEL,)))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def parse_service(doc: Any) -> SwarmService | None:
    try:
        sid, spec = _str(doc["ID"]), doc["Spec"]
        task = spec.get("TaskTemplate") or {}
        labels = parse_labels(spec.get("Labels"), (AVOID_LABEL,))
        container = parse_labels((task.get("ContainerSpec") or {}).get("Labels"))
        mode = spec.get("Mode") or {}
        replicated = mode.get("Replicated")
        update = spec.get("UpdateConfig") or {}
        status = doc.get("UpdateStatus") or {}
        wanted, error = None, None
        try:
            wanted = objective(effective(container, labels)[0])
        except ValueError as e:
            error = str(e)
        avoid = labels.get(AVOID_LABEL, "")
        mine = ours(labels)
        return SwarmService(
            sid, _str(spec["Name"]), "replicated" if isinstance(replicated, dict) else "global",
            int(replicated.get("Replicas", 1)) if isinstance(replicated, dict) else None,
            {k: v for k, v in mine.items() if k not in PIPELINE_KEYS}, wanted, error,
            status.get("State") in ("updating", "rollback_started"),
            update.get("Order") == "start-first",
            tuple(sorted(n for n in avoid.split(",") if n)),
            {k: v for k, v in mine.items() if k in PIPELINE_KEYS})
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def parse_task(doc: Any) -> SwarmTask | None:
    try:
        status = doc["Status"]
        slot = doc.get("Slot")
        return SwarmTask(_str(doc["ID"]), _str(doc["ServiceID"]), _str(doc.get("NodeID", "")),
                         slot if isinstance(slot, int) and slot > 0 else None,
                         _str(status["State"]), _str(doc["DesiredState"]),
                         _str((status.get("ContainerStatus") or {}).get("ContainerID", "")))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def update_service(engine: Engine, service_id: str, avoid: Collection[str],
                   replicas: int | None = None) -> None:
    """Keep the service off the nodes `avoid` (node IDs), and no others of the manager's:
    a `node.id!=ID` constraint each, the set recorded in the service's label AVOID_LABEL,
    its other constraints and labels untouched; and, given `replicas`, ask Swarm for that
    many tasks (a replicated service). A constraint alone changed moves only the tasks on
    nodes that no longer satisfy it (Swarm replaces them with the service's update order);
    a count alone changed starts or stops tasks, no other moves. One update for both.
    EngineError if Swarm refuses it."""
    def change(spec: dict[str, Any]) -> None:
        labels = spec.setdefault("Labels", {}) or {}
        placement = spec.setdefault("TaskTemplate", {}).setdefault("Placement", {})
        before = {AVOID_CONSTRAINT.format(n)
                  for n in labels.get(AVOID_LABEL, "").split(",") if n}
        theirs = [c for c in placement.get("Constraints") or [] if c not in before]
        mine = sorted({n for n in avoid if AVOID_CONSTRAINT.format(n) not in theirs})
        placement["Constraints"] = theirs + [AVOID_CONSTRAINT.format(n) for n in mine]
        if mine:
            labels[AVOID_LABEL] = ",".join(mine)
        else:
            labels.pop(AVOID_LABEL, None)
        spec["Labels"] = labels
        if replicas is not None:
            spec["Mode"]["Replicated"]["Replicas"] = replicas  # KeyError: not replicated

    _update(engine, "services", service_id, change)


def set_paused(engine: Engine, node_id: str, paused: bool) -> None:
    """Pause the node (Swarm schedules no new task there; its tasks run on), marked with
    the node label PAUSED_LABEL as the manager's doing; or make it active again and drop
    the mark. EngineError if Swarm refuses it."""
    def change(spec: dict[str, Any]) -> None:
        labels = spec.setdefault("Labels", {}) or {}
        if paused:
            spec["Availability"], labels[PAUSED_LABEL] = "pause", "1"
        else:
            spec["Availability"] = "active"
            labels.pop(PAUSED_LABEL, None)
        spec["Labels"] = labels

    _update(engine, "nodes", node_id, change)


def _update(engine: Engine, kind: str, oid: str, change: Callable[[dict[str, Any]], None]
            ) -> None:
    """Read a Swarm object's spec (services, nodes), `change` it, write it at the version
    read; again if another update came in between."""
    for attempt in range(UPDATE_ATTEMPTS):
        doc = engine.get(f"/{kind}/{oid}")
        try:
            version, spec = int(doc["Version"]["Index"]), doc["Spec"]
            change(spec)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise EngineError(f"{kind} {oid}: a spec this manager cannot read") from None
        try:
            engine.call("POST", f"/{kind}/{oid}/update", {"version": str(version)}, body=spec)
            return
        except EngineError as e:
            if "out of sequence" not in str(e) or attempt == UPDATE_ATTEMPTS - 1:
                raise
            log.debug("%s %s changed meanwhile; trying again", kind, oid)


def _str(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 4096:
        raise ValueError("not a string")
    return value
