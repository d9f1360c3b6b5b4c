"""The targets, the cgroups they are bound to, and the original limits the daemon must give
back. Every change is persisted (the journal, state.py) before it is made in memory, so
that a failed write changes nothing.

A target is *bound* when its cgroup is known and *pending* while it is not: set with
--pending before its container exists, or back from bound when its cgroup went away. The
cgroups of pending targets are looked for off the loop (`Binder`), one walk of the cgroup
tree for all of them. `version` counts changes of the bound set: the loop rebuilds its
per-slot tables when it moves, and at once when `removed` does (a cgroup left it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from ..cgroup import CgroupError, InvalidName, Resolved, require_cpu_controller
from ..state import Originals, StateError, StateStore, cgroup_identity
from .objective import Objective, Target, check_target

log = logging.getLogger(__name__)

ResolveMany = Callable[[list[str]], dict[str, Resolved | CgroupError]]


class TargetError(Exception):
    """A request about targets that is refused; a one-line message."""


class Targets:
    def __init__(self, store: StateStore, mount: Path) -> None:
        self.store = store
        self.mount = mount
        self._targets = store.load()
        self._by_cgroup = {t.cgroup: t.name for t in self._targets.values() if t.cgroup}
        self.reasons: dict[str, str] = {}  # why a pending target is pending
        self.version = 0  # changes of the bound set
        self.removed = 0  # those of them that took a cgroup out of it
        self._deferring = False  # between defer_sync and sync_deferred
        self._unsynced: list[str] = []  # added while deferring, not durable yet

    def __iter__(self) -> Iterator[Target]:
        return iter(self._targets.values())

    def __len__(self) -> int:
        return len(self._targets)

    def __contains__(self, name: str) -> bool:
        return name in self._targets

    def find(self, name: str) -> Target | None:
        return self._targets.get(name)

    def get(self, name: str) -> Target:
        try:
            return self._targets[name]
        except KeyError:
            raise TargetError(f"no target for {name!r} (see dqoesctl list)") from None

    def bound(self) -> list[Target]:
        return [t for t in self._targets.values() if t.cgroup]

    def pending(self) -> list[str]:
        # Each cgroup in _by_cgroup is a bound target's: as many as targets, none is pending.
        # The loop asks at every rebind interval; the walk costs 13 us at N = 1,000.
        if len(self._by_cgroup) == len(self._targets):
            return []
        return [t.name for t in self._targets.values() if not t.cgroup]

    # --- requests ------------------------------------------------------------------------

    def add(self, name: str, objective: Objective, found: Resolved | CgroupError,
            pending: bool, source: str, prepare: Callable[[], None],
            ring: str | None = None) -> Target:
        """A new target: an inference service's latency target, or a training job (no
        target nor metric). `found` is what resolving the name gave: it must be a usable
        cgroup, unless `pending` accepts one that may appear later (but never a name that
        can never be valid). `prepare` runs once the target is accepted, before it is saved
        (it creates the ring). `ring`: its ring, if not the default one (its volume's).
        TargetError or StateError: nothing changed (while deferring, see `defer_sync`)."""
        _check(objective)
        try:
            path = self._usable(name, found)
        except InvalidName as e:
            raise TargetError(str(e)) from None
        except CgroupError as e:
            if not pending:
                raise TargetError(str(e)) from None
            path, reason = None, str(e)
        target = Target(name, _seconds(objective.target_s), objective.metric, source, ring=ring,
                        kind=objective.kind, **_scrape_fields(objective))
        if path is not None:
            target.cgroup, target.cgroup_id = str(path), cgroup_identity(path)
        prepare()
        self._save(target, sync=not self._deferring)
        if self._deferring:
            self._unsynced.append(name)
        if path is None:
            self.reasons[name] = reason
        return target

    def change(self, name: str, objective: Objective, source: str) -> Target:
        """A new objective (or kind) for an existing target. TargetError or StateError:
        nothing changed."""
        _check(objective)
        changed = replace(self.get(name), target_s=_seconds(objective.target_s),
                          metric=objective.metric, source=source, kind=objective.kind,
                          **_scrape_fields(objective))
        self._save(changed)
        return changed

    def unset(self, name: str) -> Target:
        """Remove a target (its limit must have been given back already)."""
        target = self.get(name)
        self.store.delete(name, sync=not self._deferring)
        self._synced()
        del self._targets[name]
        self.reasons.pop(name, None)
        if target.cgroup:
            self._by_cgroup.pop(target.cgroup, None)
            self.version += 1
            self.removed += 1
        self._compact_if_due()
        return target

    def defer_sync(self) -> None:
        """Until `sync_deferred`, new targets, removed ones and originals given back are
        written to the journal but not through to disk: `sync_deferred` does it once for
        all, and must come before anything acts on the new targets (the others record what
        was done already). Any other change is written through at once, and them with it."""
        self._deferring = True

    def sync_deferred(self, undo: Callable[[Target], None]) -> None:
        """Write what was deferred through to disk. StateError: it could not be, and was
        cut from the journal; the new targets are undone (`undo` is called for each, after
        it is no target any more, to remove what its `prepare` made); the removals stay
        done (a restart would find their targets again, and give them back again)."""
        self._deferring = False
        try:
            self.store.sync()
        except StateError as e:
            names, self._unsynced = self._unsynced, []
            for name in names:
                target = self._targets.pop(name)
                self.reasons.pop(name, None)
                if target.cgroup:
                    self._by_cgroup.pop(target.cgroup, None)
                    self.version += 1
                undo(target)
            raise StateError(f"{e}; {len(names)} new target(s) undone") from None
        self._unsynced.clear()

    # --- binding -------------------------------------------------------------------------

    def bind(self, found: dict[str, Resolved | CgroupError]) -> None:
        """Bind the pending targets whose cgroup was found (a Binder's answers); the others
        keep the reason they are pending."""
        newly = []
        for name, result in found.items():
            target = self._targets.get(name)
            if target is None or target.cgroup:
                continue  # removed, or bound meanwhile
            try:
                path = self._usable(name, result)
                newly.append(replace(target, cgroup=str(path),
                                     cgroup_id=cgroup_identity(path)))
            except (CgroupError, OSError) as e:
                if self.reasons.get(name) != str(e):
                    log.info("%s: pending (%s)", name, e)
                self.reasons[name] = str(e)
        if newly:
            self._save(*newly)
            for t in newly:
                self.reasons.pop(t.name, None)
                log.info("%s: bound to %s", t.name, t.cgroup)

    def release(self, names: list[str], why: str) -> None:
        """These targets' cgroups are gone: pending again, with no original to give back."""
        released = [replace(self._targets[n], cgroup=None, cgroup_id=None, original_max=None,
                            original_weight=None) for n in names]
        for t in released:
            log.info("%s: %s; pending until its container is back", t.name, why)
        self._save(*released)

    def readopt(self) -> None:
        """After a restart: a target stays bound where its cgroup is still the one it was
        bound to (same identity), with the original limit saved by the previous run; any
        other goes back to pending, and an original saved for another cgroup is dropped."""
        stale = []
        for t in self._targets.values():
            if not t.cgroup:
                continue
            try:
                same = t.cgroup_id is None or cgroup_identity(t.cgroup) == t.cgroup_id
            except OSError:
                same = False
            if not same or not Path(t.cgroup, "cpu.max").exists():
                stale.append(t.name)
        if stale:
            self.release(stale, "its cgroup is gone or was re-created while dqoesd was down")

    # --- original limits ---------------------------------------------------------------

    def record_originals(self, originals: dict[str, Originals]) -> None:
        """Save the cpu.max and cpu.weight each cgroup had before our first write to it
        (those not None: the others stay as saved; StateError: not saved, and then they must
        not be written)."""
        self._save(*(replace(t, original_max=o.cpu_max or t.original_max,
                             original_weight=o.weight or t.original_weight)
                     for t, o in ((self._targets[n], o) for n, o in originals.items())),
                   membership=False)

    def forget_originals(self, names: list[str]) -> None:
        """The originals of these targets were given back."""
        changed = [replace(self._targets[n], original_max=None, original_weight=None)
                   for n in names if self._targets[n].original_max is not None
                   or self._targets[n].original_weight is not None]
        if changed:
            self._save(*changed, membership=False, sync=not self._deferring)

    # --- internals ---------------------------------------------------------------------

    def _usable(self, name: str, found: Resolved | CgroupError) -> Path:
        """The cgroup `found` for `name`, checked usable and managed under no other name."""
        if isinstance(found, CgroupError):
            raise found
        require_cpu_controller(found.path, self.mount)
        other = self._by_cgroup.get(str(found.path))
        if other is not None and other != name:
            how = {"label": " (by its labels)", "service": " (by its service's labels)"}.get(
                self._targets[other].source, "")
            raise CgroupError(f"{found.path} is already managed as {other!r}{how}")
        return found.path

    def _save(self, *targets: Target, membership: bool = True, sync: bool = True) -> None:
        """Persist, then change memory (StateError: nothing changed)."""
        self.store.put(*targets, sync=sync)
        self._synced()
        moved = left = False
        for t in targets:
            old = self._targets.get(t.name)
            if old is not None and old.cgroup:
                self._by_cgroup.pop(old.cgroup, None)
            if t.cgroup:
                self._by_cgroup[t.cgroup] = t.name
            before = (None, None) if old is None else (old.cgroup, old.cgroup_id)
            moved |= before != (t.cgroup, t.cgroup_id)
            left |= before[0] is not None and before != (t.cgroup, t.cgroup_id)
            self._targets[t.name] = t
        if membership and moved:
            self.version += 1
            self.removed += left
        self._compact_if_due()

    def _compact_if_due(self) -> None:
        if self.store.due_for_compaction(len(self._targets)):
            self.store.compact(self._targets)
            self._synced()

    def _synced(self) -> None:
        """The adds made while deferring are durable if the journal has nothing unsynced
        (a synced change or a compaction made them so)."""
        if not self.store.unsynced:
            self._unsynced.clear()


def _check(o: Objective) -> None:
    try:
        check_target(o.target_s, o.metric, o.kind, o.scrape)
    except ValueError as e:
        raise TargetError(str(e)) from None


def _scrape_fields(o: Objective) -> dict[str, str | None]:
    """A target's fields of where its latencies are scraped from (None: its ring)."""
    s = o.scrape
    return {"metrics": None if s is None else s.endpoint,
            "histogram": None if s is None else s.histogram}


def _seconds(target_s: float | None) -> float | None:
    return None if target_s is None else float(target_s)


class Binder:
    """Finds the cgroups of pending targets off the loop. `ask(names)` hands a batch to a
    thread of its own (if none is in progress), which resolves them all against one walk
    of the cgroup tree; `answers()` returns what it found, without waiting; `cost` is the
    CPU time the last batch took. With `threaded=False` (tests), `ask` resolves at once."""

    def __init__(self, resolve_many: ResolveMany, threaded: bool = True) -> None:
        self._resolve_many = resolve_many
        self._answers: queue.SimpleQueue[dict[str, Resolved | CgroupError]] = \
            queue.SimpleQueue()
        self._busy = threading.Event()
        self._threaded = threaded
        self.cost = 0.0

    def ask(self, names: list[str]) -> None:
        if not names or self._busy.is_set():
            return
        if not self._threaded:
            self._run(names)
            return
        self._busy.set()
        threading.Thread(target=self._run, args=(names,), name="dqoes-binder",
                         daemon=True).start()

    def answers(self) -> dict[str, Resolved | CgroupError]:
        found: dict[str, Resolved | CgroupError] = {}
        while True:
            try:
                found.update(self._answers.get_nowait())
            except queue.Empty:
                return found

    def _run(self, names: list[str]) -> None:
        cpu = time.thread_time()
        try:
            self._answers.put(self._resolve_many(names))
        except Exception:  # a bug must not end the search for good
            log.exception("looking for pending containers failed")
        finally:
            self.cost = time.thread_time() - cpu
            self._busy.clear()


__all__ = ["Binder", "StateError", "TargetError", "Targets"]
