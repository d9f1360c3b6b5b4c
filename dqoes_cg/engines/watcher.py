"""Follows a container engine (Docker, or Podman's compatible API) from a thread of its
own, and tells the loop which containers its labels and volumes concern.

The thread subscribes to the engine's events (containers: start, die, destroy, rename,
update; services: create, update, remove) from a second before it connects, then lists
every running container and Swarm service: the engine replays the events of that second,
so nothing that happens around the listing is missed (Docker sends its answer's headers
before it subscribes). It does the same after every reconnect (a restart of dockerd or of
dqoesd loses nothing). On each container event it inspects the container and derives what
it should be from what it is, never from the event alone: a container that starts and
dies in a loop settles on its last state, and an event seen twice changes nothing.

A subscription lasts SUBSCRIPTION_S. At its end the thread subscribes again, from a second
before, and compares the engine's running containers and services with what it knows:
Docker drops an event when a slow reader's queue stays full for 100 ms, and a change so
lost is made up for within that time.

What the loop gets (`take`) is the latest `Seen` per container ID that changed since it
last asked, and whether a full listing came in since (then every container it had not
been told about again is gone): at most one entry per container however many events came.

Swarm services: the labels of a service reach its tasks' containers (they carry the
service's ID as the label com.docker.swarm.service.id). On a manager the thread reads them
from the engine; `push_service_labels` gives them from elsewhere (a cluster component, for
worker nodes, whose engines cannot list services).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..cgroup import CgroupError, Resolved
from ..membership.engine_targets import Changes, Seen
from ..membership.labels import effective, objective, ours
from .client import Container, Engine, EngineError, EventStream, check_container_name

log = logging.getLogger(__name__)

CONTAINER_ACTIONS = frozenset({"start", "die", "destroy", "rename", "update", "kill", "stop",
                               "restart", "oom", "pause", "unpause"})
SERVICE_ACTIONS = frozenset({"create", "update", "remove"})
RETRY_MIN_S, RETRY_MAX_S = 0.5, 5.0
SUBSCRIPTION_S = 60
OVERLAP_S = 1  # each subscription replays this much before it: whole seconds, the API's

ResolvePid = Callable[[int], Resolved | CgroupError]


class Watcher:
    def __init__(self, engine: Engine, resolve_pid: ResolvePid,
                 volume_ring: Callable[[str], Path], volume_driver: str = "dqoes",
                 subscription_s: int = SUBSCRIPTION_S) -> None:
        self.engine = engine
        self._subscription_s = subscription_s
        self._resolve_pid = resolve_pid
        self._volume_ring = volume_ring
        self._driver = volume_driver
        self._lock = threading.Lock()
        self._changes: Changes | None = None
        self._containers: dict[str, Container] = {}  # running, by ID (this thread's own)
        self._names: dict[str, str] = {}  # name -> ID of every running container
        self._listed_services: dict[str, dict[str, str]] = {}  # from the engine (a manager)
        self._pushed_services: dict[str, dict[str, str]] = {}  # from push_service_labels
        self._stream: EventStream | None = None
        self._stopping = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dqoes-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- for the loop --------------------------------------------------------------------

    def take(self) -> Changes | None:
        """What changed since the last call (None: nothing)."""
        with self._lock:
            changes, self._changes = self._changes, None
        return changes

    def container_id(self, name: str) -> str | None:
        """The ID of the running container of that name, as last seen (no I/O); None if
        none, or if the engine's state is not known (not connected)."""
        if not self.connected.is_set():
            return None
        with self._lock:
            return self._names.get(name)

    def push_service_labels(self, service_id: str, labels: dict[str, str] | None) -> None:
        """A Swarm service's labels, from a component that knows them (None: forget them).
        They apply to its task containers on this node, over what the engine lists."""
        with self._lock:
            if labels is None:
                self._pushed_services.pop(service_id, None)
            else:
                self._pushed_services[service_id] = ours(labels)
            self._service_changed(service_id)

    # --- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        delay, warned = RETRY_MIN_S, False
        while not self._stopping.is_set():
            try:
                self._follow()
                continue  # the subscription ran its time: the next at once
            except EngineError as e:
                if self.connected.is_set() or not warned:  # once per outage
                    log.warning("%s; following it again as soon as it answers", e)
                warned = True
            except Exception:  # a bug must not end the watch for good
                log.exception("following %s failed", self.engine)
            if self.connected.is_set():
                delay = RETRY_MIN_S
            self.connected.clear()
            if self._stopping.wait(delay):
                return
            delay = min(delay * 2, RETRY_MAX_S)

    def _follow(self) -> None:
        """One subscription: returns when it ran its time, raises EngineError when the
        engine ended it or failed."""
        now = int(time.time())
        until = now + self._subscription_s
        stream = self.engine.events(("container", "service"), now - OVERLAP_S, until)
        with self._lock:
            self._stream = stream
        try:
            if self._stopping.is_set():
                return
            if self.connected.is_set():
                self._make_up()
            else:
                self._list_all()
                self._load_volume_driver()
            for event in stream:
                if event.type == "container" and event.action in CONTAINER_ACTIONS:
                    self._look_at(event.id)
                elif event.type == "service" and event.action in SERVICE_ACTIONS:
                    self._reread_services(event.id)
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        if not self._stopping.is_set() and time.time() < until - OVERLAP_S:
            raise EngineError(f"{self.engine}: the event stream ended")

    def _list_all(self) -> None:
        containers = {}
        for cid in self.engine.running():
            c = self.engine.inspect(cid)
            if c is not None and c.running:
                containers[c.id] = c
        services = self.engine.services() or {}
        with self._lock:
            self._listed_services = services
            self._containers = containers
            self._names = {c.name: c.id for c in containers.values()}
            seen = {cid: s for cid, c in containers.items() if (s := self._seen(c))}
            self._changes = Changes(listed=True, seen=seen)
            self.connected.set()  # with the listing: whoever takes it can look names up
            ours = len(seen)
        log.info("following %s: %d running container(s), %d of them with dqoes labels or "
                 "volumes", self.engine, len(containers), ours)

    def _make_up(self) -> None:
        """Inspects the containers whose start or end no event told of (see the module's
        docstring), and rereads the services."""
        running = set(self.engine.running())
        with self._lock:
            known = set(self._containers)
        missed = running ^ known
        for cid in missed:
            self._look_at(cid)
        if missed:
            log.info("%s: %d container(s) started or ended with no event seen yet",
                     self.engine, len(missed))
        self._reread_services(None)

    def _load_volume_driver(self) -> None:
        """Makes the engine load the volume driver. Swarm places a task that mounts a volume
        of a driver only on nodes whose engine lists that driver, and an engine lists a
        legacy plugin only once it has loaded it; listing volumes loads every plugin its
        spec files name."""
        try:
            self.engine.get("/volumes", {"filters": json.dumps({"driver": [self._driver]})})
        except EngineError as e:
            log.warning("%s; Swarm may not place tasks with %s volumes on this node", e,
                        self._driver)

    def _look_at(self, cid: str) -> None:
        c = self.engine.inspect(cid)
        if c is not None and not c.running:
            c = None
        with self._lock:
            old = self._containers.pop(cid, None)
            if old is not None and self._names.get(old.name) == cid:
                del self._names[old.name]
            if c is not None:
                self._containers[cid] = c
                self._names[c.name] = cid
            if old is not None or c is not None:
                self._record(cid, None if c is None else self._seen(c))

    def _reread_services(self, sid: str | None) -> None:
        """The services' labels again, after an event of service `sid` (None: of any)."""
        services = self.engine.services()
        if services is None:
            return
        with self._lock:
            old, self._listed_services = self._listed_services, services
            changed = [sid] if sid is not None else \
                [s for s in old.keys() | services.keys() if old.get(s) != services.get(s)]
            for s in changed:
                self._service_changed(s)

    def _service_changed(self, sid: str) -> None:
        """(Under the lock.) A service's labels changed: so may its tasks' targets."""
        for c in self._containers.values():
            if c.service_id == sid:
                self._record(c.id, self._seen(c))

    def _record(self, cid: str, seen: Seen | None) -> None:
        """(Under the lock.) The latest state of one container, for the loop."""
        if self._changes is None:
            self._changes = Changes(listed=False)
        self._changes.seen[cid] = seen

    def _seen(self, c: Container) -> Seen | None:
        """(Under the lock.) What the loop must know of `c`; None: nothing."""
        sid = c.service_id
        service = None
        if sid is not None:
            service = self._pushed_services.get(sid, self._listed_services.get(sid))
        labels, source = effective(c.labels, service)
        rings = [self._volume_ring(name) for driver, name in c.volumes if driver == self._driver]
        if not labels and not rings:
            return None
        name = c.name
        try:
            wanted, error = objective(labels), None
        except ValueError as e:
            wanted, error = None, str(e)
        if len(rings) > 1:
            wanted, error = None, f"{len(rings)} {self._driver} volumes: mount one"
        try:
            check_container_name(name)
        except ValueError as e:
            name, wanted, error = f"<{ascii(name)[1:41]}>", None, str(e)
        return Seen(c.id, name, wanted, source, error, self._resolve_pid(c.pid),
                    rings[0] if rings else None)

