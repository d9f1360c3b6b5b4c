"""The status snapshot of the loop's tables (`build`) and what the loop counts for it
(`Counters`): the daemon's side of status.py, which dqoesctl reads without numpy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .membership.objective import TRAINING, Target
from .policy import Cls
from .ring import STATS
from .status import CLASSES, ContainerStatus, HostStatus, Status, pressure_of

MEAN, P95 = STATS.index("mean"), STATS.index("p95")  # rows of the rings' window stats

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


def build(targets: list[Target], rings: dict[str, str], reasons: dict[str, str],
          fleet: Fleet, actuator: Actuator, counters: Counters, policy: str, cpus: float,
          systemd: tuple[int, int], alpha: float, node: NodePressure | None = None,
          hardware: HardwareCounters | None = None, hardware_said: str | None = None,
          scraper: Scraper | None = None) -> Status:
    """The status of `targets` (all, or the one asked for) from the loop's tables; when
    the actuator only recommends, with the limit it would set and the class expected under
    it (`alpha`: the policy's tolerance band). What slowed each container, and the node
    (`node`, `hardware` and what was said of it at start), over the last window."""
    t = fleet.table
    foreign_writes, contested = actuator.foreign_writes, actuator.contested  # both files'
    containers = []
    for target in targets:
        i = fleet.slot.get(target.name)
        if i is None:
            containers.append(ContainerStatus(
                target.name, "pending", target.target_s, target.metric, None, None, None,
                0.0, 0.0, 0, target.cgroup, rings[target.name], target.source,
                reason=reasons.get(target.name), kind=target.kind, metrics=target.metrics,
                histogram=target.histogram))
            continue
        cls = Cls(int(fleet.classes[i]))
        training = target.kind == TRAINING
        score = None if cls == Cls.IDLE else _finite(fleet.score[i])
        quota, period = int(t.max_quota_usec[i]), int(t.max_period_usec[i])
        would = None if actuator.acting else _finite(actuator.limit[i] * cpus)
        measured, usage = _finite(fleet.measured[i]), float(fleet.tick_cores[i])
        throttled = float(fleet.throttled_ratio[i])
        containers.append(ContainerStatus(
            target.name, "idle" if cls == Cls.IDLE else cls.name, target.target_s,
            target.metric, measured, None if training else score,
            None if quota < 0 or period <= 0 else quota / period, usage, throttled,
            int(fleet.samples[i]), target.cgroup, rings[target.name], target.source,
            int(foreign_writes[i]), bool(contested[i]), kind=target.kind,
            evaluation=_finite(fleet.evaluation[i]) if training else None,
            growth_efficiency=score if training else None, recommended_limit_cores=would,
            expected_class=None if training else expected_class(
                target.target_s, measured, usage, throttled > 0, would, alpha),
            rate_hz=_finite(fleet.rate[i]),
            window_usage_cores=_finite(fleet.usage[i] * fleet.cpus),
            mean_s=None if training else _finite(fleet.rings.stats[MEAN, i]),
            p95_s=None if training else _finite(fleet.rings.stats[P95, i]),
            pressure=pressure_of([_finite(x) for x in fleet.stall_share[:, i]],
                                 [_finite(x) for x in fleet.stall_avg10[:, i]]),
            throttled_window_ratio=_finite(fleet.throttled_window[i]),
            ipc=_counted(hardware and hardware.ipc, target.name),
            llc_misses_per_s=_counted(hardware and hardware.llc_misses_per_s, target.name),
            metrics=target.metrics, histogram=target.histogram,
            scrape_error=scraper.errors.get(target.name) if scraper else None,
            measured_error_s=_finite(scraper.error_s.get(target.name, math.nan))
            if scraper and measured is not None else None))
    counts = {k: sum(1 for c in containers if c.cls == k) for k in CLASSES}
    r = fleet.rings
    n = len(fleet)
    host = HostStatus(
        **counts, policy=policy, interval_s=counters.interval,
        last_decision_age_s=(None if counters.last_decision is None
                             else time.monotonic() - counters.last_decision),
        last_decision_unix=counters.last_decision_wall, budget_cpus=cpus,
        ticks=counters.ticks, decisions=counters.decisions,
        reconcile_corrections=actuator.corrections,
        ring_faults=int(r.faults.sum()) if n else 0,
        ring_lost=int(r.lost_overrun.sum() + r.torn.sum() + r.invalid.sum()) if n else 0,
        totals=dict(counters.totals),
        foreign_writes=int(foreign_writes.sum()) if n else 0,
        contested=int(contested.sum()) if n else 0,
        systemd_sent=systemd[0], systemd_failed=systemd[1], acting=actuator.acting,
        pressure={} if node is None else pressure_of([_finite(x) for x in node.share],
                                                     [_finite(x) for x in node.avg10]),
        hardware_counters=hardware_said,
        ipc=_counted(hardware and hardware.ipc, hardware and hardware.NODE),
        llc_misses_per_s=_counted(hardware and hardware.llc_misses_per_s,
                                  hardware and hardware.NODE))
    return Status(host, containers)


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
