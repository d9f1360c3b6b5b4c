"""The paper's cluster experiment at its scale, for the simulator.

At the paper's scale it is bench/experiments' s5-cluster (4 workers of 2 CPUs, 40 containers
of random models, targets and arrivals in [0, 300 s], targets as ratios to the latency at a
worker's even share of 10): its 40 containers, no longer tied to a node, arrive in the order
of their arrival times and Swarm or placement puts them somewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.experiments.scenarios import PAPER_PARAMS, paper_scenarios
from bench.experiments.sim import Container, Curve, Params

PAPER_SATISFIED = {"dqoes": 26, "default": 3}  # of 40 (section V, cluster)
PAPER_KEY = "s5-cluster"


@dataclass(frozen=True)
class ClusterScenario:
    key: str
    title: str
    cpus: tuple[float, ...]  # the nodes' budgets
    containers: tuple[Container, ...]
    duration_s: float
    params: Params  # the daemons'

    @property
    def last_arrival_s(self) -> float:
        return max(c.arrival_s for c in self.containers)


def paper_cluster(curves: dict[str, Curve], quick: bool = False) -> ClusterScenario:
    """s5-cluster with placement free."""
    (sc,) = [s for s in paper_scenarios(quick) if s.key == PAPER_KEY]
    nodes = sc.build(curves)
    return ClusterScenario(
        "c1-paper-scale", "4 workers of 2 CPUs, 40 containers of 3 types, random targets and "
        "arrivals in [0, 300 s]", tuple(nd.cpus for nd in nodes),
        tuple(c for nd in nodes for c in nd.containers), sc.duration_s, PAPER_PARAMS)
