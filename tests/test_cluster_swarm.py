"""The cluster end to end on the swarm guest's three real dockerd (lab/swarm.py): dqoesd and
dqoes-agent on every node, dqoes-manager on the Swarm manager, a service labelled with a
target. `dqoesctl cluster status` shows every node and the service's tasks with its target;
a target changed on the service reaches every task without recreating any; a manager
started again has the whole view back; a node whose agent stops, whose dockerd is killed or
whose link is cut is shown unreachable, none of its tasks counted, and comes back.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dqoes_cg.cluster.swarmapi import PAUSED_LABEL
from dqoes_cg.volumes import DRIVER, SOCKET_NAME, plugin_spec
from lab.guest.e2e import VOLUME, artifacts
from lab.shell import sh, wait_for
from lab.swarm import BUSYBOX_IMAGE, Node, Swarm

pytestmark = pytest.mark.guest_swarm

ROOT = Path(__file__).resolve().parent.parent
CONVERGE_S = 600.0  # minutes: seven Python daemons and three engines on an emulated CPU
SERVICE = "cluster-web"
INFER_IMAGE = "lab/infer:1"
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
            spec = node.etc_docker / "plugins" / f"{DRIVER}.spec"  # its ring volumes
            spec.parent.mkdir(exist_ok=True)
            spec.write_text(plugin_spec(run / SOCKET_NAME))
            self._start(f"dqoesd-{node.name}", node, "dqoes_cg.daemon", "--cpus", str(node.cpus),
                        "--engine-socket", str(node.socket),
                        "--run-dir", str(run), "--state-dir", str(run / "state"))
            self._start(f"agent-{node.name}", node, "dqoes_cg.cluster.agent", "--engine-socket",
                        str(node.socket), "--socket", str(run / "dqoes.sock"), "--interval", "2")
        self.start_manager()

    def start_manager(self, *options: str) -> None:
        self._start("manager", self.swarm.manager, "dqoes_cg.cluster.managerd",
                    "--engine-socket", str(self.swarm.manager.socket), "--socket",
                    str(self.manager_socket), "--tick", "2", "--node-timeout",
                    str(NODE_TIMEOUT_S), *options)

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
        for node in self.swarm.nodes:
            (node.etc_docker / "plugins" / f"{DRIVER}.spec").unlink(missing_ok=True)

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


@pytest.mark.parametrize("fault", ["dockerd killed", "link cut"])
def test_a_node_that_disappears_is_unreachable_and_its_task_not_counted(
        swarm: Swarm, daemons: Daemons, fault: str) -> None:
    swarm.create_service(SERVICE, BUSYBOX_IMAGE, ["/busybox", "sleep", "1000000"],
                         replicas=3, options=["--label", "dqoes.target=2s",
                                              "--replicas-max-per-node", "1",
                                              "--stop-grace-period", "0s"])
    daemons.wait("every node reachable, the three tasks reported", _targets_everywhere(2.0))
    node3 = swarm.node("node3")
    cut, restore = ((node3.kill_dockerd, node3.start_dockerd) if fault == "dockerd killed"
                    else (node3.cut_link, node3.restore_link))

    def node3_gone(doc: dict[str, Any]) -> bool:
        (node,) = [n for n in doc["nodes"] if n["name"] == "node3"]
        counted = [t for t in doc["tasks"] if t["node"] == "node3" and t["class"] != "unknown"]
        others = [n for n in doc["nodes"] if n["name"] != "node3"]
        return not node["reachable"] and not counted and node["S"] == 0 \
            and all(n["reachable"] for n in others)

    cut()
    try:
        started = time.monotonic()
        doc = daemons.wait(f"node3 unreachable ({fault}), none of its tasks counted",
                           node3_gone)
        (node,) = [n for n in doc["nodes"] if n["name"] == "node3"]
        print(f"{fault}: node3 unreachable {time.monotonic() - started:.0f} s after the "
              f"fault: {node['reason']}")
    finally:
        restore()
    swarm.wait_nodes("ready")
    daemons.wait("node3 back: every node reachable, the three tasks reported",
                 _targets_everywhere(2.0))


# A task of a service that cannot be in S beside its neighbour moves to a node with room.
CROWD = ("crowd-small", "crowd-large")
CROWD_NEEDS = (0.25, 0.35)  # CPUs: on a 0.5 node both cannot be in S, each alone can
REQUEST_CPU_MS = 40  # CPU time of one request of the inference server
SETTLE_S = 30.0  # stuck this long before a move (the manager's --settle)


@pytest.fixture
def infer_image(swarm: Swarm, tmp_path: Path) -> str:
    """The static inference server as an image on every node; its command for requests of
    REQUEST_CPU_MS of CPU."""
    infer = artifacts(tmp_path).infer
    swarm.import_image(INFER_IMAGE, {"infer": infer})
    return sh(infer, "--calibrate", str(REQUEST_CPU_MS)).strip()


def _crowd(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The running task of each crowd service, by service, once every crowd task runs."""
    tasks = {t["service"]: t for t in doc["tasks"]
             if t["service"] in CROWD and t["state"] == "running"}
    return tasks if len(tasks) == len(CROWD) else {}


def test_a_task_stuck_in_b_moves_to_a_node_that_can_satisfy_it(
        swarm: Swarm, daemons: Daemons, infer_image: str) -> None:
    """Two single-threaded services on node1 (0.5 CPU), needing 0.25 and 0.35 CPU for their
    targets: dqoesd can satisfy the smaller there, not both; the manager with QoE-aware
    placement moves the other to node2 or node3 through Swarm, where it is satisfied too,
    never running fewer replicas than asked, and lifts its constraint once it settled."""
    wait_for(lambda: all(DRIVER in _volume_drivers(swarm, n.name) for n in swarm.nodes),
             CONVERGE_S, "every engine listing the dqoes volume driver to Swarm",
             lambda: str({n.name: _volume_drivers(swarm, n.name) for n in swarm.nodes}),
             every=3.0)
    others = [n.name for n in swarm.nodes if n.name != "node1"]
    for node in others:  # as an operator would, while both start
        swarm.docker("node", "update", "--availability", "pause", node)
    try:
        for name in CROWD:
            swarm.create_service(name, INFER_IMAGE, ["/infer", infer_image], options=[
                "--label", "dqoes.target=20s", "--label", "dqoes.metric=mean",
                "--mount", VOLUME, "--update-order", "start-first",
                "--stop-grace-period", "0s"])
        for name in CROWD:
            swarm.wait_running(name, 1, lambda placed: bool(placed["node1"]))
    finally:
        for node in others:
            swarm.docker("node", "update", "--availability", "active", node)
    try:
        # Each one's work per request, measured where both share node1 (usage x latency is
        # the same at any share), sets the target it meets at its need: the median of three
        # windows within 20% of each other (the emulated CPU's speed swings).
        works: dict[str, list[float]] = {name: [] for name in CROWD}

        def steady(doc: dict[str, Any]) -> bool:
            for name, task in _crowd(doc).items():
                if task["measured_s"] and task["cpu_usage_cores"]:
                    work = task["measured_s"] * task["cpu_usage_cores"]
                    if not works[name] or works[name][-1] != work:  # a new window
                        works[name].append(work)
            return all(len(w) >= 3 and max(w[-3:]) <= 1.2 * min(w[-3:]) for w in works.values())

        daemons.wait("both crowd tasks' work per request steady on node1", steady)
        for name, need in zip(CROWD, CROWD_NEEDS, strict=True):
            work = statistics.median(works[name][-3:])
            swarm.update_service(name, "--label-add", f"dqoes.target={work / need * 1e3:.0f}ms")
        daemons.stop("manager")
        daemons.start_manager("--placement", "qoe", "--settle", str(SETTLE_S))

        fewer: list[str] = []

        def both_in_s_apart(doc: dict[str, Any]) -> bool:
            fewer.extend(s["name"] for s in doc["services"]
                         if s["name"] in CROWD and s["running"] < 1)
            tasks = _crowd(doc)
            return bool(tasks) and tasks[CROWD[0]]["node"] == "node1" \
                and tasks[CROWD[1]]["node"] != "node1" \
                and all(t["class"] == "S" for t in tasks.values())

        started = time.monotonic()
        doc = daemons.wait("crowd-large moved off node1, both in S", both_in_s_apart)
        where = [(t["service"], t["node"], t["measured_s"], t["target_s"])
                 for t in _crowd(doc).values()]
        print(f"moved, both in S {time.monotonic() - started:.0f} s after placement began: "
              f"{where}")
        assert not fewer, f"fewer running replicas than asked: {fewer}"
        log = (swarm.manager.run_dir / "manager.log").read_text()
        moves = [line for line in log.splitlines() if "placement: service" in line
                 and " move to node " in line]
        assert len(moves) == 1, moves
        print(moves[0])
        wait_for(lambda: not _constraints(swarm, CROWD[1]), CONVERGE_S,
                 "the move's constraint lifted", lambda: str(_constraints(swarm, CROWD[1])),
                 every=3.0)
    finally:
        for name in CROWD:
            swarm.remove_service(name)
        daemons.stop("manager")  # first: it could pause a node again
        for node in swarm.nodes:  # placement may have paused one to new tasks
            if PAUSED_LABEL in _node_labels(swarm, node.name):
                swarm.docker("node", "update", "--availability", "active", "--label-rm",
                             PAUSED_LABEL, node.name)


def _constraints(swarm: Swarm, service: str) -> list[str]:
    spec = json.loads(swarm.docker("service", "inspect", "--format", "{{json .Spec}}",
                                   service))
    return spec["TaskTemplate"].get("Placement", {}).get("Constraints") or []


def _node_labels(swarm: Swarm, node: str) -> dict[str, str]:
    return json.loads(swarm.docker("node", "inspect", "--format", "{{json .Spec.Labels}}",
                                   node)) or {}


def _volume_drivers(swarm: Swarm, node: str) -> set[str]:
    """The volume drivers a node's engine lists to Swarm (which places a task with a volume
    only on a node that lists its driver)."""
    plugins = json.loads(swarm.docker("node", "inspect", "--format",
                                      "{{json .Description.Engine.Plugins}}", node)) or []
    return {p["Name"] for p in plugins if p["Type"] == "Volume"}
