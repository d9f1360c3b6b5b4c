"""A pipeline scaled by the model-based scaler (dqoes_cg.cluster.scaler) against a fixed
deployment, in the model's own world: every stage behaves exactly as the model the split and
the scaler assume (a replica of work s at c CPUs, fed λ/r a second, answers in s / (c - λs/r),
overloaded past c), so this checks the rule's dynamics (reaction to a step in λ, hysteresis,
the cap, the replica-seconds it saves), not the model against real requests.

A chain of stages, each replica of one CPU on a node of its own (nodes with room are never
short), under a rate that steps up and back down. Every second: the stages' work and rate
are measured with multiplicative noise, the split is made again every RESPLIT_S from them
and the running replicas (held while no share moves by more than 10%, as the manager does),
and the scaler evaluates; a replica scaled out starts `start_s` later (Swarm pulls and
starts it; the stage is busy meanwhile), one scaled in stops at once. A window (a second)
holds when the chain's latency, the stages' summed, is within the target.

Two fixed deployments: the most replicas the scaled one ran at any time per stage, and the
fewest replicas (in all) that the model says hold the target at the peak rate: the least
over-provisioned deployment that holds it.

    python3 -m bench.cluster.pipeline_scaling   # prints the figures as JSON
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dqoes_cg.cluster.manager import RESPLIT_S
from dqoes_cg.cluster.scaler import PipelineLoad, Scaler, ScalerParams, StageLoad
from dqoes_cg.cluster.split import settle, split

WORK_S = (0.020, 0.050, 0.010)  # CPU-seconds a request, per stage
TARGET_S = 0.3  # end to end
STEPS = ((0.0, 10.0), (120.0, 40.0), (360.0, 10.0))  # (from time, rate a second)
DURATION_S = 600.0
SETTLE_S = 30.0  # windows this soon after a step are not counted as settled


@dataclass(frozen=True)
class Run:
    replicas: list[list[int]]  # per second, per stage: running
    latency_s: list[float]  # per second, end to end (inf: a stage overloaded)
    rates: list[float]
    actions: int


def rate_at(t: float, steps: Sequence[tuple[float, float]] = STEPS) -> float:
    return [rate for start, rate in steps if start <= t][-1]


def stage_latency(work_s: float, rate_hz: float, replicas: int, cpus: float = 1.0) -> float:
    """The model's: s / (c - λs/r), inf when the replicas are overloaded."""
    spare = cpus - rate_hz * work_s / replicas
    return work_s / spare if spare > 0 else math.inf


def simulate(scaled: bool = True, fixed: Sequence[int] | None = None,
             work_s: Sequence[float] = WORK_S, target_s: float = TARGET_S,
             steps: Sequence[tuple[float, float]] = STEPS, duration_s: float = DURATION_S,
             start_s: float = 5.0, noise: float = 0.05, seed: int = 1,
             params: ScalerParams | None = None) -> Run:
    """One run: scaled by the scaler from one replica a stage, or `fixed` replicas."""
    rng = np.random.default_rng(seed)
    n = len(work_s)
    paths = [tuple(range(n))]
    ids = [f"stage{i}" for i in range(n)]
    asked = list(fixed) if fixed is not None else [1] * n
    starting: list[list[float]] = [[] for _ in range(n)]  # when each new replica runs
    running = list(asked)
    scaler = Scaler(params or ScalerParams())
    held, made = None, -math.inf
    out = Run([], [], [], 0)
    for tick in range(int(duration_s)):
        t = float(tick)
        lam = rate_at(t, steps)
        for i in range(n):
            ready = [s for s in starting[i] if s <= t]
            starting[i] = [s for s in starting[i] if s > t]
            running[i] += len(ready)
        measured_s = [s * float(rng.lognormal(0.0, noise)) for s in work_s]
        measured_rate = [lam * float(rng.lognormal(0.0, noise)) for _ in range(n)]
        if t - made >= RESPLIT_S:
            held, made = settle(held, split(target_s, paths, measured_s, measured_rate,
                                            running)), t
        assert held is not None
        if scaled:
            loads = [StageLoad(ids[i], ids[i], asked[i], measured_s[i], measured_rate[i],
                               held.stage_s[i], {f"{ids[i]}-{k}": 1.0
                                                 for k in range(running[i])},
                               {"spare": 1.0},
                               None if running[i] == asked[i] else "starting")
                     for i in range(n)]
            pipeline = PipelineLoad("chain", tuple(loads), held.feasible)
            for d in scaler.plan(t, [pipeline]).decisions:
                i = ids.index(d.service_id)
                out = Run(out.replicas, out.latency_s, out.rates, out.actions + 1)
                if d.replicas > asked[i]:
                    starting[i] += [t + start_s] * (d.replicas - asked[i])
                else:
                    running[i] -= asked[i] - d.replicas
                asked[i] = d.replicas
        out.replicas.append(list(running))
        out.rates.append(lam)
        out.latency_s.append(sum(stage_latency(work_s[i], lam, running[i])
                                 for i in range(n)))
    return out


def figures(run: Run, target_s: float = TARGET_S,
            steps: Sequence[tuple[float, float]] = STEPS) -> dict[str, float]:
    """Windows held (all, and after settling), replica-seconds, most replicas a stage."""
    held = [lat <= target_s for lat in run.latency_s]
    settled = [h for t, h in enumerate(held)
               if all(not 0 <= t - start < SETTLE_S for start, _ in steps)]
    return {"windows": len(held), "held": sum(held) / len(held),
            "settled_windows": len(settled), "held_settled": sum(settled) / len(settled),
            "replica_seconds": float(sum(sum(r) for r in run.replicas)),
            "actions": run.actions,
            "most_replicas": [max(r[i] for r in run.replicas)
                              for i in range(len(run.replicas[0]))]}


def least_fixed(work_s: Sequence[float] = WORK_S, target_s: float = TARGET_S,
                peak_hz: float = max(rate for _, rate in STEPS), most: int = 8
                ) -> list[int]:
    """The fewest replicas in all (at most `most` a stage) whose chain holds `target_s` at
    `peak_hz` by the model."""
    combos = itertools.product(range(1, most + 1), repeat=len(work_s))
    holding = [c for c in combos if sum(stage_latency(s, peak_hz, r)
                                        for s, r in zip(work_s, c, strict=True)) <= target_s]
    return list(min(holding, key=sum))


def compare(**kwargs: float) -> dict[str, dict[str, float]]:
    """The scaled run, the fixed deployment of its most replicas per stage and the least
    fixed one that holds the peak."""
    scaled = simulate(**kwargs)  # type: ignore[arg-type]
    most = [max(r[i] for r in scaled.replicas) for i in range(len(scaled.replicas[0]))]
    return {"scaled": figures(scaled),
            "fixed_most": figures(simulate(scaled=False, fixed=most, **kwargs)),  # type: ignore[arg-type]
            "fixed_least": figures(simulate(scaled=False, fixed=least_fixed(),
                                            **kwargs))}  # type: ignore[arg-type]


if __name__ == "__main__":
    print(json.dumps(compare(), indent=1))
