"""A stand-in for the control sockets of dqoesd and dqoes-manager: one canned, well-formed
reply per operation, for tests and benchmarks of dqoesctl alone (what the CLI imports and
costs, not what the daemon does)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

from dqoes_cg.cluster.view import ClusterView, NodeView, ServiceView, TaskView
from dqoes_cg.status import ContainerStatus, HostStatus, Listing, Status

RING = "/run/dqoes/rings/web/ring"


def _status() -> dict[str, Any]:
    web = ContainerStatus("web", "S", 0.04, "p95", 0.038, 0.002, 0.5, 0.45, 0.1, 120,
                          "/system.slice/web.scope", RING)
    host = HostStatus(G=0, S=1, B=0, idle=0, pending=0, policy="admit", interval_s=4.0,
                      last_decision_age_s=1.0, last_decision_unix=1.7e9, budget_cpus=2.0,
                      ticks=10, decisions=2, reconcile_corrections=0, ring_faults=0,
                      ring_lost=0)
    return Status(host, [web]).to_json()


def _cluster() -> dict[str, Any]:
    node = NodeView("n1", "node-1", "manager", "ready", "active", True, None, 2.0, 0.5, 1.5,
                    S=1)
    service = ServiceView("s1", "web", "replicated", 1, 1, 0.04, "p95", None, False, True)
    task = TaskView("t1", "s1", "web", 1, "n1", "node-1", "c1", "running", "S", 0.04, "p95",
                    0.038, 0.5, 0.45, 120)
    return ClusterView(1.7e9, "n1", None, [node], [service], [task]).to_json()


REPLIES: dict[str, Any] = {
    "status": _status(),
    "list": [Listing("web", 0.04, "p95", "bound", "/system.slice/web.scope", RING,
                     RING.rsplit("/", 1)[0]).to_json()],
    "set-target": {"name": "web", "target_s": 0.04, "metric": "p95", "kind": "inference",
                   "cgroup": "/system.slice/web.scope", "ring": RING,
                   "ring_dir": RING.rsplit("/", 1)[0]},
    "cluster-status": _cluster(),
}


class StubDaemon:
    """Serves REPLIES on a Unix socket, one request per connection, in a thread of its own
    until `close`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            with conn:
                conn.settimeout(10)
                try:
                    line = conn.makefile("rb").readline()
                    op = json.loads(line).get("op")
                    reply = ({"version": 1, "ok": True, "result": REPLIES[op]} if op in REPLIES
                             else {"version": 1, "ok": False, "error": f"no stub for {op!r}"})
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join()

    def __enter__(self) -> StubDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
