"""A client of a container engine's HTTP API over its unix socket: Docker's Engine API, or
Podman's Docker-compatible one. Plain `http.client` on an AF_UNIX socket: the daemon needs
five GET requests and the event stream, the cluster's manager a few more and a service
update, with bounded reads and timeouts of their own, which is less code than adapting a
client library (and no dependency).

Replies are parsed into small typed records (`Container`); what a container's creator
wrote (its name, its labels) is kept as strings, bounded, and judged elsewhere
(membership/labels.py).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..membership.labels import KNOWN, PIPELINE_KEYS, PREFIX

API = "/v1.41"  # Docker 20.10's; Docker's later engines and Podman's compatible API accept it
DOCKER_SOCKET = Path("/run/docker.sock")
PODMAN_SOCKET = Path("/run/podman/podman.sock")
TIMEOUT_S = 10.0
MAX_REPLY = 64 << 20  # a listing of thousands of containers is a few MB
MAX_EVENT = 1 << 20  # one event line
MAX_LABELS = len(KNOWN) + len(PIPELINE_KEYS) + 1  # `dqoes.` labels kept: one unknown
MAX_LABEL_CHARS = 256  # of a `dqoes.` label's key or value kept (membership/labels.py reads 64)
MAX_OTHER_CHARS = 4096  # of another label's value kept (a list of node IDs)
SERVICE_ID = "com.docker.swarm.service.id"  # a label of every task container of a service
# The names Docker and Podman accept (bounded: they set no limit); a name is hostile input
_CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}", re.ASCII)


class EngineError(Exception):
    """The engine cannot be reached or answered something unusable; a one-line message."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Container:
    """What the daemon needs of one container, from the engine's inspect data."""

    id: str
    name: str  # without Docker's leading "/"
    running: bool
    pid: int  # of its first process (0 when not running)
    labels: dict[str, str]
    volumes: tuple[tuple[str, str], ...]  # (driver, volume name) of its volume mounts

    @property
    def service_id(self) -> str | None:
        """The Swarm service it is a task of."""
        return self.labels.get(SERVICE_ID)


def parse_container(doc: Any) -> Container:
    """A Container from `GET /containers/{id}/json`; ValueError if it is not one."""
    if not isinstance(doc, dict):
        raise ValueError("not a container")
    cid, name, state = doc.get("Id"), doc.get("Name"), doc.get("State")
    config = doc.get("Config") or {}
    if not (isinstance(cid, str) and isinstance(name, str) and isinstance(state, dict)
            and isinstance(config, dict)):
        raise ValueError("a container without Id, Name or State")
    pid = state.get("Pid", 0)
    mounts = doc.get("Mounts") or []
    if not isinstance(pid, int) or not isinstance(mounts, list):
        raise ValueError(f"container {cid[:12]}: malformed State or Mounts")
    volumes = tuple((m["Driver"], m["Name"]) for m in mounts
                    if isinstance(m, dict) and m.get("Type") == "volume"
                    and isinstance(m.get("Driver"), str) and isinstance(m.get("Name"), str))
    return Container(cid, name.removeprefix("/"), state.get("Running") is True,
                     max(pid, 0), parse_labels(config.get("Labels")), volumes)


def check_container_name(name: str) -> None:
    """ValueError, with a one-line reason, unless `name` has the form of a name Docker or
    Podman gives a container."""
    if not _CONTAINER_NAME.fullmatch(name):
        raise ValueError(f"the engine names it {ascii(name)[:80]}, not a container name "
                         "(letters, digits, '_', '.' and '-', at most 255)")


def parse_labels(value: Any, also: tuple[str, ...] = (SERVICE_ID,)) -> dict[str, str]:
    """The labels dqoes-cg reads, as a dict of strings (null: none): the `dqoes.` ones (at
    most MAX_LABELS), and the keys in `also`; no other label is kept, whatever their number
    and size. A `dqoes.` key or value longer than MAX_LABEL_CHARS is cut to it, never
    dropped: it is then longer than any that membership/labels.py accepts, so the container is
    refused with a reason, as it is for the surplus (MAX_LABELS `dqoes.` keys hold an
    unknown one)."""
    if not isinstance(value, dict):
        return {}
    kept: dict[str, str] = {}
    ours = 0
    for k, v in value.items():
        if not (isinstance(k, str) and isinstance(v, str)):
            continue
        if k.startswith(PREFIX):
            ours += 1
            if ours <= MAX_LABELS:
                kept[k[:MAX_LABEL_CHARS]] = v[:MAX_LABEL_CHARS]
        elif k in also:
            kept[k] = v[:MAX_OTHER_CHARS]
    return kept


def service_labels(doc: Any) -> tuple[str, dict[str, str]]:
    """(ID, labels) of a service from `GET /services`; ValueError if it is not one."""
    if not isinstance(doc, dict) or not isinstance(doc.get("ID"), str):
        raise ValueError("a service without ID")
    spec = doc.get("Spec")
    return doc["ID"], parse_labels(spec.get("Labels") if isinstance(spec, dict) else None)


class Engine:
    """One engine's API at `path`. Each call opens a connection of its own, so that calls
    from several threads never share one."""

    def __init__(self, path: Path, runtime: str = "Docker", timeout: float = TIMEOUT_S) -> None:
        self.path = path
        self.runtime = runtime
        self.timeout = timeout

    def __str__(self) -> str:
        return f"{self.runtime} (API at {self.path})"

    def get(self, path: str, query: dict[str, str] | None = None,
            missing_ok: tuple[int, ...] = ()) -> Any:
        """The JSON reply to GET `path`; None when its status is in `missing_ok`."""
        return self.call("GET", path, query, missing_ok=missing_ok)

    def call(self, method: str, path: str, query: dict[str, str] | None = None,
             body: Any = None, missing_ok: tuple[int, ...] = ()) -> Any:
        """The JSON reply to `method` `path` with `body` (JSON) if not None; None when its
        status is in `missing_ok`, or when a success has no body (a node's update)."""
        target = API + path + ("?" + urllib.parse.urlencode(query) if query else "")
        conn = _UnixConnection(self.path, self.timeout)
        try:
            if body is None:
                conn.request(method, target)
            else:
                conn.request(method, target, json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read(MAX_REPLY + 1)
        except (OSError, http.client.HTTPException) as e:
            raise EngineError(f"{self}: {_why(e)}") from None
        finally:
            conn.close()
        if reply.status in missing_ok:
            return None
        if reply.status != 200:
            raise EngineError(f"{self}: {method} {path} answered {reply.status}: "
                              f"{_message(data)}")
        if not data:
            return None
        if len(data) > MAX_REPLY:
            raise EngineError(f"{self}: the reply to {method} {path} exceeds {MAX_REPLY} "
                              "bytes")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise EngineError(f"{self}: {method} {path} answered no valid JSON") from None

    def running(self) -> list[str]:
        """The IDs of the running containers."""
        listing = self.get("/containers/json")
        if not isinstance(listing, list):
            raise EngineError(f"{self}: the container listing is not a list")
        return [c["Id"] for c in listing if isinstance(c, dict) and isinstance(c.get("Id"), str)]

    def inspect(self, name_or_id: str) -> Container | None:
        """The container of that name or ID; None if there is none."""
        doc = self.get("/containers/" + urllib.parse.quote(name_or_id, safe="") + "/json",
                       missing_ok=(404,))
        if doc is None:
            return None
        try:
            return parse_container(doc)
        except ValueError as e:
            raise EngineError(f"{self}: {e}") from None

    def services(self) -> dict[str, dict[str, str]] | None:
        """Every Swarm service's labels by service ID; None when this node is no Swarm
        manager (the engine answers 503), in no Swarm, or the engine has no Swarm (Podman
        answers 404)."""
        listing = self.get("/services", missing_ok=(503, 406, 404))
        if listing is None:
            return None
        if not isinstance(listing, list):
            raise EngineError(f"{self}: the service listing is not a list")
        services = {}
        for doc in listing:
            try:
                sid, labels = service_labels(doc)
            except ValueError:
                continue
            services[sid] = labels
        return services

    def events(self, types: tuple[str, ...], since: int, until: int) -> EventStream:
        """The engine's events of these object types from `since` (Unix seconds: the
        engine replays those it still holds) until `until`, when the stream ends."""
        query = urllib.parse.urlencode({"filters": json.dumps({"type": list(types)}),
                                        "since": str(since), "until": str(until)})
        conn = _UnixConnection(self.path, None)  # an idle stream is normal: no timeout
        try:
            conn.connect()
            conn.sock.settimeout(self.timeout)
            conn.request("GET", f"{API}/events?{query}")
            reply = conn.getresponse()
            conn.sock.settimeout(None)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise EngineError(f"{self}: {_why(e)}") from None
        if reply.status != 200:
            body = reply.read(4096)
            conn.close()
            raise EngineError(f"{self}: GET /events answered {reply.status}: "
                              f"{_message(body)}")
        return EventStream(conn, reply, str(self))


@dataclass(frozen=True)
class Event:
    type: str  # container, service
    action: str  # start, die, destroy, rename, update, create, remove...
    id: str  # of the object


class EventStream:
    """The events of an engine, one JSON object per line; iterating ends when the engine
    goes away or `close` is called (from any thread)."""

    def __init__(self, conn: http.client.HTTPConnection, reply: http.client.HTTPResponse,
                 what: str) -> None:
        self._conn = conn
        self._reply = reply
        self._what = what
        self._lock = threading.Lock()
        self._sock = conn.sock

    def __iter__(self) -> Iterator[Event]:
        while True:
            try:
                line = self._reply.readline(MAX_EVENT + 1)
            except (OSError, ValueError, AttributeError, http.client.HTTPException):
                return  # AttributeError: http.client, when `close` came first
            if not line:
                return
            if len(line) > MAX_EVENT:
                raise EngineError(f"{self._what}: an event longer than {MAX_EVENT} bytes")
            event = parse_event(line)
            if event is not None:
                yield event

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
                except OSError:
                    pass
                self._sock = None
        self._conn.close()


def parse_event(line: bytes) -> Event | None:
    """An event from one line of the stream; None for what is not a well-formed event."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    actor = doc.get("Actor")
    kind, action = doc.get("Type"), doc.get("Action")
    oid = actor.get("ID") if isinstance(actor, dict) else None
    if not (isinstance(kind, str) and isinstance(action, str) and isinstance(oid, str)):
        return None
    # "exec_start: sh -c ..." and the like: the action is the word before the colon
    return Event(kind, action.split(":", 1)[0], oid)


def _why(e: Exception) -> str:
    if isinstance(e, FileNotFoundError):
        return "not running (no socket)"
    if isinstance(e, ConnectionRefusedError):
        return "not running (nothing listens on its socket)"
    if isinstance(e, TimeoutError):
        return "did not answer in time"
    return str(e) or type(e).__name__


def _message(body: bytes) -> str:
    try:
        doc = json.loads(body)
        text = doc.get("message") if isinstance(doc, dict) else None
    except (ValueError, RecursionError):
        text = None
    return (text if isinstance(text, str) else body.decode(errors="replace"))[:200].strip()
