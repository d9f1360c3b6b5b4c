"""The status model: what the daemon shows of itself, built in one place
(`snapshot.build`), sent as JSON by the control protocol, and rendered by dqoesctl, the
Prometheus endpoint and the demo. Fields are only ever added; a reader ignores the fields
it does not know. It imports no numpy: dqoesctl reads it, and must start fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from .membership.objective import INFERENCE, Target

CLASSES = ("G", "S", "B", "idle", "pending", "NL", "WL", "CL")
"""The classes a container can show: an inference service's (G, S, B, idle: no requests in
the window), pending (no cgroup yet), and a training job's list (NL, WL, CL)."""


PRESSURE_RESOURCES = ("cpu", "memory", "io")
"""The pressure files, as in a `Pressure`: {resource: {"some_ratio": the share of the
window in which some task stalled on it, "avg10_pct": the kernel's 10 s average, percent}},
either None where unknown."""


def pressure_of(some_ratio: list[float | None],
                avg10_pct: list[float | None]) -> dict[str, dict[str, float | None]]:
    """A `Pressure` from a value per PRESSURE_RESOURCES of each."""
    return {r: {"some_ratio": s, "avg10_pct": a}
            for r, s, a in zip(PRESSURE_RESOURCES, some_ratio, avg10_pct, strict=True)}


@dataclass(frozen=True)
class ContainerStatus:
    name: str
    cls: str  # one of CLASSES (JSON: "class")
    target_s: float | None  # None: a training job
    metric: str | None
    measured_s: float | None  # the metric over the last decision window
    q_s: float | None  # target - measured (None: idle or pending)
    cpu_limit_cores: float | None  # cpu.max in CPUs (None: max, or pending)
    cpu_usage_cores: float  # over the last tick
    throttled_ratio: float  # throttled periods over the last tick
    samples: int  # requests in the last window
    cgroup: str | None
    ring: str
    source: str = "cli"  # who set the target: dqoesctl (cli) or the container's labels
    foreign_writes: int = 0  # values of someone else's (cpu.max, cpu.weight) in place of ours
    contested: bool = False  # left to another writer for a while (see actuator.py)
    reason: str | None = None  # why it is pending
    kind: str = INFERENCE  # inference (a latency target) or training (FlowCon)
    evaluation: float | None = None  # a training job's latest reported value
    growth_efficiency: float | None = None  # its G at the last decision: progress per
    #                                         second per fraction of the budget used
    # Recommend-only (the daemon writes no limit): the limit it would set, in CPUs, and the
    # class it expects the container in under it (G, S, B; None: no estimate)
    recommended_limit_cores: float | None = None
    expected_class: str | None = None
    # Over the last decision window (None before the first): requests a second, and the
    # CPUs used, whose ratio is the work per request (the cluster's pipelines split by it)
    rate_hz: float | None = None
    window_usage_cores: float | None = None
    mean_s: float | None = None  # the window's mean latency and p95, whatever its metric
    p95_s: float | None = None
    # What slowed it over the last decision window (see `Pressure`), the share of its CFS
    # periods throttled over that window, and where the host has hardware counters its
    # instructions per cycle and last-level-cache misses per second (None: unknown)
    pressure: dict[str, dict[str, float | None]] = field(default_factory=dict)
    throttled_window_ratio: float | None = None
    ipc: float | None = None
    llc_misses_per_s: float | None = None
    # Latencies from a Prometheus histogram instead of the ring: its endpoint (":PORT/PATH")
    # and name, why the last scrape failed (None: it did not), and the width of the bucket
    # the measured statistic fell in (its error bound; None: exact, or no reading)
    metrics: str | None = None
    histogram: str | None = None
    scrape_error: str | None = None
    measured_error_s: float | None = None


@dataclass(frozen=True)
class HostStatus:
    G: int
    S: int
    B: int
    idle: int
    pending: int
    policy: str
    interval_s: float  # the listener's current interval
    last_decision_age_s: float | None
    last_decision_unix: float | None
    budget_cpus: float  # T_R
    ticks: int
    decisions: int
    reconcile_corrections: int
    ring_faults: int
    ring_lost: int
    totals: dict[str, float] = field(default_factory=dict)  # the last round's sums
    foreign_writes: int = 0
    contested: int = 0
    systemd_sent: int = 0
    systemd_failed: int = 0
    NL: int = 0  # training jobs per list
    WL: int = 0
    CL: int = 0
    acting: bool = True  # False: recommend only, no limit is written
    # The node's stalls over the last decision window (see `Pressure`); what dqoesd found of
    # the hardware counters at start (its log line); the node's instructions per cycle and
    # LLC misses per second where they are counted for the node alone
    pressure: dict[str, dict[str, float | None]] = field(default_factory=dict)
    hardware_counters: str | None = None
    ipc: float | None = None
    llc_misses_per_s: float | None = None


@dataclass(frozen=True)
class Status:
    host: HostStatus
    containers: list[ContainerStatus]

    def to_json(self) -> dict[str, Any]:
        return {"host": _fields(self.host),
                "containers": [_container_json(c) for c in self.containers]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Status:
        return cls(known_fields(HostStatus, doc["host"]),
                   [known_fields(ContainerStatus, {**c, "cls": c["class"]})
                    for c in doc["containers"]])


@dataclass(frozen=True)
class Listing:
    """One target as `dqoesctl list` shows it."""

    name: str
    target_s: float | None  # None: a training job, or invalid (its labels are refused)
    metric: str | None
    state: str  # bound, pending, or invalid (a container whose labels are refused)
    cgroup: str | None
    ring: str
    ring_dir: str
    source: str = "cli"
    reason: str | None = None  # why it is pending or invalid
    kind: str | None = INFERENCE  # inference or training; None: invalid
    metrics: str | None = None  # ":PORT/PATH": latencies from a histogram there, not the ring
    histogram: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _fields(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Listing:
        return known_fields(cls, doc)


def refused(name: str, source: str, cgroup: str | None, ring: str, reason: str) -> Listing:
    """A container whose labels are refused: listed, not managed."""
    return Listing(name, None, None, "invalid", cgroup, ring, ring.rsplit("/", 1)[0], source,
                   reason, kind=None)


def listing(target: Target, ring: str, reason: str | None) -> Listing:
    return Listing(target.name, target.target_s, target.metric,
                   "bound" if target.cgroup else "pending", target.cgroup, ring,
                   ring.rsplit("/", 1)[0], target.source,
                   None if target.cgroup else reason, target.kind, target.metrics,
                   target.histogram)


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields by name: `asdict` without its deep copy, which took most of the
    time of a status of thousands of containers (the loop waits for it)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _container_json(c: ContainerStatus) -> dict[str, Any]:
    doc = _fields(c)
    return {"name": doc.pop("name"), "class": doc.pop("cls"), **doc}


T = TypeVar("T")


def known_fields(cls: type[T], doc: dict[str, Any]) -> T:
    """An instance from the fields of `doc` that `cls` knows (a newer daemon may send
    more)."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in doc.items() if k in names})
