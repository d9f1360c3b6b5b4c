"""Targets from the container engine's labels: they come, change and go with their
containers, as the watcher (engines/watcher.py) reports them (`Seen`, `Changes`: defined
here, so that membership imports nothing of the engines); a target set by dqoesctl on the
same name wins. The controller calls `follow` once per tick, first, so that a container that
just started is sensed at once; what a tick cannot apply within ENGINE_BUDGET_S waits for
the next ones. What a tick adds and removes is written to the journal with one write through
to disk, before the tick acts on the new targets.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from ..cgroup import CgroupError, Resolved
from ..state import StateError
from .objective import ENGINE_SOURCES, Objective, Target
from .rings import Rings
from .targets import TargetError, Targets

log = logging.getLogger(__name__)

ENGINE_BUDGET_S = 0.25
"""Wall time a tick may spend applying changes of the engine's containers (one at least):
each costs a state line and a ring (a tick's lines are written through to disk together),
and 10,000 containers arriving at once took one tick of 32 s, requests unanswered
meanwhile; the rest wait for the next ticks."""


@dataclass(frozen=True)
class Seen:
    """A running container that dqoes-cg has to do with: it has `dqoes.` labels (its own
    or its service's), or a volume of the dqoes volume driver."""

    id: str
    name: str  # a malformed one's stand-in, "<...>": no container name has that form
    objective: Objective | None  # None: no target in its labels
    source: str  # "label" (its own labels) or "service" (its service's)
    error: str | None  # why its labels are refused (then objective is None)
    cgroup: Resolved | CgroupError
    ring: Path | None  # the ring of its dqoes volume, if it has one


@dataclass
class Changes:
    """What the watcher saw change since the loop last asked."""

    listed: bool  # a full listing: containers not in `seen` since are gone
    seen: dict[str, Seen | None] = field(default_factory=dict)  # by container ID; None: gone


class Following(Protocol):
    """The engine's watcher (engines/watcher.py), as far as the targets need it."""

    def take(self) -> Changes | None:
        """What changed since the last call (None: nothing)."""
        ...

    def push_service_labels(self, service_id: str, labels: dict[str, str] | None) -> None:
        """A Swarm service's labels, from a component that knows them (None: forget them)."""
        ...


class Owner(Protocol):
    """What following the engine needs of the controller, beyond the targets themselves."""

    def room(self) -> int:
        """How many more targets the open-file limit holds."""
        ...

    def room_refusal(self) -> str:
        """Why no target can be added when there is no room."""
        ...

    def retarget(self, name: str, objective: Objective, source: str) -> Target:
        """Give an existing target a new objective, in force at once."""
        ...

    def give_back(self, name: str) -> str | None:
        """Remove a target, giving its container's limit back (returned; None: none)."""
        ...


class EngineTargets:
    """The targets that follow the engine's containers: `follow` applies what `watcher` saw
    change; `refollow` lets a container's labels take over again once dqoesctl's target on
    its name is gone; `refused` lists the containers whose labels were refused."""

    def __init__(self, watcher: Following | None, targets: Targets, rings: Rings) -> None:
        self.watcher = watcher
        self.targets = targets
        self.rings = rings
        self._seen: dict[str, Seen] = {}  # the engine's containers that concern us, by ID
        self._queue: dict[str, Seen | None] = {}  # changes not applied yet, by ID
        self._listed = False  # a listing is in the queue: sweep once it is applied
        self._no_room: dict[str, Seen] = {}  # refused for want of descriptors, as seen

    def follow(self, owner: Owner) -> None:
        """Apply what the watcher saw change, for ENGINE_BUDGET_S of the tick at most.
        (`owner` is passed at each call, not kept: a reference back to the controller
        would delay freeing it, and closing its files, to the cycle collector.)"""
        self._take_changes()
        self.targets.defer_sync()
        try:
            self._apply(owner)
        finally:  # before anything acts on the new targets: one write through to disk
            try:
                self.targets.sync_deferred(self.rings.remove)
            except StateError as e:
                log.error("%s", e)
        for cid in list(self._no_room)[:max(0, owner.room())]:  # tried where room was made
            self._queue.setdefault(cid, self._no_room.pop(cid))
        if self._listed and not self._queue:
            self._listed = False  # targets of a previous run whose containers are gone
            names = {s.name for s in self._seen.values()}
            for t in list(self.targets):
                if t.source in ENGINE_SOURCES and t.name not in names:
                    self._drop(owner, t.name, "its container is gone")

    def _apply(self, owner: Owner) -> None:
        """Apply the queued changes, for ENGINE_BUDGET_S at most."""
        deadline = time.monotonic() + ENGINE_BUDGET_S
        for n, cid in enumerate(list(self._queue)):
            if n and time.monotonic() > deadline:
                break
            seen = self._queue.pop(cid)
            self._no_room.pop(cid, None)  # this change is newer
            old = self._seen.pop(cid, None)
            try:
                if old is not None and (seen is None or seen.name != old.name):
                    why = "its container stopped" if seen is None else \
                        f"its container is now {seen.name}"
                    self._drop(owner, old.name, why)
                if seen is not None:
                    self._seen[cid] = seen
                    self._follow_seen(owner, seen, old)
            except (TargetError, StateError) as e:
                log.error("%s: %s", (seen or old).name if (seen or old) else cid[:12], e)
            except Exception:  # the engine's answers are input: none may stop the loop
                log.exception("container %s: following its change failed", cid[:12])

    def refollow(self, owner: Owner, name: str) -> None:
        """dqoesctl's target on `name` is gone: its container's labels, if any, take over."""
        for seen in list(self._seen.values()):
            if seen.name == name:
                self._follow_seen(owner, seen)

    def refused(self) -> list[Seen]:
        """The containers whose labels were refused, and that no target names."""
        return [s for s in self._seen.values() if s.error and s.name not in self.targets]

    def push_service_labels(self, service_id: str, labels: dict[str, str] | None) -> None:
        """A Swarm service's labels, from whoever knows them (see engines/watcher.py)."""
        if self.watcher is None:
            raise TargetError("dqoesd follows no container engine (--engine-socket)")
        self.watcher.push_service_labels(service_id, labels)

    def _take_changes(self) -> None:
        changes = self.watcher.take() if self.watcher is not None else None
        if changes is None:
            return
        if changes.listed:  # it supersedes the queue; whatever it does not name is gone
            for cid in set(self._seen) - set(changes.seen):
                changes.seen[cid] = None
            self._queue, self._listed = changes.seen, True
        else:
            self._queue.update(changes.seen)

    def _follow_seen(self, owner: Owner, seen: Seen, old: Seen | None = None) -> None:
        name, ring = seen.name, None if seen.ring is None else str(seen.ring)
        current = self.targets.find(name)
        if current is not None and current.source not in ENGINE_SOURCES:
            if ring is not None and current.ring != ring:  # dqoesctl's target, its own ring
                self._drop(owner, name, "", force=True)
                self._add(seen, current.objective, "cli", ring)
            return
        if seen.objective is not None and current is None \
                and owner.room() <= 0:  # as set-target refuses one
            self._no_room[seen.id] = seen
            seen = replace(seen, objective=None, error=owner.room_refusal())
            self._seen[seen.id] = seen
        if seen.objective is None:
            if seen.error and (old is None or old.error != seen.error):
                log.warning("%s: labels refused, container left unmanaged: %s", name,
                            seen.error)
            if current is not None:
                self._drop(owner, name, seen.error or "its labels name no target")
            return
        o = seen.objective
        if current is not None and current.ring != ring:
            self._drop(owner, name, "its ring moved")
            current = None
        if current is None:
            self._add(seen, o, seen.source, ring)
            log.info("%s: %s from %s", name, o, _from(seen.source))
        elif (current.objective, current.source) != (o, seen.source):
            owner.retarget(name, o, seen.source)
            log.info("%s: now %s from %s", name, o, _from(seen.source))
        if current is not None and current.cgroup is None \
                and not isinstance(seen.cgroup, CgroupError):
            self.targets.bind({name: seen.cgroup})

    def _add(self, seen: Seen, o: Objective, source: str, ring: str | None) -> None:
        self.targets.add(seen.name, o, seen.cgroup, True, source,
                         (lambda: None) if ring else (lambda: self.rings.ensure(seen.name)),
                         ring=ring)

    def _drop(self, owner: Owner, name: str, why: str, force: bool = False) -> None:
        target = self.targets.find(name)
        if target is None or not (force or target.source in ENGINE_SOURCES):
            return
        restored = owner.give_back(name)
        if why:
            log.info("%s: target removed (%s)%s", name, why,
                     f"; cpu.max restored to '{restored}'" if restored else "")


def _from(source: str) -> str:
    return "its service's labels" if source == "service" else "its labels"
