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
    mode: str  # the policy of the dqoesd managing the node, or "default" (no limits)
    source: str  # "real" (a kernel, real workers) or "sim"
    params: dict[str, float]  # the daemon's (empty for the default platform)
    nodes: list[Node]
    t: np.ndarray  # window ends, s since the first arrival
    latency_s: np.ndarray  # (T, n), containers in node order
    usage_cores: np.ndarray
    limit_cores: np.ndarray
    notes: dict[str, Any] = field(default_factory=dict)
    decisions: list[list[float]] = field(default_factory=list)  # policy rounds, per node

    @classmethod
    def from_windows(cls, scenario: str, mode: str, source: str,
                     params: dict[str, float], nodes: list[Node], windows: list[Windows],
                     **notes: Any) -> Run:
        """Join the windows of each node (same window ends) into one run."""
        rows = min(len(w.t) for w in windows)
        joined = {name: np.concatenate([getattr(w, name)[:rows] for w in windows], axis=1)
                  for name in ARRAYS[1:]}
        return cls(scenario, mode, source, params, nodes, windows[0].t[:rows], **joined,
                   notes=notes, decisions=[w.decisions.tolist() for w in windows])

    @property
    def containers(self) -> list[Container]:
        return [c for node in self.nodes for c in node.containers]

    @property
    def node_of(self) -> np.ndarray:
        return np.concatenate([np.full(len(nd.containers), k)
                               for k, nd in enumerate(self.nodes)]).astype(int)

    @property
    def targets(self) -> np.ndarray:
        """(T, n) each container's target in each window (targets may change mid-run)."""
        return np.column_stack([c.target_at(self.t) for c in self.containers]) \
            if self.containers else np.zeros((len(self.t), 0))

    def classes(self, alpha: float = 0.10) -> np.ndarray:
        """(T, n) Cls codes of each window, as the policy classifies (IDLE: no request),
        but an open-loop service faster than its band counts in S: its users wait no more
        than its target allows, and the CPU it holds beyond its need is charged by the
        comparison with the oracle, which counts it at its least share (analysis.counted)."""
        is_open = [c.open_loop for c in self.containers]
        return np.array([classify(target, latency, alpha, is_open)
                         for target, latency in zip(self.targets, self.latency_s, strict=True)],
                        np.int8).reshape(self.latency_s.shape)

    def satisfied(self, alpha: float = 0.10, node: int | None = None) -> np.ndarray:
        """(T,) how many containers are in S (on one node, or all)."""
        s = self.classes(alpha) == Cls.S
        return (s if node is None else s[:, self.node_of == node]).sum(axis=1)

    def gaps(self, alpha: float = 0.10) -> tuple[np.ndarray, np.ndarray]:
        """(T,) Q_G and Q_B: the summed gaps q = target - latency of G and of B."""
        q = self.targets - self.latency_s
        cls = self.classes(alpha)
        return (np.where(cls == Cls.G, q, 0.0).sum(axis=1),
                np.where(cls == Cls.B, q, 0.0).sum(axis=1))

    # --- files ---------------------------------------------------------------------

    def save(self, path: Path) -> None:
        data = _finite_or_none({k: v for k, v in asdict(self).items() if k not in ARRAYS})
        data.update({k: _nan_to_none(getattr(self, k)) for k in ARRAYS})
        path.write_text(json.dumps(data, indent=None, separators=(",", ":")))

    @classmethod
    def load(cls, path: Path) -> Run:
        data = json.loads(path.read_text())
        nodes = [Node(nd["cpus"], tuple(Container.from_dict(c) for c in nd["containers"]),
                      tuple(tuple(s) for s in nd.get("slowdowns", ())))
                 for nd in data.pop("nodes")]
        arrays = {k: np.array(data.pop(k), dtype=float) for k in ARRAYS}
        n = sum(len(nd.containers) for nd in nodes)
        for k in ARRAYS[1:]:
            arrays[k] = arrays[k].reshape(-1, n)
        return cls(nodes=nodes, **arrays, **data)


def _finite_or_none(x: Any) -> Any:
    """JSON has no infinity (a container that never leaves): None."""
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return None if isinstance(x, float) and not np.isfinite(x) else x


def _nan_to_none(a: np.ndarray) -> Any:
    return np.where(np.isfinite(a), a, None).tolist()
