"""Eq. 1's constants (dqoes_cg.cluster.darly K1, K2, K3) by measurement: the custom
scheduler trained with each candidate on several training seeds, each agent judged greedy on
the held-out evaluation seeds of bench/cluster/darly.py (1000 + run, never trained on), at
the loose and the strict constraint. Per candidate and constraint: the violations, the
reward (Eq. 1 with the reference constants, so candidates compare), the replicas and nodes,
as mean and spread over the training seeds. Each finished run is kept in
results/darly/constants.json (a rerun skips it); the table is printed (constants.md keeps
it with the choice made from it).

    python3 -m bench.cluster.darly_constants [--episodes N] [--seeds 0 1 2] [--jobs 2]
                                             [--only K1 K2 K3 ...]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from dqoes_cg.cluster.darly import ActionSpace

from .darly import (
    CONSTRAINTS,
    EVAL_RUNS,
    EVAL_STEPS,
    RESULTS,
    agent_policy,
    env_params,
    evaluate,
    summary,
    train,
)
from .pipeline_env import PipelineEnv

SCHEDULER = "custom"
REFERENCE = (1.0, 20.0, 10.0)  # the constants before this measurement
# k1 swept from 0 to 8 (above 3, a held window near the constraint earns more than any
# saving of nodes or replicas: N/sp + Rs/r is at most N + 1 = 5); then, at the chosen k1 = 3,
# k3 below, at and above the most a held window earns (N + 1 + k1 = 8) and k2 from just
# above k3 (an overloaded window costs about what a violation does) to 4 times it; the
# first k3 and k2 checks were at the former k1 = 1
K1_SWEEP = ((0.0, 20.0, 10.0), (0.5, 20.0, 10.0), (1.0, 20.0, 10.0), (2.0, 20.0, 10.0),
            (3.0, 20.0, 10.0), (5.0, 20.0, 10.0), (8.0, 20.0, 10.0))
K3_SWEEP = ((3.0, 20.0, 3.0), (3.0, 20.0, 6.0), (3.0, 20.0, 15.0))
K2_SWEEP = ((3.0, 12.0, 10.0), (3.0, 40.0, 10.0), (3.0, 80.0, 10.0))
FORMER = ((1.0, 20.0, 3.0), (1.0, 40.0, 20.0))
CANDIDATES = K1_SWEEP + K3_SWEEP + K2_SWEEP + FORMER
EPISODES = 1000


def key(k: Sequence[float], constraint: str, seed: int) -> str:
    return f"k={k[0]:g},{k[1]:g},{k[2]:g} {constraint} seed={seed}"


def measure(k: tuple[float, float, float], constraint: str, seed: int,
            episodes: int) -> tuple[str, dict[str, float]]:
    """One agent trained with constants `k` on training seed `seed`, judged with the
    reference constants: its figures and its training minutes."""
    started = time.monotonic()
    agent, _ = train(SCHEDULER, replace(env_params(constraint), k=k), episodes, seed=seed)
    minutes = (time.monotonic() - started) / 60.0
    judged = replace(env_params(constraint), k=REFERENCE)
    probe = PipelineEnv(judged)
    space = ActionSpace(SCHEDULER, probe.stages, probe.nodes)
    figures = summary(evaluate(lambda: agent_policy(agent, space), SCHEDULER, judged,
                               EVAL_RUNS, EVAL_STEPS))
    return key(k, constraint, seed), {**figures, "minutes": minutes, "episodes": episodes}


def table(done: dict[str, dict[str, float]], seeds: Sequence[int]) -> str:
    rows = ["| k1 | k2 | k3 | constraint | violations /200 | reward | replicas | nodes | "
            "seeds |", "|---|---|---|---|---|---|---|---|---|"]
    for constraint in CONSTRAINTS:
        for k in CANDIDATES:
            got = [done[key(k, constraint, s)] for s in seeds if key(k, constraint, s) in done]
            if not got:
                continue

            def cell(name: str, digits: int, got: list[dict[str, float]] = got) -> str:
                values = [g[name] for g in got]
                return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"

            rows.append(f"| {k[0]:g} | {k[1]:g} | {k[2]:g} | {constraint} | "
                        f"{cell('violations', 1)} | {cell('reward', 0)} | "
                        f"{cell('replicas', 1)} | {cell('nodes', 2)} | {len(got)} |")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.cluster.darly_constants",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=EPISODES)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", type=float, nargs=3, action="append", metavar=("K1", "K2", "K3"),
                   help="measure only these candidates (repeatable; default: all)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "constants.json"
    done: dict[str, dict[str, float]] = json.loads(store.read_text()) \
        if store.exists() else {}
    candidates = [tuple(k) for k in args.only] if args.only else CANDIDATES
    todo = [(k, c, s) for k in candidates for s in args.seeds for c in CONSTRAINTS
            if key(k, c, s) not in done]
    with ProcessPoolExecutor(args.jobs) as pool:
        for name, figures in pool.map(measure, *zip(*todo, strict=True),
                                      [args.episodes] * len(todo)) if todo else ():
            done[name] = figures
            store.write_text(json.dumps(done, indent=1))
            print(f"{name}: violations {figures['violations']:.1f}, replicas "
                  f"{figures['replicas']:.1f}, {figures['minutes']:.1f} min", flush=True)
    print(table(done, args.seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
