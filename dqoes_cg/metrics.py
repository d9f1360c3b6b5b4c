"""Prometheus metrics (opt-in): the controller's status as an exposition over HTTP.

`dqoesd --metrics-listen [ADDR:]PORT` serves GET /metrics from a thread of its own, on
127.0.0.1 unless ADDR names another address. Each scrape takes one snapshot of the
controller's status (the daemon's loop holds the same lock while it ticks, so the arrays are
never read half-updated), and prometheus_client renders it (a custom collector over the
snapshot) in the format the scraper's Accept header asks for: OpenMetrics, or the text
format version 0.0.4:

    per container  target, measured latency, class, CPU limit and usage, throttling, samples,
                   foreign writes of its cpu.max and cpu.weight, whether it is contested;
                   for a training job, its list (as its class), evaluation value and growth
                   efficiency; recommending only, the limit it would set and the class
                   expected; what slowed it over the last window: the share stalled on
                   cpu, memory and io (pressure "some"), the share of periods throttled,
                   IPC and LLC misses where the host has hardware counters
    per host       containers per class, ticks, decisions, reconcile corrections, ring faults
                   and lost records, systemd updates, the CPU budget, the listener's interval,
                   whether it acts; the node's pressure (the window's share, avg10), and its
                   IPC and LLC misses where counted for the node alone

The endpoint is open to anyone who can reach the address: `MetricsServer` bounds what each
client may hold (see there).
"""

from __future__ import annotations

import contextlib
import logging
import math
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import (
    CONTENT_TYPE_PLAIN_0_0_4,
    choose_encoder,
    generate_latest,
)
from prometheus_client.registry import Collector

from .membership.objective import TRAINING
from .status import CLASSES, Status

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
REQUEST_DEADLINE_S = 5.0
"""From a connection's accept to the last byte of its reply (a scrape on loopback takes
milliseconds)."""
MAX_CONNECTIONS = 64
MAX_PER_ADDRESS = 8
MAX_REQUEST_BYTES = 8192  # a request's line and headers
MAX_RENDERINGS = 4  # kept of one snapshot, for as many formats
LISTEN_BACKLOG = 1024
"""Connections the kernel completes before the server accepts them (capped by somaxconn):
past it a connection's SYN is dropped and retried a second later, so a burst of idle
connections past 128 came in after a scrape that followed it, and dropped it as the
oldest that had sent nothing."""
LOG_EVERY_S = 60.0  # a line about clients' hang-ups or failed accepts, at most
ACCEPT_BACKOFF_S = 0.1  # after a failed accept (out of descriptors), rather than spin
SNAPSHOT_MAX_AGE_S = 1.0
"""A scrape within this time of the last snapshot is answered from it: however many
scrapes come, the loop's lock is taken for a snapshot once a second at most."""

Snapshot = Callable[[], Status | None]
"""The controller's status now, or None while the loop is too busy to give it (a long tick):
the last one is served meanwhile."""


def parse_listen(text: str) -> tuple[str, int]:
    """'9750' -> ('127.0.0.1', 9750); '0.0.0.0:9750'; '[::1]:9750' -> ('::1', 9750)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = DEFAULT_HOST
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 < int(port) < 65536 or (sep and not host):
        raise ValueError(f"bad metrics address {text!r}: use PORT, ADDR:PORT or [ADDR6]:PORT")
    return host, int(port)


class StatusCollector(Collector):
    """A collector over one status snapshot."""

    def __init__(self, status: Status) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        return iter(families(self.status))


def _text(value: str) -> str:
    """A label value that encodes as UTF-8 whatever a name holds (a lone surrogate from an
    engine's answer would fail the whole scrape)."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _number(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _per_container(name: str, help_text: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"dqoes_container_{name}", help_text, labels=["container"])


def families(status: Status) -> list[Metric]:
    """The metric families of a status snapshot."""
    target = GaugeMetricFamily("dqoes_container_target_seconds", "QoE target of the container",
                               labels=["container", "metric"])
    measured = GaugeMetricFamily(
        "dqoes_container_latency_seconds",
        "Latency statistic (the target's metric) of the last decision window",
        labels=["container", "metric"])
    cls = GaugeMetricFamily(
        "dqoes_container_class",
        "1 for the container's class: G (beats its target), S (meets it), B (misses it), "
        "idle (no requests), pending (no cgroup bound yet); a training job's list: "
        "NL (new), WL (watching), CL (completing)", labels=["container", "class"])
    limit = _per_container("cpu_limit_cores",
                           "CPU limit in force (cpu.max) in CPUs; +Inf when unlimited")
    usage = _per_container("cpu_usage_cores", "CPU usage over the last tick, in CPUs")
    throttled = _per_container("throttled_ratio",
                               "Share of CFS periods throttled over the last tick")
    samples = _per_container("window_samples", "Latency records in the last decision window")
    foreign = CounterMetricFamily(
        "dqoes_container_foreign_writes",
        "cpu.max and cpu.weight values written by someone else in place of the daemon's",
        labels=["container"])
    contested = _per_container("contested", "1 while the container's cpu.max or cpu.weight "
                               "is left to another writer")
    evaluation = _per_container("evaluation",
                                "A training job's latest evaluation value (its loss, accuracy...)")
    growth = _per_container(
        "growth_efficiency",
        "A training job's growth efficiency at the last decision: progress of its evaluation "
        "value per second, per fraction of the CPU budget used")
    would = _per_container("recommended_cpu_limit_cores",
                           "Recommend-only: the CPU limit the daemon would set, in CPUs")
    expected = GaugeMetricFamily(
        "dqoes_container_expected_class",
        "Recommend-only: 1 for the class (G, S, B) the container is expected in under the "
        "limit the daemon would set", labels=["container", "class"])
    stalled = GaugeMetricFamily(
        "dqoes_container_pressure_some_ratio",
        "Share of the last decision window in which some task of the container stalled on "
        "the resource (pressure stall information)", labels=["container", "resource"])
    throttled_window = _per_container("throttled_window_ratio",
                                      "Share of CFS periods throttled over the last window")
    ipc = _per_container("instructions_per_cycle",
                         "Instructions per cycle over the last window (hardware counters)")
    llc = _per_container("llc_misses_per_second",
                         "Last-level-cache misses per second over the last window")
    for c in status.containers:
        name = [_text(c.name)]
        for resource, values in c.pressure.items():
            if values.get("some_ratio") is not None:
                stalled.add_metric([*name, resource], values["some_ratio"])
        if c.throttled_window_ratio is not None:
            throttled_window.add_metric(name, c.throttled_window_ratio)
        if c.ipc is not None:
            ipc.add_metric(name, c.ipc)
        if c.llc_misses_per_s is not None:
            llc.add_metric(name, c.llc_misses_per_s)
        if c.recommended_limit_cores is not None:
            would.add_metric(name, c.recommended_limit_cores)
        if c.expected_class is not None:
            expected.add_metric([*name, c.expected_class], 1)
        training = c.kind == TRAINING
        if not training:
            target.add_metric([*name, c.metric or ""], _number(c.target_s))
        for k in CLASSES:
            cls.add_metric([*name, k], 1 if c.cls == k else 0)
        if c.cls == "pending":
            continue
        if training:
            evaluation.add_metric(name, _number(c.evaluation))
            growth.add_metric(name, _number(c.growth_efficiency))
        else:
            measured.add_metric([*name, c.metric or ""], _number(c.measured_s))
        limit.add_metric(name, math.inf if c.cpu_limit_cores is None else c.cpu_limit_cores)
        usage.add_metric(name, c.cpu_usage_cores)
        throttled.add_metric(name, c.throttled_ratio)
        samples.add_metric(name, c.samples)
        foreign.add_metric(name, c.foreign_writes)
        contested.add_metric(name, int(c.contested))

    h = status.host
    containers = GaugeMetricFamily("dqoes_containers", "Containers with a target, by class",
                                   labels=["class"])
    for k in CLASSES:
        containers.add_metric([k], getattr(h, k))
    updates = CounterMetricFamily("dqoes_systemd_updates",
                                  "CPU limits of systemd units sent to systemd, by result",
                                  labels=["result"])
    updates.add_metric(["sent"], h.systemd_sent)
    updates.add_metric(["failed"], h.systemd_failed)
    node_stalled = GaugeMetricFamily(
        "dqoes_node_pressure_some_ratio",
        "Share of the last decision window in which some task of the node stalled on the "
        "resource", labels=["resource"])
    node_avg10 = GaugeMetricFamily(
        "dqoes_node_pressure_some_avg10_percent",
        "The kernel's 10 s average of the node's stalls on the resource, percent",
        labels=["resource"])
    for resource, values in h.pressure.items():
        node_stalled.add_metric([resource], _number(values.get("some_ratio")))
        node_avg10.add_metric([resource], _number(values.get("avg10_pct")))
    node_counted = [] if h.ipc is None else [
        GaugeMetricFamily("dqoes_node_instructions_per_cycle",
                          "The node's instructions per cycle over the last window", h.ipc),
        GaugeMetricFamily("dqoes_node_llc_misses_per_second",
                          "The node's last-level-cache misses per second over the last window",
                          _number(h.llc_misses_per_s))]
    return [
        target, measured, cls, limit, usage, throttled, samples, foreign, contested, evaluation,
        growth, would, expected, stalled, throttled_window, ipc, llc, containers,
        node_stalled, node_avg10, *node_counted,
        GaugeMetricFamily("dqoes_acting",
                          "1 while the daemon writes the limits it decides, 0 while it only "
                          "recommends them", int(h.acting)),
        CounterMetricFamily("dqoes_ticks", "Ticks of the control loop", h.ticks),
        CounterMetricFamily("dqoes_decisions", "Decisions of the policy", h.decisions),
        CounterMetricFamily("dqoes_reconcile_corrections",
                            "Limits found changed by someone else and written again",
                            h.reconcile_corrections),
        CounterMetricFamily("dqoes_ring_faults", "Faults met reading latency rings",
                            h.ring_faults),
        CounterMetricFamily("dqoes_ring_lost_records",
                            "Latency records lost to overruns, torn or invalid slots",
                            h.ring_lost),
        updates,
        GaugeMetricFamily("dqoes_budget_cpus", "CPU budget T_R of the managed containers",
                          h.budget_cpus),
        GaugeMetricFamily("dqoes_interval_seconds", "Current interval of the adaptive listener",
                          h.interval_s),
        GaugeMetricFamily("dqoes_last_decision_timestamp_seconds",
                          "Unix time of the last decision (NaN: none yet)",
                          _number(h.last_decision_unix)),
    ]


def _encoder(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """prometheus_client's encoder and content type for an Accept header; the text format
    0.0.4 for a header its parser cannot read (it raises on `version=abc`): the header is
    the client's."""
    try:
        return choose_encoder(accept)
    except Exception:
        return generate_latest, CONTENT_TYPE_PLAIN_0_0_4


def render(status: Status, accept: str = "") -> tuple[bytes, str]:
    """The exposition of a status snapshot in the format `accept` (an HTTP Accept header)
    asks for: OpenMetrics, or Prometheus's text format (the default); and its content
    type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))
    encode, content_type = _encoder(accept)
    return encode(registry), content_type


class SnapshotUnavailable(Exception):
    """No snapshot could be taken yet."""


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    address: str  # the peer's IP address
    deadline: float  # monotonic: its whole request and reply, or it is dropped
    request: bytearray = field(default_factory=bytearray)
    reply: memoryview | None = None  # what is left to send, once the request is read


def _victim(clients: list[_Client]) -> _Client:
    """The one of `clients` (oldest first) to drop for a newcomer: the oldest that has sent
    nothing yet, so that connections opened and left idle go before a scrape whose request
    is waiting to be read; else the oldest."""
    for client in clients:
        if not client.request and client.reply is None and not _sent_something(client.sock):
            return client
    return clients[0]


def _sent_something(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except OSError:  # nothing to read yet, or reset
        return False


class MetricsServer:
    """GET /metrics on (host, port), served by one background thread that never waits on a
    client: sockets are non-blocking, each connection has REQUEST_DEADLINE_S from its accept
    to the last byte of its reply, and a new connection past MAX_PER_ADDRESS from its
    address, or past MAX_CONNECTIONS in all, drops the oldest one (of that address, or of
    all): idle or slow clients lose only their own connections, and a scraper, which sends
    its request at once, is served. (Per address, not per uid: the peer of a TCP connection
    has no credentials to ask for.)"""

    def __init__(self, address: tuple[str, int], snapshot: Snapshot,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._snapshot = snapshot
        self._clock = clock
        self._status: Status | None = None  # the last snapshot, taken at _rendered_at
        self._rendered_at = -math.inf
        self._rendered: dict[str, bytes] = {}  # its expositions, by content type
        self._listener = socket.create_server(address, family=_family_of(address[0]),
                                              backlog=LISTEN_BACKLOG)
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._wake, self._waker = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake, selectors.EVENT_READ)
        self._clients: dict[socket.socket, _Client] = {}  # oldest first
        self._closing = False
        self._hangups = 0  # since the last line about them
        self._logged_at = {"hang-up": -math.inf, "accept": -math.inf, "render": -math.inf}
        self._thread = threading.Thread(target=self._serve, name="dqoes-metrics", daemon=True)
        self._thread.start()

    def connections(self) -> int:
        """Connections open now."""
        return len(self._clients)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(BrokenPipeError):  # the thread has ended (and said why)
            self._waker.send(b"\0")
        self._thread.join()
        # Closed here, not by the thread: woken by a client, it may see _closing and end
        # before the send above.
        self._waker.close()

    def _serve(self) -> None:
        try:
            while not self._closing:
                oldest = next(iter(self._clients.values()), None)
                timeout = None if oldest is None else oldest.deadline - time.monotonic()
                for key, _ in self._selector.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj in self._clients:  # not dropped by an accept just now
                        self._on_ready(self._clients[key.fileobj])  # type: ignore[index]
                now = time.monotonic()
                while self._clients and (c := next(iter(self._clients.values()))).deadline <= now:
                    self._drop(c)
        finally:
            for c in list(self._clients.values()):
                self._drop(c)
            self._selector.close()
            for s in (self._listener, self._wake):
                s.close()

    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):  # a bounded batch: then the others are served
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors: the connection waits in the backlog
                if self._due("accept"):
                    log.warning("metrics: accept failed: %s", e.strerror or e)
                time.sleep(ACCEPT_BACKOFF_S)
                return
            sock.setblocking(False)
            same = [c for c in self._clients.values() if c.address == peer[0]]
            if len(same) >= MAX_PER_ADDRESS:
                self._drop(_victim(same))
            elif len(self._clients) >= MAX_CONNECTIONS:
                self._drop(_victim(list(self._clients.values())))
            self._clients[sock] = _Client(sock, peer[0], time.monotonic() + REQUEST_DEADLINE_S)
            self._selector.register(sock, selectors.EVENT_READ)

    def _on_ready(self, client: _Client) -> None:
        try:
            if client.reply is None:
                self._read(client)
            else:
                self._write(client)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # reset, broken pipe: it hung up before its reply was sent
            self._drop(client)
            self._hung_up()

    def _read(self, client: _Client) -> None:
        data = client.sock.recv(4096)
        if not data:  # closed before asking anything
            self._drop(client)
            return
        client.request += data
        end = client.request.find(b"\r\n\r\n")
        if end < 0:
            if len(client.request) > MAX_REQUEST_BYTES:
                client.reply = memoryview(_response(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE))
                self._selector.modify(client.sock, selectors.EVENT_WRITE)
            return
        client.reply = memoryview(self._answer(bytes(client.request[:end])))
        self._selector.modify(client.sock, selectors.EVENT_WRITE)
        self._write(client)

    def _write(self, client: _Client) -> None:
        assert client.reply is not None
        client.reply = client.reply[client.sock.send(client.reply):]
        if not client.reply:
            self._drop(client)

    def _answer(self, head: bytes) -> bytes:
        """The whole HTTP response to a request's head (its request line and headers)."""
        request_line, *headers = head.decode("latin-1").split("\r\n")
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response(HTTPStatus.BAD_REQUEST)
        method, target, _ = parts
        if method != "GET":
            return _response(HTTPStatus.METHOD_NOT_ALLOWED)
        if target.split("?", 1)[0] != "/metrics":
            return _response(HTTPStatus.NOT_FOUND, b"only /metrics is served here\n")
        accept = next((value for name, _, value in (h.partition(":") for h in headers)
                       if name.strip().lower() == "accept"), "")
        try:
            body, content_type = self._render(accept)
        except SnapshotUnavailable:
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, b"the daemon is busy: try again\n")
        except Exception:  # a bug must not take the thread down with it
            if self._due("render"):
                log.exception("metrics: rendering failed")
            return _response(HTTPStatus.INTERNAL_SERVER_ERROR)
        return _response(HTTPStatus.OK, body, content_type)

    def _drop(self, client: _Client) -> None:
        del self._clients[client.sock]
        self._selector.unregister(client.sock)
        client.sock.close()

    def _render(self, accept: str) -> tuple[bytes, str]:
        """The exposition for `accept`, of a snapshot at most SNAPSHOT_MAX_AGE_S old."""
        now = self._clock()
        if now - self._rendered_at >= SNAPSHOT_MAX_AGE_S:
            status = self._snapshot()
            if status is not None:
                self._status, self._rendered_at = status, now
                self._rendered.clear()
        if self._status is None:  # busy since the start: no snapshot yet
            raise SnapshotUnavailable
        content_type = _encoder(accept)[1]
        if content_type not in self._rendered:
            if len(self._rendered) >= MAX_RENDERINGS:  # the Accept header is the client's
                self._rendered.clear()
            self._rendered[content_type] = render(self._status, accept)[0]
        return self._rendered[content_type], content_type

    def _hung_up(self) -> None:
        """One line a minute at most: a client may hang up as often as it likes."""
        self._hangups += 1
        if self._due("hang-up"):
            log.info("metrics: %d client(s) hung up before their reply was sent",
                     self._hangups)
            self._hangups = 0

    def _due(self, what: str) -> bool:
        """Whether a line about `what` may be logged now (one a minute)."""
        now = time.monotonic()
        if now - self._logged_at[what] < LOG_EVERY_S:
            return False
        self._logged_at[what] = now
        return True


def _response(status: HTTPStatus, body: bytes = b"",
              content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (f"HTTP/1.1 {status.value} {status.phrase}\r\nServer: dqoesd\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode("latin-1") + body


def _family_of(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
