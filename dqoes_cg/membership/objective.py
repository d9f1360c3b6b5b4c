"""What a managed container is pursued for: its objective, and the target that holds it.

An `Objective` is a latency target and the window statistic compared with it (an inference
service), or none of them (a training job, managed by the progress it reports). It comes
from a `dqoesctl set-target` request or from a container's labels (labels.py), and is
checked here (`check_target`) whatever its source, and passed whole to the targets
(membership/targets.py) and to the fleet's row (fleet.py); a `Target` is a container's
objective with where it came from, the cgroup it is bound to and what the daemon must give
back (the journal, state.py, stores it flat).

An inference service's latencies come from its ring, or from a Prometheus histogram that
it exports (`Scrape`: the port and path of its metrics endpoint inside its network
namespace, and the histogram's name), which dqoesd scrapes at each window (scrape.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..duration import format_duration

METRICS = ("mean", "p50", "p90", "p95", "p99")
"""The statistics a target may name; each is a row of the rings' STATS of the same name."""
DEFAULT_METRIC = "p95"
"""The metric of a target that names none."""
INFERENCE, TRAINING = KINDS = ("inference", "training")
TRAINING_POLICY = "flowcon"
"""The policy of training jobs (policy/flowcon.py): the value of the label dqoes.policy that
marks one."""
SOURCES = ("cli", "label", "service")
ENGINE_SOURCES = ("label", "service")  # targets that follow the container engine
MAX_TARGET_S = 3600.0
MAX_PATH = 256  # characters of a metrics endpoint's path
_HISTOGRAM_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,199}")
_ENDPOINT = re.compile(r":([0-9]{1,5})(/[!-~]*)")  # :PORT/PATH, printable ASCII, no space


@dataclass(frozen=True)
class Scrape:
    """Where a service's latency histogram is: http://127.0.0.1:PORT/PATH inside its
    network namespace, and the histogram's name there."""

    endpoint: str  # ":PORT/PATH"
    histogram: str

    @property
    def port(self) -> int:
        return int(self.endpoint[1:].split("/", 1)[0])

    @property
    def path(self) -> str:
        return "/" + self.endpoint.split("/", 1)[1]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.histogram}"


def scrape_from(endpoint: Any, histogram: Any) -> Scrape | None:
    """The `Scrape` that an endpoint (":PORT/PATH") and a histogram's name describe; None
    when neither is given. ValueError, with a one-line reason, when they are malformed."""
    if endpoint is None and histogram is None:
        return None
    if endpoint is None or histogram is None:
        raise ValueError("a metrics endpoint and a histogram's name go together")
    if not isinstance(endpoint, str) or not isinstance(histogram, str):
        raise ValueError("the metrics endpoint and the histogram's name must be strings")
    match = _ENDPOINT.fullmatch(endpoint)
    if match is None or len(endpoint) > MAX_PATH:
        raise ValueError(f"metrics endpoint {endpoint[:64]!r} is not :PORT/PATH (e.g. "
                         ":8000/metrics)")
    if not 0 < int(match[1]) < 65536:
        raise ValueError(f"metrics endpoint {endpoint[:64]!r}: port out of range")
    if not _HISTOGRAM_NAME.fullmatch(histogram):
        raise ValueError(f"not a metric name: {histogram[:64]!r}")
    return Scrape(endpoint, histogram)


@dataclass(frozen=True)
class Objective:
    target_s: float | None  # None: a training job
    metric: str | None
    kind: str = INFERENCE
    scrape: Scrape | None = None  # where its latencies are, if not in its ring

    def __str__(self) -> str:
        if self.kind == TRAINING:
            return f"a training job ({TRAINING_POLICY})"
        where = f", latency from {self.scrape}" if self.scrape else ""
        return f"target {format_duration(self.target_s)} ({self.metric}){where}"


TRAINING_JOB = Objective(None, None, TRAINING)


@dataclass
class Target:
    name: str  # the container as the user named it; the key
    target_s: float | None  # QoE objective o_i, seconds; None for a training job
    metric: str | None  # which window statistic is p_i; None for a training job
    # who set it: dqoesctl ("cli"), the container's labels ("label") or its Swarm service's
    # ("service")
    source: str = "cli"
    cgroup: str | None = None  # bound cgroup directory, None while pending
    cgroup_id: str | None = None  # "<boot id>:<inode>" of that directory
    original_max: str | None = None  # cpu.max before our first write; None: never written
    ring: str | None = None  # its ring when not RUN_DIR/rings/<name>/ring: its volume's
    # an inference service (a latency target, the daemon's --policy) or a training job (no
    # target: FlowCon, by the progress it reports)
    kind: str = INFERENCE
    original_weight: int | None = None  # cpu.weight before our first write; None: never written
    # its latencies from a Prometheus histogram (Scrape) instead of its ring; None: its ring
    metrics: str | None = None  # ":PORT/PATH"
    histogram: str | None = None

    @property
    def scrape(self) -> Scrape | None:
        return None if self.metrics is None else Scrape(self.metrics, self.histogram or "")

    @property
    def objective(self) -> Objective:
        """What the target is pursued for."""
        return Objective(self.target_s, self.metric, self.kind, self.scrape)


def check_target(target_s: Any, metric: Any, kind: Any = INFERENCE,
                 scrape: Scrape | None = None) -> None:
    """Raise ValueError unless (target, metric) is something the controller can pursue: a
    latency target for an inference service, none for a training job."""
    if kind == TRAINING:
        if target_s is not None or metric is not None or scrape is not None:
            raise ValueError("a training job has no latency target, metric or histogram")
        return
    if kind != INFERENCE:
        raise ValueError(f"unknown kind {kind!r:.40} (one of {', '.join(KINDS)})")
    if not isinstance(target_s, (int, float)) or isinstance(target_s, bool):
        raise ValueError("target must be a number of seconds")
    if not math.isfinite(target_s) or target_s <= 0:
        raise ValueError("target must be a positive duration")
    if target_s > MAX_TARGET_S:
        raise ValueError(f"target must be at most {MAX_TARGET_S:.0f} s")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})")
