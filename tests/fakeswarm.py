"""Stand-ins for the cluster's unit tests on the host: a Swarm manager's engine answering
from documents shaped as Docker's Engine API gives them (StubEngine), and a dqoesd whose
status the test sets and which records the service labels it is given (FakeDqoesd, a real
control server on a unix socket)."""

from __future__ import annotations

import copy
import json
import threading
import zlib
from pathlib import Path
from typing import Any

from dqoes_cg.control import ControlServer, Peer
from dqoes_cg.engines.client import EngineError


def node_doc(node_id: str, hostname: str, role: str = "worker", state: str = "ready",
             availability: str = "active") -> dict[str, Any]:
    return {"ID": node_id, "Version": {"Index": 3}, "Description": {"Hostname": hostname},
            "Spec": {"Role": role, "Availability": availability, "Labels": {}},
            "Status": {"State": state, "Addr": "127.0.0.1"}}


def service_doc(service_id: str, name: str, labels: dict[str, str] | None = None,
                replicas: int | None = 1, start_first: bool = True,
                constraints: list[str] | None = None, updating: bool = False,
                container_labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"ID": service_id, "Version": {"Index": 7},
            "Spec": {"Name": name, "Labels": dict(labels or {}),
                     "TaskTemplate": {"ContainerSpec": {"Image": "x",
                                                        "Labels": container_labels},
                                      "Placement": {"Constraints": list(constraints or [])}},
                     "Mode": {"Replicated": {"Replicas": replicas}} if replicas is not None
                     else {"Global": {}},
                     "UpdateConfig": {"Order": "start-first" if start_first else "stop-first"}},
            **({"UpdateStatus": {"State": "updating"}} if updating else {})}


def task_doc(task_id: str, service_id: str, node_id: str, container_id: str, slot: int = 1,
             state: str = "running", desired: str = "running") -> dict[str, Any]:
    return {"ID": task_id, "ServiceID": service_id, "NodeID": node_id, "Slot": slot,
            "DesiredState": desired,
            "Status": {"State": state, "ContainerStatus": {"ContainerID": container_id}}}


def versioned(answer: Any) -> Any:
    """The listing with each versioned object's Version.Index made of its content: as in
    Swarm, it moves whenever a test changes the object."""
    for doc in answer if isinstance(answer, list) else ():
        if isinstance(doc, dict) and "Version" in doc:
            doc["Version"] = {"Index": zlib.crc32(json.dumps(
                {k: v for k, v in doc.items() if k != "Version"}, sort_keys=True).encode())}
    return answer


class StubEngine:
    """GET answers `docs[path]` (a copy), or the object of that ID in the listing (GET
    /services/ID: the one in docs["/services"]); `down` makes every call fail; POSTs are
    recorded in `posts` and answered with {}."""

    def __init__(self, docs: dict[str, Any] | None = None) -> None:
        self.docs: dict[str, Any] = docs or {}
        self.posts: list[tuple[str, dict[str, str] | None, Any]] = []
        self.down = False
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return "the stub engine"

    def get(self, path: str, query: dict[str, str] | None = None,
            missing_ok: tuple[int, ...] = ()) -> Any:
        return self.call("GET", path, query, missing_ok=missing_ok)

    def call(self, method: str, path: str, query: dict[str, str] | None = None,
             body: Any = None, missing_ok: tuple[int, ...] = ()) -> Any:
        with self._lock:
            if self.down:
                raise EngineError(f"{self}: not running (no socket)")
            if method == "POST":
                self.posts.append((path, query, copy.deepcopy(body)))
                return {}
            if path in self.docs:
                return versioned(copy.deepcopy(self.docs[path]))
            kind, _, oid = path.rpartition("/")
            for doc in self.docs.get(kind, ()):  # one object: GET /services/ID
                if doc["ID"] == oid:
                    return copy.deepcopy(doc)
            raise EngineError(f"{self}: GET {path} answered 404: page not found")


def status_doc(budget: float, containers: list[dict[str, Any]], ticks: int = 10
               ) -> dict[str, Any]:
    """A dqoesd status (status.Status.to_json's shape) with these containers."""
    host = {"G": 0, "S": 0, "B": 0, "idle": 0, "pending": 0, "policy": "dqoes",
            "interval_s": 4.0, "last_decision_age_s": 1.0, "last_decision_unix": 1.0,
            "budget_cpus": budget, "ticks": ticks, "decisions": 1,
            "reconcile_corrections": 0, "ring_faults": 0, "ring_lost": 0}
    return {"host": host, "containers": [
        {"name": c["name"], "class": c.get("class", "S"), "target_s": c.get("target_s", 2.0),
         "metric": "p95", "measured_s": c.get("measured_s", 1.9), "q_s": 0.1,
         "cpu_limit_cores": c.get("limit", 0.3), "cpu_usage_cores": c.get("usage", 0.25),
         "throttled_ratio": 0.0, "samples": 12, "cgroup": "/x", "ring": "/r",
         "source": "service"} for c in containers]}


class FakeDqoesd:
    """A control server at `path` answering `status` with `self.status` and recording the
    `service-labels` requests in `self.labels` (service ID: labels, None: forgotten)."""

    def __init__(self, path: Path) -> None:
        self.status: dict[str, Any] = status_doc(0.5, [])
        self.labels: dict[str, dict[str, str] | None] = {}
        self.requests: list[tuple[str, Any]] = []
        self._server = ControlServer(path, self._handle, {"status": False,
                                                          "service-labels": True})
        self.path = path
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _handle(self, op: str, req: dict[str, Any], peer: Peer) -> Any:
        if op == "status":
            return self.status
        self.labels[req["service_id"]] = req["labels"]
        self.requests.append((req["service_id"], req["labels"]))
        return {"service_id": req["service_id"]}

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self._server.poll(0.05)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join()
        self._server.close()
