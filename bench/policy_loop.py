"""DQoES Algorithm 1 as a plain per-container loop, line by line as in the paper's
pseudo-code: the oracle for dqoes_cg.policy's vectorized form, and its benchmark baseline.

    python3 -m bench.policy_loop [--quick]   # one round: DQoES.decide vs the loop

`run(ns, repeats, budget_s)` times one policy round on n containers both ways, after checking
that both give the same limits, classes and totals. Both run Algorithm 2 (the Listener,
three scalars per round, no per-container work) after Algorithm 1, as DQoES.decide does.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import numpy as np

from bench.timing import HOST, Row, format_table, measure
from dqoes_cg.policy import T_R, Cls, Observation
from dqoes_cg.policy.dqoes import DQoES, Listener, Round, algorithm1

PART = "policy"
OURS = "vectorized: DQoES.decide (Algorithms 1 + 2, numpy)"
LOOP = "Python loop per container (bench/policy_loop.py) + Listener"
NS = (10, 100, 1000, 10000)


def algorithm1_loop(
    target: Sequence[float], measured: Sequence[float], usage: Sequence[float],
    limit: Sequence[float], alpha: float = 0.10, beta: float = 0.10,
) -> tuple[list[float], list[int], Round]:
    """Algorithm 1, one container at a time: (new limits, classes, totals)."""
    n = len(target)
    q = [o - p for o, p in zip(target, measured, strict=True)]
    classes = []
    q_g = q_b = r_g = r_b = 0.0
    satisfied = 0
    for o, q_i, r in zip(target, q, usage, strict=True):
        if not (math.isfinite(q_i) and math.isfinite(r)):
            classes.append(Cls.IDLE)
        elif q_i > alpha * o:
            classes.append(Cls.G)
            q_g += q_i
            r_g += r
        elif q_i < -alpha * o:
            classes.append(Cls.B)
            q_b += q_i
            r_b += r
        else:
            classes.append(Cls.S)
            satisfied += 1

    used = sum(r for r in usage if math.isfinite(r))  # idle containers hold CPU too
    idle = max(T_R - used, 0.0) if q_g == 0.0 else 0.0
    limits = list(limit)
    for i in range(n):
        if classes[i] == Cls.G:
            binding = min(limit[i], usage[i])
            limits[i] = max(binding * (1 - q[i] / q_g * r_g * beta), 1 / (2 * n))
        elif classes[i] == Cls.B:
            grown = limit[i] * (1 + q[i] / q_b * r_g * beta) + q[i] / q_b * idle
            limits[i] = min(grown, T_R)
    return limits, [int(c) for c in classes], Round(q_g, q_b, r_g, r_b, satisfied)


def compare(
    target: Sequence[float], measured: Sequence[float], usage: Sequence[float],
    limit: Sequence[float], alpha: float = 0.10, beta: float = 0.10,
) -> float:
    """How far the vectorized form is from the loop: the largest relative difference of the
    limits and totals; inf if any class differs."""
    v_limits, v_classes, v_totals = algorithm1(target, measured, usage, limit, alpha, beta)
    l_limits, l_classes, l_totals = algorithm1_loop(target, measured, usage, limit, alpha, beta)
    if v_classes.tolist() != l_classes:
        return math.inf
    pairs = [*zip(v_limits.tolist(), l_limits, strict=True),
             *zip(v_totals, l_totals, strict=True)]
    return max((abs(a - b) / max(abs(a), abs(b), 1e-300) for a, b in pairs if a != b),
               default=0.0)


def random_inputs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A worker of n containers in a mix of G, S, B and idle."""
    target = rng.uniform(0.01, 2.0, n)
    measured = target * rng.uniform(0.5, 1.6, n)
    measured[rng.random(n) < 0.1] = np.nan
    limit = rng.uniform(0.5 / n, 2.0 / n, n)
    usage = limit * rng.uniform(0.3, 1.0, n)
    return target, measured, usage, limit


def run(ns: Sequence[int], repeats: int, budget_s: float) -> list[Row]:
    rng = np.random.default_rng(1)
    rows = []
    for n in ns:
        target, measured, usage, limit = random_inputs(n, rng)
        lists = [a.tolist() for a in (target, measured, usage, limit)]
        if compare(*lists) > 1e-9:
            raise AssertionError(f"n={n}: the vectorized Algorithm 1 differs from the loop")
        policy, listener = DQoES(), Listener()
        policy.resize(n)
        obs = Observation(target=target, measured=measured, usage=usage, limit=limit)

        def vectorized(policy: DQoES = policy, obs: Observation = obs) -> None:
            policy.reset()  # due now
            policy.decide(obs, 0.0)

        def loop(listener: Listener = listener, lists: list[list[float]] = lists) -> None:
            listener.reset()
            _, _, totals = algorithm1_loop(*lists)
            listener.observe(totals.q_g, totals.q_b, totals.satisfied)
            listener.schedule(0.0)

        policy.reset()
        decision = policy.decide(obs, 0.0)
        limits, classes, _ = algorithm1_loop(*lists)
        if (decision is None or decision.classes.tolist() != classes
                or not np.allclose(decision.limits, limits, rtol=1e-12, atol=0)):
            raise AssertionError(f"n={n}: DQoES.decide differs from the loop")
        rows.append(Row.of(PART, OURS, measure(vectorized, repeats=repeats, budget_s=budget_s),
                           where=HOST, n=n, per="round"))
        rows.append(Row.of(PART, LOOP, measure(loop, repeats=repeats, budget_s=budget_s),
                           where=HOST, n=n, role="baseline", per="round", versus=OURS))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench.policy_loop", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small n, few repeats")
    quick = p.parse_args().quick
    print(format_table(run(NS[:2] if quick else NS, 5 if quick else 15, 0.5 if quick else 3)))


if __name__ == "__main__":
    main()
