"""Swarm as a manager's engine shows it: its nodes, its services and their tasks, read
through the Engine API (engine.py) into small typed records, and the writes the cluster
makes: a service's placement constraints and replicas, a node's availability.

What Swarm answers was written by whoever created the services (names, labels): it is kept
bounded and judged where it is used (membership/labels.py); an entry that is not what Swarm's API
documents is skipped.
"""

from __future__ import annotations

import logging
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


@dataclass(frozen=True)
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
    nodes = [parse_node(doc) for doc in _listing(engine, "/nodes")]
    services = [parse_service(doc) for doc in _listing(engine, "/services")]
    tasks = [parse_task(doc) for doc in _listing(engine, "/tasks")]
    return Snapshot({n.id: n for n in nodes if n is not None},
                    {s.id: s for s in services if s is not None},
                    [t for t in tasks if t is not None])


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
