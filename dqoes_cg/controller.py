"""The controller: the tick that runs the bound containers, and the request front that
changes membership (dqoes_cg/membership/).

One tick (every sample interval), for all bound containers at once:

    sense   one C call reads every cpu.stat, one C call drains every latency ring
            (fleet.py); a cgroup found removed sends its target back to pending; a scrape's
            timeout and a tick before the window closes, the scraper is asked for the
            latencies of the targets that export a histogram (scrape.py, off the loop)
    act     on its schedule, the actuator reads every cpu.max back and rewrites what
            someone else changed (actuator.py)
    decide  when the policy is due: the window's latency statistic, CPU usage and limit in
            force go to the policy (policy/), which returns the new limits; what slowed
            the containers and the node over the window (pressure, throttling, hardware
            counters where the host has them) is taken then, for status
    act     the actuator writes the limits that changed, in one C call (actuator.py)

The per-tick path is C calls and numpy on preallocated per-slot arrays. Python work per
container happens only when membership changes (the bound set's version moves,
membership/targets.py): the fleet and the actuator are then rebuilt once, whatever the
number of changes since the last. A target removed (or
a cgroup gone) is out of the tables at the next tick: nothing may be written to a cgroup
given back. New targets join at the next tick too, unless rebuilding would then take more
than REBUILD_SHARE of the loop's CPU time: a rebuild costs O(N), and paced so, adding a
target costs the same at any N (new targets wait a few ticks instead); and a rebuild takes
as many new targets as JOIN_SHARE of a tick holds at the last one's time per target (each
opens its cgroup's files and its ring), so a burst joins over several. Likewise the look
for pending containers, a walk of the whole cgroup tree off the loop, takes at most
WALK_SHARE of a CPU, and a request never walks the tree for a pending name; and applying
what the engine's containers did takes at most ENGINE_BUDGET_S of a tick (a burst of them
joins over several ticks; membership/engine_targets.py).
"""

from __future__ import annotations

import logging
import math
import os
import time
from functools import partial
from pathlib import Path

import numpy as np

from .actuator import Actuator
from .cgroup import (
    CgroupError,
    InvalidName,
    Resolved,
    Runtime,
    check_name,
    find_cgroup2_mount,
    needs_walk,
    require_cpu_on_mount,
    resolve_many,
)
from .cgtable import FDS_PER_CGROUP, CgroupTable, open_file_limit
from .config import Config
from .engines.watcher import Watcher
from .fleet import Fleet
from .membership.engine_targets import EngineTargets
from .membership.objective import ENGINE_SOURCES, Objective, Target
from .membership.rings import Rings
from .membership.targets import Binder, ResolveMany, TargetError, Targets
from .nodepressure import NodePressure
from .perfcounters import HardwareCounters
from .policy import Cls, Policy, make_policy
from .ring import RingSet
from .scrape import Job, Scraper, timeout_for
from .snapshot import Counters, Listings, View, capture
from .state import Originals, StateError, StateStore
from .status import Listing, Status, listing, refused
from .systemd_units import UnitLimiter

log = logging.getLogger(__name__)

FDS_PER_TARGET = FDS_PER_CGROUP + 1  # cpu.stat, cpu.max, cpu.weight, three pressures, the ring
FD_RESERVE = 512
"""Descriptors kept for all but the targets: the control socket's clients (at most 288),
the state log, inotify, D-Bus, the metrics server, the walk for pending containers."""
REBUILD_SHARE = 0.2
"""At most this share of the loop's CPU time goes to rebuilds that only add targets."""
JOIN_SHARE = 0.2
"""A rebuild that adds targets takes about this share of a tick at most: as many new ones
join as that holds at the last rebuild's time per target, the rest at the next ones (each
opens its cgroup's files and its ring: 2,784 at once held a tick 0.5-3.3 s)."""
JOIN_MIN = 100
"""At least this many new targets join at each rebuild, whatever its cost."""
WALL_PER_TARGET_S = 1e-3
"""A rebuild's time per target until one of JOIN_MIN targets at least has measured it
(about 0.1-1 ms on a 2-core host, idle to loaded; an emulated CPU's is more)."""
WALK_SHARE = 0.1
"""At most this share of a CPU goes to looking for pending containers: each look is a walk
of the whole cgroup tree (in the Binder's thread, but it holds the interpreter's lock)."""


class Controller:
    def __init__(self, cfg: Config, *, policy: Policy | None = None,
                 resolve: ResolveMany | None = None, limiter: UnitLimiter | None = None,
                 watcher: Watcher | None = None, runtimes: tuple[Runtime, ...] = (),
                 threaded_binder: bool = True) -> None:
        self.cfg = cfg
        self.mount = cfg.mount or find_cgroup2_mount()
        require_cpu_on_mount(self.mount)
        self.cpus = cfg.cpus or float(os.cpu_count() or 1)
        self.policy = policy or make_policy(cfg.policy, cfg.params)
        self.limiter = limiter
        self.acting = not cfg.recommend  # else recommend only: no cpu.max is written
        self._resolve = resolve or partial(resolve_many, mount=self.mount, runtimes=runtimes)
        self.binder = Binder(self._resolve, threaded=threaded_binder)
        self.targets = Targets(StateStore(cfg.state_dir), self.mount)
        self.rings = Rings(cfg.run_dir, cfg.ring_capacity, self.targets)
        self.counters = Counters(interval=cfg.params.iv_initial)
        self.node_pressure = NodePressure()
        self.node_pressure.sample(time.monotonic())
        self.hardware, self.hardware_said = HardwareCounters.start()
        self._next_rebind = 0.0
        self.fd_limit = open_file_limit()
        self.max_targets = max(0, (self.fd_limit - FD_RESERVE) // FDS_PER_TARGET)
        if len(self.targets) > self.max_targets:
            log.error("%d targets, but the open-file limit (%d) holds %d: raise it",
                      len(self.targets), self.fd_limit, self.max_targets)
        self.targets.readopt()
        for t in self.targets:
            if t.ring is None:
                self.rings.ensure(t.name)
        self.engine_targets = EngineTargets(watcher, self.targets, self.rings)
        self.scraper = Scraper(self.mount, timeout=timeout_for(cfg.params.iv_initial))
        self.fleet: Fleet | None = None
        self.actuator: Actuator | None = None
        self._built = self._built_removed = -1
        self._rebuild_tick = 0  # the first tick at which new targets may join
        self._wall_per_target = WALL_PER_TARGET_S  # the last rebuild's, a busy host's more
        # The view of every target, taken once a tick and after each change a request made
        # (by its key, the tick's count and the changes'): the requests of a tick share it
        # and what is made of it (a status of 10,000 is 7 MB of JSON), held until the tick.
        self._changes = 0
        self._shared: tuple[tuple[int, int], View] | None = None
        self._rebuild(time.monotonic())
        log.info("re-adopted %d target(s), %d bound", len(self.targets), len(self.fleet))

    # --- the tick ----------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self.counters.ticks += 1
        self._shared = None  # a view is shared by one tick's requests, and held no longer
        self.engine_targets.follow(self)  # first: a container just started is sensed at once
        self._rebuild_if_changed(now)
        f = self.fleet
        if len(f) and f.sense(now):
            self._release_gone()
            self._rebuild_if_changed(now)
            f = self.fleet
        if len(f):
            self.actuator.reconcile(now)
            if len(self.scraper) and self.policy.due(
                    now + self.cfg.sample_interval + self.scraper.timeout):
                self.scraper.kick()  # so that its readings are in before the window closes
            if self.policy.due(now):
                self._decide(now)
        self._rebind(now)
        self._rebuild_if_changed(now)

    def _decide(self, now: float) -> None:
        decision = self.policy.decide(self.fleet.observe_window(now), now)
        self.node_pressure.sample(now)
        if self.hardware is not None:
            self.hardware.sample(now)
        if decision is None:
            return
        self.fleet.record(decision)
        c = self.counters
        c.decisions += 1
        c.last_decision, c.last_decision_wall = now, time.time()
        c.interval = decision.interval
        c.totals = {k: float(v) for k, v in decision.totals.items()}
        c.class_counts = np.bincount(decision.classes, minlength=len(Cls)).tolist()
        self.actuator.apply(decision.limits, now)

    # --- membership --------------------------------------------------------------------

    def _rebuild_if_changed(self, now: float) -> None:
        t = self.targets
        if t.version == self._built:
            return
        if t.removed == self._built_removed and self.counters.ticks < self._rebuild_tick:
            return  # only additions, and too soon after the last rebuild
        self._rebuild(now)

    def _rebuild(self, now: float) -> None:
        """New per-slot tables for the bound targets, taking over the open files and the
        per-container state of the old ones."""
        cpu = time.thread_time()  # not wall time: the same on a busy host
        wall = time.monotonic()  # what the tick waits for, and requests with it
        old_fleet, old_actuator = self.fleet, self.actuator
        every = self.targets.bound()
        bound = every if old_fleet is None else self._joining_now(every, old_fleet.slot)
        table = CgroupTable([t.cgroup for t in bound],
                            adopt=old_fleet.table if old_fleet else None)
        rings = RingSet([self.rings.path(t.name) for t in bound], self.cfg.ring_capacity,
                        adopt=old_fleet.rings if old_fleet else None)
        self.actuator = Actuator(
            table, [t.name for t in bound],
            [Originals(t.original_max, t.original_weight) for t in bound], self.cpus,
            self.targets, weights=self.cfg.weights, period_usec=self.cfg.period_usec,
            reconcile_interval=self.cfg.reconcile_interval, limiter=self.limiter,
            mount=self.mount, previous=old_actuator, acting=self.acting)
        if not self.acting:  # a limit of ours still in force from an earlier run: given back
            self.actuator.stop_acting()
        self.fleet = Fleet(bound, table, rings, self.cpus, self.actuator.limit, old_fleet, now,
                           self.scraper)
        self._assign_scrapes()
        if self.hardware is not None:
            self.hardware.follow({t.name: Path(t.cgroup) for t in bound if t.cgroup})
        if old_fleet is not None:
            old_fleet.table.close()  # what the new table did not take over
        self.policy.resize(len(self.fleet), self.fleet.carried)
        self._built_removed = self.targets.removed
        # at start, every re-adopted target at once; else those that wait, at the next one
        self._built = self.targets.version if len(bound) == len(every) else -1
        cost = time.thread_time() - cpu
        if len(bound) >= JOIN_MIN:  # below, the fixed part would swamp the cost per target
            self._wall_per_target = (time.monotonic() - wall) / len(bound)
        self._rebuild_tick = self.counters.ticks + math.ceil(
            cost * (1 / REBUILD_SHARE - 1) / self.cfg.sample_interval)

    def _joining_now(self, bound: list[Target], slot: dict[str, int]) -> list[Target]:
        """The bound targets for this rebuild, in their order: those in the tables, and as
        many new ones as JOIN_SHARE of a tick holds (JOIN_MIN at least)."""
        joining = [t.name for t in bound if t.name not in slot]
        fit = int(JOIN_SHARE * self.cfg.sample_interval / self._wall_per_target)
        room = max(JOIN_MIN, fit - (len(bound) - len(joining)))
        if len(joining) <= room:
            return bound
        waiting = set(joining[room:])
        return [t for t in bound if t.name not in waiting]

    def _assign_scrapes(self) -> None:
        """The bound targets whose latencies are scraped, with their slots."""
        self.scraper.assign([
            (i, Job(t.name, t.cgroup, t.scrape, t.metric or ""))
            for i, t in enumerate(self.targets.get(n) for n in self.fleet.names)
            if t.scrape is not None and t.cgroup is not None])

    def _release_gone(self) -> None:
        gone = [self.fleet.names[i] for i in np.flatnonzero(self.fleet.gone)]
        try:
            self.targets.release(gone, "its cgroup went away")
        except StateError as e:  # tried again at the next tick
            log.error("cannot record that %d cgroup(s) went away: %s", len(gone), e)

    def _rebind(self, now: float) -> None:
        if now >= self._next_rebind:
            self._next_rebind = now + self.cfg.rebind_interval
            # the engine's targets are bound by what the watcher sees, not by name
            self.binder.ask([n for n in self.targets.pending()
                             if self.targets.get(n).source not in ENGINE_SOURCES])
        found = self.binder.answers()
        if found:  # a look is over: the next waits for its cost to be WALK_SHARE of the time
            self._next_rebind = max(self._next_rebind,
                                    now + self.binder.cost * (1 / WALK_SHARE - 1))
            try:
                self.targets.bind(found)
            except StateError as e:
                log.error("cannot record new bindings: %s", e)

    def push_service_labels(self, service_id: str, labels: dict[str, str] | None) -> None:
        """A Swarm service's labels, from whoever knows them (see engines/watcher.py)."""
        self.engine_targets.push_service_labels(service_id, labels)

    # --- requests ----------------------------------------------------------------------

    def set_target(self, name: str, objective: Objective, pending: bool,
                   source: str = "cli") -> Listing:
        """Give a container an objective (or a new one): a latency target, or none for a
        training job. TargetError or StateError: nothing changed. The policy runs
        again at once for a new objective; a new target makes it run when it joins the
        tables (a rebuild resets the policy), not at every request of a stream of them."""
        self._changes += 1
        if name in self.targets:
            self.retarget(name, objective, source)
        else:
            if self.room() <= 0:
                raise TargetError(self.room_refusal())
            self.targets.add(name, objective, self._find(name, pending), pending, source,
                             lambda: self.rings.ensure(name))
        return self.describe(name)

    def retarget(self, name: str, objective: Objective, source: str) -> Target:
        """Give an existing target a new objective (TargetError or StateError: nothing
        changed); a bound one's is in force at the next decision, which comes at once."""
        before = self.targets.get(name).scrape
        target = self.targets.change(name, objective, source)
        if name in self.fleet.slot:
            self.fleet.set_target(name, target.objective)
            if target.scrape != before:
                self._assign_scrapes()
            self.policy.reset()
        return target

    def room(self) -> int:
        """How many more targets the open-file limit holds."""
        return self.max_targets - len(self.targets)

    def room_refusal(self) -> str:
        """Why no target can be added: the open-file limit holds no more."""
        return (f"no room for more than {self.max_targets:,} targets: each holds "
                f"{FDS_PER_TARGET} open files, and the open-file limit is "
                f"{self.fd_limit:,} (raise LimitNOFILE= of dqoesd.service)")

    def _find(self, name: str, pending: bool) -> Resolved | CgroupError:
        """What `name` names now. A pending name that only a walk of the cgroup tree can
        find is left to the Binder, with all the others, at its next walk: a walk costs as
        much as the tree is big, and the loop would answer nobody meanwhile."""
        if pending and needs_walk(name):
            try:
                check_name(name)
            except InvalidName as e:
                return e
            return CgroupError("not looked for yet")
        return self._resolve([name])[name]

    def unset_target(self, name: str) -> str | None:
        """Remove a target set by dqoesctl; returns the cpu.max given back (None: never
        written). A container's labels take over again if it has some."""
        self._changes += 1
        target = self.targets.get(name)
        if target.source in ENGINE_SOURCES:
            where = "its service's labels" if target.source == "service" else "its labels"
            raise TargetError(f"the target of {name} comes from {where}: remove the label "
                              "dqoes.target to unset it")
        restored = self.give_back(name)
        self.engine_targets.refollow(self, name)
        return restored

    def give_back(self, name: str) -> str | None:
        """Remove a target, giving its container's limit back (returned; None: never
        written), and its own ring."""
        restored = None
        i = self.fleet.slot.get(name)
        if i is not None and self.fleet.table.dirs[i].is_dir():  # not a gone container
            mask = np.zeros(len(self.fleet), bool)
            mask[i] = True
            restored = self.actuator.restore(mask)[0]
        self.rings.remove(self.targets.unset(name))
        self.policy.reset()
        return restored

    def set_acting(self, acting: bool) -> bool:
        """Act (write the limits decided) or recommend only (write none, and give back the
        limits written so far), from the next decision on, which comes at the next tick.
        Returns whether the mode changed."""
        self._changes += 1
        if acting == self.acting:
            return False
        self.acting = acting
        if acting:
            self.actuator.start_acting()
        else:
            self.actuator.stop_acting()
        self.policy.reset()
        log.info("%s", "acting: the limits decided are written from now on" if acting else
                 "recommending only: no limit is written, those written were given back")
        return True

    def describe(self, name: str) -> Listing:
        t = self.targets.get(name)
        return listing(t, str(self.rings.path(name)), self.targets.reasons.get(name))

    def listings(self) -> list[Listing]:
        return self.listings_later()()

    def listings_later(self) -> Listings:
        """What makes the listing of every target, from what is taken of them now (no
        work per target: the loop waits only for this), and of the containers whose labels
        are refused."""
        invalid = [refused(s.name, s.source,
                           s.cgroup.path.as_posix() if not isinstance(s.cgroup, CgroupError)
                           else None, str(s.ring or self.rings.path(s.name)), s.error)
                   for s in self.engine_targets.refused()]
        return Listings(list(self.targets), self.rings.frozen(), dict(self.targets.reasons),
                        invalid)

    def view(self, only: str | None = None) -> View:
        """What the status of every target (or of `only`) shows (`take_view`). That of every
        target is taken once a tick (and again after a request changed something), and
        shared by every request of the tick, with what is made of it (View)."""
        if only is not None:
            return self.take_view(only)
        key = (self.counters.ticks, self._changes)
        if self._shared is None or self._shared[0] != key:
            self._shared = (key, self.take_view())
        return self._shared[1]

    def take_view(self, only: str | None = None) -> View:
        """The view of every target (or of `only`) now, taken at a cost that does not grow
        with the targets: the loop waits only for this."""
        targets = [self.targets.get(only)] if only is not None else list(self.targets)
        systemd = (self.limiter.sent, self.limiter.failed) if self.limiter else (0, 0)
        return capture(targets, self.rings.frozen(), self.targets.reasons, self.fleet,
                       self.actuator, self.counters, self.policy.name, self.cpus, systemd,
                       self.cfg.params.alpha, self.node_pressure, self.hardware,
                       self.hardware_said, self.scraper)

    def status(self, only: str | None = None) -> Status:
        """The status now, made at once of a view of its own (in the caller's thread)."""
        return self.take_view(only).status()

    def summary(self) -> str:
        """One line for sd_notify's STATUS= on every tick: cheap, no per-container work
        (the counts come from the last decision)."""
        c, n = self.counters, len(self.fleet)
        return (f"{n} bound, {len(self.targets) - n} pending; "
                f"G {c.class_counts[Cls.G]} S {c.class_counts[Cls.S]} "
                f"B {c.class_counts[Cls.B]}; NL {c.class_counts[Cls.NL]} "
                f"WL {c.class_counts[Cls.WL]} CL {c.class_counts[Cls.CL]}; "
                f"interval {c.interval:.0f}s")

    def shutdown(self) -> None:
        """Give every container its original limit back; the targets stay for next time."""
        if len(self.fleet):
            self.actuator.restore(np.ones(len(self.fleet), bool))
        self.scraper.close()
        self.fleet.close()
        if self.hardware is not None:
            self.hardware.close()
        self.targets.store.close()
