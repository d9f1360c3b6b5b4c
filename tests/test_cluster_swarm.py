"""The cluster end to end on the swarm guest's three real dockerd (lab/swarm.py): dqoesd and
dqoes-agent on every node, dqoes-manager on the Swarm manager, a service labelled with a
target. `dqoesctl cluster status` shows every node and the service's tasks with its target;
a target changed on the service reaches every task without recreating any; a manager
started again has the whole view back; a node whose agent stops is shown unreachable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.shell import wait_for
from lab.swarm import BUSYBOX_IMAGE, Node, Swarm

pytestmark = pytest.mark.guest_swarm

ROOT = Path(__file__).resolve().parent.parent
CONVERGE_S = 600.0  # minutes: seven Python daemons and three engines on an emulated CPU
SERVICE = "cluster-web"
# Agents report every 2 s; on an emulated CPU shared with other guests a report may come
# tens of seconds late, which must not make a node that runs well unreachable.
NODE_TIMEOUT_S = 60.0


class Daemons:
    """dqoesd and dqoes-agent on every node, dqoes-manager on the manager node."""

    def __init__(self, swarm: Swarm) -> None:
        self.swarm = swarm
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.manager_socket = swarm.manager.run_dir / "dqoes-manager.sock"
        for node in swarm.nodes:
            run = self.run_dir(node)
            self._start(f"dqoesd-{node.name}", node, "dqoes_cg.daemon", "--cpus", str(node.cpus),
                        "--engine-socket", str(node.socket),
                        "--run-dir", str(run), "--state-dir", str(run / "state"))
            self._start(f"agent-{node.name}", node, "dqoes_cg.cluster.agent", "--engine-socket",
                        str(node.socket), "--socket", str(run / "dqoes.sock"), "--interval", "2")
        self.start_manager()

    def start_manager(self) -> None:
        self._start("manager", self.swarm.manager, "dqoes_cg.cluster.managerd",
                    "--engine-socket", str(self.swarm.manager.socket), "--socket",
                    str(self.manager_socket), "--tick", "2", "--node-timeout",
                    str(NODE_TIMEOUT_S))

    @staticmethod
    def run_dir(node: Node) -> Path:
        return node.run_dir / "dqoes"

    def _start(self, name: str, node: Node, module: str, *args: str) -> None:
        log = (node.run_dir / f"{name}.log").open("ab")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.processes[name] = node.spawn([sys.executable, "-m", module, *args],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          env=env, cwd=ROOT)
        log.close()

    def stop(self, name: str) -> None:
        process = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # dqoesd gives its limits back
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def close(self) -> None:
        for name in self.processes:
            self.stop(name)

    def logs(self) -> str:
        tails = []
        for name in self.processes:
            node = self.swarm.manager if name == "manager" else self.swarm.node(
                name.split("-", 1)[1])
            lines = (node.run_dir / f"{name}.log").read_text(errors="replace").splitlines()
            tails.append(f"--- {name}\n" + "\n".join(lines[-15:]))
        return "\n".join(tails)

    def status(self) -> dict[str, Any] | None:
        """`dqoesctl cluster status --json` (None while the manager does not answer)."""
        result = subprocess.run(
            [sys.executable, "-m", "dqoes_cg.ctl", "cluster", "status", "--json",
             "--manager-socket", str(self.manager_socket)],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        return json.loads(result.stdout) if result.returncode == 0 else None

    def table(self) -> str:
        return subprocess.run(
            [sys.executable, "-m", "dqoes_cg.ctl", "cluster", "status", "--manager-socket",
             str(self.manager_socket)], capture_output=True, text=True, timeout=120,
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout

    def wait(self, what: str, check: Any) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            doc = self.status()
            return doc if doc is not None and check(doc) else None

        return wait_for(ready, CONVERGE_S, what,
                        lambda: (self.table() if self.status() else "") + self.logs(),
                        every=3.0)


@pytest.fixture
def daemons(swarm: Swarm) -> Iterator[Daemons]:
    daemons = Daemons(swarm)
    try:
        yield daemons
    finally:
        if swarm.docker("service", "ls", "--quiet", "--filter", f"name={SERVICE}").strip():
            swarm.remove_service(SERVICE)
        daemons.close()


def _tasks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in doc["tasks"] if t["service"] == SERVICE and t["state"] == "running"]


def _targets_everywhere(target_s: float):  # type: ignore[no-untyped-def]
    def check(doc: dict[str, Any]) -> bool:
        tasks = _tasks(doc)
        return all(n["reachable"] for n in doc["nodes"]) and len(tasks) == 3 and all(
            t["class"] != "unknown" and t["target_s"] == target_s for t in tasks)
    return check


def test_the_manager_shows_every_node_and_a_labelled_services_tasks_with_their_target(
        swarm: Swarm, daemons: Daemons) -> None:
    swarm.create_service(SERVICE, BUSYBOX_IMAGE, ["/busybox", "sleep", "1000000"],
                         replicas=3, options=["--label", "dqoes.target=2s",
                                              "--replicas-max-per-node", "1",
                                              "--stop-grace-period", "0s"])
    doc = daemons.wait("every node reachable, the three tasks reported with target 2s",
                       _targets_everywhere(2.0))
    assert sorted(n["name"] for n in doc["nodes"]) == ["node1", "node2", "node3"]
    assert {n["name"]: n["budget_cpus"] for n in doc["nodes"]} == {
        node.name: node.cpus for node in swarm.nodes}
    (service,) = [s for s in doc["services"] if s["name"] == SERVICE]
    assert (service["target_s"], service["replicas"], service["error"]) == (2.0, 3, None)
    assert sorted(t["node"] for t in _tasks(doc)) == ["node1", "node2", "node3"]
    containers = {t["container_id"] for t in _tasks(doc)}
    wait_for(lambda: "nodes 3 of 3 up" in daemons.table(), CONVERGE_S,
             "the table: every node up", daemons.table, every=3.0)

    # A new target on the service reaches every task, none recreated.
    swarm.update_service(SERVICE, "--label-add", "dqoes.target=3s")
    doc = daemons.wait("the three tasks pursuing the new target 3s", _targets_everywhere(3.0))
    assert {t["container_id"] for t in _tasks(doc)} == containers

    # The manager started again rebuilds its view from Swarm and the nodes' reports.
    daemons.stop("manager")
    daemons.start_manager()
    doc = daemons.wait("the new manager's view: every target", _targets_everywhere(3.0))
    assert {t["container_id"] for t in _tasks(doc)} == containers

    # A node whose agent stops is unreachable, its task no longer counted.
    daemons.stop("agent-node3")

    def node3_unreachable(doc: dict[str, Any]) -> bool:
        return [n["name"] for n in doc["nodes"] if not n["reachable"]] == ["node3"] and [
            t["node"] for t in _tasks(doc) if t["class"] == "unknown"] == ["node3"]

    doc = daemons.wait("node3 unreachable, its task unknown, the others as they were",
                       node3_unreachable)
    (node3,) = [n for n in doc["nodes"] if n["name"] == "node3"]
    assert node3["reason"].startswith("no report for"), node3
    assert node3["S"] == node3["B"] == 0
