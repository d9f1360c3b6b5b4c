"""The multi-node testbed (lab/swarm.py) on the swarm guest's real kernel: three real
dockerd, one Swarm. Its nodes are Ready, each with its own engine, hostname, network and TLS
identity from the Swarm CA; a service's tasks run in their node's cgroup subtree, capped at
the node's budget; Swarm places and moves tasks by node labels and constraints; a node whose
dockerd dies, or whose link is cut, is Down to the manager, and comes back.

The tests share the session's Swarm and run in order, as one story; each removes what it
created and leaves every node Ready.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab.shell import sh
from lab.swarm import BUSYBOX_IMAGE, Node, Swarm, Task

pytestmark = pytest.mark.guest_swarm

SLEEP = ["/busybox", "sleep", "1000000"]
# PID 1 of a container ignores SIGTERM: no grace period to wait out before SIGKILL.
QUICK_STOP = ["--stop-grace-period", "0s"]


@pytest.fixture
def service(swarm: Swarm) -> Iterator[str]:
    """A name for the test's service, removed afterwards."""
    name = "probe"
    yield name
    if swarm.docker("service", "ls", "--quiet", "--filter", f"name={name}").strip():
        swarm.remove_service(name)


def _one_each(placed: dict[str, list[Task]]) -> bool:
    return all(len(tasks) == 1 for tasks in placed.values())


def _on(node: str) -> Callable[[dict[str, list[Task]]], bool]:
    return lambda placed: len(placed[node]) == 1


def test_every_node_is_ready_with_an_identity_of_its_own(swarm: Swarm) -> None:
    status = swarm.node_status()
    assert sorted(status) == ["node1", "node2", "node3"]
    assert {name: (s.state, s.availability, s.role) for name, s in status.items()} == {
        "node1": ("ready", "active", "manager"), "node2": ("ready", "active", "worker"),
        "node3": ("ready", "active", "worker")}
    assert status["node1"].reachability == "reachable"
    assert len({node.node_id for node in swarm.nodes}) == 3
    ca = swarm.manager.tls.ca_cert.read_bytes()
    for node in swarm.nodes:
        assert node.tls.ca_cert.read_bytes() == ca, "one Swarm CA"
        subject = sh("openssl", "x509", "-in", node.tls.cert, "-noout", "-subject",
                     "-nameopt", "RFC2253")
        role = "swarm-manager" if node.manager else "swarm-worker"
        assert f"CN={node.node_id},OU={role}," in subject, subject
        assert (node.cgroup / "cpu.max").read_text().strip() == node.cpu_max


def test_swarm_identities_authenticate_a_mutual_tls_channel(swarm: Swarm,
                                                             tmp_path: Path) -> None:
    manager, worker = swarm.manager, swarm.node("node2")
    keys = {}
    for node in (manager, worker):
        keys[node.name] = tmp_path / f"{node.name}.key"
        keys[node.name].write_bytes(node.tls.key_pem())
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(manager.tls.cert, keys[manager.name])
    server.load_verify_locations(manager.tls.ca_cert)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(cafile=worker.tls.ca_cert)
    client.load_cert_chain(worker.tls.cert, keys[worker.name])
    ends = socket.socketpair()
    seen: dict[str, object] = {}

    def serve() -> None:
        with server.wrap_socket(ends[0], server_side=True) as tls:
            seen["client"] = dict(pair[0] for pair in tls.getpeercert()["subject"])

    thread = threading.Thread(target=serve)
    thread.start()
    with client.wrap_socket(ends[1], server_hostname=manager.node_id) as tls:
        seen["server"] = dict(pair[0] for pair in tls.getpeercert()["subject"])
    thread.join(timeout=60)
    assert seen["server"]["commonName"] == manager.node_id
    assert seen["client"] == seen["client"] | {"commonName": worker.node_id,
                                               "organizationalUnitName": "swarm-worker"}


def test_a_process_runs_as_its_node(swarm: Swarm) -> None:
    node = swarm.node("node2")
    script = ("hostname; cat /proc/self/cgroup; cat /sys/fs/cgroup/{cgroup}/cpu.max; "
              "ip -4 -o addr show eth0; ls /etc/docker")
    process = node.spawn(["sh", "-c", script.format(
        cgroup=node.cgroup.relative_to("/sys/fs/cgroup"))], stdout=subprocess.PIPE)
    out, _ = process.communicate(timeout=120)
    hostname, cgroup, cpu_max, addr, *_ = out.decode().splitlines()
    assert hostname == "node2"
    assert cgroup == f"0::/{node.system_cgroup.relative_to('/sys/fs/cgroup')}"
    assert cpu_max == node.cpu_max  # the node's own cgroup2 mount shows its subtree
    assert f"inet {node.address}/24" in addr


def test_a_service_spreads_one_task_per_node_in_its_nodes_cgroup(
        swarm: Swarm, service: str) -> None:
    # At most one per node: a node slow to report (the CPU is emulated) waits for its task.
    swarm.create_service(service, BUSYBOX_IMAGE, SLEEP, replicas=3,
                         options=["--replicas-max-per-node", "1", *QUICK_STOP])
    placed = swarm.wait_running(service, 3, where=_one_each)
    for node in swarm.nodes:
        (task,) = placed[node.name]
        cgroup = node.container_cgroup(task.container_id)
        assert cgroup.parent == node.cgroup, (node.name, cgroup)
        assert (cgroup.parent / "cpu.max").read_text().strip() == node.cpu_max


def test_tasks_move_by_node_label_and_by_constraint(swarm: Swarm, service: str) -> None:
    swarm.docker("node", "update", "--label-add", "lab.pool=a", "node2")
    swarm.create_service(service, BUSYBOX_IMAGE, SLEEP, constraints=["node.labels.lab.pool==a"],
                         options=QUICK_STOP)
    swarm.wait_running(service, 1, where=_on("node2"))
    # The label moves: Swarm stops the task where the constraint no longer holds.
    swarm.docker("node", "update", "--label-add", "lab.pool=a", "node3")
    swarm.docker("node", "update", "--label-rm", "lab.pool", "node2")
    swarm.wait_running(service, 1, where=_on("node3"))
    # The constraint changes: a rolling update puts the task where it now points.
    swarm.update_service(service, "--constraint-rm", "node.labels.lab.pool==a",
                         "--constraint-add", "node.hostname==node1")
    swarm.wait_running(service, 1, where=_on("node1"))
    swarm.docker("node", "update", "--label-rm", "lab.pool", "node3")


@pytest.fixture
def worker(swarm: Swarm) -> Iterator[Node]:
    """node3, back on the network, with its dockerd, and Ready afterwards."""
    node = swarm.node("node3")
    yield node
    node.restore_link()
    if not node.dockerd_running:
        node.start_dockerd()
    swarm.wait_nodes("ready")


def test_a_node_whose_dockerd_is_killed_is_down_then_rejoins(swarm: Swarm,
                                                            worker: Node) -> None:
    worker.kill_dockerd()
    swarm.wait_nodes({worker.name: "down", "node1": "ready", "node2": "ready"})
    worker.start_dockerd()
    swarm.wait_nodes("ready")


def test_a_node_whose_link_is_cut_is_down_then_comes_back(swarm: Swarm,
                                                          worker: Node) -> None:
    worker.cut_link()
    swarm.wait_nodes({worker.name: "down", "node1": "ready", "node2": "ready"})
    worker.restore_link()
    swarm.wait_nodes("ready")
