"""The cluster's manager and agent on the host: the mutual-TLS channel with Swarm-like
identities (tests/swarmca.py), a node's reports judged against Swarm's task list, the view
(`dqoesctl cluster status`, table and JSON), malformed service labels and unreachable
nodes. Swarm's API is a stub answering documents shaped as Docker's (tests/fakeswarm.py);
the real thing on three real dockerd is tests/test_cluster_swarm.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dqoes_cg import ctl
from dqoes_cg.cluster.actions import Update
from dqoes_cg.cluster.agent import Agent
from dqoes_cg.cluster.identity import Credentials, IdentityError, peer_identity, plain_key
from dqoes_cg.cluster.manager import Manager, judge
from dqoes_cg.cluster.managerd import OPERATIONS, handler, serve, swarm_when_it_answers
from dqoes_cg.cluster.protocol import (
    Ack,
    Channel,
    ContainerReport,
    ProtocolError,
    Report,
    Services,
    parse,
)
from dqoes_cg.cluster.server import Server
from dqoes_cg.cluster.show import format_cluster
from dqoes_cg.cluster.view import ClusterView
from dqoes_cg.control import ControlServer
from dqoes_cg.sdnotify import Notifier
from tests.fakeswarm import FakeDqoesd, StubEngine, node_doc, service_doc, status_doc, task_doc
from tests.swarmca import SwarmCA, swarm_id

T = TypeVar("T")
DEADLINE_S = 60.0  # a loaded 2-core host

CID_WEB = "a" * 64  # web.1 on node2
CID_DB = "b" * 64  # db.1 on node3
CID_STRAY = "c" * 64  # no task of Swarm's


def wait_for(what: str, check: Callable[[], T | None], timeout: float = DEADLINE_S) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)


class Cluster:
    """A Swarm of three nodes (node1 the manager) as the stub engine shows it: service web
    (target 2s) with a task on node2, db (target 500ms) with one on node3, and the
    certificates of each node from one Swarm CA."""

    def __init__(self, directory: Path) -> None:
        self.ca = SwarmCA(directory / "ca")
        self.ids = {name: swarm_id() for name in ("node1", "node2", "node3")}
        self.creds = {name: self.ca.node(name, "manager" if name == "node1" else "worker",
                                         node=nid)[1] for name, nid in self.ids.items()}
        self.web, self.db = swarm_id(), swarm_id()
        self.engine = StubEngine({
            "/nodes": [node_doc(self.ids["node1"], "node1", role="manager"),
                       node_doc(self.ids["node2"], "node2"),
                       node_doc(self.ids["node3"], "node3")],
            "/services": [service_doc(self.web, "web", {"dqoes.target": "2s"}),
                          service_doc(self.db, "db", {"dqoes.target": "500ms"})],
            "/tasks": [task_doc(swarm_id(), self.web, self.ids["node2"], CID_WEB),
                       task_doc(swarm_id(), self.db, self.ids["node3"], CID_DB)],
        })
        self.manager = Manager(self.engine, self.ids["node1"], node_timeout=5.0)
        self.manager.tick(time.monotonic())

    def id(self, name: str) -> str:
        return self.ids[name]


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


@pytest.fixture
def server(cluster: Cluster) -> Iterator[Server]:
    server = Server(cluster.manager, cluster.creds["node1"], cluster.ca.swarm,
                    ("127.0.0.1", 0))
    server.start()
    yield server
    server.close()


def container(cid: str, cls: str = "S", target: float = 2.0) -> ContainerReport:
    return ContainerReport(cid, cls, target, "p95", target * 0.9, 0.3, 0.25, 12)


def report(seq: int, *containers: ContainerReport) -> Report:
    return Report(seq, 0.5, 0.25, True, True, None, containers)


def agent_engine(cluster: Cluster, node: str, containers: dict[str, str]) -> StubEngine:
    """The node's own engine: its Swarm (node1 the manager) and its task containers."""
    return StubEngine({
        "/info": {"DockerRootDir": "/nonexistent",
                  "Swarm": {"LocalNodeState": "active", "NodeID": cluster.id(node),
                            "RemoteManagers": [{"NodeID": cluster.id("node1"),
                                                "Addr": "127.0.0.1:2377"}]}},
        "/containers/json": [{"Id": cid, "Names": [f"/{name}"]}
                             for name, cid in containers.items()]})


def connect(server: Server, creds: Credentials, manager_id: str) -> Channel:
    """A raw client of the manager with these credentials (its handshake done)."""
    raw = socket.create_connection(server.address, timeout=DEADLINE_S)
    tls = creds.client_context().wrap_socket(raw, server_hostname=manager_id)
    return Channel(tls)


def exchange(channel: Channel, message: Report) -> Ack:
    """Send a report; the manager's acknowledgement (labels that come first are skipped)."""
    channel.send(message, DEADLINE_S)
    while True:
        answer = wait_for("an answer from the manager", lambda: channel.receive(1.0))
        if isinstance(answer, Ack):
            return answer


# --- the channel ------------------------------------------------------------------------

def test_an_agent_reports_over_mutual_tls_and_its_dqoesd_gets_the_labels(
        cluster: Cluster, server: Server, tmp_path: Path) -> None:
    dqoesd = FakeDqoesd(tmp_path / "dqoesd.sock")
    dqoesd.status = status_doc(0.5, [{"name": "web.1.xyz", "class": "S", "target_s": 2.0,
                                      "measured_s": 1.5, "limit": 0.3, "usage": 0.2},
                                     {"name": "not-a-task", "class": "B"}])
    agent = Agent(agent_engine(cluster, "node2", {"web.1.xyz": CID_WEB}), dqoesd.path,
                  server.address[1], cluster.creds["node2"].directory)
    try:
        def settled() -> ClusterView | None:
            agent.step(time.monotonic())
            view = cluster.manager.tick(time.monotonic())
            node = view.node(cluster.id("node2"))
            return view if node and node.reachable and node.S == 1 and \
                dqoesd.labels.get(cluster.web) else None

        view = wait_for("node2 reported and was given web's labels", settled)
    finally:
        agent.close()
        dqoesd.close()
    assert dqoesd.labels == {cluster.web: {"dqoes.target": "2s"}}, "only its node's services"
    node2 = view.node(cluster.id("node2"))
    assert node2 is not None
    assert (node2.budget_cpus, node2.S, node2.B, node2.refused) == (0.5, 1, 0, 0)
    web = next(t for t in view.tasks if t.service == "web")
    assert (web.node, web.cls, web.target_s, web.measured_s, web.cpu_limit_cores) == (
        "node2", "S", 2.0, 1.5, 0.3)
    db = next(t for t in view.tasks if t.service == "db")
    assert (db.cls, db.reason) == ("unknown", "no report from its agent")
    assert view.satisfied() == 1


def test_the_manager_listens_on_an_ipv6_address_too(cluster: Cluster) -> None:
    server = Server(cluster.manager, cluster.creds["node1"], cluster.ca.swarm, ("::1", 0))
    server.start()
    try:
        channel = connect(server, cluster.creds["node2"], cluster.id("node1"))
        try:
            assert isinstance(exchange(channel, report(1, container(CID_WEB))), Ack)
        finally:
            channel.close()
    finally:
        server.close()


class _EngineAnsweringLate(StubEngine):
    """Answers /info only from its third call (dockerd starting, or slow on a loaded host)."""

    def __init__(self) -> None:
        super().__init__({"/info": {"DockerRootDir": "/var/lib/docker", "Swarm": {
            "LocalNodeState": "active", "ControlAvailable": True, "NodeID": "n1",
            "NodeAddr": "10.0.0.1", "Cluster": {"ID": "c1"}}}})
        self.calls = 0

    def get(self, path: str, query: dict[str, str] | None = None,
            missing_ok: tuple[int, ...] = ()) -> Any:
        self.calls += 1
        self.down = self.calls < 3
        return super().get(path, query, missing_ok)


def test_the_manager_waits_for_an_engine_that_does_not_answer_yet(
        caplog: pytest.LogCaptureFixture) -> None:
    engine = _EngineAnsweringLate()
    with caplog.at_level(logging.WARNING):
        swarm = swarm_when_it_answers(engine, threading.Event(),
                                      first_wait_s=0.01)
    assert swarm == ("n1", "c1", "10.0.0.1", Path("/var/lib/docker"))
    assert engine.calls == 3
    assert [r.getMessage() for r in caplog.records] == [
        "the stub engine: not running (no socket); waiting for it"]  # once, not per try
    stopping = threading.Event()
    stopping.set()
    engine.calls = -10
    assert swarm_when_it_answers(engine, stopping) is None


def test_a_node_reports_only_about_its_own_tasks(cluster: Cluster, server: Server) -> None:
    channel = connect(server, cluster.creds["node2"], cluster.id("node1"))
    try:
        ack = exchange(channel, report(1, container(CID_WEB), container(CID_DB, "B")))
    finally:
        channel.close()
    assert ack.refused == ((CID_DB, "not a container of this node's tasks"),)
    view = cluster.manager.tick(time.monotonic())
    db = next(t for t in view.tasks if t.service == "db")
    assert db.cls == "unknown", "node3's task is not node2's to report"
    assert view.node(cluster.id("node2")).refused == 1  # type: ignore[union-attr]
    assert view.node(cluster.id("node3")).B == 0  # type: ignore[union-attr]


def test_a_node_refused_again_and_again_logs_a_line_a_minute(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """2,000 reports claiming another node's container, every other one: each was a line."""
    node2 = cluster.id("node2")
    with caplog.at_level(logging.INFO):
        for seq in range(2000):
            claims = (container(CID_DB),) if seq % 2 else ()
            cluster.manager.receive(node2, report(seq, *claims), time.monotonic())
    assert sum("refused" in m for m in caplog.messages) == 1


def test_unauthenticated_peers_log_a_line_a_minute(
        server: Server, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        for _ in range(50):
            with socket.create_connection(server.address, timeout=DEADLINE_S) as raw:
                raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
                with contextlib.suppress(ConnectionResetError):
                    while raw.recv(4096):  # until the manager hangs up: it has logged then
                        pass
    assert sum("connection from 127.0.0.1 ended" in m for m in caplog.messages) == 1


def test_a_container_no_task_runs_is_refused_after_a_grace() -> None:
    mine, other = swarm_id(), swarm_id()
    owners = {CID_WEB: mine, CID_DB: other}
    claims = report(1, container(CID_WEB), container(CID_DB), container(CID_STRAY))
    accepted, refused, waiting = judge(mine, claims, owners, {}, now=100.0, grace=10.0)
    assert list(accepted) == [CID_WEB]
    assert [cid for cid, _ in refused] == [CID_DB]
    assert waiting == {CID_STRAY: 100.0}, "Swarm may not list a task just started yet"
    _, refused, waiting = judge(mine, claims, owners, waiting, now=111.0, grace=10.0)
    assert refused == [(CID_DB, "not a container of this node's tasks"),
                       (CID_STRAY, "no task of Swarm's runs this container")]
    assert waiting == {}


def test_the_manager_refuses_a_certificate_of_another_swarm(cluster: Cluster, server: Server,
                                                             tmp_path: Path) -> None:
    stranger = SwarmCA(tmp_path / "other")
    _, creds = stranger.node("node2", node=cluster.id("node2"))
    with pytest.raises((ssl.SSLError, OSError)):
        channel = connect(server, creds, cluster.id("node1"))
        exchange(channel, report(1, container(CID_WEB)))
    # Signed by this Swarm's CA, but naming another Swarm (its O).
    _, forged = cluster.ca.node("forged", node=cluster.id("node2"), swarm=swarm_id())
    channel = connect(server, forged, cluster.id("node1"))
    with pytest.raises((ConnectionError, OSError)):
        exchange(channel, report(1, container(CID_WEB)))
    channel.close()
    assert not cluster.manager.view().node(cluster.id("node2")).reachable  # type: ignore


def test_the_manager_refuses_a_node_that_swarm_no_longer_has(cluster: Cluster,
                                                              server: Server) -> None:
    _, removed = cluster.ca.node("removed")  # a valid certificate of a node Swarm forgot
    channel = connect(server, removed, cluster.id("node1"))
    with pytest.raises((ConnectionError, OSError)):
        exchange(channel, report(1))
    channel.close()


def test_an_agent_talks_only_to_the_manager_it_meant(cluster: Cluster, tmp_path: Path
                                                     ) -> None:
    """A worker's certificate cannot pass for the manager's."""
    impostor = Server(cluster.manager, cluster.creds["node3"], cluster.ca.swarm,
                      ("127.0.0.1", 0))
    impostor.start()
    try:
        with pytest.raises(ssl.SSLCertVerificationError):
            connect(impostor, cluster.creds["node2"], cluster.id("node1"))
        channel = connect(impostor, cluster.creds["node2"], cluster.id("node3"))
        identity = peer_identity(channel.sock.getpeercert())  # type: ignore[attr-defined]
        channel.close()
    finally:
        impostor.close()
    assert (identity.node_id, identity.role) == (cluster.id("node3"), "worker")


# --- the view ---------------------------------------------------------------------------

def test_a_malformed_service_label_is_reported_and_affects_no_other_service(
        cluster: Cluster) -> None:
    cluster.engine.docs["/services"][1]["Spec"]["Labels"] = {"dqoes.target": "fast"}
    now = time.monotonic()
    cluster.manager.receive(cluster.id("node2"), report(1, container(CID_WEB)), now)
    view = cluster.manager.tick(now)
    db, web = view.services
    assert (db.name, db.target_s) == ("db", None)
    assert db.error is not None and "dqoes.target" in db.error
    assert (web.name, web.target_s, web.error) == ("web", 2.0, None)
    assert view.satisfied() == 1
    assert "labels refused: dqoes.target" in format_cluster(view)
    assert cluster.manager.services_for(cluster.id("node2")) == {
        cluster.web: {"dqoes.target": "2s"}}


def test_a_silent_node_is_unreachable_and_its_tasks_do_not_count(cluster: Cluster) -> None:
    now = time.monotonic()
    cluster.manager.receive(cluster.id("node2"), report(1, container(CID_WEB)), now)
    cluster.manager.receive(cluster.id("node3"), report(1, container(CID_DB, "S", 0.5)), now)
    assert cluster.manager.tick(now).satisfied() == 2
    cluster.manager.receive(cluster.id("node3"), report(2, container(CID_DB, "S", 0.5)),
                            now + 10)
    view = cluster.manager.tick(now + 10)
    node2 = view.node(cluster.id("node2"))
    assert node2 is not None and not node2.reachable
    assert node2.reason == "no report for 10s"
    assert (node2.S, node2.used_cpus) == (0, None)
    web = next(t for t in view.tasks if t.service == "web")
    assert (web.cls, web.reason) == ("unknown", "no report for 10s")
    assert view.satisfied() == 1
    # Swarm's word counts too: a node it has down is unreachable whatever it reported.
    cluster.engine.docs["/nodes"][2]["Status"]["State"] = "down"
    view = cluster.manager.tick(now + 10)
    assert view.node(cluster.id("node3")).reason == "Swarm has it down"  # type: ignore
    assert view.satisfied() == 0
    assert "unreachable" in format_cluster(view)


def test_each_node_counts_its_own_tasks_classes_and_each_service_its_running_tasks(
        cluster: Cluster) -> None:
    """Counted in one pass over the tasks (not a pass per node or per service)."""
    cid = {(node, service): f"{n}{s}".ljust(64, "0")
           for n, node in enumerate(("node2", "node3"), 1) for s, service in enumerate(
               ("web", "db"), 1)}
    sid = {"web": cluster.web, "db": cluster.db}
    cluster.engine.docs["/tasks"] = [
        task_doc(swarm_id(), sid[service], cluster.id(node), c, slot=slot,
                 state="starting" if (node, service) == ("node3", "db") else "running")
        for slot, ((node, service), c) in enumerate(cid.items(), 1)]
    now = time.monotonic()
    cluster.manager.tick(now)
    cluster.manager.receive(cluster.id("node2"), report(
        1, container(cid["node2", "web"], "B"), container(cid["node2", "db"], "B")), now)
    cluster.manager.receive(cluster.id("node3"), report(
        1, container(cid["node3", "web"], "S"), container(cid["node3", "db"], "G")), now)
    view = cluster.manager.tick(now)
    counts = {n.name: (n.G, n.S, n.B) for n in view.nodes}
    assert counts == {"node1": (0, 0, 0), "node2": (0, 0, 2), "node3": (1, 1, 0)}
    assert {s.name: s.running for s in view.services} == {"web": 2, "db": 1}
    services = {row[0]: row for row in map(str.split, format_cluster(view).splitlines())
                if row[:1] in (["web"], ["db"])}
    assert (services["web"][6], services["db"][6]) == ("1", "0"), "tasks in S"


def test_the_view_survives_swarms_api_going_away(cluster: Cluster) -> None:
    now = time.monotonic()
    cluster.manager.receive(cluster.id("node2"), report(1, container(CID_WEB)), now)
    cluster.engine.down = True
    view = cluster.manager.tick(now)
    assert view.swarm_error is not None
    assert [s.name for s in view.services] == ["db", "web"], "the last view of Swarm"
    assert "Swarm's API does not answer" in format_cluster(view)


@pytest.fixture
def manager_socket(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """dqoes-manager's control socket serving the cluster's view."""
    path = tmp_path / "manager.sock"
    control = ControlServer(path, handler(cluster.manager), OPERATIONS)
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            control.poll(0.05)

    thread = threading.Thread(target=serve)
    thread.start()
    yield path
    stopping.set()
    thread.join()
    control.close()


def test_dqoesctl_cluster_status_table_and_json(cluster: Cluster, manager_socket: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    now = time.monotonic()
    cluster.manager.receive(cluster.id("node2"), report(1, container(CID_WEB)), now)
    cluster.manager.tick(now)
    assert ctl.main(["cluster", "status", "--manager-socket", str(manager_socket),
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(n["name"], n["reachable"]) for n in doc["nodes"]] == [
        ("node1", False), ("node2", True), ("node3", False)]
    assert [(t["service"], t["node"], t["class"], t["target_s"]) for t in doc["tasks"]] == [
        ("db", "node3", "unknown", None), ("web", "node2", "S", 2.0)]
    assert ClusterView.from_json(doc) == cluster.manager.view()
    assert ctl.main(["cluster", "status", "--manager-socket", str(manager_socket)]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert lines[0].split()[:6] == ["NODE", "ROLE", "STATE", "BUDGET", "USED", "SPARE"]
    assert any(line.split()[:3] == ["node2", "worker", "up"] for line in lines)
    assert any(line.split()[:4] == ["web.1", "node2", "running", "S"] for line in lines)
    assert "|S| 1 of 2 tasks | nodes 1 of 3 up" in table


def test_cluster_status_is_answered_while_swarms_api_is_silent(
        cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The manager reads Swarm in a thread of its own: a read that hangs (up to the
    engine's timeout, 10 s each) keeps no request waiting."""
    silent, reading, answers = threading.Event(), threading.Event(), threading.Event()
    answer = cluster.engine.call

    def hanging_call(*args: Any, **kwargs: Any) -> Any:
        if silent.is_set():
            reading.set()
            answers.wait()
        return answer(*args, **kwargs)

    cluster.engine.call = hanging_call  # type: ignore[method-assign]
    path, stopping = tmp_path / "manager.sock", threading.Event()
    control = ControlServer(path, handler(cluster.manager), OPERATIONS)
    loop = threading.Thread(target=serve, args=(cluster.manager, control, Notifier(), 0.05,
                                                stopping))
    loop.start()
    try:
        silent.set()
        wait_for("a read of Swarm's API hanging", reading.is_set)
        assert ctl.main(["cluster", "status", "--manager-socket", str(path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["nodes"]
    finally:
        stopping.set()
        answers.set()
        loop.join()
        control.close()


def test_dqoesctl_cluster_recommend_and_act_switch_the_manager_without_a_restart(
        cluster: Cluster, manager_socket: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def acting() -> bool:
        cluster.manager.tick(time.monotonic())
        assert ctl.main(["cluster", "status", "--manager-socket", str(manager_socket),
                         "--json"]) == 0
        return json.loads(capsys.readouterr().out)["acting"]

    assert acting()
    assert ctl.main(["cluster", "recommend", "--manager-socket", str(manager_socket)]) == 0
    assert "recommending" in capsys.readouterr().out
    assert not acting() and not cluster.manager.acting
    assert ctl.main(["cluster", "act", "--manager-socket", str(manager_socket)]) == 0
    assert "acting" in capsys.readouterr().out
    assert acting() and cluster.manager.acting


def test_dqoesctl_cluster_status_without_a_manager(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl.main(["cluster", "status", "--manager-socket",
                     str(tmp_path / "none.sock")]) == ctl.EXIT_UNAVAILABLE
    assert capsys.readouterr().err.count("\n") == 1


# --- what crosses the channel -----------------------------------------------------------

def _report_doc(**change: Any) -> bytes:
    doc = report(1, container(CID_WEB)).to_json()
    doc["containers"][0].update(change.pop("container", {}))
    doc.update(change)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("line", [
    b"not json", b"[]", b'{"v": 2, "type": "report"}', b'{"v": 1, "type": "hello"}',
    _report_doc(seq=-1), _report_doc(budget_cpus=0), _report_doc(used_cpus="1"),
    _report_doc(containers="x"), _report_doc(container={"id": "a" * 12}),
    _report_doc(container={"class": "Z"}), _report_doc(container={"metric": "p42"}),
    _report_doc(container={"target_s": float("nan")}), _report_doc(engine=1),
    b'{"v": 1, "type": "services", "services": {"x": {}}}',
    b'{"v": 1, "type": "services", "services": {"' + b"a" * 25 + b'": {"other": "x"}}}',
])
def test_a_malformed_message_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse(line)


def test_messages_round_trip() -> None:
    for message in (report(3, container(CID_WEB), container(CID_DB, "B")),
                    Ack(3, ((CID_DB, "not yours"),)),
                    Services({swarm_id(): {"dqoes.target": "2s"}})):
        assert parse(json.dumps(message.to_json()).encode()) == message


def test_a_swarm_key_loses_its_headers_and_an_encrypted_one_is_refused(tmp_path: Path
                                                                       ) -> None:
    key = (b"-----BEGIN PRIVATE KEY-----\nkek-version: 0\nraft-dek: xyz\n\nAAAA\nBBBB\n"
           b"-----END PRIVATE KEY-----\n")
    assert plain_key(key, tmp_path) == (b"-----BEGIN PRIVATE KEY-----\nAAAA\nBBBB\n"
                                        b"-----END PRIVATE KEY-----\n")
    with pytest.raises(IdentityError, match="autolocked"):
        plain_key(key.replace(b"PRIVATE KEY", b"ENCRYPTED PRIVATE KEY"), tmp_path)
    with pytest.raises(IdentityError, match="no private key"):
        plain_key(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                  tmp_path)


def test_an_agent_keeps_the_labels_without_a_manager_and_gives_them_to_a_new_dqoesd(
        cluster: Cluster, tmp_path: Path) -> None:
    server = Server(cluster.manager, cluster.creds["node1"], cluster.ca.swarm,
                    ("127.0.0.1", 0))
    server.start()
    dqoesd = FakeDqoesd(tmp_path / "dqoesd.sock")
    dqoesd.status = status_doc(0.5, [{"name": "web.1.xyz"}], ticks=100)
    agent = Agent(agent_engine(cluster, "node2", {"web.1.xyz": CID_WEB}), dqoesd.path,
                  server.address[1], cluster.creds["node2"].directory)
    labels = {cluster.web: {"dqoes.target": "2s"}}
    try:
        def given() -> bool:
            agent.step(time.monotonic())
            return dqoesd.labels == labels

        wait_for("web's labels given to dqoesd", given)
        server.close()  # the manager stops
        wait_for("the agent without a manager", lambda: not any(
            link.connected for link in agent.links.values()))
        for _ in range(3):
            agent.step(time.monotonic())
        assert dqoesd.labels == labels, "nothing forgotten while no manager answers"
        # dqoesd starts again (its tick count starts over): it gets the labels again.
        dqoesd.requests.clear()
        dqoesd.status = status_doc(0.5, [{"name": "web.1.xyz"}], ticks=1)
        agent.step(time.monotonic())
        assert dqoesd.requests == [(cluster.web, {"dqoes.target": "2s"})]
    finally:
        agent.close()
        dqoesd.close()


def test_a_recommended_update_is_listed_once_with_its_latest_why() -> None:
    """The same effect asked tick after tick, with figures that move in its why, is one
    recommendation, not one per wording."""
    manager = Manager(StubEngine({}), "n1", acting=False)
    for room in (0.12, 0.10):
        manager._recommend([Update(f"service web: moving off node2 ({room:.2f} left)",
                                   service_id="web", avoid=frozenset({"node2"}))])
    manager._recommend([Update("node node3: closing to new tasks", node_id="n3", paused=True)])
    assert [r.what for r in manager._recommendations()] == [
        "node node3: closing to new tasks", "service web: moving off node2 (0.10 left)"]
