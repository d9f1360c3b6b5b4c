"""The cluster oracle: the most containers that could be in S at once across all nodes, each
container free to be on any node.

The model (the per-node oracle of bench/experiments/analysis.py, with placement free):
- container i is in S at a CPU share c when its latency there is within alpha of its target:
  the shares [lo_i, hi_i] (its model's curve); it can use at most d_i CPUs (its threads);
- every container is on exactly one node; on node k (B_k CPUs) with n_k containers, each
  not in S keeps at least the floor f_k = B_k / (2 n_k), as the per-node policies' limits
  do (in G or B); one in S is held at lo_i, under the floor if its band is (as admit holds
  an admitted container at its need);
- i can be in S on k when lo_i <= min(d_i, B_k), and then costs lo_i - f_k beyond its
  floor (negative when its need is under the floor: it frees CPU); the costs of a node's S
  containers fit in B_k - n_k f_k = B_k / 2.
The floors of a node add up to B_k / 2 whatever n_k, so what placement changes is who shares
a node (a container's cost depends on the floor, hence on how many share its node) and which
node's room serves whom. For each split (n_1, ..., n_K) of the containers over the nodes,
the best choice of S is a small integer program (each container in S at most once, each
node's costs within its room and its count within n_k), solved exactly with scipy's MILP
(HiGHS); splits are tried best bound first, and a split whose bound (each node filled
cheapest first on its own, then the program's linear relaxation) cannot beat the best
found is skipped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from bench.experiments.sim import DEMAND_CORES, Container, Curve

_GRID = np.geomspace(1e-4, 1.0, 40001)  # fractions of its most at which a band is looked for


@dataclass(frozen=True)
class Band:
    """The CPU shares at which a container is in S."""

    lo: float
    hi: float


@dataclass(frozen=True)
class ClusterOracle:
    satisfied: int
    sizes: tuple[int, ...]  # containers per node in the best split found
    placement: tuple[int, ...]  # a node per container achieving it (S ones, then the rest)


def band(c: Container, curve: Curve, most: float, alpha: float) -> Band | None:
    """The shares (CPUs, at most `most`) at which `c` is in S; None if there are none."""
    cores = _GRID * most
    latency = curve.latency(cores)
    ok = np.abs(c.target_s - latency) <= alpha * c.target_s
    if not ok.any():
        return None
    return Band(float(cores[ok].min()), float(cores[ok].max()))


def _costs(bands: Sequence[Band | None], budget: float, n: int) -> np.ndarray:
    """Each container's cost beyond the floor on a node of `budget` with n containers; inf
    where it cannot be in S there."""
    if n == 0:
        return np.full(len(bands), np.inf)
    floor = budget / (2 * n)
    return np.array([b.lo - floor if b is not None and b.lo <= budget else np.inf
                     for b in bands])


def _greedy(costs: np.ndarray, room: float, n: int) -> int:
    """How many of the cheapest fit in `room` (at most n)."""
    total, count = 0.0, 0
    for cost in np.sort(costs[np.isfinite(costs)])[:n]:
        if total + cost > room + 1e-12:
            break
        total += cost
        count += 1
    return count


def _splits(n: int, budgets: Sequence[float]) -> Iterator[tuple[int, ...]]:
    """Every split of n containers over the nodes (up to the order of nodes with the same
    budget)."""
    k = len(budgets)
    for cuts in itertools.combinations(range(n + k - 1), k - 1):
        sizes = tuple(b - a - 1 for a, b in itertools.pairwise((-1, *cuts, n + k - 1)))
        if all(sizes[i] >= sizes[i + 1] for i in range(k - 1) if budgets[i] == budgets[i + 1]):
            yield sizes


def _best_for(costs: list[np.ndarray], budgets: Sequence[float], sizes: tuple[int, ...],
              relaxed: bool = False) -> tuple[int, list[int | None]]:
    """The most in S for this split, and each container's node (None: not in S). Relaxed
    (fractions allowed): a bound on it, in a fraction of the time, and no placement."""
    pairs = [(i, k) for k, c in enumerate(costs) for i in np.flatnonzero(np.isfinite(c))]
    if not pairs:
        return 0, [None] * len(costs[0])
    m, nvar = len(costs[0]), len(pairs)
    rows, upper = [], []
    for i in range(m):  # in S once at most
        rows.append([1.0 if p[0] == i else 0.0 for p in pairs])
        upper.append(1.0)
    for k, budget in enumerate(budgets):  # each node's room, and its count
        rows.append([costs[k][p[0]] if p[1] == k else 0.0 for p in pairs])
        upper.append(budget / 2 + 1e-9)
        rows.append([1.0 if p[1] == k else 0.0 for p in pairs])
        upper.append(float(sizes[k]))
    result = milp(-np.ones(nvar), integrality=np.zeros(nvar) if relaxed else np.ones(nvar),
                  bounds=Bounds(0, 1),
                  constraints=LinearConstraint(np.array(rows), -np.inf, np.array(upper)))
    if not result.success:
        raise RuntimeError(f"the oracle's MILP failed: {result.message}")
    if relaxed:
        return int(-result.fun + 1e-6), []
    where: list[int | None] = [None] * m
    for (i, k), x in zip(pairs, result.x, strict=True):
        if x > 0.5:
            where[i] = k
    return sum(w is not None for w in where), where


def cluster_oracle(containers: Sequence[Container], budgets: Sequence[float],
                   curves: dict[str, Curve], alpha: float = 0.10,
                   threads: Sequence[float] | None = None) -> ClusterOracle:
    """The most of `containers` in S at once on nodes of `budgets` CPUs, with free placement
    (the model above). Nodes with equal budgets should be adjacent (their splits are
    enumerated up to order)."""
    most = threads or [DEMAND_CORES] * len(containers)
    bands = [band(c, curves[c.model], min(d, max(budgets)), alpha)
             for c, d in zip(containers, most, strict=True)]
    bounded = []
    for sizes in _splits(len(containers), budgets):
        costs = [_costs(bands, b, n) for b, n in zip(budgets, sizes, strict=True)]
        bound = min(sum(_greedy(c, b / 2, n) for c, b, n in zip(costs, budgets, sizes,
                                                               strict=True)),
                    int(np.isfinite(np.array(costs)).any(axis=0).sum()))
        bounded.append((bound, sizes, costs))
    bounded.sort(key=lambda x: -x[0])
    best = ClusterOracle(-1, (), ())
    for bound, sizes, costs in bounded:
        if bound <= best.satisfied:
            break
        if best.satisfied >= 0 and _best_for(costs, budgets, sizes, relaxed=True)[0] <= \
                best.satisfied:
            continue
        count, where = _best_for(costs, budgets, sizes)
        if count > best.satisfied:
            best = ClusterOracle(count, sizes, _fill(where, sizes))
    return best


def _fill(where: list[int | None], sizes: tuple[int, ...]) -> tuple[int, ...]:
    """A node for every container: the S ones where the program put them, the others in the
    places left."""
    left = list(sizes)
    for k in where:
        if k is not None:
            left[k] -= 1
    free = iter(k for k, n in enumerate(left) for _ in range(n))
    return tuple(k if k is not None else next(free) for k in where)
