"""Admit: each container's CPU need from what it measures, containers admitted to S cheapest
first within the budget, and caps that add up to at most the budget (the loop's interface:
policy/base.py).

DQoES moves limits by small steps along the gaps; this policy computes where each limit
should be and puts it there. One round, with o_i the target, p_i the measured latency over
the window, r_i the CPU usage over the window (fractions of T_R), L_i the limit in force and
n the number of slots:

Work per request
----------------
A worker serving requests back to back at a share c of the budget takes p = w / c, so its
usage times its latency, w_i = r_i · p_i, is the same at any share (at any cap, and whatever
CFS gave it), and the share at which it meets its target is w_i / o_i. Each window's value
is smoothed in logs:

    d_i  = log(r_i p_i) - lw_i
    lw_i += g_i · d_i        v_i = (1 - g_i) v_i + g_i · d_i²        g_i = max(1/k_i, GAIN)

with k_i the windows since lw_i was last set: the running mean of the windows since then,
an exponential average once there are 1/GAIN of them. A deviation |d_i| > max(JUMP_Z √v_i,
JUMP_MIN) is an outlier, and the window is left out; two in a row on the same side are a
change of load (work per request doubling, a host slowing down), not noise, and lw_i is set
to the new value at once (k_i = 1). A single outlier is typically the window right after
the container's cap changed, whose first requests ran partly at the old cap. √v_i is the
measured scatter of the container's log latency: its noise.

Where in the band
-----------------
S is the band p in [o(1 - alpha), o(1 + alpha)], the shares [w/(o(1+alpha)), w/(o(1-alpha))].
A container is aimed inside it by a margin mu_i = clip(MARGIN_Z √v_i, MARGIN_MIN, atanh
alpha) of log latency from the slow edge (atanh alpha is half the band's width in logs):

    lean_i  = (w_i/o_i) e^mu_i / (1 + alpha)       the least share, mu_i from the slow edge
    comfy_i = (w_i/o_i) / √(1 - alpha²)            the middle of the band

On a quiet host mu is small, and a container admitted at its lean share costs 10% less than
at the middle: that is what lets the last container in when CPU is scarce. The noisier the
measurements, the nearer the middle; at a scatter of alpha/2 and more, the middle itself.

The usable maximum
------------------
A single-threaded worker cannot use two CPUs, whatever its cap. A container that used less
than (1 - SLACK) of its cap (the budget if unlimited), where the CPU it left was mostly idle
(at most twice the node's idle CPU, so that CFS did not give it to others) and it waited
for a CPU through at most half of what it left (its tasks' time runnable but not running:
cpu.pressure, where the loop measures it), has shown the most it can use:
m_i = r_i. One that uses more than its m_i raises it. Unknown: T_R. The pressure tells a
worker at its maximum from one that could run more but waited: on a real node the
scheduler does not always place a task where the idle CPU is (a worker sharing a CPU with
throttled neighbours), and CPU used outside the containers is not idle.

Only that rule reads the pressure, so the loop measures it (a system call per container)
only where the decision asks for it (Decision.pressure): the services that used less than
(1 - SLACK/2) of the cap the round leaves them (T_R if none), those that may use less than
(1 - SLACK) of it over the next window. A container at its cap that was not raised is not
read; should its own load drop under the cap within that window, its pressure is unknown
(+inf: as if it waited) and its maximum is learned one window later. A container whose cap
was raised is read at once, so a worker that cannot use the raise is told from one that
waited in the very next window.

Admission: the most containers in S
-----------------------------------
Every container not in S keeps at least the floor f = T_R / (2n), as under DQoES: none is
starved. A container in S is held at its need instead, under the floor if that is where its
band is: it is not starved there (it meets its target) and what it gives back of its floor
goes to the others. The evaluation's oracles count the same: each S container at the lower
edge of its band, every other at the floor. Container i can be in S when its band meets the
shares it can have, lean_i <= m_i; its cost is what it needs beyond its floor, c_i = lean_i
- f, negative when its need is under the floor (it frees budget). With the budget E = T_R -
n_known f - (what the idle slots hold), the admitted set A is the longest run of the
cheapest whose costs fit, Σ_A c_i <= E (the negative costs first, all of them: they only
free budget): when each container counts one, cheapest first is optimal. In the order (not
the sum), a container admitted last round counts its cost INCUMBENT (10% of its size) lower,
so that a newcomer displaces it only by being clearly cheaper and noise does not swap
containers in and out of S.

Allocation: caps are guarantees
-------------------------------
    i in A:          L_i = lean_i + theta (t_i - lean_i)   t_i = min(comfy_i, m_i)
                                                        theta = min(1, R / Σ_A (t_i - lean_i))
    i known, not A:  L_i = f + min(h_i, lambda)         h_i = min(max(comfy_i, f),
                                                                  m_i (1 + PROBE), T_R) - f
                     lambda: Σ min(h_i, lambda) = what A left of R (max h_i if all fits)
    idle:            L_i unchanged

R = E - Σ_A c_i is what the admitted leave. It first moves them from their lean share towards
the middle of the band (robustness), then goes to the containers that cannot be satisfied,
each up to its middle share or what it can use: a max-min fair split, as CFS would share it,
so a hopeless container gets as close to its target as the spare CPU allows but never takes
what an admissible one needs, and no cap is larger than its container can use (plus the
probe: if it could use more after all, more threads, it does, and m_i follows). A container
whose need is under the floor (lean_i < f) and that can be in S is always admitted (its cost
is negative), at a cap under the floor. What nobody can use stays unallocated.

Σ L_i <= T_R, the idle slots' limits counted: caps that do not overlap are guarantees, each
container gets its cap whatever the others do. That ends the competition of capped B
containers under CFS, where caps above the fair share do not bind.

Readings and choices
--------------------
- Classes (G, S, B, idle) and q_i = o_i - p_i are DQoES's (classify_into), for status; they
  do not drive the limits.
- A valid window (DQoES's: finite target, latency and usage) with a positive target,
  latency and usage updates lw_i. A slot with no valid window or no estimate yet is idle:
  limit untouched, and it holds its limit (its usage if unlimited), at least f, out of E.
- There is no special first limit: the first window (CFS's even share, or whatever a
  newcomer got) gives w_i, and the first round puts every container where it belongs.
- A container's memory (lw_i, v_i, k_i, m_i, admitted) follows it across a membership
  change when the loop says where it went (`resize(n, carried)`); otherwise it starts afresh.
- alpha is the band (0 <= alpha < 1); DQoES's step beta is not used: limits go to their
  computed value in one round. Rounds are spaced by DQoES's adaptive listener (Algorithm 2).

Why it is the daemon's default
------------------------------
DQoES stops short of the best possible |S| for four reasons, all visible in its traces: S
never gives back what it holds beyond its need; CPU flows to the largest gaps rather than
the cheapest wins (a hopeless container takes most of what G gives up); caps above the fair
share do not bind, so B containers split what they get evenly whatever their caps; and
steps of 1-3% a round take tens of rounds. Admit removes each: needs are computed, not
searched for; the cheapest are admitted first; caps are guarantees; limits move in one
round. In the evaluation (bench/experiments, summary.md) it reaches the oracle's |S| in
every simulated scenario, the paper's and ours (target changes, a load phase, departures,
a hopeless target, 20 containers on 4 CPUs, multi-threaded workers), within three rounds
of the last arrival or change; DQoES ends 1 to 14 below it in 19 of those 21 phases, after
tens to hundreds of rounds. With measurement noise admit stays within one of the oracle per
node (two in the short phases of one scenario) and is never below DQoES.

Hot path: `decide` writes into arrays preallocated by `resize` and allocates no arrays (the
admission sorts a preallocated copy of the keys in place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from .base import (
    ALPHA,
    IV_INITIAL_S,
    IV_MAX_S,
    T_R,
    BoolArray,
    Decision,
    FloatArray,
    IndexArray,
    Observation,
    PolicyParams,
)
from .dqoes import Listener, Workspace, classify_into, masked_sum

ComplexArray = npt.NDArray[np.complex128]

GAIN = 0.1  # the least smoothing gain of log work per request
JUMP_Z = 3.0  # a deviation beyond JUMP_Z scatters (and JUMP_MIN) is a change of load
JUMP_MIN = 0.10
MARGIN_Z = 2.0  # margin from the band's edges, in scatters of log latency
MARGIN_MIN = 0.005  # ... and at least this (model error, rounding): 0.5% of latency
SLACK = 0.10  # using less than 90% of its cap: the container cannot use more
WANT_PRESSURE = 1.0 - SLACK / 2  # its pressure is read if it used less than this of its cap
PROBE = 0.15  # a container held at its usable maximum m gets m (1 + PROBE)
INCUMBENT = 0.10  # an admitted container's cost counts 10% less in the admission order
_TIE = 1e-12  # per slot, so that equal costs are admitted in slot order


@dataclass(slots=True)
class Memory:
    """What the policy keeps per container from round to round."""

    log_work: FloatArray  # lw_i, log of work per request (share-seconds); NaN: not yet known
    log_var: FloatArray  # v_i, the scatter of log work per request, squared
    samples: FloatArray  # k_i, windows since lw_i was last set outright
    outlier: FloatArray  # the sign of the last window's deviation if it was an outlier, else 0
    usable: FloatArray  # m_i, the most it was seen able to use; NaN: not known
    admitted: BoolArray  # in A last round

    @classmethod
    def sized(cls, n: int) -> Memory:
        return cls(np.full(n, np.nan), np.zeros(n), np.zeros(n), np.zeros(n),
                   np.full(n, np.nan), np.zeros(n, bool))

    def carried(self, n: int, carried: IndexArray | None) -> Memory:
        """The memory of n new slots: slot i takes what old slot carried[i] had (-1: new)."""
        new = Memory.sized(n)
        if carried is None:
            return new
        carried = np.asarray(carried, dtype=np.intp)
        if carried.shape != (n,):
            raise ValueError(f"carried must have shape ({n},), got {carried.shape}")
        kept = carried >= 0
        for f in fields(Memory):
            getattr(new, f.name)[kept] = getattr(self, f.name)[carried[kept]]
        return new


@dataclass(slots=True)
class Scratch:
    """Per-round arrays, allocated once per membership."""

    x: FloatArray  # temporaries
    y: FloatArray
    d: FloatArray  # d_i
    gain: FloatArray  # g_i
    bound: FloatArray  # the deviation beyond which load changed
    cap: FloatArray  # the limit in force, T_R where unlimited
    work: FloatArray
    margin: FloatArray
    lean: FloatArray
    comfy: FloatArray
    usable: FloatArray  # m_i, T_R where unknown
    cost: FloatArray
    top: FloatArray
    head: FloatArray
    held: FloatArray  # what idle containers hold out of the budget
    sorted: FloatArray
    cums: FloatArray
    levels: FloatArray
    rest: FloatArray  # n-1, n-2, ..., 0
    tie: FloatArray
    keys: ComplexArray  # admission order (real) and cost (imaginary), sorted in place
    est: BoolArray
    known: BoolArray
    fresh: BoolArray
    outlier: BoolArray
    jump: BoolArray
    smooth: BoolArray
    slack: BoolArray
    admissible: BoolArray
    admitted: BoolArray
    other: BoolArray
    mask: BoolArray

    @classmethod
    def sized(cls, n: int) -> Scratch:
        dtypes = {"BoolArray": np.bool_, "ComplexArray": np.complex128}  # else float64
        s = cls(**{f.name: np.zeros(n, dtypes.get(str(f.type), np.float64))
                   for f in fields(cls)})
        s.rest[:] = np.arange(n - 1, -1, -1)
        s.tie[:] = np.arange(n) * _TIE
        return s


def water_level(head: FloatArray, total: float, s: Scratch) -> float:
    """The level λ ≥ 0 at which Σ min(head_i, λ) = total (max(head) if all of it fits): the
    max-min fair split of `total` among slots that can each take up to head_i ≥ 0."""
    n = head.shape[0]
    if total <= 0.0 or n == 0:
        return 0.0
    hs, cums, levels = s.sorted, s.cums, s.levels
    np.copyto(hs, head)
    hs.sort()
    np.cumsum(hs, out=cums)
    np.multiply(hs, s.rest, out=levels)
    np.add(levels, cums, out=levels)  # levels[j] = Σ min(head, hs[j]), non-decreasing
    j = int(np.searchsorted(levels, total))
    if j == n:
        return float(hs[-1])
    return float((total - (cums[j - 1] if j else 0.0)) / (n - j))


def learn_into(obs: Observation, valid: BoolArray, mem: Memory, s: Scratch) -> None:
    """This window's work per request and usable maximum into the memory."""
    est, fresh, jump, smooth, x, d, gain = s.est, s.fresh, s.jump, s.smooth, s.x, s.d, s.gain
    # est: a window that says something about the work: valid, latency and usage > 0.
    np.multiply(obs.usage, obs.measured, out=x)
    np.greater(x, 0.0, out=est)
    np.logical_and(est, valid, out=est)
    np.log(x, out=x, where=est)  # log(r_i p_i)
    np.isnan(mem.log_work, out=fresh)
    np.logical_and(fresh, est, out=fresh)
    np.subtract(x, mem.log_work, out=d)
    np.sqrt(mem.log_var, out=s.bound)
    np.multiply(s.bound, JUMP_Z, out=s.bound)
    np.maximum(s.bound, JUMP_MIN, out=s.bound)
    np.abs(d, out=s.y)
    outlier = s.outlier
    np.greater(s.y, s.bound, out=outlier)  # NaN (fresh) compares false
    np.logical_and(outlier, est, out=outlier)
    np.sign(d, out=s.y)
    np.equal(s.y, mem.outlier, out=jump)  # the second in a row on the same side
    np.logical_and(jump, outlier, out=jump)
    np.logical_or(jump, fresh, out=jump)  # set outright
    np.logical_or(outlier, jump, out=smooth)
    np.logical_not(smooth, out=smooth)
    np.logical_and(smooth, est, out=smooth)  # neither outlier nor set
    np.putmask(mem.outlier, est, 0.0)
    np.putmask(mem.outlier, outlier, s.y)
    np.putmask(mem.outlier, jump, 0.0)
    np.putmask(mem.log_work, jump, x)
    np.putmask(mem.samples, jump, 0.0)
    np.add(mem.samples, 1.0, out=mem.samples, where=est)
    np.maximum(mem.samples, 1.0, out=gain)
    np.divide(1.0, gain, out=gain)
    np.maximum(gain, GAIN, out=gain)  # g_i = max(1/k_i, GAIN)
    np.multiply(d, gain, out=s.y)
    np.add(mem.log_work, s.y, out=mem.log_work, where=smooth)
    np.square(d, out=d)
    np.subtract(d, mem.log_var, out=d)
    np.multiply(d, gain, out=d)
    np.add(mem.log_var, d, out=mem.log_var, where=smooth)
    np.putmask(mem.log_var, fresh, 0.0)

    # Usable maximum: it used less than (1 - SLACK) of its cap, and at least half of what
    # it left was idle CPU (else CFS gave it to others: an unlimited newcomer, say).
    slack, usage, cap = s.slack, obs.usage, s.cap
    idle = T_R - masked_sum(usage, np.isfinite(usage, out=s.mask), x)
    np.copyto(cap, obs.limit)
    np.putmask(cap, np.isnan(cap, out=s.mask), T_R)
    np.multiply(cap, 1.0 - SLACK, out=x)
    np.less(usage, x, out=slack)
    np.subtract(cap, usage, out=x)  # what it left of its cap
    np.less_equal(x, 2.0 * idle, out=s.mask)
    np.logical_and(slack, s.mask, out=slack)
    if obs.waited is not None:  # ... and it did not wait for a CPU through most of it
        np.multiply(obs.waited, 2.0, out=s.y)
        np.greater(s.y, x, out=s.mask)  # NaN (unknown) compares false
        np.logical_not(s.mask, out=s.mask)
        np.logical_and(slack, s.mask, out=slack)
    np.logical_and(slack, est, out=slack)
    np.putmask(mem.usable, slack, usage)
    np.greater(usage, mem.usable, out=s.mask)  # NaN (unknown) compares false
    np.logical_and(s.mask, est, out=s.mask)
    np.putmask(mem.usable, s.mask, usage)


def shares_into(target: FloatArray, alpha: float, floor: float, mem: Memory,
                s: Scratch) -> None:
    """lean, comfy, usable and cost of every known slot: s.known (valid, with a
    positive target) and with an estimate of its work."""
    known = s.known
    np.isfinite(mem.log_work, out=s.mask)
    np.logical_and(known, s.mask, out=known)
    np.exp(mem.log_work, out=s.work, where=known)
    np.sqrt(mem.log_var, out=s.margin)
    np.multiply(s.margin, MARGIN_Z, out=s.margin)
    np.maximum(s.margin, MARGIN_MIN, out=s.margin)
    np.minimum(s.margin, math.atanh(alpha), out=s.margin)
    np.divide(s.work, target, out=s.comfy, where=known)  # w/o, then each aim
    np.exp(s.margin, out=s.x)
    np.multiply(s.comfy, s.x, out=s.lean)
    np.multiply(s.lean, 1.0 / (1.0 + alpha), out=s.lean)
    np.multiply(s.comfy, 1.0 / math.sqrt(1.0 - alpha * alpha), out=s.comfy)
    np.fmin(mem.usable, T_R, out=s.usable)  # NaN (unknown): T_R
    # An admitted container is held at its need (lean), under the floor if that is where its
    # band is: its cost beyond the floor, lean - f, is negative there (it frees budget).
    # admissible: lean ≤ m.
    np.subtract(s.lean, floor, out=s.cost)
    adm = s.admissible
    np.less_equal(s.lean, s.usable, out=adm)
    np.logical_and(adm, known, out=adm)


def admit_into(budget: float, mem: Memory, s: Scratch) -> float:
    """The admitted set into s.admitted: the longest run, cheapest first (incumbents
    discounted), whose costs fit in `budget`. Returns what it leaves of the budget."""
    keys, adm = s.keys, s.admissible
    n = adm.shape[0]
    order = s.x
    np.copyto(order, s.cost)
    np.abs(order, out=s.y)  # an incumbent's cost counts INCUMBENT lower, whatever its sign
    np.multiply(s.y, INCUMBENT, out=s.y)
    np.subtract(order, s.y, out=order, where=mem.admitted)
    np.add(order, s.tie, out=order)
    keys.real.fill(math.inf)
    keys.imag.fill(0.0)
    np.copyto(keys.real, order, where=adm)
    np.copyto(keys.imag, s.cost, where=adm)
    keys.sort()  # by key, then cost: the admission order, with each one's cost
    np.cumsum(keys.imag, out=s.cums)
    # The negative costs (needs under the floor) come first: the running sum falls, then
    # rises; its running maximum is what the longest run that fits is searched in.
    np.maximum.accumulate(s.cums, out=s.cums)
    k = int(np.searchsorted(s.cums, budget * (1.0 + 1e-12) + 1e-15, side="right")) if n else 0
    k = min(k, int(np.count_nonzero(adm)))
    admitted = s.admitted
    if k == 0:
        admitted.fill(False)
        return budget
    np.less_equal(order, keys.real[k - 1], out=admitted)
    np.logical_and(admitted, adm, out=admitted)
    return budget - masked_sum(s.cost, admitted, s.y)


def allocate_into(limit_out: FloatArray, floor: float, left: float, s: Scratch) -> None:
    """Limits of the known slots (others untouched in limit_out): the admitted from their
    lean share towards the middle of the band, the rest by water level over the floor."""
    adm, other = s.admitted, s.other
    # Admitted: lean + θ (top - lean).
    np.minimum(s.comfy, s.usable, out=s.top)
    np.maximum(s.top, s.lean, out=s.top)
    np.subtract(s.top, s.lean, out=s.head)
    room = masked_sum(s.head, adm, s.x)
    theta = min(1.0, left / room) if room > 0.0 else 0.0
    left -= theta * room
    np.multiply(s.head, theta, out=s.x)
    np.add(s.x, s.lean, out=s.x)
    np.putmask(limit_out, adm, s.x)
    # The others known: up to their comfortable share, their usable maximum (probed) or T_R.
    np.logical_not(adm, out=other)
    np.logical_and(other, s.known, out=other)
    np.maximum(s.comfy, floor, out=s.top)
    np.multiply(s.usable, 1.0 + PROBE, out=s.x)
    np.minimum(s.top, s.x, out=s.top)
    np.minimum(s.top, T_R, out=s.top)
    np.subtract(s.top, floor, out=s.head)
    np.maximum(s.head, 0.0, out=s.head)
    np.putmask(s.head, np.logical_not(other, out=s.mask), 0.0)
    level = water_level(s.head, left, s)
    np.minimum(s.head, level, out=s.x)
    np.add(s.x, floor, out=s.x)
    np.putmask(limit_out, other, s.x)


def pressure_wanted(obs: Observation, d: Decision, s: Scratch) -> None:
    """d.pressure: the services whose usage over the window was under WANT_PRESSURE of the
    cap d.limits leaves them (T_R where none), the only ones that may be found under
    (1 - SLACK) of it at the next window's end, when learn_into reads their pressure."""
    assert d.pressure is not None
    np.fmin(d.limits, T_R, out=s.x)  # NaN (no limit): T_R
    np.multiply(s.x, WANT_PRESSURE, out=s.x)
    np.less(obs.usage, s.x, out=d.pressure)
    np.isfinite(obs.target, out=s.mask)  # a training job has no target: never read
    np.logical_and(d.pressure, s.mask, out=d.pressure)


class Admit:
    """The admission policy: needs from work per request, cheapest first, caps as guarantees."""

    name = "admit"

    def __init__(self, alpha: float = ALPHA, iv_initial: float = IV_INITIAL_S,
                 iv_max: float = IV_MAX_S) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        self.alpha = alpha
        self.listener = Listener(iv_initial, iv_max)
        self._mem = Memory.sized(0)
        self.resize(0)

    @classmethod
    def from_params(cls, params: PolicyParams) -> Admit:
        return cls(params.alpha, params.iv_initial, params.iv_max)

    def resize(self, n: int, carried: IndexArray | None = None) -> None:
        self._mem = self._mem.carried(n, carried)
        self._ws = Workspace.sized(n)
        self._s = Scratch.sized(n)
        self._decision = Decision(limits=np.zeros(n), classes=np.zeros(n, dtype=np.int8),
                                  score=self._ws.q, pressure=np.ones(n, bool))
        self.reset()

    def reset(self) -> None:
        self.listener.reset()

    def due(self, now: float) -> bool:
        return self.listener.due(now)

    def decide(self, obs: Observation, now: float) -> Decision | None:
        if not self.listener.due(now):
            return None
        d, s, mem, ws = self._decision, self._s, self._mem, self._ws
        n = d.limits.shape[0]
        for a in (obs.target, obs.measured, obs.usage, obs.limit):
            if a.shape != (n,):
                raise ValueError(f"observation arrays must have shape ({n},), got {a.shape}")
        totals = classify_into(obs.target, obs.measured, obs.usage, alpha=self.alpha, ws=ws,
                               classes_out=d.classes)
        learn_into(obs, ws.valid, mem, s)
        floor = T_R / (2 * n) if n else 0.0
        np.greater(obs.target, 0.0, out=s.known)
        np.logical_and(s.known, ws.valid, out=s.known)
        shares_into(obs.target, self.alpha, floor, mem, s)
        # What the unknown (idle) slots hold: their limit, else their usage, at least f.
        held = s.held
        np.copyto(held, obs.limit)
        np.putmask(held, np.isnan(held, out=s.mask), obs.usage)
        np.fmax(held, floor, out=held)
        np.putmask(held, s.known, 0.0)
        n_known = int(np.count_nonzero(s.known))
        budget = max(T_R - n_known * floor - float(held.sum()), 0.0)
        left = admit_into(budget, mem, s)
        np.copyto(d.limits, obs.limit)
        allocate_into(d.limits, floor, left, s)
        np.copyto(mem.admitted, s.admitted)
        pressure_wanted(obs, d, s)
        self.listener.observe(totals.q_g, totals.q_b, totals.satisfied)
        self.listener.schedule(now)
        d.totals = {**totals._asdict(), "admitted": int(np.count_nonzero(s.admitted))}
        d.interval = self.listener.interval
        return d
