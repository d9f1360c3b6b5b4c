"""One simulated cluster run, window by window: where each container served, its
latency, and the moves placement made; what it achieved."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bench.experiments.analysis import TAIL, reached
from bench.experiments.sim import Container
from dqoes_cg.policy import Cls, classify


@dataclass(frozen=True)
class Moved:
    at_s: float  # when placement asked for it
    service: str
    source: str
    destination: str


@dataclass
class ClusterRun:
    way: str  # default, per-node, placement
    policy: str | None  # the per-node policy (None: the default platform)
    source: str  # what made it: "sim", "testbed"
    cpus: list[float]  # the nodes' budgets
    containers: list[Container]
    t: np.ndarray  # (T,) window ends, s since the first arrival
    latency_s: np.ndarray  # (T, n) mean latency in the window (NaN: none, not arrived)
    node: np.ndarray  # (T, n) the node each container served on (-1: none yet)
    paused: np.ndarray  # (T, nodes) whether placement had the node paused
    moves: list[Moved] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.way if self.policy is None else f"{self.way} ({self.policy})"

    @property
    def targets(self) -> np.ndarray:
        return np.array([c.target_s for c in self.containers])

    def to_json(self) -> dict[str, Any]:
        """The run as JSON values (NaN latencies as null, an infinite departure as null)."""
        return {"way": self.way, "policy": self.policy, "source": self.source,
                "cpus": self.cpus,
                "containers": [{**asdict(c), "departure_s": None if math.isinf(c.departure_s)
                                else c.departure_s} for c in self.containers],
                "t": self.t.tolist(),
                "latency_s": [[None if math.isnan(x) else x for x in row]
                              for row in self.latency_s.tolist()],
                "node": self.node.tolist(), "paused": self.paused.tolist(),
                "moves": [asdict(m) for m in self.moves], "notes": self.notes}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ClusterRun:
        return cls(doc["way"], doc["policy"], doc["source"], doc["cpus"],
                   [Container.from_dict(c) for c in doc["containers"]], np.array(doc["t"]),
                   np.array(doc["latency_s"], dtype=float).reshape(len(doc["t"]), -1),
                   np.array(doc["node"], dtype=int).reshape(len(doc["t"]), -1),
                   np.array(doc["paused"], dtype=bool).reshape(len(doc["t"]), -1),
                   [Moved(**m) for m in doc["moves"]], doc["notes"])

    def satisfied(self, alpha: float = 0.10) -> np.ndarray:
        """(T,) how many containers are in S in each window."""
        return np.array([int((classify(self.targets, row, alpha) == Cls.S).sum())
                         for row in self.latency_s])


@dataclass(frozen=True)
class Outcome:
    final_s: int  # |S| converged: median over the last TAIL of the run
    best_s: int  # the most in S in any window
    converged_s: float | None  # seconds after the last arrival until |S| held final_s
    moves: int


def outcome(run: ClusterRun, alpha: float = 0.10) -> Outcome:
    s = run.satisfied(alpha)
    tail = run.t >= run.t[-1] * (1 - TAIL)
    final = int(np.percentile(s[tail], 50, method="lower"))
    last = max(c.arrival_s for c in run.containers)
    when = reached(run.t, s, final)
    return Outcome(final, int(s.max()), None if when is None else max(when - last, 0.0),
                   len(run.moves))
