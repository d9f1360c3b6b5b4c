"""The controller: the tick that runs the bound containers, and the membership changes
around it.

One tick (every sample interval), for all bound containers at once:

    sense   one C call reads every cpu.stat, one C call drains every latency ring
            (fleet.py); a cgroup found removed sends its target back to pending
    act     on its schedule, the actuator reads every cpu.max back and rewrites what
            someone else changed (actuator.py)
    decide  when the policy is due: the window's latency statistic, CPU usage and limit in
            force go to the policy (policy/), which returns the new limits
    act     the actuator writes the limits that changed, in one C call (actuator.py)

The per-tick path is C calls and numpy on preallocated per-slot arrays. Python work per
container happens only when membership changes (targets.py): the fleet and the actuator
are then rebuilt once, at the next tick, whatever the number of changes since the last.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from functools import partial
from pathlib import Path

import numpy as np

from .actuator import Actuator
from .cgroup import (
    CgroupError,
    InvalidName,
    check_name,
    find_cgroup2_mount,
    needs_walk,
    require_cpu_on_mount,
    resolve_many,
)
from .cgtable import CgroupTable
from .config import Config
from .fleet import Fleet
from .policy import Cls, Policy, make_policy
from .ring import RingSet, create_ring, ring_dir_name, ring_path
from .state import StateError, StateStore
from .status import Counters, Listing, Status, build, listing
from .systemd_units import UnitLimiter
from .targets import Binder, ResolveMany, TargetError, Targets

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, cfg: Config, *, policy: Policy | None = None,
                 resolve: ResolveMany | None = None, limiter: UnitLimiter | None = None,
                 threaded_binder: bool = True) -> None:
        self.cfg = cfg
        self.mount = cfg.mount or find_cgroup2_mount()
        require_cpu_on_mount(self.mount)
        self.cpus = cfg.cpus or float(os.cpu_count() or 1)
        self.policy = policy or make_policy(cfg.policy, cfg.params)
        self.limiter = limiter
        self._resolve = resolve or partial(resolve_many, mount=self.mount,
                                           docker_root=cfg.docker_root)
        self.binder = Binder(self._resolve, threaded=threaded_binder)
        self.targets = Targets(StateStore(cfg.state_dir), self.mount)
        self.counters = Counters(interval=cfg.params.iv_initial)
        self._next_rebind = 0.0
        self.targets.readopt()
        for t in self.targets:
            self._ensure_ring(t.name)
        self.fleet: Fleet | None = None
        self.actuator: Actuator | None = None
        self._built = -1
        self._rebuild(time.monotonic())
        log.info("re-adopted %d target(s), %d bound", len(self.targets), len(self.fleet))

    # --- the tick ----------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self.counters.ticks += 1
        self._rebuild_if_changed(now)
        f = self.fleet
        if len(f) and f.sense(now):
            self._release_gone()
            self._rebuild_if_changed(now)
            f = self.fleet
        if len(f):
            self.actuator.reconcile(now)
            if self.policy.due(now):
                self._decide(now)
        self._rebind(now)
        self._rebuild_if_changed(now)

    def _decide(self, now: float) -> None:
        decision = self.policy.decide(self.fleet.observe_window(now), now)
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
        if self.targets.version != self._built:
            self._rebuild(now)

    def _rebuild(self, now: float) -> None:
        """New per-slot tables for the bound targets, taking over the open files and the
        per-container state of the old ones."""
        bound = self.targets.bound()
        old_fleet, old_actuator = self.fleet, self.actuator
        table = CgroupTable([t.cgroup for t in bound],
                            adopt=old_fleet.table if old_fleet else None)
        rings = RingSet([self.ring(t.name) for t in bound], self.cfg.ring_capacity,
                        adopt=old_fleet.rings if old_fleet else None)
        self.actuator = Actuator(
            table, [t.name for t in bound], [t.original_max for t in bound], self.cpus,
            self.targets, period_usec=self.cfg.period_usec,
            reconcile_interval=self.cfg.reconcile_interval, limiter=self.limiter,
            mount=self.mount, previous=old_actuator)
        self.fleet = Fleet(bound, table, rings, self.cpus, self.actuator.limit, old_fleet, now)
        if old_fleet is not None:
            old_fleet.table.close()  # what the new table did not take over
        self.policy.resize(len(self.fleet))
        self._built = self.targets.version

    def _release_gone(self) -> None:
        gone = [self.fleet.names[i] for i in np.flatnonzero(self.fleet.gone)]
        try:
            self.targets.release(gone, "its cgroup went away")
        except StateError as e:  # tried again at the next tick
            log.error("cannot record that %d cgroup(s) went away: %s", len(gone), e)

    def _rebind(self, now: float) -> None:
        if now >= self._next_rebind:
            self._next_rebind = now + self.cfg.rebind_interval
            self.binder.ask(self.targets.pending())
        found = self.binder.answers()
        if found:
            try:
                self.targets.bind(found)
            except StateError as e:
                log.error("cannot record new bindings: %s", e)

    def ring(self, name: str) -> Path:
        return ring_path(self.cfg.run_dir, ring_dir_name(name))

    def _ensure_ring(self, name: str) -> Path:
        path = self.ring(name)
        if not path.is_file() or path.is_symlink():
            try:
                create_ring(path, self.cfg.ring_capacity)
            except OSError as e:
                raise TargetError(f"cannot create the ring for {name}: {e}") from None
        return path

    # --- requests ----------------------------------------------------------------------

    def set_target(self, name: str, target_s: float, metric: str, pending: bool,
                   source: str = "cli") -> Listing:
        """Give a container a target (or a new one). TargetError or StateError: nothing
        changed."""
        if name in self.targets:
            target = self.targets.change(name, target_s, metric, source)
            if name in self.fleet.slot:
                self.fleet.set_target(name, target.target_s, target.metric)
        else:
            # A pending container or unit name is looked for by the binder, with all the
            # others, at its next walk of the tree: a request costs the same whatever the
            # number of targets and cgroups.
            found = self._look_later(name) if pending and needs_walk(name) else \
                self._resolve([name])[name]
            target = self.targets.add(name, target_s, metric, found, pending, source,
                                      lambda: self._ensure_ring(name))
        self.policy.reset()
        return self.describe(name)

    @staticmethod
    def _look_later(name: str) -> CgroupError:
        try:
            check_name(name)
        except InvalidName as e:
            return e
        return CgroupError("looking for it")

    def unset_target(self, name: str) -> str | None:
        """Remove a target; returns the cpu.max given back (None: never written)."""
        self.targets.get(name)
        restored = None
        i = self.fleet.slot.get(name)
        if i is not None:
            mask = np.zeros(len(self.fleet), bool)
            mask[i] = True
            restored = self.actuator.restore(mask)[0]
        self.targets.unset(name)
        self.policy.reset()
        ring = self.ring(name)
        with contextlib.suppress(OSError):  # a container still has it open: harmless
            ring.unlink()
            ring.parent.rmdir()
        return restored

    def describe(self, name: str) -> Listing:
        t = self.targets.get(name)
        return listing(t, str(self.ring(name)), self.targets.reasons.get(name))

    def listings(self) -> list[Listing]:
        return [self.describe(t.name) for t in self.targets]

    def status(self, only: str | None = None) -> Status:
        targets = [self.targets.get(only)] if only is not None else list(self.targets)
        systemd = (self.limiter.sent, self.limiter.failed) if self.limiter else (0, 0)
        return build(targets, {t.name: str(self.ring(t.name)) for t in targets},
                     self.targets.reasons, self.fleet, self.actuator, self.counters,
                     self.policy.name, self.cpus, systemd)

    def summary(self) -> str:
        """One line for sd_notify's STATUS= on every tick: cheap, no per-container work
        (the counts come from the last decision)."""
        c, n = self.counters, len(self.fleet)
        return (f"{n} bound, {len(self.targets) - n} pending; "
                f"G {c.class_counts[Cls.G]} S {c.class_counts[Cls.S]} "
                f"B {c.class_counts[Cls.B]}; interval {c.interval:.0f}s")

    def shutdown(self) -> None:
        """Give every container its original limit back; the targets stay for next time."""
        if len(self.fleet):
            self.actuator.restore(np.ones(len(self.fleet), bool))
        self.fleet.close()
        self.targets.store.close()
