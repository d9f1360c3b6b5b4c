"""DQoES, the paper's policy (section IV): Algorithm 1 each round, Algorithm 2 to space them.

Limits are caps, so they may add up to more than T_R and CFS shares out whatever the caps
leave (the loop's interface: policy/base.py).

DQoES (the paper's section IV), one round
------------------------------------------
With o_i the target, p_i the measured latency over the window, r_i the CPU usage over the
window and L_i the current limit:

    q_i = o_i - p_i                        > 0: faster than the target
    G = {q_i > alpha·o_i}    S = {|q_i| <= alpha·o_i}    B = {q_i < -alpha·o_i}
    Q_G = Σ_G q_i > 0     Q_B = Σ_B q_i < 0      R_G = Σ_G r_i

    I = max(T_R - Σ_all r_i, 0) if G is empty, else 0:   the CPU nobody used in the window

    i in G:  L_i' = max(min(L_i, r_i) · (1 - (q_i/Q_G)·R_G·β),  1/(2n))
    i in B:  L_i' = min(L_i · (1 + (q_i/Q_B)·R_G·β) + (q_i/Q_B)·I,  T_R)
    i in S:  L_i' = L_i

q_i/Q_G and q_i/Q_B lie in (0, 1]: each container moves by its share of its class's gap.
B grows by R_G, what G gives up, so with no container in G and every CPU busy nothing
changes (the paper's unachievable-targets run stays at an even share). n counts every
managed container, idle or not, so the floors add up to T_R/2 at most and never cross the
cap.

Readings taken where the paper is loose (see shared/papers/ALGORITHMS.md):
- G is cut from min(L_i, r_i), the limit that binds: a container that uses far less than its
  cap (one that started unlimited) would otherwise be cut for hundreds of rounds before the
  cut bites. B grows from L_i itself: growing from a usage a little under the cap (as
  measured usage always is) would shrink a starved container's cap whenever the step is
  small, and would move limits with no G at all.
- The idle term I is ours: in the paper's rule, B grows only by what G gives up, so once
  no container is in G (G cut too far, or a load change) caps that add up to less than the
  budget stay put while CPUs idle and every container misses its target. B then takes what
  nobody used at once, shared like the gap. Where G is not empty, or the CPUs are busy, the
  paper's rule is unchanged. Every container's usage counts as used, an idle one's too: a
  busy container that finished no request in the window still holds its CPU.
- A container without a usable measurement (no requests in the window, no target, or a
  non-finite value anywhere) is IDLE: no class, not in the sums, limit untouched.
- A container's first limit (the loop passes NaN for a limit it never set) is max(its usage
  share, the even share 1/n), capped at T_R: no
  tighter than what it uses nor than the default platform would give it, and a finite cap
  that growth in B can act on (an unlimited one is already at the cap).
- alpha is the tolerance band (alpha ≥ 0), β the step (0 < β ≤ 1); both default to 0.10.

Algorithm 2, the adaptive listener, runs after each round on (Q_G, Q_B, |S|) and sets when
the next round is due, IV seconds later:
- Q_G fell and Q_B rose (both gaps shrinking) for the third round in a row: IV doubles, up
  to a ceiling iv_max.
- else |S| fell (the steady state broke): IV = IV_initial. This round is the immediate run
  of Algorithm 1 the paper asks for.
- else: the streak ends, IV unchanged.
A container joining or leaving, or a target changing, calls `reset()`: IV = IV_initial, the
series forgotten (it described other containers or targets), and the next round due at once.

Hot path: `decide` writes into arrays preallocated by `resize` and allocates no arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from .base import (
    ALPHA,
    BETA,
    IV_INITIAL_S,
    IV_MAX_S,
    T_R,
    BoolArray,
    Cls,
    Decision,
    FloatArray,
    IndexArray,
    Int8Array,
    Observation,
    PolicyParams,
)

# classify_into adds up its masks into these codes.
assert (Cls.IDLE, Cls.G, Cls.S, Cls.B) == (0, 1, 2, 3)


class Round(NamedTuple):
    """The per-round totals of Algorithm 1."""

    q_g: float  # Q_G = Σ_G q_i (≥ 0)
    q_b: float  # Q_B = Σ_B q_i (≤ 0)
    r_g: float  # R_G = Σ_G r_i
    r_b: float  # R_B = Σ_B r_i
    satisfied: int  # |S|


@dataclass(slots=True)
class Workspace:
    """Scratch arrays of Algorithm 1 for n slots, allocated once per membership."""

    q: FloatArray
    x: FloatArray
    y: FloatArray
    limit: FloatArray  # the limits in force, first limits filled in
    valid: BoolArray
    used: BoolArray
    g: BoolArray
    s: BoolArray
    b: BoolArray

    @classmethod
    def sized(cls, n: int) -> Workspace:
        def flags() -> BoolArray:
            return np.zeros(n, dtype=bool)

        return cls(q=np.zeros(n), x=np.zeros(n), y=np.zeros(n), limit=np.zeros(n),
                   valid=flags(), used=flags(), g=flags(), s=flags(), b=flags())


def masked_sum(values: FloatArray, mask: BoolArray, scratch: FloatArray) -> float:
    """Σ values[mask], through scratch: masked reductions and ufuncs (`where=`) run several
    times slower per element than a plain copy and sum (np.putmask: half the cost of
    np.copyto with `where=`)."""
    scratch.fill(0.0)
    np.putmask(scratch, mask, values)
    return float(scratch.sum())


def classify_into(target: FloatArray, measured: FloatArray, usage: FloatArray, *,
                  alpha: float, ws: Workspace, classes_out: Int8Array) -> Round:
    """Algorithm 1's first step over n slots: q_i into ws.q, the masks ws.valid, ws.used,
    ws.g, ws.s, ws.b, the Cls codes into classes_out, and the class totals. A slot is valid
    (classified) when q_i and its usage are finite. Allocates no arrays."""
    q, x, y, valid, used, g, s, b = ws.q, ws.x, ws.y, ws.valid, ws.used, ws.g, ws.s, ws.b
    # NaN compares false, so only the valid mask keeps idle slots out of G and B.
    np.subtract(target, measured, out=q)
    np.isfinite(q, out=valid)
    np.isfinite(usage, out=used)
    np.logical_and(valid, used, out=valid)
    np.multiply(target, alpha, out=x)  # the tolerance alpha·o
    np.greater(q, x, out=g)
    np.logical_and(g, valid, out=g)
    np.negative(x, out=x)
    np.less(q, x, out=b)
    np.logical_and(b, valid, out=b)
    np.logical_or(g, b, out=s)
    np.logical_xor(s, valid, out=s)  # valid and neither G nor B (G and B lie inside valid)

    # The codes as sums of the masks, viewed as int8 (three masked copies cost several times
    # more): IDLE 0 off valid, and on it G 1, S 1 + 1, B 1 + 2.
    np.add(valid.view(np.int8), s.view(np.int8), out=classes_out)
    np.add(classes_out, b.view(np.int8), out=classes_out)
    np.add(classes_out, b.view(np.int8), out=classes_out)
    return Round(q_g=masked_sum(q, g, y), q_b=masked_sum(q, b, y),
                 r_g=masked_sum(usage, g, y), r_b=masked_sum(usage, b, y),
                 satisfied=int(np.count_nonzero(s)))


def algorithm1_into(
    target: FloatArray, measured: FloatArray, usage: FloatArray, limit: FloatArray, *,
    alpha: float, beta: float, ws: Workspace, limits_out: FloatArray, classes_out: Int8Array,
) -> Round:
    """DQoES Algorithm 1 over n slots, written into limits_out, classes_out and ws.q (= q_i).
    All arrays have shape (n,); limits_out may be `limit` (each slot reads only its own
    limit, before writing it). Allocates no arrays."""
    q, x, y, used, g, b = ws.q, ws.x, ws.y, ws.used, ws.g, ws.b
    n = q.shape[0]
    totals = classify_into(target, measured, usage, alpha=alpha, ws=ws, classes_out=classes_out)

    # Each class's new limit is computed for every slot, then copied where the class holds.
    np.copyto(limits_out, limit)  # S and idle keep theirs
    if totals.q_g > 0.0:  # G is not empty
        np.minimum(limit, usage, out=x)  # the limit that binds
        np.multiply(q, -totals.r_g * beta / totals.q_g, out=y)
        np.add(y, 1.0, out=y)
        np.multiply(x, y, out=x)
        np.maximum(x, 0.5 / n, out=x)
        np.putmask(limits_out, g, x)
    if totals.q_b < 0.0:  # B is not empty
        # The factor 1 + (q_i/Q_B)·R_G·β is ≥ 1 (q_i and Q_B are both < 0); with no G, the
        # idle CPU is added by the same shares.
        idle = T_R - masked_sum(usage, used, y) if totals.q_g == 0.0 else 0.0
        np.multiply(q, totals.r_g * beta / totals.q_b, out=y)
        np.add(y, 1.0, out=y)
        np.multiply(limit, y, out=y)
        if idle > 0.0:
            np.multiply(q, idle / totals.q_b, out=x)
            np.add(y, x, out=y)
        np.minimum(y, T_R, out=y)
        np.putmask(limits_out, b, y)
    return totals


def algorithm1(
    target: npt.ArrayLike, measured: npt.ArrayLike, usage: npt.ArrayLike,
    limit: npt.ArrayLike, alpha: float = 0.10, beta: float = 0.10,
) -> tuple[FloatArray, Int8Array, Round]:
    """Algorithm 1 on fresh arrays (tests, benchmarks): (new limits, classes, totals)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in (target, measured, usage, limit)]
    n = arrays[0].shape[0]
    limits, classes = np.empty(n), np.empty(n, dtype=np.int8)
    totals = algorithm1_into(*arrays, alpha=alpha, beta=beta, ws=Workspace.sized(n),
                             limits_out=limits, classes_out=classes)
    return limits, classes, totals


def classify(target: npt.ArrayLike, measured: npt.ArrayLike, alpha: float = ALPHA,
             open_loop: npt.ArrayLike | None = None) -> Int8Array:
    """Each container's class (Cls codes) at these latencies, as Algorithm 1 sees them, and
    as dqoesd's admit classes a service whose requests arrive on their own (`open_loop`):
    faster than its band, satisfied (README, "What satisfied means"). For reports and
    experiments, which have latencies but no limits to move."""
    zeros = np.zeros(np.shape(target))
    classes = algorithm1(target, measured, zeros, zeros, alpha=alpha)[1]
    if open_loop is not None:
        classes[np.asarray(open_loop, bool) & (classes == Cls.G)] = Cls.S
    return classes


def first_limits_into(obs: Observation, ws: Workspace) -> FloatArray:
    """obs.limit with a first limit for each container the loop never limited that measured
    something: max(its usage share, the even share), at most T_R. Written into ws.limit."""
    limit, first = ws.limit, ws.valid
    np.copyto(limit, obs.limit)
    np.isnan(limit, out=first)
    np.isfinite(obs.measured, out=ws.used)
    np.logical_and(first, ws.used, out=first)
    if first.any():  # rare: once per container
        np.fmax(obs.usage, T_R / max(limit.shape[0], 1), out=ws.x)
        np.minimum(ws.x, T_R, out=ws.x)
        np.putmask(limit, first, ws.x)
    return limit


class Listener:
    """DQoES Algorithm 2: when the next round is due, with exponential back-off."""

    def __init__(self, iv_initial: float = IV_INITIAL_S, iv_max: float = IV_MAX_S) -> None:
        if not 0.0 < iv_initial <= iv_max < math.inf:
            raise ValueError(f"need 0 < iv_initial <= iv_max < inf, got {iv_initial}, {iv_max}")
        self.iv_initial = iv_initial
        self.iv_max = iv_max
        self.reset()

    def reset(self) -> None:
        """Back to IV_initial, forget the series, and be due at once."""
        self._interval = self.iv_initial
        self._streak = 0  # the paper's i: shrinking rounds in a row
        self._last: tuple[float, float, int] | None = None  # (Q_G, Q_B, |S|) of the last round
        self.next_run = -math.inf

    @property
    def interval(self) -> float:
        return self._interval

    def observe(self, q_g: float, q_b: float, satisfied: int) -> bool:
        """Feed one round's (Q_G, Q_B, |S|). True when the steady state broke (|S| fell):
        the interval went back to IV_initial."""
        last, self._last = self._last, (q_g, q_b, satisfied)
        if last is not None and q_g < last[0] and q_b > last[1]:
            self._streak += 1
            if self._streak > 2:
                self._interval = min(2.0 * self._interval, self.iv_max)
                self._streak = 0
            return False
        self._streak = 0
        if last is not None and satisfied < last[2]:
            self._interval = self.iv_initial
            return True
        return False

    def schedule(self, now: float) -> None:
        """A round ran at `now`: the next is due one interval later."""
        self.next_run = now + self._interval

    def due(self, now: float) -> bool:
        return now >= self.next_run


class DQoES:
    """The DQoES policy: Algorithm 1 each round, Algorithm 2 to space the rounds."""

    name = "dqoes"

    def __init__(self, alpha: float = ALPHA, beta: float = BETA,
                 iv_initial: float = IV_INITIAL_S, iv_max: float = IV_MAX_S) -> None:
        if not 0.0 <= alpha < math.inf:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"beta must be in (0, 1], got {beta}")
        self.alpha = alpha
        self.beta = beta
        self.listener = Listener(iv_initial, iv_max)
        self.resize(0)

    def resize(self, n: int, carried: IndexArray | None = None) -> None:
        """n slots from now on; DQoES keeps nothing per container, so `carried` is unused."""
        self._ws = Workspace.sized(n)
        self._decision = Decision(limits=np.zeros(n), classes=np.zeros(n, dtype=np.int8),
                                  score=self._ws.q, pressure=np.zeros(n, bool))  # never used
        self.reset()

    def reset(self) -> None:
        self.listener.reset()

    @classmethod
    def from_params(cls, params: PolicyParams) -> DQoES:
        return cls(params.alpha, params.beta, params.iv_initial, params.iv_max)

    def due(self, now: float) -> bool:
        return self.listener.due(now)

    def decide(self, obs: Observation, now: float) -> Decision | None:
        if not self.listener.due(now):
            return None
        d = self._decision
        n = d.limits.shape[0]
        for a in (obs.target, obs.measured, obs.usage, obs.limit):
            if a.shape != (n,):
                raise ValueError(f"observation arrays must have shape ({n},), got {a.shape}")
        limit = first_limits_into(obs, self._ws)
        totals = algorithm1_into(obs.target, obs.measured, obs.usage, limit,
                                 alpha=self.alpha, beta=self.beta, ws=self._ws,
                                 limits_out=d.limits, classes_out=d.classes)
        self.listener.observe(totals.q_g, totals.q_b, totals.satisfied)
        self.listener.schedule(now)
        d.totals = totals._asdict()
        d.interval = self.listener.interval
        return d
