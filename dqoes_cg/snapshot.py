"""The status snapshot of the loop's tables: a view taken while the loop waits, at a cost
that does not grow with the containers (`capture`), and the status made of it away from
the loop (`View.status`, or a page of it: `View.page`); what the listing is made of
(`Listings`); and what the loop counts for it (`Counters`). The daemon's side
of status.py, which dqoesctl reads without numpy.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .jsonline import Encoded, text_in_parts
from .membership.objective import TRAINING, Target
from .membership.rings import RingPaths
from .paging import Page, take
from .policy import Cls
from .ring import STATS
from .status import ContainerStatus, HostStatus, Listing, Status, listing, pressure_of

MEAN, P95 = STATS.index("mean"), STATS.index("p95")  # rows of the rings' window stats
T = TypeVar("T")

if TYPE_CHECKING:
    from .actuator import Actuator
    from .fleet import Fleet
    from .nodepressure import NodePressure
    from .perfcounters import HardwareCounters
    from .scrape import Scraper


@dataclass
class Counters:
    """What the loop counts, for status."""

    ticks: int = 0
    decisions: int = 0
    last_decision: float | None = None  # monotonic
    last_decision_wall: float | None = None
    interval: float = 0.0
    totals: dict[str, float] = field(default_factory=dict)
    class_counts: list[int] = field(default_factory=lambda: [0] * len(Cls))


@dataclass(frozen=True)
class Rows:
    """Copies of the loop's per-slot arrays that status shows, by `slot`."""

    slot: dict[str, int]
    cpus: float  # the fleet's: its usage is a share of them
    arrays: dict[str, np.ndarray]

    @classmethod
    def of(cls, fleet: Fleet, actuator: Actuator) -> Rows:
        """Copies of `fleet`'s and `actuator`'s arrays (memory copies: no Python work per
        container)."""
        t, r = fleet.table, fleet.rings
        arrays = {
            "classes": fleet.classes, "score": fleet.score, "measured": fleet.measured,
            "tick_cores": fleet.tick_cores, "throttled_ratio": fleet.throttled_ratio,
            "samples": fleet.samples, "quota": t.max_quota_usec, "period": t.max_period_usec,
            "foreign_writes": actuator.foreign_writes, "contested": actuator.contested,
            "limit": actuator.limit, "evaluation": fleet.evaluation, "rate": fleet.rate,
            "usage": fleet.usage, "mean": r.stats[MEAN], "p95": r.stats[P95],
            "stall_share": fleet.stall_share.T, "stall_avg10": fleet.stall_avg10.T,
            "throttled_window": fleet.throttled_window}
        return cls(dict(fleet.slot), fleet.cpus, {k: np.array(v) for k, v in arrays.items()})


@dataclass(frozen=True)
class View:
    """What a status shows, taken from the loop's tables while it waits (`capture`): the
    targets (never changed in place: a change replaces one), copies of the dictionaries
    and arrays, the host's figures. `status` makes the status of it, away from the loop:
    that is the work per container."""

    targets: list[Target]
    rings: RingPaths
    reasons: dict[str, str]
    rows: Rows
    host: dict[str, Any]  # HostStatus but the counts of each class
    acting: bool
    alpha: float
    ipc: dict[str, float] | None  # hardware counters by name, where counted
    llc_misses_per_s: dict[str, float] | None
    scrape_errors: dict[str, str] | None  # None: no scraper
    scrape_error_s: dict[str, float] | None

    # What is made of the view, once: the requests of a tick share the view (Controller.view)
    # and so what it makes. Made in the thread for replies, or the metrics thread.
    _made: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, compare=False,
                                   repr=False)

    def status(self) -> Status:
        """The status of every target of the view, in its order."""
        return self._once("status", self._status)

    def status_json(self) -> Encoded:
        """`status()` as JSON, encoded once for every client that asks for it (the status
        itself is not kept for them: the JSON is what they share)."""
        return self._once("status_json",
                          lambda: Encoded(text_in_parts(self._status().to_json())))

    def _status(self) -> Status:
        return Status(self._host(), self._containers(self.targets, self._slots()))

    def page(self, page: Page) -> dict[str, Any]:
        """A page of the status (paging.py), by name: the host's figures (of every target),
        the page's containers, and `next`, the cursor to the next page."""
        names, order = self._by_name()
        shown, after = take(names, order, page)
        slots = self._slots()
        containers = self._containers([self.targets[k] for k in shown], [slots[k] for k in shown])
        return {**Status(self._host(), containers).to_json(), "next": after}

    def _once(self, what: str, make: Callable[[], T]) -> T:
        with self._lock:
            if what not in self._made:
                self._made[what] = make()
            return self._made[what]  # type: ignore[no-any-return]

    def _slots(self) -> list[int]:
        """Each target's slot in the rows (-1: none, it is pending)."""
        return self._once("slots", lambda: [self.rows.slot.get(t.name, -1)
                                            for t in self.targets])

    def _by_name(self) -> tuple[list[str], list[int]]:
        """The targets' names sorted, and the targets' indexes in that order."""
        def make() -> tuple[list[str], list[int]]:
            order = sorted(range(len(self.targets)), key=lambda k: self.targets[k].name)
            return [self.targets[k].name for k in order], order
        return self._once("by_name", make)

    def _host(self) -> HostStatus:
        """The host's figures, with how many targets are in each class."""
        def make() -> HostStatus:
            slots = np.array(self._slots(), dtype=np.intp)
            bound = slots[slots >= 0]
            per = np.bincount(self.rows.arrays["classes"][bound].astype(np.intp),
                              minlength=len(Cls))
            counts = {_shown(Cls(c)): int(x) for c, x in enumerate(per)}
            return HostStatus(**counts, pending=len(slots) - len(bound), **self.host)
        return self._once("host", make)

    def _containers(self, targets: list[Target], slots: list[int]) -> list[ContainerStatus]:
        """The status of each of `targets`, at `slots` in the rows (-1: pending)."""
        rows, acting, alpha = self.rows, self.acting, self.alpha
        # Python numbers, read fast: the rows of these targets only (pending ones read row 0)
        taken = np.array([max(i, 0) for i in slots], dtype=np.intp)
        a = ({k: v[taken].tolist() for k, v in rows.arrays.items()}
             if len(rows.arrays["classes"]) and any(i >= 0 for i in slots) else {})
        errors, error_s = self.scrape_errors, self.scrape_error_s
        containers = []
        for i, target in enumerate(targets):
            name = target.name
            if slots[i] < 0:
                containers.append(ContainerStatus(
                    name, "pending", target.target_s, target.metric, None, None, None,
                    0.0, 0.0, 0, target.cgroup, str(self.rings.of(target)), target.source,
                    reason=self.reasons.get(name), kind=target.kind, metrics=target.metrics,
                    histogram=target.histogram))
                continue
            cls = Cls(a["classes"][i])
            training = target.kind == TRAINING
            score_i = None if cls == Cls.IDLE else _finite(a["score"][i])
            quota, period = a["quota"][i], a["period"][i]
            would = None if acting else _finite(a["limit"][i] * self.host["budget_cpus"])
            measured_i, usage = _finite(a["measured"][i]), float(a["tick_cores"][i])
            throttled = float(a["throttled_ratio"][i])
            containers.append(ContainerStatus(
                name, _shown(cls), target.target_s,
                target.metric, measured_i, None if training else score_i,
                None if quota < 0 or period <= 0 else quota / period, usage, throttled,
                int(a["samples"][i]), target.cgroup, str(self.rings.of(target)),
                target.source, int(a["foreign_writes"][i]), bool(a["contested"][i]),
                kind=target.kind,
                evaluation=_finite(a["evaluation"][i]) if training else None,
                growth_efficiency=score_i if training else None,
                recommended_limit_cores=would,
                expected_class=None if training else expected_class(
                    target.target_s, measured_i, usage, throttled > 0, would, alpha),
                rate_hz=_finite(a["rate"][i]),
                window_usage_cores=_finite(a["usage"][i] * rows.cpus),
                mean_s=None if training else _finite(a["mean"][i]),
                p95_s=None if training else _finite(a["p95"][i]),
                pressure=pressure_of([_finite(x) for x in a["stall_share"][i]],
                                     [_finite(x) for x in a["stall_avg10"][i]]),
                throttled_window_ratio=_finite(a["throttled_window"][i]),
                ipc=_counted(self.ipc, name),
                llc_misses_per_s=_counted(self.llc_misses_per_s, name),
                metrics=target.metrics, histogram=target.histogram,
                scrape_error=errors.get(name) if errors is not None else None,
                measured_error_s=_finite(error_s.get(name, math.nan))
                if error_s is not None and measured_i is not None else None))
        return containers


def _shown(cls: Cls) -> str:
    """A class as status shows it (CLASSES)."""
    return "idle" if cls == Cls.IDLE else cls.name


def capture(targets: list[Target], rings: RingPaths, reasons: dict[str, str], fleet: Fleet,
            actuator: Actuator, counters: Counters, policy: str, cpus: float,
            systemd: tuple[int, int], alpha: float, node: NodePressure | None = None,
            hardware: HardwareCounters | None = None, hardware_said: str | None = None,
            scraper: Scraper | None = None) -> View:
    """The view of `targets` (all, or the one asked for) in the loop's tables now: copies,
    taken with no Python work per container; when the actuator only recommends, its status
    shows the limit it would set and the class expected under it (`alpha`: the policy's
    tolerance band). What slowed each container, and the node (`node`, `hardware` and what
    was said of it at start), over the last window."""
    r = fleet.rings
    n = len(fleet)
    host = dict(
        policy=policy, interval_s=counters.interval,
        last_decision_age_s=(None if counters.last_decision is None
                             else time.monotonic() - counters.last_decision),
        last_decision_unix=counters.last_decision_wall, budget_cpus=cpus,
        ticks=counters.ticks, decisions=counters.decisions,
        reconcile_corrections=actuator.corrections,
        ring_faults=int(r.faults.sum()) if n else 0,
        ring_lost=int(r.lost_overrun.sum() + r.torn.sum() + r.invalid.sum()) if n else 0,
        totals=dict(counters.totals),
        foreign_writes=int(actuator.foreign_writes.sum()) if n else 0,
        contested=int(actuator.contested.sum()) if n else 0,
        systemd_sent=systemd[0], systemd_failed=systemd[1], acting=actuator.acting,
        pressure={} if node is None else pressure_of([_finite(x) for x in node.share],
                                                     [_finite(x) for x in node.avg10]),
        hardware_counters=hardware_said,
        ipc=_counted(hardware and hardware.ipc, hardware and hardware.NODE),
        llc_misses_per_s=_counted(hardware and hardware.llc_misses_per_s,
                                  hardware and hardware.NODE))
    return View(targets, rings, dict(reasons), Rows.of(fleet, actuator), host,
                actuator.acting, alpha, hardware.ipc if hardware else None,
                hardware.llc_misses_per_s if hardware else None,
                dict(scraper.errors) if scraper else None,
                dict(scraper.error_s) if scraper else None)


@dataclass(frozen=True)
class Listings:
    """What the listing is made of, taken from the loop's tables: every target, and the
    containers whose labels are refused (`invalid`). Called, the listing of them all, in
    that order; `page`, a page of it by name (paging.py)."""

    targets: list[Target]
    rings: RingPaths
    reasons: dict[str, str]
    invalid: list[Listing]

    def __call__(self) -> list[Listing]:
        return [self._listing(t) for t in self.targets] + self.invalid

    def page(self, page: Page) -> dict[str, Any]:
        names = [t.name for t in self.targets] + [s.name for s in self.invalid]
        order = sorted(range(len(names)), key=names.__getitem__)
        shown, after = take([names[k] for k in order], order, page)
        n = len(self.targets)
        return {"entries": [(self._listing(self.targets[k]) if k < n
                             else self.invalid[k - n]).to_json() for k in shown],
                "next": after}

    def _listing(self, t: Target) -> Listing:
        return listing(t, str(self.rings.of(t)), self.reasons.get(t.name))


def _counted(rates: dict[str, float] | None, name: str | None) -> float | None:
    """A counted rate by name, None where not counted (or unknown)."""
    return None if not rates or name is None or name not in rates else _finite(rates[name])


def expected_class(target_s: float | None, measured_s: float | None, usage: float,
                   throttled: bool, would: float | None, alpha: float) -> str | None:
    """The class (G, S, B) a service would be in under the limit `would` (CPUs), by a fluid
    estimate: its latency scales inversely with the CPU it gets, which is `usage` now and,
    under `would`, all of it if it was throttled (it wanted more), else at most its usage.
    None: nothing to go on (no limit, no measurement, no usage)."""
    if target_s is None or measured_s is None or not would or usage <= 0:
        return None
    gets = would if throttled else min(would, usage)
    q = target_s - measured_s * usage / gets
    return "G" if q > alpha * target_s else "S" if q >= -alpha * target_s else "B"


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
