"""A pipeline's end-to-end target split into per-stage targets, where a millisecond is
cheapest (pure numpy; the manager calls it, cluster/manager.py).

The model. A stage's replica whose requests cost s CPU-seconds each, arriving at λ/r a
second (λ the stage's rate, r its replicas), served at a cap of c CPUs, answers in about
L = s / (c - λ s / r) (M/M/1-like: the service time s/c stretched by 1/(1 - rho)). Holding
latency L thus costs the stage r c = λ s + r s / L CPUs. The λ s part is the same whatever
L is; what the split chooses is Σ w_i / L_i, with w_i = r_i s_i. So:

    minimise  Σ_i w_i / L_i   subject to  Σ_{i in P} L_i <= T for every source-to-sink
                                          path P, and L_i >= f_i (the stage's floor)

On a chain, the Lagrange condition w_i / L_i² = μ gives L_i = T √w_i / Σ_j √w_j: the share
grows as the square root of the stage's work x replicas, so the stage where a millisecond is
cheapest (least w: cutting its latency costs least CPU) gets the tightest share, and a
stage twice as costly gets √2 times the latency, not twice. λ is in the floor (below), not
in the shares.

On a DAG the shared stages and the branches are coupled: two parallel branches of weights
w_b, w_c between the same stages get the same latency, which acts as one stage of weight
w_b + w_c (not √w_b alone, which splitting along the critical path would give). The
problem is convex and small (at most 32 stages and 256 paths), so it is solved exactly by its
dual: a flow y_P ≥ 0 over the paths, each stage's L_i = max(f_i, κ √(w_i / φ_i)) with φ_i the
flow through it and κ set so that the longest path is exactly T; the flow moves onto the
longer paths (y_P ← y_P (len_P / T)^GAMMA) until every path that carries flow is at T (the
KKT conditions), i.e. until the duality gap is within TOLERANCE of the cost. Each iterate is
feasible (every path within T), so stopping early costs optimality, never the target.

Floor and ceiling. No stage gets less than FLOOR_MARGIN times its latency at one whole CPU
per replica, s / (1 - rho) with rho = λ s / r (at most RHO_MAX: a stage busier than that at one
CPU a replica needs more replicas, which the split does not give). The ceiling is what is
left of T by the floors of the other stages on the stage's paths. When the floors on some
path add up to more than T, the target cannot be met: the floors are scaled down to fit
(`feasible` false), so each stage still gets its part of T in proportion to what it needs.
A stage not measured yet (no request in its window) weighs as the median of those that are
(all alike when none is), with the least floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FLOOR_MARGIN = 1.2
RHO_MAX = 0.9
MIN_STAGE_S = 1e-6  # a stage target's least: the daemon's (1 us)
HYSTERESIS = 0.10  # a new split replaces the last only when a stage's share moves more
ITERATIONS = 400
GAMMA = 4.0  # larger oscillates
TOLERANCE = 1e-4  # of the cost: a split this close to the least is the least
MIN_FLOW = 1e-12  # of the largest, on any path


@dataclass(frozen=True)
class Split:
    target_s: float  # the end-to-end target split
    stage_s: tuple[float, ...]  # each stage's target, in the pipeline's stage order
    feasible: bool  # every stage's floor fits within the target on every path


def floors(work_s: np.ndarray, rate_hz: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    """Each stage's least latency target: FLOOR_MARGIN x s / (1 - rho) at one CPU per replica
    (MIN_STAGE_S where s is unknown)."""
    rho = np.minimum(np.nan_to_num(rate_hz * work_s / replicas, nan=0.0), RHO_MAX)
    floor = FLOOR_MARGIN * np.nan_to_num(work_s, nan=0.0) / (1.0 - rho)
    return np.maximum(floor, MIN_STAGE_S)


def split(target_s: float, paths: Sequence[Sequence[int]], work_s: Sequence[float | None],
          rate_hz: Sequence[float | None], replicas: Sequence[int]) -> Split:
    """The per-stage targets of a pipeline of len(work_s) stages whose source-to-sink
    `paths` (stage indices) must each stay within `target_s`: the least CPU by the model
    above, from each stage's work per request (CPU-seconds), arrival rate (requests a
    second) and replicas; None (or not positive) where not measured."""
    n = len(work_s)
    s = np.array([np.nan if v is None or not v > 0 else v for v in work_s], dtype=float)
    lam = np.array([np.nan if v is None else v for v in rate_hz], dtype=float)
    r = np.maximum(np.asarray(replicas, dtype=float), 1.0)
    incidence = np.zeros((len(paths), n))
    for p, path in enumerate(paths):
        incidence[p, list(path)] = 1.0
    w = r * s
    known = np.isfinite(w)
    w[~known] = float(np.median(w[known])) if known.any() else 1.0
    floor = floors(s, lam, r)
    longest = float((incidence @ floor).max())
    if longest >= target_s:  # the floors fill a path, or more
        return Split(target_s, tuple(float(x) for x in floor * target_s / longest),
                     longest == target_s)
    flow = np.ones(len(paths))
    stage_s = floor
    for _ in range(ITERATIONS):
        kappa, stage_s = _fit(np.sqrt(w / (incidence.T @ flow)), floor, incidence, target_s)
        lengths = incidence @ stage_s
        # stage_s is what the flow / kappa² makes each stage's cheapest, so the duality gap
        # between this feasible split and the dual bound of that flow is its slack on the
        # paths it loads: within TOLERANCE of the cost, the split is the least to that
        cost = float(np.sum(w / stage_s))
        if float(flow @ (target_s - lengths)) <= TOLERANCE * cost * kappa**2:
            break
        flow *= (lengths / target_s) ** GAMMA
        flow /= flow.max()
        np.maximum(flow, MIN_FLOW, out=flow)  # a stage with no flow would get no bound
    return Split(target_s, tuple(float(x) for x in stage_s), True)


def _fit(shape: np.ndarray, floor: np.ndarray, incidence: np.ndarray, target_s: float
         ) -> tuple[float, np.ndarray]:
    """The largest κ for which max(floor, κ shape) keeps every path within target_s, and
    that split. A path's length is piecewise linear in κ, bending where a stage leaves its
    floor (κ = floor / shape): the last bend that fits is found among them all at once, and
    κ past it from each path's line."""
    bend = floor / shape
    bends = np.sort(bend)
    lengths = incidence @ np.maximum(floor[None, :], bends[:, None] * shape[None, :]).T
    fits = np.flatnonzero(lengths.max(axis=0) <= target_s)
    low = float(bends[fits[-1]]) if fits.size else 0.0  # 0: the floors fill a path
    free = bend <= low
    fixed = incidence @ np.where(free, 0.0, floor)
    slope = incidence @ np.where(free, shape, 0.0)
    rising = slope > 0
    if not rising.any():
        return low, floor
    kappa = max(low, float(((target_s - fixed[rising]) / slope[rising]).min()))
    return kappa, np.maximum(floor, kappa * shape)


def settle(previous: Split | None, proposed: Split, band: float = HYSTERESIS) -> Split:
    """The split to hold: the proposed one when it is the first, the end-to-end target
    changed, or a stage's share moved by more than `band` (relative); else the previous,
    so that stage targets do not chatter with the measurements' noise."""
    if previous is None or previous.target_s != proposed.target_s \
            or len(previous.stage_s) != len(proposed.stage_s) \
            or previous.feasible != proposed.feasible:
        return proposed
    old, new = np.asarray(previous.stage_s), np.asarray(proposed.stage_s)
    return proposed if float(np.abs(new / old - 1.0).max()) > band else previous

