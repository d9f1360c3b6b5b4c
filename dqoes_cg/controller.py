"""The controller: targets, the cgroups they are bound to, and the tick that runs them.

One tick (every sample interval) is, for all bound containers at once:

    sense   one C call reads every cpu.stat, one C call drains every latency ring; every
            reconcile interval (2 s), one C call reads back every cpu.max (a limit someone
            else changed is logged, counted and written again)
    decide  when the policy is due: the window's latency statistic p_i (the target's
            metric), CPU usage r_i and current limit L_i go to the policy, which returns
            the new limits (fractions of the CPU budget T_R)
    act     limits become cpu.max quotas, quota = max(1 ms, L_i · T_R CPUs · 100 ms) per
            100 ms period, written in one C call where they changed

The per-tick path is C calls and numpy on preallocated per-slot arrays (`Fleet`). Python
work per container happens only when membership changes: a target is set or removed, a
pending container appears, or a bound cgroup disappears (its target goes back to pending).

A limit is only ever written after the cgroup's own cpu.max has been saved in the state file,
so that removing the target, stopping the daemon, or a crash followed by a restart and a stop,
all give the container back what it had.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .cgroup import DOCKER_ROOT, CgroupError, find_cgroup2_mount, require_cpu_controller, resolve
from .cgtable import LEAVE_ALONE, PERIOD_UNKNOWN, Status
from .control import Peer, RequestError
from .fleet import Fleet, format_cpu_max
from .policy import (
    ALPHA,
    BETA,
    DEFAULT_POLICY,
    IV_INITIAL_S,
    IV_MAX_S,
    Cls,
    Policy,
    PolicyParams,
    make_policy,
)
from .ring import DEFAULT_CAPACITY, create_ring, ring_path
from .state import METRICS, StateStore, Target, check_target
from .systemd_units import UnitLimiter, UnitQuotas

log = logging.getLogger(__name__)

# The classes a container can show in status: the policy's, and "pending" (no cgroup yet).
STATUS_CLASSES = ("G", "S", "B", "idle", "pending")

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass
class Config:
    sample_interval: float = 1.0
    state_dir: Path = Path("/var/lib/dqoes")
    run_dir: Path = Path("/run/dqoes")
    cpus: float | None = None  # the budget T_R in CPUs; None: all online CPUs
    policy: str = DEFAULT_POLICY  # a name in dqoes_cg.policy.POLICIES
    alpha: float = ALPHA
    beta: float = BETA
    iv_initial: float = IV_INITIAL_S
    iv_max: float = IV_MAX_S
    ring_capacity: int = DEFAULT_CAPACITY
    docker_root: Path = DOCKER_ROOT
    rebind_interval: float = 2.0  # seconds between look-ups of pending containers
    # Seconds between read-backs of every cpu.max. Outside writers are rare (an operator, a
    # systemd daemon-reload): a read-back every tick would cost more than the rest of the
    # sense step at 1,000 containers.
    reconcile_interval: float = 2.0
    mount: Path | None = None  # the cgroup2 mount; None: found in /proc/self/mountinfo


def ring_dir_name(name: str) -> str:
    """A container's ring directory: its name where that is a plain file name, else a
    readable slug made unique by a hash (paths, unit names with odd characters)."""
    if _PLAIN_NAME.fullmatch(name) and name not in (".", ".."):
        return name
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")[:40] or "container"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


@dataclass
class Counters:
    ticks: int = 0
    decisions: int = 0
    reconcile_corrections: int = 0
    last_decision: float | None = None  # monotonic
    last_decision_wall: float | None = None
    interval: float = 0.0
    totals: dict[str, float] = field(default_factory=dict)
    class_counts: list[int] = field(default_factory=lambda: [0] * len(Cls))


class Controller:
    def __init__(self, cfg: Config, policy: Policy | None = None,
                 resolver: Callable[..., Any] = resolve,
                 limiter: UnitLimiter | None = None) -> None:
        self.cfg = cfg
        self.limiter = limiter  # tells systemd the limits of cgroups that are its units
        self.mount = cfg.mount or find_cgroup2_mount()
        self.cpus = cfg.cpus or float(os.cpu_count() or 1)
        self.policy = policy or make_policy(
            cfg.policy, PolicyParams(cfg.alpha, cfg.beta, cfg.iv_initial, cfg.iv_max))
        self._resolve = resolver
        self.store = StateStore(cfg.state_dir)
        self.targets = self.store.load()
        self.counters = Counters(interval=cfg.iv_initial)
        self._pending_errors: dict[str, str] = {}
        self._next_rebind = 0.0
        self._next_reconcile = 0.0
        self._readopt(time.monotonic())

    # --- membership ------------------------------------------------------------------

    def _ring(self, name: str) -> Path:
        return ring_path(self.cfg.run_dir, ring_dir_name(name))

    def _new_fleet(self, previous: Fleet | None, now: float) -> Fleet:
        """A fleet of the bound targets (the previous one's rings and limits carry over)."""
        bound = [t for t in self.targets.values() if t.cgroup]
        fleet = Fleet(bound, [self._ring(t.name) for t in bound], self.cpus,
                      self.cfg.ring_capacity, previous, now)
        self.unit_quotas = UnitQuotas(self.limiter, [t.cgroup for t in bound], self.mount)
        if previous is not None:
            previous.table.close()  # its rings were adopted by the new fleet
        self.policy.resize(len(fleet))
        return fleet

    def _rebuild(self, now: float) -> None:
        self.fleet = self._new_fleet(self.fleet, now)
        self.store.save(self.targets)

    def _readopt(self, now: float) -> None:
        """After a restart: targets whose cgroup is still there stay bound (with the
        original limit saved by the previous run); the others look for their container."""
        for t in self.targets.values():
            self._ensure_ring(t.name)
            if t.cgroup and not Path(t.cgroup, "cpu.max").exists():
                log.info("%s: cgroup %s is gone; pending", t.name, t.cgroup)
                t.cgroup, t.original_max = None, None
        self.fleet = self._new_fleet(None, now)
        self.store.save(self.targets)
        self._bind_pending(now)
        log.info("re-adopted %d target(s), %d bound", len(self.targets), len(self.fleet))

    def _ensure_ring(self, name: str) -> Path:
        path = self._ring(name)
        if not path.is_file() or path.is_symlink():
            create_ring(path, self.cfg.ring_capacity)
        return path

    def _lookup(self, name: str) -> Path:
        """The cgroup of a container, checked to be usable; CgroupError otherwise."""
        found = self._resolve(name, self.mount, docker_root=self.cfg.docker_root)
        require_cpu_controller(found.path, self.mount)
        for other in self.targets.values():
            if other.name != name and other.cgroup == str(found.path):
                raise CgroupError(f"{found.path} is already managed as {other.name!r}")
        return found.path

    def _bind_pending(self, now: float) -> None:
        bound = False
        for t in self.targets.values():
            if t.cgroup:
                continue
            try:
                t.cgroup = str(self._lookup(t.name))
            except CgroupError as e:
                if self._pending_errors.get(t.name) != str(e):
                    self._pending_errors[t.name] = str(e)
                    log.info("%s: pending (%s)", t.name, e)
                continue
            self._pending_errors.pop(t.name, None)
            log.info("%s: bound to %s", t.name, t.cgroup)
            bound = True
        if bound:
            self._rebuild(now)

    def _release_gone(self, now: float) -> None:
        gone = np.flatnonzero(self.fleet.table.status == Status.GONE)
        for i in gone:
            t = self.targets[self.fleet.names[i]]
            log.info("%s: cgroup %s went away; pending until it is back", t.name, t.cgroup)
            t.cgroup, t.original_max = None, None
        self._rebuild(now)

    def _restore(self, mask: np.ndarray) -> list[str]:
        """Give the masked slots back the cpu.max they had before we wrote it."""
        f = self.fleet
        t = f.table
        owned = mask & (f.original_period != PERIOD_UNKNOWN) & (t.last_period_usec
                                                                 != PERIOD_UNKNOWN)
        np.copyto(t.quota_usec, f.original_quota, where=owned)
        np.copyto(t.period_usec, f.original_period, where=owned)
        np.copyto(t.period_usec, LEAVE_ALONE, where=mask & ~owned)
        t.apply()
        self.unit_quotas.tell(t.quota_usec, t.period_usec)
        failed = owned & (t.apply_status != Status.OK)
        for i in np.flatnonzero(failed):
            log.warning("%s: could not restore cpu.max (%s)", f.names[i], t.error(int(i)))
        restored = []
        for i in np.flatnonzero(mask):
            target = self.targets[f.names[i]]
            restored.append(target.original_max if owned[i] else None)
            target.original_max = None
        return restored

    # --- the tick ----------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self.counters.ticks += 1
        f = self.fleet
        if len(f):
            f.sense(now)
            if f.any_gone():
                self._release_gone(now)
                f = self.fleet
        if len(f):
            if now >= self._next_reconcile:
                self._next_reconcile = now + self.cfg.reconcile_interval
                self._reconcile()
            if self.policy.due(now):
                self._decide(now)
        if now >= self._next_rebind:
            self._next_rebind = now + self.cfg.rebind_interval
            if len(self.fleet) < len(self.targets):
                self._bind_pending(now)

    def _reconcile(self) -> None:
        t = self.fleet.table
        drifted = t.read_back()
        if not drifted:
            return
        self.counters.reconcile_corrections += drifted
        for i in np.flatnonzero(t.drifted):
            log.warning("%s: cpu.max was changed to '%s' by someone else; writing '%s' again",
                        self.fleet.names[i],
                        format_cpu_max(int(t.max_quota_usec[i]), int(t.max_period_usec[i])),
                        format_cpu_max(int(t.last_quota_usec[i]), int(t.last_period_usec[i])))
        t.invalidate(t.drifted)
        t.apply()
        # systemd may have put its own value back (daemon-reload): tell it ours again.
        self.unit_quotas.tell(t.quota_usec, t.period_usec, again=t.drifted)

    def _decide(self, now: float) -> None:
        f = self.fleet
        f.observe_window(now)
        decision = self.policy.decide(f.obs, now)
        if decision is None:
            return
        np.copyto(f.limit, decision.limits)
        np.copyto(f.classes, decision.classes)
        np.copyto(f.score, decision.score)
        c = self.counters
        c.decisions += 1
        c.last_decision, c.last_decision_wall = now, time.time()
        c.interval = decision.interval
        c.totals = {k: float(v) for k, v in decision.totals.items()}
        c.class_counts = np.bincount(f.classes, minlength=len(Cls)).tolist()
        f._request()
        self._save_originals()
        f.table.apply()
        self.unit_quotas.tell(f.table.quota_usec, f.table.period_usec)

    def _save_originals(self) -> None:
        """Before the first write to a cgroup, keep the cpu.max it had (in the state file)."""
        f = self.fleet
        t = f.table
        first = f.first_writes()
        if not first.any():
            return
        for i in np.flatnonzero(first):
            original = format_cpu_max(int(t.max_quota_usec[i]), int(t.max_period_usec[i]))
            self.targets[f.names[i]].original_max = original
            f.original_quota[i], f.original_period[i] = t.max_quota_usec[i], t.max_period_usec[i]
        self.store.save(self.targets)

    def shutdown(self) -> None:
        """Give every container its original limit back; the targets stay for next time."""
        if len(self.fleet):
            self._restore(np.ones(len(self.fleet), bool))
        self.store.save(self.targets)
        self.fleet.close()

    # --- requests ----------------------------------------------------------------------

    def handle(self, op: str, req: dict[str, Any], peer: Peer) -> Any:
        if op == "list":
            return [self._describe(t) for t in self.targets.values()]
        if op == "status":
            return self.status(_optional_name(req.get("container")))
        name = _name(req.get("container"))
        if op == "unset-target":
            return self.unset_target(name, peer)
        pending = req.get("pending", False)
        if not isinstance(pending, bool):
            raise RequestError("pending must be true or false")
        return self.set_target(name, req.get("target_s"), req.get("metric", "p95"), pending,
                               peer)

    def set_target(self, name: str, target_s: Any, metric: Any, pending: bool,
                   peer: Peer) -> dict[str, Any]:
        try:
            check_target(target_s, metric)
        except ValueError as e:
            raise RequestError(str(e)) from None
        now = time.monotonic()
        existing = self.targets.get(name)
        if existing is None:
            try:
                cgroup: str | None = str(self._lookup(name))
            except CgroupError as e:
                if not pending:
                    raise RequestError(str(e)) from None
                cgroup = None
            try:
                self._ensure_ring(name)
            except OSError as e:
                raise RequestError(f"cannot create the ring for {name}: {e}") from None
            self.targets[name] = Target(name, float(target_s), metric, cgroup)
            self._rebuild(now)
        else:
            existing.target_s, existing.metric = float(target_s), metric
            if existing.cgroup:
                i = self.fleet.names.index(name)
                self.fleet.target_s[i] = existing.target_s
                self.fleet.metric[i] = METRICS.index(metric)
                n = len(self.fleet)
                self.fleet.metric_index[i] = self.fleet.metric[i] * n + i
            self.store.save(self.targets)
        self.policy.reset()
        log.info("%s: target %.6g s (%s), set by uid %d", name, target_s, metric, peer.uid)
        return self._describe(self.targets[name])

    def unset_target(self, name: str, peer: Peer) -> dict[str, Any]:
        if name not in self.targets:
            raise RequestError(f"no target for {name!r} (see dqoesctl list)")
        restored = None
        if name in self.fleet.names:
            mask = np.zeros(len(self.fleet), bool)
            mask[self.fleet.names.index(name)] = True
            restored = self._restore(mask)[0]
        del self.targets[name]
        self._rebuild(time.monotonic())
        self.policy.reset()
        ring_file = self._ring(name)
        try:
            ring_file.unlink()
            ring_file.parent.rmdir()
        except OSError:
            pass  # a container still has it open or left files there: harmless
        log.info("%s: target removed by uid %d%s", name, peer.uid,
                 f"; cpu.max restored to '{restored}'" if restored else "")
        return {"name": name, "restored": restored}

    # --- views -------------------------------------------------------------------------

    def _describe(self, t: Target) -> dict[str, Any]:
        ring = self._ring(t.name)
        return {"name": t.name, "target_s": t.target_s, "metric": t.metric,
                "state": "bound" if t.cgroup else "pending", "cgroup": t.cgroup,
                "ring": str(ring), "ring_dir": str(ring.parent)}

    def status(self, only: str | None = None) -> dict[str, Any]:
        if only is not None and only not in self.targets:
            raise RequestError(f"no target for {only!r} (see dqoesctl list)")
        f = self.fleet
        t = f.table
        slot = {name: i for i, name in enumerate(f.names)}
        containers = []
        for target in self.targets.values():
            if only is not None and target.name != only:
                continue
            row: dict[str, Any] = {
                "name": target.name, "class": "pending", "target_s": target.target_s,
                "metric": target.metric, "measured_s": None, "q_s": None,
                "cpu_limit_cores": None, "cpu_usage_cores": 0.0, "throttled_ratio": 0.0,
                "samples": 0, "cgroup": target.cgroup, "ring": str(self._ring(target.name))}
            i = slot.get(target.name)
            if i is not None:
                cls = Cls(int(f.classes[i]))
                row.update({
                    "class": cls.name if cls != Cls.IDLE else "idle",
                    "measured_s": _finite(f.measured[i]),
                    "q_s": _finite(f.score[i]) if cls != Cls.IDLE else None,
                    "cpu_limit_cores": (None if t.max_quota_usec[i] < 0 else
                                        float(t.max_quota_usec[i] / t.max_period_usec[i])),
                    "cpu_usage_cores": float(f.tick_cores[i]),
                    "throttled_ratio": float(f.throttled_ratio[i]),
                    "samples": int(f.samples[i]),
                })
            containers.append(row)
        c = self.counters
        counts = {k: sum(1 for r in containers if r["class"] == k)
                  for k in STATUS_CLASSES}
        rings = f.rings
        host = {
            **counts, "policy": self.policy.name, "interval_s": c.interval,
            "last_decision_age_s": (None if c.last_decision is None
                                    else time.monotonic() - c.last_decision),
            "last_decision_unix": c.last_decision_wall, "budget_cpus": self.cpus,
            "ticks": c.ticks, "decisions": c.decisions,
            "reconcile_corrections": c.reconcile_corrections,
            "ring_faults": int(rings.faults.sum()) if len(f) else 0,
            "ring_lost": int(rings.lost_overrun.sum() + rings.torn.sum()
                              + rings.invalid.sum()) if len(f) else 0,
            "totals": c.totals,
        }
        return {"host": host, "containers": containers}

    def summary(self) -> str:
        """One line for sd_notify's STATUS= on every tick: cheap, no per-container work
        (the counts come from the last decision)."""
        f, c = self.fleet, self.counters
        return (f"{len(f)} bound, {len(self.targets) - len(f)} pending; "
                f"G {c.class_counts[Cls.G]} S {c.class_counts[Cls.S]} "
                f"B {c.class_counts[Cls.B]}; interval {c.interval:.0f}s")


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RequestError("container must be a non-empty name")
    if len(value) > 256 or not value.isprintable():
        raise RequestError("container name must be printable and at most 256 characters")
    return value


def _optional_name(value: Any) -> str | None:
    return None if value is None else _name(value)
