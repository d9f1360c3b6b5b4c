"""One run of a scenario, real or simulated, as observed window by window, and the classes
of its containers (the policy's own G/S/B classification of each window's latency)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dqoes_cg.policy import Cls, classify

from .sim import Container, Node, Windows

ARRAYS = ("t", "latency_s", "usage_cores", "limit_cores")


@dataclass
class Run:
    scenario: str
    mode: str  # "dqoes" (dqoesd manages the node) or "default" (no limits: even share)
    source: str  # "real" (a kernel, real workers) or "sim"
    params: dict[str, float]  # the daemon's (empty for the default platform)
    nodes: list[Node]
    t: np.ndarray  # window ends, s since the first arrival
    latency_s: np.ndarray  # (T, n), containers in node order
    usage_cores: np.ndarray
    limit_cores: np.ndarray
    notes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_windows(cls, scenario: str, mode: str, source: str,
                     params: dict[str, float], nodes: list[Node], windows: list[Windows],
                     **notes: Any) -> Run:
        """Join the windows of each node (same window ends) into one run."""
        rows = min(len(w.t) for w in windows)
        joined = {name: np.concatenate([getattr(w, name)[:rows] for w in windows], axis=1)
                  for name in ARRAYS[1:]}
        return cls(scenario, mode, source, params, nodes, windows[0].t[:rows], **joined,
                   notes=notes)

    @property
    def containers(self) -> list[Container]:
        return [c for node in self.nodes for c in node.containers]

    @property
    def node_of(self) -> np.ndarray:
        return np.concatenate([np.full(len(nd.containers), k)
                               for k, nd in enumerate(self.nodes)]).astype(int)

    @property
    def targets(self) -> np.ndarray:
        return np.array([c.target_s for c in self.containers])

    def classes(self, alpha: float = 0.10) -> np.ndarray:
        """(T, n) Cls codes of each window, as the policy classifies (IDLE: no request)."""
        return np.array([classify(self.targets, latency, alpha)
                         for latency in self.latency_s], np.int8).reshape(self.latency_s.shape)

    def satisfied(self, alpha: float = 0.10) -> np.ndarray:
        """(T,) how many containers are in S."""
        return (self.classes(alpha) == Cls.S).sum(axis=1)

    def gaps(self, alpha: float = 0.10) -> tuple[np.ndarray, np.ndarray]:
        """(T,) Q_G and Q_B: the summed gaps q = target - latency of G and of B."""
        q = self.targets - self.latency_s
        cls = self.classes(alpha)
        return (np.where(cls == Cls.G, q, 0.0).sum(axis=1),
                np.where(cls == Cls.B, q, 0.0).sum(axis=1))

    # --- files ---------------------------------------------------------------------

    def save(self, path: Path) -> None:
        data = {k: v for k, v in asdict(self).items() if k not in ARRAYS}
        data.update({k: _nan_to_none(getattr(self, k)) for k in ARRAYS})
        path.write_text(json.dumps(data, indent=None, separators=(",", ":")))

    @classmethod
    def load(cls, path: Path) -> Run:
        data = json.loads(path.read_text())
        nodes = [Node(nd["cpus"], tuple(Container(**c) for c in nd["containers"]))
                 for nd in data.pop("nodes")]
        arrays = {k: np.array(data.pop(k), dtype=float) for k in ARRAYS}
        n = sum(len(nd.containers) for nd in nodes)
        for k in ARRAYS[1:]:
            arrays[k] = arrays[k].reshape(-1, n)
        return cls(nodes=nodes, **arrays, **data)


def _nan_to_none(a: np.ndarray) -> Any:
    return np.where(np.isfinite(a), a, None).tolist()
