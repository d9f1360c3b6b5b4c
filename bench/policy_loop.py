"""DQoES Algorithm 1 as a plain per-container loop, line by line as in the paper's
pseudo-code: the oracle for dqoes_cg.policy's vectorized form, and its benchmark baseline.

    python3 bench/policy_loop.py          # vectorized vs loop, median time per round
"""

from __future__ import annotations

import math
import platform
import statistics
import sys
import timeit
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dqoes_cg.policy import T_R, Cls, Round, Workspace, algorithm1, algorithm1_into


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

    limits = list(limit)
    for i in range(n):
        if classes[i] == Cls.G:
            binding = min(limit[i], usage[i])
            limits[i] = max(binding * (1 - q[i] / q_g * r_g * beta), 1 / (2 * n))
        elif classes[i] == Cls.B:
            limits[i] = min(limit[i] * (1 + q[i] / q_b * r_g * beta), T_R)
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


def main() -> None:
    rng = np.random.default_rng(1)
    print(f"DQoES Algorithm 1, one round; host {platform.node()}, Python "
          f"{platform.python_version()}, numpy {np.__version__}")
    print(f"{'n':>6} {'loop median':>12} {'numpy median':>13} {'loop/numpy':>11}")
    for n in (10, 100, 1000, 10000):
        target, measured, usage, limit = random_inputs(n, rng)
        lists = [a.tolist() for a in (target, measured, usage, limit)]
        ws, out, classes = Workspace.sized(n), np.empty(n), np.empty(n, dtype=np.int8)
        assert compare(*lists) < 1e-9

        def vectorized(ws=ws, out=out, classes=classes, target=target, measured=measured,
                       usage=usage, limit=limit) -> None:
            algorithm1_into(target, measured, usage, limit, alpha=0.1, beta=0.1, ws=ws,
                            limits_out=out, classes_out=classes)

        number = max(1, 20000 // n)
        times = {}
        for name, fn in (("loop", lambda lists=lists: algorithm1_loop(*lists)),
                         ("numpy", vectorized)):
            runs = timeit.repeat(fn, number=number, repeat=7)
            times[name] = statistics.median(runs) / number
        print(f"{n:>6} {times['loop'] * 1e6:>10.1f}us {times['numpy'] * 1e6:>11.1f}us "
              f"{times['loop'] / times['numpy']:>10.1f}x")


if __name__ == "__main__":
    main()
