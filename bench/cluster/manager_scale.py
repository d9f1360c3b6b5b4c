"""python -m bench.cluster.manager_scale: the cluster's manager (dqoes-manager) with many
nodes' agents reporting over real mutual TLS, on loopback.

    python -m bench.cluster.manager_scale [--nodes 100 1000] [--containers 100]
                                          [--steady 30] [--out DIR]

For each N of --nodes, a process runs the real manager (manager.py, server.py and the
control socket of managerd.py) against a Swarm of N workers, --containers services of N
replicas each (one task of each on every node), its API served from JSON documents as the
engine answers them, every object with its version (so the manager decodes what it reads,
as it does Docker's answers); the
manager recommends only (`--placement qoe --recommend`). This process runs N simulated
agents as asyncio tasks, each with its own node certificate from one Swarm CA (the manager
checks each as it checks Swarm's), each sending its node's report of its --containers
containers (all in S) every --period seconds (the agent's default), at phases spread over
the period, or at the longer interval the manager's acknowledgements ask (back-pressure:
pace.py), and only once the report before was answered (else at the next period, as
dqoes-agent holds it); as dqoes-agent does, one whose report the manager does not take
within the agent's send timeout connects again (each such failure counts in agent_errors). Measured,
each over the same run:

- CPU per report: the manager process's CPU time (user + system) over --steady seconds,
  divided by the reports it acknowledged in them, with and without the CPU time of its
  ticks' thread (reading Swarm, the view, placement); the rate it acknowledged, against
  the rate the agents sent and the rate their own period offers; the interval asked.
- memory: the manager's RSS at the end of the steady interval, and its peak.
- report round trip: from a report sent to its acknowledgement.
- placement in a tick: its wall time and its thread's CPU time (the wall time waits for
  the CPU, and for the interpreter's lock the connections' threads hold).
- `dqoesctl cluster status`: its request on the control socket and the table made of its
  answer (what the command does), timed from here, while the agents report; and the
  request alone (the manager's answer, read and decoded here).
- report to decision: a node starts reporting its containers out of S on a full CPU
  budget; from that report sent to the first tick of the manager whose view shows the node
  so (seen), and to the first tick whose placement recommends closing the node to new tasks
  (decided), as the manager's ticks time them (one monotonic clock on this machine).

Writes manager_scale.json and manager_scale.md in --out (default bench/cluster/results).
Every wait has a deadline: a manager that stalls ends the run with what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from dqoes_cg.cluster.agent import (
    CONNECT_TIMEOUT_S,
    RETRY_MAX_S,
    RETRY_MIN_S,
    SEND_TIMEOUT_S,
)
from dqoes_cg.cluster.identity import NODE_CERT, NODE_KEY, ROOT_CA, Credentials
from dqoes_cg.cluster.managerd import OPERATIONS, handler, serve
from dqoes_cg.cluster.pace import MAX_INTERVAL_S
from dqoes_cg.cluster.placement import PlacementParams
from dqoes_cg.cluster.protocol import ContainerReport, Report
from dqoes_cg.cluster.show import format_cluster
from dqoes_cg.cluster.view import ClusterView
from dqoes_cg.control import ControlServer, DaemonUnavailable, RequestError, request
from dqoes_cg.engines.client import EngineError
from dqoes_cg.jsonline import encode
from dqoes_cg.sdnotify import Notifier

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = "python3 -m bench.cluster.manager_scale"
BUDGET_CPUS = 16.0  # each node's
TARGET_S = 1.0
# A node's containers share its budget evenly. Steady: 80% of it used, each in S (90% of
# its target): a need of 0.72 budget/containers each, admission has room for one more.
# Overloaded: all of it used, each 2.5x late: its node can take no new task.
STEADY = dict(cls="S", measured_s=0.9 * TARGET_S, used=0.8 * BUDGET_CPUS)
OVERLOADED = dict(cls="B", measured_s=2.5 * TARGET_S, used=BUDGET_CPUS)
START_DEADLINE_S = 120.0
CONNECT_DEADLINE_S = 300.0  # for every agent's first acknowledgement
DECISION_DEADLINE_S = 60.0
STATUS_TIMEOUT_S = 120.0
HANDSHAKES_AT_ONCE = 32


# --- the Swarm: IDs, certificates, the engine's documents ---------------------------------

def swarm_ids(prefix: str, count: int) -> list[str]:
    """Distinct IDs of Swarm's form (25 characters of [a-z0-9])."""
    return [f"{prefix}{i:024d}" for i in range(count)]


@dataclass(frozen=True)
class SwarmPlan:
    swarm: str
    manager: str
    nodes: list[str]
    services: list[str]

    @classmethod
    def of(cls, nodes: int, services: int) -> SwarmPlan:
        return cls("s" * 25, "m" * 25, swarm_ids("n", nodes), swarm_ids("v", services))

    @staticmethod
    def container(node: int, service: int) -> str:
        return f"{node:032x}{service:032x}"

    def documents(self) -> dict[str, bytes]:
        """GET /nodes, /services, /tasks as Docker's Engine API answers them."""
        def node(nid: str, name: str, role: str) -> dict[str, Any]:
            return {"ID": nid, "Version": {"Index": 3}, "Description": {"Hostname": name},
                    "Spec": {"Role": role, "Availability": "active", "Labels": {}},
                    "Status": {"State": "ready", "Addr": "127.0.0.1"}}
        nodes = [node(self.manager, "manager", "manager")] + [
            node(nid, f"node{i:04d}", "worker") for i, nid in enumerate(self.nodes)]
        services = [{"ID": sid, "Version": {"Index": 7},
                     "Spec": {"Name": f"svc{j:03d}", "Labels": {"dqoes.target": "1s"},
                              "TaskTemplate": {"ContainerSpec": {"Image": "x"}},
                              "Mode": {"Replicated": {"Replicas": len(self.nodes)}},
                              "UpdateConfig": {"Order": "start-first"}}}
                    for j, sid in enumerate(self.services)]
        tasks = [{"ID": f"t{i:012d}{j:012d}", "Version": {"Index": 11}, "ServiceID": sid,
                  "NodeID": nid, "Slot": i + 1,
                  "DesiredState": "running",
                  "Status": {"State": "running",
                             "ContainerStatus": {"ContainerID": self.container(i, j)}}}
                 for i, nid in enumerate(self.nodes) for j, sid in enumerate(self.services)]
        return {"/nodes": json.dumps(nodes).encode(),
                "/services": json.dumps(services).encode(),
                "/tasks": json.dumps(tasks).encode()}


class DocumentEngine:
    """A Swarm manager's engine answering GETs from JSON documents, decoded on each call as
    the real client decodes the engine's answers; updates are refused (the manager only
    recommends here)."""

    def __init__(self, documents: dict[str, bytes]) -> None:
        self.documents = documents

    def __str__(self) -> str:
        return "the benchmark's engine"

    def get(self, path: str, query: dict[str, str] | None = None,
            missing_ok: tuple[int, ...] = ()) -> Any:
        if path not in self.documents:
            raise EngineError(f"{self}: GET {path} answered 404")
        return json.loads(self.documents[path])

    def call(self, method: str, path: str, query: dict[str, str] | None = None,
             body: Any = None, missing_ok: tuple[int, ...] = ()) -> Any:
        if method == "GET":
            return self.get(path, query, missing_ok)
        raise EngineError(f"{self}: {method} {path} refused: the benchmark only recommends")


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True,
                   timeout=60)


def issue_certificates(directory: Path, plan: SwarmPlan) -> dict[str, Credentials]:
    """A Swarm root CA, and a certificate for the manager and each node as Swarm issues
    them (subject O=Swarm ID, OU=role, CN=node ID; DNS names; server and client use), each
    in a directory laid out as dockerd's. One key serves every node (a certificate a
    node, one openssl run each, several at once: 1,000 nodes in seconds)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert, key = directory / "ca.key", directory / ROOT_CA, directory / "node.key"
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", ca_key)
    _openssl("req", "-x509", "-new", "-key", ca_key, "-subj", "/CN=swarm-ca", "-days", "2",
             "-out", ca_cert, "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", key)
    config = directory / "leaf.cnf"
    config.write_text("[req]\ndistinguished_name=dn\nx509_extensions=leaf\n[dn]\n[leaf]\n"
                      "basicConstraints=critical,CA:FALSE\n"
                      "keyUsage=critical,digitalSignature,keyEncipherment\n"
                      "extendedKeyUsage=serverAuth,clientAuth\n")

    def one(node: str, role: str) -> tuple[str, Credentials]:
        where = directory / node
        where.mkdir()
        _openssl("req", "-new", "-x509", "-config", config, "-key", key, "-CA", ca_cert,
                 "-CAkey", ca_key, "-days", "2", "-subj",
                 f"/O={plan.swarm}/OU=swarm-{role}/CN={node}",
                 "-addext", f"subjectAltName=DNS:swarm-{role},DNS:{node}",
                 "-out", where / NODE_CERT)
        (where / ROOT_CA).write_bytes(ca_cert.read_bytes())
        (where / NODE_KEY).write_bytes(key.read_bytes())
        return node, Credentials(where)

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(lambda nr: one(*nr), [(plan.manager, "manager")]
                             + [(n, "worker") for n in plan.nodes]))


# --- the manager's process ----------------------------------------------------------------

class TimedPlacement:
    """The manager's placement (qoe), and on stdout, once per node: the first tick whose
    view shows the node out of S on a full budget (seen), and the first whose placement
    closes it to new tasks (decided); and each tick's length up to placement and the CPU
    time of the ticks' thread so far."""

    def __init__(self, inner: Any, containers: int) -> None:
        self.inner = inner
        self.containers = containers
        self.seen: set[str] = set()
        self.decided: set[str] = set()

    def tick(self, view: ClusterView, now: float, actions: Any) -> None:
        built, cpu = time.monotonic(), time.thread_time()
        self.inner.tick(view, now, actions)
        decided_at, tick_cpu = time.monotonic(), time.thread_time()
        _emit({"tick_s": built - now, "placement_s": decided_at - built,
               "placement_cpu_s": tick_cpu - cpu, "tick_cpu_s": tick_cpu, "t": decided_at})
        for node in view.nodes:
            if node.id not in self.seen and self.containers <= node.B \
                    and node.spare_cpus == 0.0:
                self.seen.add(node.id)
                _emit({"seen": node.id, "t": built})
        for update in actions.updates():
            if update.paused and update.node_id not in self.decided:
                self.decided.add(update.node_id)
                _emit({"decided": update.node_id, "t": decided_at})


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def run_manager(directory: Path, nodes: int, containers: int, tick_s: float) -> int:
    """The manager's process: serves until SIGTERM or its stdin closes."""
    # Imported here: the agents' process needs none of the manager's modules loaded.
    from dqoes_cg.cluster.manager import Manager
    from dqoes_cg.cluster.qoe_placement import QoEPlacement
    from dqoes_cg.cluster.server import Server

    plan = SwarmPlan.of(nodes, containers)
    manager = Manager(DocumentEngine(plan.documents()), plan.manager,
                      placement=TimedPlacement(QoEPlacement(PlacementParams()), containers),
                      acting=False)
    manager.tick(time.monotonic())
    server = Server(manager, Credentials(directory / plan.manager), plan.swarm,
                    ("127.0.0.1", 0))
    control = ControlServer(directory / "manager.sock", handler(manager), OPERATIONS)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stopping.set()), daemon=True).start()
    server.start()
    _emit({"port": server.address[1]})
    try:
        serve(manager, control, Notifier(""), tick_s, stopping)
    finally:
        control.close()
        server.close()
    return 0


# --- the agents ---------------------------------------------------------------------------

def report_line(plan: SwarmPlan, node: int, containers: int, state: dict[str, Any]) -> bytes:
    """A report of `node` (seq 0: `with_seq` sets it), as the agent sends it."""
    reports = tuple(ContainerReport(plan.container(node, j), state["cls"], TARGET_S, "p95",
                                    state["measured_s"], None, state["used"] / containers,
                                    50) for j in range(containers))
    return encode(Report(0, BUDGET_CPUS, state["used"], True, True, None,
                         reports).to_json())


def with_seq(line: bytes, seq: int) -> bytes:
    return line.replace(b'"seq":0,', b'"seq":%d,' % seq, 1)


class Agents:
    """N agents: each keeps its TLS connection to the manager and sends its node's report
    every period; counts the acknowledgements and their round trips."""

    def __init__(self, plan: SwarmPlan, creds: dict[str, Credentials], port: int,
                 containers: int, period: float) -> None:
        self.plan, self.port, self.period = plan, port, period
        self.contexts = {n: creds[n].client_context() for n in plan.nodes}
        self.lines = [report_line(plan, i, containers, STEADY) for i in range(len(plan.nodes))]
        self.overloaded = {i: report_line(plan, i, containers, OVERLOADED)
                           for i in range(min(5, len(plan.nodes)))}
        self.overload_from: dict[str, float] = {}  # node ID: first overloaded report sent
        self.marked: set[int] = set()
        self.acks = 0
        self.acked_nodes: set[str] = set()
        self.round_trips: list[float] = []
        self.errors: list[str] = []
        self._sent: dict[tuple[int, int], float] = {}
        self.seq = [0] * len(plan.nodes)  # each node's last report
        self.asked: list[float | None] = [None] * len(plan.nodes)  # interval, by the manager
        self.sent = 0

    async def run(self, stop: asyncio.Event) -> None:
        gate = asyncio.Semaphore(HANDSHAKES_AT_ONCE)
        await asyncio.gather(*(self._agent(i, gate, stop) for i in range(len(self.plan.nodes))))

    async def _agent(self, i: int, gate: asyncio.Semaphore, stop: asyncio.Event) -> None:
        """Node i's agent: as dqoes-agent, it connects again after a failure, waiting
        RETRY_MIN_S doubled up to RETRY_MAX_S."""
        delay = RETRY_MIN_S
        while not stop.is_set():
            if await self._converse(i, gate, stop):
                delay = RETRY_MIN_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(2 * delay, RETRY_MAX_S)

    async def _converse(self, i: int, gate: asyncio.Semaphore, stop: asyncio.Event) -> bool:
        """One connection: reports every period until `stop` (True) or a failure (False,
        in `errors`)."""
        node = self.plan.nodes[i]
        try:
            async with gate:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", self.port, ssl=self.contexts[node],
                    server_hostname=self.plan.manager, limit=1 << 21), CONNECT_TIMEOUT_S)
        except (OSError, ssl.SSLError, TimeoutError) as e:
            self.errors.append(f"{node}: connect: {type(e).__name__}: {e}")
            return False
        acks = asyncio.create_task(self._read(i, reader))
        self._sent.pop((i, self.seq[i]), None)  # a new connection: nothing unanswered
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.period * (i / len(self.plan.nodes))
        try:
            while not stop.is_set() and not acks.done():
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                next_at = max(next_at + self.interval(i), loop.time())
                if (i, self.seq[i]) in self._sent:  # unanswered: this one waits (agent.py)
                    continue
                self.seq[i] += 1
                overloaded = i in self.marked
                line = self.overloaded[i] if overloaded else self.lines[i]
                sent = time.monotonic()  # before the answer can come
                self._sent[(i, self.seq[i])] = sent
                self.sent += 1
                if overloaded:
                    self.overload_from.setdefault(node, sent)
                writer.write(with_seq(line, self.seq[i]))
                await asyncio.wait_for(writer.drain(), SEND_TIMEOUT_S)
            return stop.is_set()
        except (OSError, ssl.SSLError, TimeoutError) as e:
            self.errors.append(f"{node}: {type(e).__name__}: {e}")
            return False
        finally:
            acks.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 5.0)

    def interval(self, i: int) -> float:
        """Node i's report interval: the agent's (agent.Agent.interval)."""
        asked = self.asked[i]
        return max(self.period, min(asked if asked is not None else self.period,
                                    MAX_INTERVAL_S))

    async def _read(self, i: int, reader: asyncio.StreamReader) -> None:
        node = self.plan.nodes[i]
        with contextlib.suppress(OSError, ssl.SSLError, asyncio.IncompleteReadError,
                                 asyncio.LimitOverrunError, ValueError):
            while line := await reader.readline():
                if line.startswith(b'{"v":1,"type":"ack"'):
                    ack = json.loads(line)
                    self.asked[i] = ack.get("interval_s")
                    sent = self._sent.pop((i, ack["seq"]), None)
                    self.acks += 1
                    self.acked_nodes.add(node)
                    if sent is not None:
                        self.round_trips.append(time.monotonic() - sent)


# --- one run ------------------------------------------------------------------------------

class ManagerProcess:
    """The manager's process, its events (stdout) gathered."""

    def __init__(self, directory: Path, nodes: int, containers: int, tick_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.cluster.manager_scale", "--serve", str(directory),
             "--nodes", str(nodes), "--containers", str(containers), "--tick", str(tick_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=Path(__file__).parents[2])
        self.ps = psutil.Process(self.proc.pid)
        self.port: int | None = None
        self.seen: dict[str, float] = {}
        self.decided: dict[str, float] = {}
        self.ticks: list[float] = []
        self.placements: list[float] = []
        self.placements_cpu: list[float] = []
        self.tick_cpu: list[tuple[float, float]] = []  # (when, the ticks' CPU so far)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            if "port" in event:
                self.port = event["port"]
            elif "tick_s" in event:
                self.ticks.append(event["tick_s"])
                self.placements.append(event["placement_s"])
                self.placements_cpu.append(event["placement_cpu_s"])
                self.tick_cpu.append((event["t"], event["tick_cpu_s"]))
            elif "seen" in event:
                self.seen[event["seen"]] = event["t"]
            elif "decided" in event:
                self.decided[event["decided"]] = event["t"]

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def tick_cpu_s(self, start: float, end: float) -> float | None:
        """The CPU time of the ticks that ended from `start` to `end` (monotonic)."""
        inside = [cpu for t, cpu in self.tick_cpu if start <= t <= end]
        before = [cpu for t, cpu in self.tick_cpu if t < start]
        return inside[-1] - before[-1] if inside and before else None

    def memory(self) -> tuple[int, int]:
        """(RSS, peak RSS) in bytes."""
        rss, peak = self.ps.memory_info().rss, 0
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
        return rss, max(rss, peak)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        if self.proc.stdin:
            self.proc.stdin.close()


async def _until(what: str, check: Any, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {deadline_s:.0f} s: {what}")
        await asyncio.sleep(0.1)


def cluster_status(socket: Path) -> tuple[float, float, int]:
    """What `dqoesctl cluster status` does: its request and the table; (seconds, of which
    the answer, decoded, bytes of the table)."""
    start = time.monotonic()
    answer = request(socket, "cluster-status", timeout=STATUS_TIMEOUT_S)
    answered = time.monotonic()
    table = format_cluster(ClusterView.from_json(answer))
    return time.monotonic() - start, answered - start, len(table)


async def measure(nodes: int, containers: int, period: float, steady_s: float,
                  statuses: int, decisions: int, tick_s: float, directory: Path
                  ) -> dict[str, Any]:
    plan = SwarmPlan.of(nodes, containers)
    started = time.monotonic()
    creds = issue_certificates(directory / "certs", plan)
    certs_s = time.monotonic() - started
    manager = ManagerProcess(directory / "certs", nodes, containers, tick_s)
    stop = asyncio.Event()
    result: dict[str, Any] = {"nodes": nodes, "containers": containers, "period_s": period,
                              "tick_s": tick_s, "certificates_s": round(certs_s, 1)}
    agents: Agents | None = None
    running: asyncio.Task[None] | None = None
    try:
        await _until("the manager listens", lambda: manager.port or manager.proc.poll()
                     is not None, START_DEADLINE_S)
        if manager.port is None:
            raise RuntimeError(f"the manager exited ({manager.proc.returncode})")
        agents = Agents(plan, creds, manager.port, containers, period)
        running = asyncio.create_task(agents.run(stop))
        connecting = time.monotonic()
        await _until("every node acknowledged", lambda: len(agents.acked_nodes) == nodes
                     or running.done(), CONNECT_DEADLINE_S)
        result["all_connected_s"] = round(time.monotonic() - connecting, 1)
        await asyncio.sleep(3 * period)  # the first views, placement's first needs
        # and the interval asked settled: three of them
        await asyncio.sleep(3 * max(agents.interval(i) for i in range(nodes)))

        cpu0, acks0, t0 = manager.cpu_s(), agents.acks, time.monotonic()
        sent0, ticks0 = agents.sent, len(manager.ticks)
        await asyncio.sleep(steady_s)
        cpu1, acks1, t1 = manager.cpu_s(), agents.acks, time.monotonic()
        sent1 = agents.sent
        intervals = [agents.interval(i) for i in range(nodes)]
        rss, peak = manager.memory()
        handled = acks1 - acks0
        ticks_cpu = manager.tick_cpu_s(t0, t1)
        result.update(
            tick_cpu_per_s=None if ticks_cpu is None else round(ticks_cpu / (t1 - t0), 3),
            reports_cpu_ms=None if ticks_cpu is None or not handled else round(
                1e3 * (cpu1 - cpu0 - ticks_cpu) / handled, 3),
            steady_s=round(t1 - t0, 1), reports=handled,
            reports_per_s=round(handled / (t1 - t0), 1),
            offered_per_s=round(nodes / period, 1),
            sent_per_s=round((sent1 - sent0) / (t1 - t0), 1),
            interval_s=round(statistics.median(intervals), 2),
            manager_cpu_per_s=round((cpu1 - cpu0) / (t1 - t0), 3),
            cpu_ms_per_report=round(1e3 * (cpu1 - cpu0) / handled, 3) if handled else None,
            rss_mb=round(rss / 2**20, 1), peak_rss_mb=round(peak / 2**20, 1),
            round_trip_ms=_median_ms(agents.round_trips),
            view_tick_ms=_median_ms(manager.ticks[ticks0:]),
            placement_ms=_median_ms(manager.placements[ticks0:]),
            placement_cpu_ms=_median_ms(manager.placements_cpu[ticks0:]),
            placement_cpu_max_ms=round(1e3 * max(manager.placements_cpu[ticks0:]), 2)
            if manager.placements_cpu[ticks0:] else None)

        times, answers, size = [], [], 0
        for _ in range(statuses):
            took, answered, size = await asyncio.wait_for(asyncio.to_thread(
                cluster_status, directory / "certs" / "manager.sock"), STATUS_TIMEOUT_S + 10)
            times.append(took)
            answers.append(answered)
        result.update(status_ms=_median_ms(times), status_answer_ms=_median_ms(answers),
                      status_table_kb=round(size / 1024, 1))

        seen: list[float] = []
        decided: list[float] = []
        try:
            for i in range(min(decisions, len(agents.overloaded))):
                node = plan.nodes[i]
                agents.marked.add(i)
                await _until(f"node {i}'s overload decided",
                             lambda node=node: node in manager.decided,  # type: ignore[misc]
                             DECISION_DEADLINE_S)
                seen.append(manager.seen[node] - agents.overload_from[node])
                decided.append(manager.decided[node] - agents.overload_from[node])
        finally:
            result.update(seen_ms=_median_ms(seen), decided_ms=_median_ms(decided),
                          decisions=len(decided))
    except (TimeoutError, RuntimeError, DaemonUnavailable, RequestError) as e:
        result["error"] = str(e)
    finally:
        stop.set()
        if running is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(running, 30)
        manager.stop()
        if agents is not None:
            result["agent_errors"] = len(agents.errors)
            if agents.errors:
                result["first_agent_error"] = agents.errors[0][:200]
    return result


def _median_ms(values: list[float]) -> float | None:
    return round(1e3 * statistics.median(values), 2) if values else None


# --- the report ---------------------------------------------------------------------------

ROWS = [("cpu_ms_per_report", "manager CPU per report, ticks included (ms)"),
        ("reports_cpu_ms", "manager CPU per report, ticks apart (ms)"),
        ("manager_cpu_per_s", "manager CPU (cores)"),
        ("tick_cpu_per_s", "of which its ticks (cores)"),
        ("reports_per_s", "reports acknowledged per s"),
        ("sent_per_s", "reports sent per s"),
        ("interval_s", "report interval asked, median (s)"),
        ("offered_per_s", "reports offered per s at the agents' own interval"),
        ("rss_mb", "manager RSS (MiB)"),
        ("peak_rss_mb", "manager peak RSS (MiB)"),
        ("round_trip_ms", "report round trip, median (ms)"),
        ("view_tick_ms", "manager tick up to placement, median (ms)"),
        ("placement_ms", "placement in a tick, median (ms)"),
        ("placement_cpu_ms", "its CPU time, median (ms)"),
        ("placement_cpu_max_ms", "its CPU time, the longest (ms)"),
        ("status_ms", "`dqoesctl cluster status`, median (ms)"),
        ("status_answer_ms", "of which its answer, decoded, median (ms)"),
        ("status_table_kb", "its table (KiB)"),
        ("seen_ms", "report to the view showing it, median (ms)"),
        ("decided_ms", "report to placement's decision, median (ms)")]


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# The manager at scale\n\n`{meta['command']}` at {meta['commit']}, "
             f"{meta['date']}, on {meta['host']}.\n",
             "| | " + " | ".join(f"N = {r['nodes']}" for r in results)
             + (" | ratio |" if len(results) == 2 else " |"),
             "|---|" + "---|" * (len(results) + (len(results) == 2))]
    for key, label in ROWS:
        values = [r.get(key) for r in results]
        cells = ["-" if v is None else f"{v:g}" for v in values]
        if len(results) == 2:
            a, b = values
            cells.append(f"{b / a:.1f}" if a and b is not None else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for r in results:
        if "error" in r or r.get("agent_errors"):
            lines.append(f"\nN = {r['nodes']}: {r.get('error', '')} "
                         f"{r.get('agent_errors', 0)} agent errors "
                         f"{r.get('first_agent_error', '')}".rstrip())
    return "\n".join(lines) + "\n"


def _meta(argv: list[str]) -> dict[str, Any]:
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    return {"command": " ".join([COMMAND, *argv]), "commit": commit or "?",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": f"{platform.node()}: {os.cpu_count()} CPUs, "
                    f"load {os.getloadavg()[0]:.1f} at the start"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--containers", type=int, default=100, help="per node")
    p.add_argument("--period", type=float, default=1.0, help="seconds between a node's "
                   "reports (the agent's default: %(default)s)")
    p.add_argument("--tick", type=float, default=1.0, help="the manager's (its default)")
    p.add_argument("--steady", type=float, default=30.0, help="seconds measured")
    p.add_argument("--statuses", type=int, default=5)
    p.add_argument("--decisions", type=int, default=3, help="nodes overloaded, one by one")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the manager's process
    args = p.parse_args(argv)
    if args.serve:
        return run_manager(args.serve, args.nodes[0], args.containers, args.tick)
    if max(args.nodes) > 1000 or min(args.nodes) < 1 or not 1 <= args.containers <= 4096:
        p.error("1 to 1,000 nodes (the server's connections), 1 to 4,096 containers")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * max(args.nodes) + 256:  # a socket per agent here, and its peer's there
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = []
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory(prefix="manager-scale-") as tmp:
            print(f"N = {nodes} nodes x {args.containers} containers ...", file=sys.stderr)
            results.append(asyncio.run(measure(
                nodes, args.containers, args.period, args.steady, args.statuses,
                args.decisions, args.tick, Path(tmp))))
            print(json.dumps(results[-1]), file=sys.stderr)
    meta = _meta(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "manager_scale.json").write_text(
        json.dumps({"meta": meta, "runs": results}, indent=1) + "\n")
    text = markdown(results, meta)
    (args.out / "manager_scale.md").write_text(text)
    sys.stdout.write(text)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
