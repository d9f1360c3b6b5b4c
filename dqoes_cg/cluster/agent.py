"""dqoes-agent: the node's side of the cluster, beside dqoesd on every Swarm node.

Every report interval it asks the node's dqoesd for its status (its control socket) and
the node's dockerd for the containers of Swarm tasks it runs, and sends what dqoesd
measures of those containers, by container ID, to every Swarm manager that runs
dqoes-manager. From the managers it receives the `dqoes.` labels of the services that have
tasks on the node, and gives them to dqoesd (the `service-labels` request), which applies
them to the tasks' containers without restarting any: a worker's engine cannot list
services, so this is how a target set on a service reaches its tasks there.

It finds everything through the node's engine (`docker info`): the node's ID, the Swarm's
managers (their node IDs and addresses), and its Swarm identity in dockerd's data root,
which authenticates it to the managers (identity.py). A manager is reached at its Swarm
address on --port; its certificate must name that manager's node ID and the manager role.

Each manager's acknowledgement asks for the report interval it can sustain (back-pressure,
pace.py); the agent reports at the longest interval its managers ask, bounded by its own
--interval and pace.MAX_INTERVAL_S, and at its own again when they ask for it. A manager
has at most one of its reports unanswered at a time: a newer report waits for the answer,
and replaces the one that waited, so a manager that falls behind gets fewer reports, not a
queue of old ones.

It keeps the labels it was given while no manager answers (targets are not lost when the
manager restarts), gives them to dqoesd again when dqoesd restarts, and takes the labels
of one manager (the first of Swarm's list that answers) when there are several.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, startup
from ..control import DaemonUnavailable, RequestError, request
from ..engines.client import DOCKER_SOCKET, Engine, EngineError
from ..paths import DEFAULT_SOCKET
from ..status import Status
from .identity import Credentials, IdentityError, peer_identity
from .pace import BASE_INTERVAL_S, MAX_INTERVAL_S
from .protocol import (
    CLUSTER_PORT,
    Ack,
    Channel,
    ContainerReport,
    ProtocolError,
    Report,
    Services,
    reason,
)

log = logging.getLogger("dqoes-agent")

REPORT_INTERVAL_S = BASE_INTERVAL_S
INFO_INTERVAL_S = 10.0  # how often the Swarm's managers are looked up again
CONNECT_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 10.0  # a manager that leaves a report unanswered so long is dropped
RETRY_MIN_S, RETRY_MAX_S = 0.5, 5.0
POLL_S = 0.25
TASK_LABEL = "com.docker.swarm.task.id"


@dataclass(frozen=True)
class NodeInfo:
    """The node in its Swarm, as its engine says."""

    node_id: str
    managers: tuple[tuple[str, str], ...]  # (node ID, host) of each manager
    data_root: Path


def parse_info(doc: object) -> NodeInfo:
    """NodeInfo from `GET /info`; ValueError if the node is in no Swarm."""
    if not isinstance(doc, dict) or not isinstance(doc.get("Swarm"), dict):
        raise ValueError("the engine says nothing of a Swarm")
    swarm = doc["Swarm"]
    if swarm.get("LocalNodeState") != "active":
        raise ValueError(f"the node is in no Swarm (its state: {swarm.get('LocalNodeState')})")
    managers = []
    for m in swarm.get("RemoteManagers") or []:
        if isinstance(m, dict) and isinstance(m.get("NodeID"), str) \
                and isinstance(m.get("Addr"), str):
            managers.append((m["NodeID"], m["Addr"].rsplit(":", 1)[0].strip("[]")))
    node_id, root = swarm.get("NodeID"), doc.get("DockerRootDir")
    if not isinstance(node_id, str) or not isinstance(root, str):
        raise ValueError("the engine gives no node ID or data root")
    return NodeInfo(node_id, tuple(sorted(managers)), Path(root))


def build_report(seq: int, status: Status | None, tasks: Mapping[str, str] | None,
                 error: str | None) -> Report:
    """A report from dqoesd's status (None: it does not answer) and the node's task
    containers, name -> ID (None: the engine does not answer)."""
    containers = []
    if status is not None and tasks is not None:
        for c in status.containers:
            cid = tasks.get(c.name)
            if cid is None or c.cls not in ("G", "S", "B", "idle", "pending"):
                continue
            containers.append(ContainerReport(
                cid, c.cls, c.target_s, c.metric, c.measured_s, c.cpu_limit_cores,
                c.cpu_usage_cores, c.samples, c.rate_hz, c.window_usage_cores, c.mean_s,
                c.p95_s, c.pressure, c.throttled_window_ratio, c.ipc, c.llc_misses_per_s))
    return Report(
        seq, status.host.budget_cpus if status else None,
        sum(c.cpu_usage_cores for c in status.containers) if status else 0.0,
        tasks is not None, status is not None, error, tuple(containers),
        status.host.pressure if status else {}, status.host.ipc if status else None,
        status.host.llc_misses_per_s if status else None)


class ManagerLink:
    """The connection to one manager, kept up by a thread of its own: the latest report
    goes out, acknowledgements and labels come in."""

    def __init__(self, manager_id: str, host: str, port: int, credentials: Credentials) -> None:
        self.manager_id = manager_id
        self.host = host
        self.port = port
        self.credentials = credentials
        self.connected = False
        self.services: dict[str, dict[str, str]] | None = None  # the last labels received
        self.interval_s: float | None = None  # the report interval the manager asks
        self._report: Report | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._refused: set[str] = set()  # containers whose refusal was logged
        self._thread = threading.Thread(target=self._run, name=f"dqoes-link-{host}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def offer(self, report: Report) -> None:
        with self._lock:
            self._report = report

    def _run(self) -> None:
        delay, failing = RETRY_MIN_S, False
        while not self._stopping.is_set():
            try:
                self._talk()
                delay, failing = RETRY_MIN_S, False
            except (OSError, ssl.SSLError, IdentityError, ProtocolError, ConnectionError) as e:
                level = logging.DEBUG if failing else logging.WARNING
                log.log(level, "manager %s at %s:%d: %s", self.manager_id, self.host,
                        self.port, reason(e))
                failing = True
            except Exception:
                log.exception("the link to manager %s failed", self.manager_id)
                failing = True
            self.connected = False
            self.interval_s = None
            if self._stopping.wait(delay):
                return
            delay = min(delay * 2, RETRY_MAX_S)

    def _talk(self) -> None:
        context = self.credentials.client_context()
        raw = socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT_S)
        try:
            tls = context.wrap_socket(raw, server_hostname=self.manager_id)
        except BaseException:
            raw.close()
            raise
        channel = Channel(tls)
        try:
            identity = peer_identity(tls.getpeercert())
            if identity.node_id != self.manager_id or identity.role != "manager":
                raise IdentityError(f"the peer is {identity.role} {identity.node_id}, not "
                                    f"manager {self.manager_id}")
            log.info("connected to manager %s at %s:%d", self.manager_id, self.host,
                     self.port)
            self.connected = True
            self._converse(channel)
        finally:
            channel.close()

    def _converse(self, channel: Channel) -> None:
        sent = -1
        unanswered: float | None = None  # since when a report waits for its answer
        while not self._stopping.is_set():
            with self._lock:
                report = self._report
            if report is not None and report.seq != sent and unanswered is None:
                channel.send(report, SEND_TIMEOUT_S)
                sent = report.seq
                unanswered = time.monotonic()
            message = channel.receive(POLL_S)
            if isinstance(message, Ack):
                unanswered = None
                self.interval_s = message.interval_s
                self._log_refusals(message)
            elif isinstance(message, Services):
                with self._lock:
                    self.services = message.services
            elif message is not None:
                raise ProtocolError(f"a manager sent a {type(message).__name__} message")
            elif unanswered is not None and \
                    time.monotonic() - unanswered > ANSWER_TIMEOUT_S:
                raise TimeoutError(f"no answer for {ANSWER_TIMEOUT_S:.0f} s")

    def _log_refusals(self, ack: Ack) -> None:
        for cid, why in ack.refused:
            if cid not in self._refused:
                log.warning("manager %s refused the report on container %s: %s",
                            self.manager_id, cid[:12], why)
        self._refused = {cid for cid, _ in ack.refused}

    def take_services(self) -> dict[str, dict[str, str]] | None:
        with self._lock:
            return self.services


class Agent:
    """The agent's loop: `step` once per report interval."""

    def __init__(self, engine: Engine, dqoesd: Path, port: int = CLUSTER_PORT,
                 certs: Path | None = None) -> None:
        self.engine = engine
        self.dqoesd = dqoesd
        self.port = port
        self.certs = certs
        self.info: NodeInfo | None = None
        self.links: dict[str, ManagerLink] = {}
        self._info_due = 0.0
        self._seq = 0
        self._services: dict[str, dict[str, str]] = {}  # the labels last received
        self._applied: dict[str, dict[str, str]] = {}  # labels dqoesd has from us
        self._info_error: str | None = None
        self._ticks = -1  # dqoesd's, to tell when it restarted

    def close(self) -> None:
        for link in self.links.values():
            link.stop()
        self.links.clear()

    def step(self, now: float) -> Report:
        if now >= self._info_due:
            self._look_up_swarm()
            self._info_due = now + INFO_INTERVAL_S
        report = self._report()
        if report.controller:
            self._apply_labels()
        if not report.engine:
            self._info_due = 0.0  # the engine came back: perhaps in another Swarm
        for link in self.links.values():
            link.offer(report)
        return report

    def _look_up_swarm(self) -> None:
        try:
            info, error = parse_info(self.engine.get("/info")), None
        except (EngineError, ValueError) as e:
            info, error = None, str(e)
        if error is not None and error != self._info_error:
            log.warning("%s; reporting to no manager until the node is in a Swarm", error)
        self._info_error = error
        if info == self.info:
            return
        self.info = info
        wanted = {} if info is None else dict(info.managers)
        for mid in list(self.links):
            if wanted.get(mid) != self.links[mid].host:
                self.links.pop(mid).stop()
        for mid, host in wanted.items():
            if mid not in self.links:
                credentials = Credentials(self.certs) if self.certs else \
                    Credentials.of_data_root(info.data_root)
                self.links[mid] = ManagerLink(mid, host, self.port, credentials)
                self.links[mid].start()
        if info is not None:
            log.info("node %s; managers: %s", info.node_id,
                     ", ".join(f"{m} at {h}" for m, h in info.managers) or "none")

    def interval(self, own_s: float) -> float:
        """Seconds to the next report: the longest interval a manager asks, from `own_s`
        to MAX_INTERVAL_S."""
        asked = [link.interval_s for link in self.links.values()
                 if link.interval_s is not None]
        return max(own_s, min(max(asked, default=own_s), MAX_INTERVAL_S))

    def _apply_labels(self) -> None:
        """The labels of the first manager that answers (else the last ones known), to
        dqoesd: only what changed, or everything when dqoesd started again."""
        received = next((s for _, link in sorted(self.links.items())
                         if link.connected and (s := link.take_services()) is not None), None)
        if received is not None:
            self._services = received
        changes: dict[str, dict[str, str] | None] = {
            sid: labels for sid, labels in self._services.items()
            if self._applied.get(sid) != labels}
        changes.update({sid: None for sid in self._applied if sid not in self._services})
        for sid, labels in changes.items():
            try:
                request(self.dqoesd, "service-labels", service_id=sid, labels=labels)
            except (DaemonUnavailable, RequestError) as e:
                log.warning("cannot give dqoesd the labels of service %s: %s", sid, e)
                return  # again at the next step
            if labels is None:
                self._applied.pop(sid, None)
            else:
                self._applied[sid] = labels
            log.info("service %s: labels %s", sid[:12],
                     "forgotten" if labels is None else json.dumps(labels))

    def _report(self) -> Report:
        errors = []
        try:
            status = Status.from_json(request(self.dqoesd, "status"))
            if status.host.ticks < self._ticks:  # dqoesd started again: it lost the labels
                self._applied.clear()
            self._ticks = status.host.ticks
        except (DaemonUnavailable, RequestError, KeyError, TypeError) as e:
            status = None
            self._applied.clear()
            errors.append(f"dqoesd: {e}")
        try:
            tasks = self._task_containers()
        except EngineError as e:
            tasks = None
            errors.append(str(e))
        self._seq += 1
        return build_report(self._seq, status, tasks, "; ".join(errors) or None)

    def _task_containers(self) -> dict[str, str]:
        """Name -> ID of the node's running containers of Swarm tasks."""
        listing = self.engine.get("/containers/json",
                                  {"filters": json.dumps({"label": [TASK_LABEL]})})
        if not isinstance(listing, list):
            raise EngineError(f"{self.engine}: the container listing is not a list")
        found = {}
        for c in listing:
            if isinstance(c, dict) and isinstance(c.get("Id"), str) \
                    and isinstance(c.get("Names"), list):
                for name in c["Names"]:
                    if isinstance(name, str):
                        found[name.removeprefix("/")] = c["Id"]
        return found


def _parser() -> argparse.ArgumentParser:
    p = startup.parser("dqoes-agent", __doc__)
    p.add_argument("--engine-socket", type=Path, default=DOCKER_SOCKET,
                   help="the node's Docker engine (default %(default)s)")
    p.add_argument("--socket", type=Path, default=DEFAULT_SOCKET,
                   help="dqoesd's control socket (default %(default)s)")
    p.add_argument("--port", type=int, default=CLUSTER_PORT,
                   help="dqoes-manager's port on the Swarm managers (default %(default)s)")
    p.add_argument("--certs", type=Path, default=None,
                   help="the node's Swarm certificates (default: DATA_ROOT/swarm/"
                        "certificates of its engine)")
    p.add_argument("--interval", type=float, default=REPORT_INTERVAL_S,
                   help="seconds between reports (default %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stopping = startup.start(args.verbose, log)
    agent = Agent(Engine(args.engine_socket), args.socket, args.port, args.certs)
    log.info("dqoes-agent %s: dqoesd at %s, engine at %s", __version__, args.socket,
             args.engine_socket)
    try:
        while not stopping.is_set():
            agent.step(time.monotonic())
            stopping.wait(agent.interval(args.interval))
    finally:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
