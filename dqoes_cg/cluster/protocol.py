"""The messages between a node's agent and the manager, on the mutual-TLS channel
(identity.py): one JSON object per line, at most MAX_LINE bytes (jsonline.py, the framing
of the control socket too).

    agent -> manager   {"v": 1, "type": "report", "seq": N, "budget_cpus": 0.5,
                        "used_cpus": 0.31, "engine": true, "controller": true,
                        "error": null, "containers": [ContainerReport, ...],
                        "pressure": Pressure, "ipc": null, "llc_misses_per_s": null}
    manager -> agent   {"v": 1, "type": "ack", "seq": N, "refused": [{"id", "reason"}],
                        "interval_s": 2.5}
                       {"v": 1, "type": "services", "services": {SERVICE_ID: {labels}}}

A report is what the node's dqoesd measures of the containers of Swarm tasks it runs, by
container ID, every report interval; `engine` and `controller` say whether its dockerd and
its dqoesd answer (`error`: why not). The manager acknowledges each report, naming the
containers it refused (see manager.py), and the seconds it asks the agent to wait before
its next report (`interval_s`: back-pressure, pace.py; absent from an older manager's).
Fields that came later, each absent from an older
agent's report (taken as unknown): a container's `rate_hz`, `window_usage_cores`, `mean_s`
and `p95_s` over its last decision window, and what slows the node and each container (its
`pressure`, {"cpu" | "memory" | "io": {"some_ratio": share of the last window stalled,
"avg10_pct": percent}}, the container's `throttled_window_ratio`, and `ipc`,
`llc_misses_per_s` where the node has hardware counters). `services` is the whole set of
`dqoes.` service labels for the tasks Swarm gives that node (a pipeline stage's: its share
of the pipeline's target), sent when it changes (and at the start): the agent gives them to
its dqoesd (api.py, service-labels), which applies them to the tasks' containers. Both ends
treat what they receive as hostile: anything malformed is a `ProtocolError` and ends the
connection.
"""

from __future__ import annotations

import re
import socket
import ssl
from dataclasses import asdict, dataclass, field
from typing import Any

from ..jsonline import decode, encode, take_line
from ..membership.labels import MAX_VALUE, PREFIX
from ..membership.objective import METRICS
from ..status import PRESSURE_RESOURCES

VERSION = 1
CLUSTER_PORT = 2378  # dqoes-manager's, on each Swarm manager (Swarm's own is 2377)
MAX_LINE = 1 << 20
MAX_CONTAINERS = 4096  # in one report
MAX_SERVICES = 4096  # in one services message
MAX_LABELS = 16  # dqoes. labels of one service
MAX_CPUS = 1 << 16
MAX_ERROR = 200
MAX_SAMPLES = 1 << 40
MAX_RATE_HZ = 1e7
MAX_SECONDS = 1e6
MAX_IPC = 64.0  # instructions per cycle: well above any core's width
MAX_MISS_RATE = 1e12  # LLC misses per second
PRESSURE_KEYS = ("some_ratio", "avg10_pct")
PRESSURE_KEYS_SET = frozenset(PRESSURE_KEYS)
PRESSURE_RESOURCES_SET = frozenset(PRESSURE_RESOURCES)
REPORT_CLASSES = ("G", "S", "B", "idle", "pending")
CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
SWARM_ID = re.compile(r"^[a-z0-9]{25}$")  # Swarm's object IDs (services, nodes, tasks)


class ProtocolError(Exception):
    """A message that breaks the protocol; a one-line message."""


@dataclass(frozen=True, slots=True)  # no __dict__: 100,000 of them at a time
class ContainerReport:
    """What a node's dqoesd measures of one container, as its status shows it."""

    id: str  # the container's full ID
    cls: str  # G, S, B, idle, pending (JSON: "class")
    target_s: float
    metric: str
    measured_s: float | None
    cpu_limit_cores: float | None  # None: no limit
    cpu_usage_cores: float
    samples: int
    # Over the node's last decision window (None: not measured, or an older agent)
    rate_hz: float | None = None  # requests a second
    window_usage_cores: float | None = None  # CPUs used
    mean_s: float | None = None  # latency, whatever the target's metric
    p95_s: float | None = None
    # What slowed it over its node's last window (see the module's docstring; absent from
    # an older agent's report: empty, None)
    pressure: dict[str, dict[str, float | None]] = field(default_factory=dict)
    throttled_window_ratio: float | None = None
    ipc: float | None = None
    llc_misses_per_s: float | None = None


@dataclass(frozen=True)
class Report:
    seq: int
    budget_cpus: float | None  # dqoesd's T_R; None when dqoesd does not answer
    used_cpus: float  # by every container dqoesd manages, over its last tick
    engine: bool  # the node's dockerd answers
    controller: bool  # the node's dqoesd answers
    error: str | None  # why one of them does not
    containers: tuple[ContainerReport, ...]
    pressure: dict[str, dict[str, float | None]] = field(default_factory=dict)  # the node's
    ipc: float | None = None  # the node's, where counted for the node alone
    llc_misses_per_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["containers"] = [{"id": c["id"], "class": c.pop("cls"), **c}
                             for c in doc["containers"]]
        return {"v": VERSION, "type": "report", **doc}


@dataclass(frozen=True)
class Ack:
    seq: int
    refused: tuple[tuple[str, str], ...]  # (container ID, why)
    interval_s: float | None = None  # the report interval the manager asks (None: its own)

    def to_json(self) -> dict[str, Any]:
        return {"v": VERSION, "type": "ack", "seq": self.seq,
                "refused": [{"id": cid, "reason": why} for cid, why in self.refused],
                "interval_s": self.interval_s}


@dataclass(frozen=True)
class Services:
    services: dict[str, dict[str, str]]  # service ID: its dqoes. labels

    def to_json(self) -> dict[str, Any]:
        return {"v": VERSION, "type": "services", "services": self.services}


Message = Report | Ack | Services


def parse(line: bytes) -> Message:
    """The message on one line; ProtocolError if it is not a well-formed one."""
    try:
        doc = decode(line)
    except ValueError as e:
        raise ProtocolError(f"a message that {e}") from None
    if doc.get("v") != VERSION:
        raise ProtocolError(f"protocol version {doc.get('v')!r:.20} (this end speaks "
                            f"{VERSION})")
    kind = doc.get("type")
    try:
        if kind == "report":
            return _report(doc)
        if kind == "ack":
            return _ack(doc)
        if kind == "services":
            return _services(doc)
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"a malformed {kind} message: {e}") from None
    raise ProtocolError(f"unknown message type {kind!r:.40}")


def _report(doc: dict[str, Any]) -> Report:
    containers = _list(doc["containers"], MAX_CONTAINERS, "containers")
    budget = doc["budget_cpus"]
    return Report(_count(doc["seq"], "seq"),
                  None if budget is None else _cpus(budget, "budget_cpus", positive=True),
                  _cpus(doc["used_cpus"], "used_cpus"), _bool(doc["engine"], "engine"),
                  _bool(doc["controller"], "controller"), _error(doc.get("error")),
                  tuple(_container(c) for c in containers), _pressure(doc.get("pressure")),
                  *_counters(doc))


# A container's optional numbers (absent or null: unknown) and their highest values, in
# ContainerReport's order; "pressure" (an object) sits between the fourth and the fifth.
_CONTAINER_NUMBERS = (("rate_hz", MAX_RATE_HZ), ("window_usage_cores", MAX_CPUS),
                      ("mean_s", MAX_SECONDS), ("p95_s", MAX_SECONDS),
                      ("throttled_window_ratio", 1.0), ("ipc", MAX_IPC),
                      ("llc_misses_per_s", MAX_MISS_RATE))


def _container(doc: Any) -> ContainerReport:
    # The hot part of a report (a thousand nodes' hundred containers a second): the checks
    # inline, each value's type by identity (a bool is no number) and its range by one
    # chained comparison (NaN and the infinities fail it).
    if type(doc) is not dict:
        raise ValueError("a container that is not an object")
    get = doc.get
    cid = doc["id"]
    if type(cid) is not str or not CONTAINER_ID.match(cid):
        raise ValueError("a container ID that is not 64 hexadecimal digits")
    cls, metric = doc["class"], doc["metric"]
    if cls not in REPORT_CLASSES:
        raise ValueError(f"unknown class {cls!r:.20}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r:.20}")
    target, measured = doc["target_s"], doc["measured_s"]
    limit, usage, samples = doc["cpu_limit_cores"], doc["cpu_usage_cores"], doc["samples"]
    optional = [None if (v := get(key)) is None else _number(v, key, high, positive=False)
                for key, high in _CONTAINER_NUMBERS]
    return ContainerReport(
        cid, cls, _number(target, "target_s", MAX_SECONDS, positive=False), metric,
        None if measured is None else _number(measured, "measured_s", MAX_SECONDS,
                                              positive=False),
        None if limit is None else _number(limit, "cpu_limit_cores", MAX_CPUS,
                                           positive=True),
        _number(usage, "cpu_usage_cores", MAX_CPUS, positive=False),
        _count(samples, "samples"), *optional[:4], _pressure(get("pressure")), *optional[4:])


def _optional(value: Any, what: str, high: float) -> float | None:
    return None if value is None else _number(value, what, high, positive=False)


def _counters(doc: dict[str, Any]) -> tuple[float | None, float | None]:
    """(ipc, llc_misses_per_s) of a report (None: not counted)."""
    return (_optional(doc.get("ipc"), "ipc", MAX_IPC),
            _optional(doc.get("llc_misses_per_s"), "llc_misses_per_s", MAX_MISS_RATE))


def _pressure(value: Any) -> dict[str, dict[str, float | None]]:
    """A pressure object (None: absent, from an older agent)."""
    if value is None:
        return {}
    if type(value) is not dict or not value.keys() <= PRESSURE_RESOURCES_SET:
        raise ValueError(f"pressure must be an object of {', '.join(PRESSURE_RESOURCES)}")
    checked = {}
    for resource, stall in value.items():
        if type(stall) is not dict or stall.keys() != PRESSURE_KEYS_SET:
            raise ValueError(f"the {resource} pressure must be an object of "
                             f"{' and '.join(PRESSURE_KEYS)}")
        checked[resource] = {
            "some_ratio": _optional(stall["some_ratio"], f"{resource} some_ratio", 1.0),
            "avg10_pct": _optional(stall["avg10_pct"], f"{resource} avg10_pct", 100.0)}
    return checked


def _ack(doc: dict[str, Any]) -> Ack:
    refused = []
    for entry in _list(doc["refused"], MAX_CONTAINERS, "refused"):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) \
                or not isinstance(entry.get("reason"), str):
            raise ValueError("a refusal without id and reason")
        refused.append((entry["id"][:64], entry["reason"][:MAX_ERROR]))
    return Ack(_count(doc["seq"], "seq"), tuple(refused),
               _optional(doc.get("interval_s"), "interval_s", MAX_SECONDS))


def _services(doc: dict[str, Any]) -> Services:
    services = doc["services"]
    if not isinstance(services, dict) or len(services) > MAX_SERVICES:
        raise ValueError(f"services must be an object of at most {MAX_SERVICES}")
    checked = {}
    for sid, labels in services.items():
        if not SWARM_ID.match(sid):
            raise ValueError(f"a service ID {sid!r:.40} that is not Swarm's")
        if not isinstance(labels, dict) or len(labels) > MAX_LABELS or not all(
                isinstance(k, str) and k.startswith(PREFIX) and len(k) <= MAX_VALUE
                and isinstance(v, str) and len(v) <= MAX_VALUE for k, v in labels.items()):
            raise ValueError(f"the labels of service {sid} are not {PREFIX} labels")
        checked[sid] = labels
    return Services(checked)


def _list(value: Any, limit: int, what: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > limit:
        raise ValueError(f"{what} must be a list of at most {limit}")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false")
    return value


def _count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAMPLES:  # a bool's type is bool
        raise ValueError(f"{what} must be a count")
    return value


def _number(value: Any, what: str, high: float, positive: bool) -> float:
    # `high` is finite: the chained comparison fails for NaN and the infinities
    if (type(value) is not float and type(value) is not int) or not 0 <= value <= high \
            or (positive and value == 0):
        raise ValueError(f"{what} must be a number from 0 to {high:g}")
    return float(value)


def _seconds(value: Any, what: str) -> float:
    return _number(value, what, MAX_SECONDS, positive=False)


def _cpus(value: Any, what: str, positive: bool = False) -> float:
    return _number(value, what, MAX_CPUS, positive)


def _error(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("error must be a string or null")
    return value[:MAX_ERROR]


class Channel:
    """One end of a connection, after its TLS handshake: messages out, messages in."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self._buffer = bytearray()

    def send(self, message: Message, timeout: float) -> None:
        """OSError (TimeoutError) if it cannot go out within `timeout` seconds."""
        self.sock.settimeout(timeout)
        self.sock.sendall(encode(message.to_json()))

    def receive(self, timeout: float) -> Message | None:
        """The next message, or None if none came within `timeout` seconds. ProtocolError
        for a malformed one, ConnectionError when the peer closed the connection."""
        while True:
            try:
                line = take_line(self._buffer, MAX_LINE)
            except ValueError as e:
                raise ProtocolError(f"a message that {e}") from None
            if line is not None:
                return parse(line)
            self.sock.settimeout(timeout)
            try:
                chunk = self.sock.recv(65536)
            except (TimeoutError, ssl.SSLWantReadError):
                return None
            if not chunk:
                raise ConnectionError("the peer closed the connection")
            self._buffer += chunk

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def reason(e: Exception) -> str:
    """A one-line reason for a failure of the channel or of its TLS."""
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    if isinstance(e, TimeoutError):
        return str(e) or "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
