"""python -m bench.cluster: the paper's cluster experiment three ways (Swarm's default;
dqoes-cg on each node; dqoes-cg with QoE-aware placement), in the simulator at the paper's
scale (4 workers, 40 containers: bench/cluster/sim.py), against the cluster oracle
(bench/cluster/oracle.py) and the paper's 26 vs 3; plots and summary.md in DIR (default
bench/cluster/results).

    python -m bench.cluster [--quick] [--policies dqoes,admit] [--out DIR]

--quick shortens everything (the tests). Per-node policies: every name in
dqoes_cg.policy.POLICIES unless --policies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.experiments.__main__ import RESULTS as EXPERIMENT_RESULTS
from bench.experiments.__main__ import load_curves
from bench.experiments.analysis import oracle
from bench.experiments.progress import Progress
from bench.experiments.sim import Curve, Node
from dqoes_cg.cluster.placement import PlacementParams
from dqoes_cg.policy import POLICIES

from .oracle import cluster_oracle
from .run import ClusterRun
from .scenarios import PAPER_SATISFIED, ClusterScenario, paper_cluster
from .sim import WAYS, simulate_cluster

RESULTS = Path(__file__).resolve().parent / "results"
SIM_WINDOW_S = 5.0
COMMAND = "python -m bench.cluster"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="short runs (tests)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="per-node policies, by name (default: %(default)s)")
    args = p.parse_args(argv)
    policies = [name for name in args.policies.split(",") if name]
    unknown = [name for name in policies if name not in POLICIES]
    if unknown or not policies:
        p.error(f"unknown policy {', '.join(unknown)} (one of {', '.join(POLICIES)})")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report_all(out, policies, args.quick)
    return 0


def simulator_curves() -> dict[str, Curve]:
    """The worker types as bench/experiments calibrated them (latency = solo / share)."""
    measured = load_curves(EXPERIMENT_RESULTS / "calibration.json")
    return {m: Curve(c.solo_s) for m, c in measured.items()}


def simulate_ways(sc: ClusterScenario, curves: dict[str, Curve], policies: list[str],
                  placement: PlacementParams, window: float = SIM_WINDOW_S,
                  ) -> list[ClusterRun]:
    """The default way, then the per-node and placement ways with each policy."""
    runs = [simulate_cluster(list(sc.containers), list(sc.cpus), curves, "default", None,
                             sc.params, sc.duration_s, window)]
    for policy in policies:
        for way in WAYS[1:]:
            runs.append(simulate_cluster(list(sc.containers), list(sc.cpus), curves, way,
                                         policy, sc.params, sc.duration_s, window, placement))
    return runs


def spread_oracle(run: ClusterRun, curves: dict[str, Curve]) -> int:
    """The per-node oracles added up, with the containers where `run` placed them last."""
    last = run.node[-1]
    return sum(oracle(Node(cpus, tuple(c for c, k in zip(run.containers, last, strict=True)
                                       if k == j)), curves)
               for j, cpus in enumerate(run.cpus))


def report_all(out: Path, policies: list[str], quick: bool) -> None:
    from . import report  # matplotlib: host side only

    curves = simulator_curves()
    sc = paper_cluster(curves, quick)
    progress = Progress(3)
    progress.step(f"simulating {sc.key} three ways")
    runs = simulate_ways(sc, curves, policies, PlacementParams())
    progress.step("the cluster oracle")
    judged = [report.Judged(
        sc.key, sc.title, "simulated (bench/cluster/sim.py), the daemons' defaults",
        runs, cluster_oracle(sc.containers, sc.cpus, curves).satisfied,
        spread_oracle(runs[0], curves), None if quick else PAPER_SATISFIED,
        COMMAND)]
    progress.step("plots and summary")
    report.write(out, judged)
    progress.close(f"results in {out}")


if __name__ == "__main__":
    sys.exit(main())
