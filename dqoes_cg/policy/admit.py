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
CFS gave it), and the share at which it meets its target is w_i / o_i. An open-loop service
(requests arriving at their own pace, lambda_i per second) is not one: at a low load it is
faster than its target and idle between requests, so r_i · p_i is far under the work of a
request. Its work per request is measured directly, s_i = r_i / lambda_i (usage over the
window's request rate), and its latency at a cap c follows from a queue (below). Which one a
container is, the window tells by Little's law: rate x latency is the mean number of
requests in the container, as many as its threads for a back-to-back worker, under
OPEN_CONCURRENCY only for a service that sat idle; so are one under its cap with idle CPU
around whose threads were not busy (running or waiting for a CPU under THREADS_SPEED of a
CPU, or of its cap if less, per request in flight: not its threads' limit, its arrivals'; a
cap above a worker's threads does not bind, and a loaded or emulated CPU gives each thread
less than a whole CPU, and less than its cap under one), and one whose queue grows
at its cap. Once seen, a container stays an open-loop service
until it looks back-to-back (at its cap, a whole number of requests in flight, at most
THREADS_MAX of them, none queueing) CLOSED_WINDOWS windows in a row: one window's noise
may make a worker look open; a queue of hundreds that its cap barely serves is within 10%
of a whole number too.
Each window's value (w_i or s_i) is smoothed in logs:

    d_i  = log(work_i) - nu - lw_i
    lw_i += g_i · d_i        v_i = (1 - g_i) v_i + g_i · d_i²        g_i = max(1/k_i, GAIN)

with k_i the windows since lw_i was last set: the running mean of the windows since then,
an exponential average once there are 1/GAIN of them. nu is the node's speed: every request
of a node costs more at once when its CPUs slow down (frequency, a noisy neighbour, the
host of a virtual machine), so the median deviation of the containers followed (NODE_MIN or
more) moves nu, not each lw_i, and its change from window to window is the node's own
scatter: a slow-down scales every need, the admitted set and each container's scatter
stay. A deviation |d_i| > max(JUMP_Z √v_i, JUMP_MIN) is an outlier, and the window is left
out; two in a row on the same side are a change of load (work per request doubling), not
noise, and lw_i is set to the new value at once (k_i = 1). A single outlier is typically
the window right after the container's cap changed, whose first requests ran partly at the
old cap. √v_i is the measured scatter of the container's log work: its noise.

The queue
---------
An open-loop service served one request at a time at its cap c (one CPU at most) is busy a
fraction rho = lambda s / c, and its mean latency is x (1 + K rho / (1 - rho)) with x = s / c
(Pollaczek-Khinchine; K = (1 + cv²) / 2: 1/2 for requests of constant work, 1 for M/M/1).
K_i is measured in every window where the service was capped and busy 15-95% of the time
(the latency statistic, the kernel's periods and the arrivals' burstiness all go into it),
QUEUE_PRIOR until then. The share at which the latency is L is s over the root of (K - 1)
lambda x² + (1 + lambda L) x - L = 0; with lambda = 0 it is s / L, a back-to-back worker's.
Where its queue grows at its cap, its own need counts OVERLOAD times the throughput as its
arrivals (they come faster than it serves them; its base, below, does not), found again once
its cap serves them. A service draining a queue (past QUEUE_GROWTH[0] in flight, that many
times fewer than a window ago) completes what had queued as well as its arrivals: that
window's count is not taken for its arrivals, which would raise its base past its need and
evict the admitted set while the queue drains.

Where in the band
-----------------
S is the band p in [o(1 - alpha), o(1 + alpha)]. A container is aimed inside it by a margin
mu_i = clip(MARGIN_Z √(v_i + v_nu), MARGIN_MIN, atanh alpha) of log work, its own scatter and
the node's from one window to the next:

    lean_i  = share at which work_i e^mu_i meets o_i (1 + alpha)    the least share
    comfy_i = share at which work_i meets o_i √(1 - alpha²)          the middle of the band
              (open loop: o_i (1 - alpha) e^mu_i, its fast edge)

(for a back-to-back worker (w_i/o_i) e^mu_i / (1 + alpha) and (w_i/o_i) / √(1 - alpha²)). On a
quiet host mu is small, and a container admitted at its lean share costs 10% less than at
the middle: that is what lets the last container in when CPU is scarce. The noisier the
measurements, the nearer the middle; at a scatter of alpha/2 and more, the middle itself.
Where many containers are that noisy, the middle costs the last one its place, so a round
whose margins would reach past REACH[1] of the way plans a second time with every margin
bound there, nearer the slow edges, where more may fit. Each plan is judged by how many
containers a window is expected to find in S under its caps: each known one's latency at
its cap (a queue's at its arrivals for an open-loop service), log-normal with its work's
scatter and the node's (a queue's amplified near its knee), against its band (a service's
slow edge alone). The other plan than last round's is taken for REACH_SWITCH more, so that
the admitted set does not flip on small changes. An
open-loop service's window latency scatters by tens of percent with its queue's chance
(fewer the faster it is served), so its spare goes towards its band's fast edge, and
beyond it what no other admitted container needs (below): faster, it is still in S.

The knee: an open-loop service is never aimed busier than RHO_MAX of its cap (lean_i is at
least lambda work e^mu / RHO_MAX), where its latency rises as 1/(1 - rho) and a few percent
more work or arrivals take it far out of its band. None is capped busier than RHO_FLOOR: its
base b_i = max(f, lambda work e^m / RHO_FLOOR), m = √(ln(1 + 2/√N)² + mu²) the margins of
its rate (two standard errors of its request count N) and of its work (mu uncapped) in
quadrature, replaces the floor below. An open-loop service faster than its
band is classed S: its users wait no longer than its target allows, and the CPU it holds
beyond its need is what the admission charges it (README, "What satisfied means").

The usable maximum
------------------
A single-threaded worker cannot use two CPUs, whatever its cap. A container that used less
than (1 - SLACK) of its cap (the budget if unlimited), where the CPU it left was mostly idle
(at most twice the node's idle CPU, so that CFS did not give it to others) and it waited
for a CPU through at most half of what it left (its tasks' time runnable but not running:
cpu.pressure, where the loop measures it), has shown the most it can use:
m_i = r_i (a back-to-back worker's threads; an open-loop service's idle CPU is its
arrivals', not a maximum, and one found to be a service forgets what it learned while it
looked back-to-back). One that uses more than its m_i raises it. Unknown: T_R. The
pressure tells a worker at its maximum from one that could run more but waited: on a real
node the scheduler does not always place a task where the idle CPU is (a worker sharing a
CPU with throttled neighbours), and CPU used outside the containers is not idle.

Only that rule reads the pressure, so the loop gives it to the policy only where the
decision asks for it (Decision.pressure; the loop reads every container's pressure files
at each window's end anyway, for status, but a reading of the CPU's at the decision is
taken only for these): the services that used less than
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
shares it can have, lean_i <= m_i; its cost is what it needs beyond its base (its floor,
or what its arrivals need), c_i = lean_i - b_i, negative when its need is under the base
(it frees budget). With the budget E = T_R - Σ_known b_i - (what the idle slots hold; if the
bases do not fit in it, each keeps f and the same fraction of what it asks beyond f), the
admitted set A is the longest run of the
cheapest whose costs fit, Σ_A c_i <= E (the negative costs first, all of them: they only
free budget): when each container counts one, cheapest first is optimal. In the order (not
the sum), a container admitted last round counts its cost INCUMBENT (10% of its size) lower,
so that a newcomer displaces it only by being clearly cheaper and noise does not swap
containers in and out of S.

Allocation: caps are guarantees
-------------------------------
    i in A:          L_i = lean_i + theta (t_i - lean_i)   t_i = min(comfy_i, m_i)
                                                        theta = min(1, R / Σ_A (t_i - lean_i))
    i in A, open:    L_i += min(u_i, kappa)              u_i = (min(lambda_i work_i e^mu_i /
                                                                SPARE_RHO, m_i) - L_i)+
                     kappa: Σ min(u_i, kappa) = what theta left of R
    i known, not A:  L_i = b_i + min(h_i, lambda)       h_i = min(max(comfy_i, b_i),
                                                                  m_i (1 + PROBE), T_R) - b_i
                     lambda: Σ min(h_i, lambda) = what A left of R (max h_i if all fits)
    idle:            L_i unchanged, raised to f if under it

R = E - Σ_A c_i is what the admitted leave. It first moves them from their lean share towards
the middle of the band (robustness), then raises the admitted open-loop services until
their arrivals keep them busy at most SPARE_RHO of their cap (a service faster than its band
is in S, and one further from its knee rides out a burst, a costlier request or the drift:
after a departure, what it freed had gone to hopeless workers while the services stayed at
their knee and left S at every burst), then goes to the containers that cannot be satisfied,
each up to its middle share or what it can use: a max-min fair split, as CFS would share it,
so a hopeless container gets as close to its target as the spare CPU allows but never takes
what an admissible one needs, and no cap is larger than its container can use (plus the
probe: if it could use more after all, more threads, it does, and m_i follows). A container
whose need is under the floor (lean_i < f) and that can be in S is always admitted (its cost
is negative), at a cap under the floor. What nobody can use stays unallocated.

Σ L_i <= T_R, the idle slots' limits counted: caps that do not overlap are guarantees, each
container gets its cap whatever the others do. That ends the competition of capped B
containers under CFS, where caps above the fair share do not bind.

Almost whatever: caps that fill the node are not all delivered to single-threaded workers
(CFS places tasks by count, not by cap; the largest caps lose most: bench/results/packing.md).
A back-to-back worker bound by its cap (capped under what its threads can use, not held
back by them, in a window whose caps were all set and within the budget) measures the share
of its cap it got, usage / cap, smoothed in logs (DELIVERED_GAIN, believed down to
DELIVERED_MIN); its lean and middle shares and its usable maximum are divided by it, so its
cap, and its cost in the admission, are what deliver its need.

Readings and choices
--------------------
- Classes (G, S, B, idle) and q_i = o_i - p_i are DQoES's (classify_into), for status; they
  do not drive the limits.
- A valid window (DQoES's: finite target, latency and usage) with a positive target,
  latency and usage updates lw_i. A slot with no valid window or no estimate yet is idle:
  limit untouched, and it holds its limit (its usage if unlimited), at least f, out of E.
  One held under f (in S, at a need under the floor) is given f: it holds that much of E
  anyway, and a window without a reading may be one in which its cap starved it (a worker
  whose requests outlast the window, a service too throttled to answer its scrape), which
  an unchanged limit would go on doing for good.
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
    RHO_MAX,
    T_R,
    BoolArray,
    Cls,
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
OPEN_CONCURRENCY = 0.8  # fewer requests in flight on average (rate x latency): open loop
CLOSED_WINDOWS = 2  # an open-loop service that looks back-to-back this many windows in a row
QUEUE_GROWTH = (2.0, 1.25)  # ... or more than 2 in flight, 1.25 times as many as a window ago
OVERLOAD = 1.5  # arrivals of a service whose queue grows at its cap: its throughput times this
ARRIVALS_KEPT = 0.8  # each window's request count counts this much less the next window
ARRIVALS_Z = 2.0  # a base's arrival rate: this many standard errors above the count
THREADS_TOL = 0.10  # a whole number of requests in flight, within 10%: one per worker thread
# ... told from its neighbours only up to 1 / (2 THREADS_TOL) of them: past that every number
# is within 10% of a whole one, a queue of hundreds that its cap barely serves too.
THREADS_MAX = 1.0 / (2.0 * THREADS_TOL)
# A back-to-back worker's threads are busy: running or waiting for a CPU (its neighbours took
# it), at least this of a CPU (of its cap, under one) per request in flight (a loaded host's
# or an emulated CPU gives a thread less than a whole one, and less than its cap: 0.70-0.87
# of a cap of 0.49 CPU in the guest). An open-loop service served a request at a time at a
# busy fraction rho of its server (a CPU, or its cap) has rho + K rho² / (1 - rho) in
# flight: busy THREADS_SPEED of it per request and at least THREADS_SPEED of it would take
# K <= (1 - THREADS_SPEED)² / THREADS_SPEED² = 0.18, under any K believed.
THREADS_SPEED = 0.7
NODE_MIN = 3  # the node's speed is followed from this many containers' work on
STEADY = 0.10  # ... of those whose usage held within 10% (in logs) of the last window's
QUEUE_PRIOR = 1.0  # K of an open-loop service before it is measured (M/M/1's)
QUEUE_RANGE = (0.25, 8.0)  # the values of K believed
QUEUE_GAIN = 0.2  # the least smoothing gain of log K (the gain of log work if more)
DELIVERED_GAIN = 0.3  # the smoothing gain of the log of the share of its cap a worker got
DELIVERED_MIN = 0.7  # ... believed down to this share
QUEUE_RHO = (0.15, 0.95)  # K is measured in windows whose busy fraction is in this range
RHO_FLOOR = 0.95  # an open-loop service is never capped above this busy fraction
SPARE_RHO = 0.5  # what the admitted leave holds an admitted service at most this busy
REACH = (1.0, 0.5)  # a plan's margins reach at most this much of the way to the middle
REACH_SWITCH = 0.1  # the other plan is taken for this many more containers expected in S
_TIE = 1e-12  # per slot, so that equal costs are admitted in slot order


@dataclass(slots=True)
class Memory:
    """What the policy keeps per container from round to round."""

    log_work: FloatArray  # lw_i, log of work per request (share-seconds) at the node's
    #                       usual speed; NaN: not yet known
    log_var: FloatArray  # v_i, the scatter of log work per request, squared
    samples: FloatArray  # k_i, windows since lw_i was last set outright
    outlier: FloatArray  # the sign of the last window's deviation if it was an outlier, else 0
    usable: FloatArray  # m_i, the most it was seen able to use; NaN: not known
    admitted: BoolArray  # in A last round
    open: BoolArray  # seen idle between requests: an open-loop service
    arrived: FloatArray  # requests counted in its recent windows (each older one decayed)
    arrival_time: FloatArray  # ... over this many seconds: lambda_i = arrived / arrival_time
    backlog: BoolArray  # its queue grew at its cap in its last window
    looked_closed: FloatArray  # windows in a row that looked back-to-back
    in_flight: FloatArray  # its mean number of requests in flight in its last window
    usage: FloatArray  # its usage in its last window
    log_queue: FloatArray  # log K_i, its queueing factor (open loop); NaN: not measured
    log_delivered: FloatArray  # log of the share of its cap a worker bound by it gets

    @classmethod
    def sized(cls, n: int) -> Memory:
        return cls(np.full(n, np.nan), np.zeros(n), np.zeros(n), np.zeros(n),
                   np.full(n, np.nan), np.zeros(n, bool), np.zeros(n, bool),
                   np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool), np.zeros(n),
                   np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), np.zeros(n))

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
class NodeSpeed:
    """The node's speed as its containers' work per request shows it, in logs: nu, the offset
    of every container's work from its usual value, and the scatter of its change from one
    window to the next, squared."""

    log_speed: float = 0.0
    log_var: float = 0.0


@dataclass(slots=True)
class Scratch:
    """Per-round arrays, allocated once per membership."""

    x: FloatArray  # temporaries
    y: FloatArray
    z: FloatArray
    d: FloatArray  # d_i
    gain: FloatArray  # g_i
    bound: FloatArray  # the deviation beyond which load changed
    cap: FloatArray  # the limit in force, T_R where unlimited
    work: FloatArray
    margin: FloatArray
    aim: FloatArray  # a latency aimed at
    lam: FloatArray  # the arrival rate of open-loop services, 0 for back-to-back workers
    lean: FloatArray
    comfy: FloatArray
    knee: FloatArray  # an open-loop service's share at RHO_MAX
    base: FloatArray  # what each known container keeps at least: the floor, or its arrivals
    usable: FloatArray  # m_i, T_R where unknown
    delivered: FloatArray  # the share of its cap each gets (1: all of it)
    cost: FloatArray
    top: FloatArray
    head: FloatArray
    held: FloatArray  # what idle containers hold out of the budget
    share: FloatArray  # the share a container gets under a plan's limits
    log_latency: FloatArray  # ... its latency there, in logs
    sigma: FloatArray  # ... and that latency's scatter from window to window
    narrow_limits: FloatArray  # the limits of the plan with the narrower margins
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
    under: BoolArray  # used less than its cap could give it, and not for lack of CPU
    counted: BoolArray  # an open-loop service whose window's requests were its arrivals
    admissible: BoolArray
    admitted: BoolArray
    wide_admitted: BoolArray  # the admitted set of the plan with the wider margins
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


def median_into(values: FloatArray, mask: BoolArray, s: Scratch) -> float:
    """The median of values[mask] (at least one), through s.sorted: the two middle order
    statistics found in place (linear, where a sort is n log n)."""
    k = int(np.count_nonzero(mask))
    s.sorted.fill(math.inf)
    np.putmask(s.sorted, mask, values)
    middle = ((k - 1) // 2, k // 2)
    s.sorted.partition(middle)
    return 0.5 * float(s.sorted[middle[0]] + s.sorted[middle[1]])


def learn_into(obs: Observation, span: float, valid: BoolArray, mem: Memory,
               node: NodeSpeed, s: Scratch) -> None:
    """This window's kind of service, work per request, the node's speed, usable maximum and
    queueing factor into the memory."""
    est, fresh, jump, smooth, x, d, gain = s.est, s.fresh, s.jump, s.smooth, s.x, s.d, s.gain
    usage = obs.usage
    # est: a window that says something about the work: valid, latency and usage > 0.
    np.multiply(usage, obs.measured, out=x)  # r_i p_i: a back-to-back worker's work
    np.greater(x, 0.0, out=est)
    np.logical_and(est, valid, out=est)
    np.isnan(mem.log_work, out=fresh)
    np.copyto(s.cap, obs.limit)
    np.putmask(s.cap, np.isnan(s.cap, out=s.mask), T_R)
    under_into(obs, est, s)
    if obs.rate is not None:
        open_loop_into(obs, span, est, fresh, mem, s)
    np.logical_and(fresh, est, out=fresh)
    np.log(x, out=x, where=est)  # log of this window's work per request

    # The node's speed: the median deviation of the containers followed moves all of them
    # (a slower CPU makes every request cost more at once); each keeps its own scatter.
    # Only those whose usage held within STEADY of the last window's count: a request
    # costs more at a small share than at a large one (caches, the kernel's periods), so
    # containers whose CPU was taken for another's would read as a slower node.
    np.subtract(x, mem.log_work, out=d)
    np.subtract(d, node.log_speed, out=d)
    with np.errstate(divide="ignore", invalid="ignore"):  # an idle window: -inf, not steady
        np.divide(usage, mem.usage, out=s.y)
        np.log(s.y, out=s.y)
    np.abs(s.y, out=s.y)
    np.less_equal(s.y, STEADY, out=s.mask)  # NaN (no last window) compares false
    np.logical_and(s.mask, np.logical_not(fresh, out=s.jump), out=s.mask)
    np.logical_and(s.mask, est, out=s.mask)
    np.putmask(mem.usage, est, usage)
    if np.count_nonzero(s.mask) >= NODE_MIN:
        delta = median_into(d, s.mask, s)
        node.log_speed += delta
        node.log_var += GAIN * (delta * delta - node.log_var)
        np.subtract(d, delta, out=d)
    np.subtract(x, node.log_speed, out=x)  # the work at the node's usual speed

    np.sqrt(mem.log_var, out=s.bound)
    np.multiply(s.bound, JUMP_Z, out=s.bound)
    np.maximum(s.bound, JUMP_MIN, out=s.bound)
    np.abs(d, out=s.y)
    outlier = s.outlier
    np.greater(s.y, s.bound, out=outlier)  # NaN (fresh) compares false
    np.logical_and(outlier, est, out=outlier)
    np.logical_and(outlier, np.logical_not(fresh, out=s.mask), out=outlier)
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

    if obs.rate is not None:
        queue_into(obs, est, mem, s)
    usable_into(obs, est, mem, s)
    delivered_into(obs, est, mem, s)


def open_loop_into(obs: Observation, span: float, est: BoolArray, fresh: BoolArray,
                   mem: Memory, s: Scratch) -> None:
    """Which containers are open-loop services, their arrival rates, and this window's work
    of theirs into s.x (usage / rate) where they have one. By Little's law rate x latency is
    the mean number of requests in a container; a back-to-back worker always has as many as
    it has threads in service. Under OPEN_CONCURRENCY the service sat idle between requests;
    past QUEUE_GROWTH and growing at its cap, requests queue faster than it serves them:
    either way they arrive at their own pace. Fresh also marks the newly open: their work
    is counted in other terms from now on."""
    x, in_flight, newly, growing = s.x, s.y, s.jump, s.slack
    np.multiply(obs.rate, obs.measured, out=in_flight)
    np.multiply(s.cap, 1.0 - SLACK, out=s.z)
    np.greater_equal(obs.usage, s.z, out=growing)  # at its cap ...
    np.multiply(mem.in_flight, QUEUE_GROWTH[1], out=s.z)
    np.logical_and(growing, np.greater(in_flight, s.z, out=s.mask), out=growing)
    np.greater(in_flight, QUEUE_GROWTH[0], out=s.mask)
    np.logical_and(growing, s.mask, out=growing)  # ... and its queue grows
    np.less(in_flight, OPEN_CONCURRENCY, out=newly)  # NaN compares false
    np.logical_or(newly, growing, out=newly)
    if obs.cpus is not None:  # ... or under its cap with idle CPU, and not for its threads
        threads_busy_into(s.mask, obs.usage, obs.waited, s.cap, obs.cpus, in_flight, s.z, s.d)
        np.logical_not(s.mask, out=s.mask)
        np.logical_and(s.mask, s.under, out=s.mask)
        np.logical_or(newly, s.mask, out=newly)
    np.logical_and(newly, est, out=newly)
    np.logical_and(newly, np.logical_not(mem.open, out=s.mask), out=newly)
    np.logical_or(fresh, newly, out=fresh)
    np.logical_or(mem.open, newly, out=mem.open)
    np.putmask(mem.usable, newly, np.nan)  # its arrivals held it back, not its threads
    closed_again_into(obs, est, fresh, growing, mem, s)
    # Its arrivals are counted unless it drains a queue (past QUEUE_GROWTH[0] in flight, that
    # many times fewer than a window ago): it then completes what had queued as well.
    counted = s.counted
    np.multiply(in_flight, QUEUE_GROWTH[1], out=s.z)
    np.less(s.z, mem.in_flight, out=counted)  # NaN (none a window ago) compares false
    np.greater(in_flight, QUEUE_GROWTH[0], out=s.mask)
    np.logical_and(counted, s.mask, out=counted)  # draining
    np.putmask(mem.in_flight, est, in_flight)
    np.logical_and(mem.open, est, out=s.mask)
    np.greater(obs.rate, 0.0, out=newly)
    np.logical_and(s.mask, newly, out=s.mask)
    np.greater(s.mask, counted, out=counted)
    if span > 0.0:  # (a clock that went back tells nothing of the arrivals)
        arrivals_into(obs.rate, span, counted, mem, s)
    np.logical_and(growing, s.mask, out=growing)
    np.putmask(mem.backlog, est, growing)
    np.divide(obs.usage, obs.rate, out=x, where=s.mask)


def arrivals_into(rate: FloatArray, span: float, seen: BoolArray, mem: Memory,
                  s: Scratch) -> None:
    """The request counts of this window (`span` seconds) into each `seen` service's recent
    arrivals. A service receiving a request a second has a handful in a window, as Poisson
    counts scattering by their square root: the rate is the decayed sum of its windows'
    counts over the decayed sum of their lengths, unless this window's count is beyond
    JUMP_Z of those standard errors (its rate changed: counted afresh). Uses s.z, s.d,
    s.gain, s.outlier, s.jump."""
    count, expected = s.z, s.d
    np.multiply(rate, span, out=count)
    np.divide(mem.arrived, mem.arrival_time, out=expected)
    np.multiply(expected, span, out=expected)  # NaN: none counted yet
    np.subtract(count, expected, out=s.gain)
    np.abs(s.gain, out=s.gain)
    np.sqrt(expected, out=expected)
    np.multiply(expected, JUMP_Z, out=expected)
    np.add(expected, 1.0, out=expected)
    np.greater(s.gain, expected, out=s.outlier)
    np.logical_or(s.outlier, np.isnan(expected, out=s.jump), out=s.outlier)
    np.logical_and(s.outlier, seen, out=s.outlier)  # counted afresh
    np.multiply(mem.arrived, ARRIVALS_KEPT, out=s.gain)
    np.add(s.gain, count, out=s.gain)
    np.putmask(mem.arrived, seen, s.gain)
    np.putmask(mem.arrived, s.outlier, count)
    np.multiply(mem.arrival_time, ARRIVALS_KEPT, out=s.gain)
    np.add(s.gain, span, out=s.gain)
    np.putmask(mem.arrival_time, seen, s.gain)
    np.putmask(mem.arrival_time, s.outlier, span)


def threads_busy_into(out: BoolArray, usage: FloatArray, waited: FloatArray | None,
                      cap: FloatArray, cpus: float, in_flight: FloatArray, x: FloatArray,
                      y: FloatArray) -> None:
    """out: the CPUs it used, and those it waited for, are its threads busy with what is in
    flight, none queued: at least THREADS_SPEED of what a thread can be served at (one CPU,
    or its cap if less) per request in flight. Not its cap but its threads held it back,
    however much of a CPU each was given: a thread that waited for a CPU was busy, not idle
    (a back-to-back worker whose neighbours take the CPUs it may use). Uses x and y."""
    np.minimum(cap, 1.0 / cpus, out=x)
    np.multiply(x, THREADS_SPEED, out=x)
    np.fmax(in_flight, 1.0, out=y)  # NaN (unknown in flight): one
    np.multiply(x, y, out=x)
    if waited is None:
        np.copyto(y, usage)
    else:
        np.fmax(waited, 0.0, out=y)  # NaN (unknown): none; +inf (not read): busy
        np.add(y, usage, out=y)
    np.greater_equal(y, x, out=out)


def closed_again_into(obs: Observation, est: BoolArray, fresh: BoolArray,
                      growing: BoolArray, mem: Memory, s: Scratch) -> None:
    """An open-loop service that looked back-to-back CLOSED_WINDOWS windows in a row is one
    after all (one window's noise made it look open): at its cap or its threads busy
    (threads_busy_into), its queue not growing, a whole number of requests in flight
    (s.y), as a worker has one per thread. A service whose arrivals keep it at its cap has
    a queue of many, growing. Uses s.z, s.d, s.gain, s.jump."""
    looks, n = s.z, s.d
    np.rint(s.y, out=n)
    np.subtract(s.y, n, out=looks)
    np.abs(looks, out=looks)
    np.multiply(s.y, THREADS_TOL, out=s.gain)
    np.less_equal(looks, s.gain, out=s.mask)
    np.greater_equal(n, 1.0, out=s.outlier)
    np.logical_and(s.mask, s.outlier, out=s.mask)
    np.less_equal(n, THREADS_MAX, out=s.outlier)
    np.logical_and(s.mask, s.outlier, out=s.mask)
    np.multiply(s.cap, 1.0 - SLACK, out=looks)
    np.greater_equal(obs.usage, looks, out=s.outlier)  # at its cap, or its threads busy
    if obs.cpus is not None:
        threads_busy_into(s.jump, obs.usage, obs.waited, s.cap, obs.cpus, s.y, looks,
                          s.gain)
        np.logical_or(s.outlier, s.jump, out=s.outlier)
    np.logical_and(s.mask, s.outlier, out=s.mask)
    np.greater(s.mask, growing, out=s.mask)  # and not growing
    np.logical_and(s.mask, mem.open, out=s.mask)
    np.logical_and(s.mask, est, out=s.mask)
    np.add(mem.looked_closed, 1.0, out=mem.looked_closed, where=s.mask)
    np.greater(est, s.mask, out=s.outlier)  # a window that did not look it
    np.putmask(mem.looked_closed, s.outlier, 0.0)
    np.greater_equal(mem.looked_closed, CLOSED_WINDOWS, out=s.mask)
    np.putmask(mem.open, s.mask, False)
    np.putmask(mem.looked_closed, s.mask, 0.0)
    np.logical_or(fresh, s.mask, out=fresh)


def queue_into(obs: Observation, est: BoolArray, mem: Memory, s: Scratch) -> None:
    """K_i of each open-loop service whose window says it: capped (its cap, or one CPU if
    less, is the rate it is served at while busy: it serves a request at a time) and busy a
    fraction rho of it in QUEUE_RHO. Uses s.d. Its latency there is
    the service time x = work / cap times 1 + K rho / (1 - rho) (Pollaczek-Khinchine: K =
    (1 + cv²) / 2, 1/2 for a constant work, 1 for M/M/1; the latency statistic, the
    kernel's periods and the arrivals' own burstiness all go into the measured K)."""
    rho, q, ok, busy = s.y, s.z, s.mask, s.d
    np.copyto(busy, s.cap)
    if obs.cpus:  # one request at a time: served at one CPU at most
        np.minimum(busy, 1.0 / obs.cpus, out=busy)
    np.divide(obs.usage, busy, out=rho)
    np.greater_equal(rho, QUEUE_RHO[0], out=ok)
    np.logical_and(ok, np.less_equal(rho, QUEUE_RHO[1], out=s.slack), out=ok)
    np.logical_and(ok, np.isfinite(obs.limit, out=s.slack), out=ok)
    np.logical_and(ok, mem.open, out=ok)
    np.logical_and(ok, est, out=ok)
    # latency / x = p busy rate / usage; K = (that - 1) (1 - rho) / rho
    np.multiply(obs.measured, obs.rate, out=q)
    np.multiply(q, busy, out=q)
    np.divide(q, obs.usage, out=q, where=ok)
    np.subtract(q, 1.0, out=q)
    np.subtract(1.0, rho, out=s.x)
    np.multiply(q, s.x, out=q)
    np.divide(q, rho, out=q, where=ok)
    np.clip(q, *QUEUE_RANGE, out=q)
    np.log(q, out=q, where=ok)
    np.isnan(mem.log_queue, out=s.slack)  # its first measurement: taken as it is
    np.logical_and(s.slack, ok, out=s.slack)
    np.putmask(mem.log_queue, s.slack, q)
    np.subtract(q, mem.log_queue, out=q)
    np.maximum(s.gain, QUEUE_GAIN, out=s.x)
    np.multiply(q, s.x, out=q)
    np.add(mem.log_queue, q, out=mem.log_queue, where=ok)


def under_into(obs: Observation, est: BoolArray, s: Scratch) -> None:
    """s.under: used less than (1 - SLACK) of its cap (the budget if unlimited), and at
    least half of what it left was idle CPU (else CFS gave it to others: an unlimited
    newcomer, say), and it did not wait for a CPU through most of it. What held it back was
    its own: its threads (a back-to-back worker) or its arrivals (an open-loop service).
    Uses s.y and s.z."""
    under, usage, cap, x = s.under, obs.usage, s.cap, s.z
    idle = T_R - masked_sum(usage, np.isfinite(usage, out=s.mask), x)
    np.multiply(cap, 1.0 - SLACK, out=x)
    np.less(usage, x, out=under)
    np.subtract(cap, usage, out=x)  # what it left of its cap
    np.less_equal(x, 2.0 * idle, out=s.mask)
    np.logical_and(under, s.mask, out=under)
    if obs.waited is not None:  # ... and it did not wait for a CPU through most of it
        np.multiply(obs.waited, 2.0, out=s.y)
        np.greater(s.y, x, out=s.mask)  # NaN (unknown) compares false
        np.logical_not(s.mask, out=s.mask)
        np.logical_and(under, s.mask, out=under)
    np.logical_and(under, est, out=under)


def usable_into(obs: Observation, est: BoolArray, mem: Memory, s: Scratch) -> None:
    """m_i: a back-to-back worker under its cap (s.under) cannot use more than it used; one
    that uses more than its m_i raises it."""
    slack, usage = s.slack, obs.usage
    np.logical_not(mem.open, out=slack)
    np.logical_and(slack, s.under, out=slack)
    np.putmask(mem.usable, slack, usage)
    np.greater(usage, mem.usable, out=s.mask)  # NaN (unknown) compares false
    np.logical_and(s.mask, est, out=s.mask)
    np.putmask(mem.usable, s.mask, usage)


def delivered_into(obs: Observation, est: BoolArray, mem: Memory, s: Scratch) -> None:
    """The share of its cap that a back-to-back worker bound by it got (usage / cap, between
    DELIVERED_MIN and 1), smoothed in logs: capped, its cap under (1 - SLACK) of what its
    threads can use, and not held back by them (s.under). Caps that fill the node are
    not all delivered: CFS places single-threaded tasks by count, not by cap, and the
    largest caps lose most (bench/results/packing.md: 0.86-0.88 of the largest of five on
    two CPUs). Only in a window whose caps were guarantees: every slot capped, within the
    budget (an unlimited newcomer takes what it can). Uses s.y and s.slack."""
    if not np.isfinite(obs.limit, out=s.mask).all() or float(obs.limit.sum()) > T_R * (1 + 1e-9):
        return
    bound = s.slack
    np.fmin(mem.usable, T_R, out=s.y)  # NaN (unknown): T_R
    np.multiply(s.y, 1.0 - SLACK, out=s.y)
    np.less_equal(s.cap, s.y, out=bound)
    np.logical_and(bound, np.isfinite(obs.limit, out=s.mask), out=bound)
    np.greater(bound, s.under, out=bound)
    np.greater(bound, mem.open, out=bound)
    np.logical_and(bound, est, out=bound)
    np.divide(obs.usage, s.cap, out=s.y)
    np.clip(s.y, DELIVERED_MIN, 1.0, out=s.y)
    np.log(s.y, out=s.y)
    np.subtract(s.y, mem.log_delivered, out=s.y)
    np.multiply(s.y, DELIVERED_GAIN, out=s.y)
    np.add(mem.log_delivered, s.y, out=mem.log_delivered, where=bound)
    np.putmask(mem.log_delivered, mem.open, 0.0)


def service_time_into(out: FloatArray, latency: FloatArray, s: Scratch) -> None:
    """The service time x at which a server with arrivals s.lam and queueing factor s.z (K)
    has the mean latency L = `latency`: x (1 + K rho / (1 - rho)) = L with rho = lam x, the
    root in (0, 1/lam) of (K - 1) lam x² + (1 + lam L) x - L = 0, written so that it holds
    at K = 1 and lam = 0 too (x = L: a back-to-back worker); uses s.x and s.y."""
    lam_l = s.y
    np.multiply(s.lam, latency, out=lam_l)
    np.subtract(s.z, 1.0, out=out)
    np.multiply(out, lam_l, out=out)
    np.multiply(out, 4.0, out=out)  # 4 (K - 1) lam L
    np.add(lam_l, 1.0, out=lam_l)
    np.square(lam_l, out=s.x)
    np.add(out, s.x, out=out)
    np.sqrt(out, out=out)
    np.add(out, lam_l, out=out)  # (1 + lam L) + sqrt((1 + lam L)² + 4 (K - 1) lam L)
    np.divide(latency, out, out=out)
    np.multiply(out, 2.0, out=out)


def shares_into(target: FloatArray, alpha: float, floor: float, reach: float, mem: Memory,
                node: NodeSpeed, s: Scratch) -> float:
    """lean, comfy, knee, base, usable and cost of every known slot (s.known: valid, with a
    positive target and an estimate of its work), each margin reaching at most `reach` of
    the way to the middle of the band. Returns the largest margin before that bound."""
    known, margin = s.known, s.margin
    np.add(mem.log_work, node.log_speed, out=s.work)
    np.exp(s.work, out=s.work, where=known)  # at the node's present speed
    # mu: the container's own scatter and the node's from one window to the next.
    np.add(mem.log_var, node.log_var, out=margin)
    np.sqrt(margin, out=margin)
    np.multiply(margin, MARGIN_Z, out=margin)
    np.maximum(margin, MARGIN_MIN, out=margin)
    # An open-loop service's arrivals; none for a back-to-back worker, whose x is then L.
    # Its base (what it keeps unadmitted) is its arrivals' need at RHO_FLOOR, past which a
    # few percent more work or arrivals take its queue far past its target, with a margin
    # for the two errors of that product, independent and so in quadrature (added, they
    # kept services under the real oracle): its rate's, ARRIVALS_Z standard errors of its
    # count N, ln(1 + z / √N), and its work's whole scatter (mu uncapped: a band's width is
    # no bound there; a window of a few requests measures it coarsely).
    np.sqrt(mem.arrived, out=s.aim)
    np.greater(mem.arrived, 0.0, out=s.mask)
    np.divide(ARRIVALS_Z, s.aim, out=s.aim, where=s.mask)  # none counted: no error
    np.log1p(s.aim, out=s.aim)
    np.square(s.aim, out=s.aim)
    np.square(margin, out=s.x)
    np.add(s.aim, s.x, out=s.aim)
    np.sqrt(s.aim, out=s.aim)
    np.exp(s.aim, out=s.aim)
    largest = float(np.max(margin, where=known, initial=0.0))
    np.minimum(margin, reach * math.atanh(alpha), out=margin)
    np.exp(margin, out=margin)  # e^mu from here on
    np.divide(mem.arrived, mem.arrival_time, out=s.lam)
    np.putmask(s.lam, np.logical_not(mem.open, out=s.mask), 0.0)
    np.putmask(s.lam, np.isnan(s.lam, out=s.mask), 0.0)
    np.multiply(s.lam, s.aim, out=s.base)
    np.putmask(s.base, np.isnan(s.base, out=s.mask), 0.0)
    np.multiply(s.base, s.work, out=s.base)
    np.multiply(s.base, 1.0 / RHO_FLOOR, out=s.base)
    np.maximum(s.base, floor, out=s.base)
    np.multiply(s.work, margin, out=s.top)  # the work with its margin
    np.multiply(s.lam, s.top, out=s.knee)  # the CPU its arrivals need
    # Its own need: where its queue grew at its cap, the arrivals are more than it served.
    np.multiply(s.lam, OVERLOAD, out=s.x)
    np.putmask(s.lam, mem.backlog, s.x)
    np.exp(mem.log_queue, out=s.z)
    np.putmask(s.z, np.isnan(s.z, out=s.mask), QUEUE_PRIOR)
    # lean: the least share at which the work, mu above its estimate, meets the slow edge.
    np.multiply(target, 1.0 + alpha, out=s.aim)
    service_time_into(s.lean, s.aim, s)
    np.divide(s.top, s.lean, out=s.lean, where=known)
    # comfy: for the estimate itself, the middle of the band (in logs) for a back-to-back
    # worker; for an open-loop service its fast edge (and beyond it what is spare:
    # allocate_into): a window's mean latency scatters by tens of percent with the queue's
    # chance, much less the faster it is served.
    np.multiply(target, math.sqrt(1.0 - alpha * alpha), out=s.aim)
    np.multiply(target, 1.0 - alpha, out=s.x)
    np.multiply(s.x, margin, out=s.x)
    np.putmask(s.aim, mem.open, s.x)
    service_time_into(s.comfy, s.aim, s)
    np.divide(s.work, s.comfy, out=s.comfy, where=known)
    # knee: an open-loop service is never held busier than RHO_MAX of its cap in S.
    np.multiply(s.knee, 1.0 / RHO_MAX, out=s.knee)
    np.maximum(s.lean, s.knee, out=s.lean)
    np.maximum(s.comfy, s.lean, out=s.comfy)
    # A worker's caps deliver what it needs despite the packing shortfall it measured.
    np.exp(mem.log_delivered, out=s.delivered)
    np.divide(s.lean, s.delivered, out=s.lean)
    np.divide(s.comfy, s.delivered, out=s.comfy)
    np.divide(mem.usable, s.delivered, out=s.usable)
    np.fmin(s.usable, T_R, out=s.usable)  # NaN (unknown): T_R
    # An admitted container is held at its need (lean), under its base if that is where its
    # band is: its cost beyond the base, lean - base, is negative there (it frees budget).
    # admissible: lean ≤ m.
    np.subtract(s.lean, s.base, out=s.cost)
    adm = s.admissible
    np.less_equal(s.lean, s.usable, out=adm)
    np.logical_and(adm, known, out=adm)
    return largest


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
    # The negative costs (needs under the base) come first: the running sum falls, then
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


def allocate_into(limit_out: FloatArray, left: float, s: Scratch) -> None:
    """Limits of the known slots (others untouched in limit_out): the admitted from their
    lean share towards the middle of the band, the rest by water level over their base."""
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
    # Then the admitted open-loop services, up to the share their arrivals keep busy
    # SPARE_RHO of the time: faster than its band a service is still in S, and further from
    # its knee it rides out a burst, a costlier request or the drift, where a container that
    # cannot be satisfied gains nothing in S from that CPU.
    np.multiply(s.knee, RHO_MAX / SPARE_RHO, out=s.head)  # 0 for a back-to-back worker
    np.minimum(s.head, s.usable, out=s.head)
    np.subtract(s.head, s.x, out=s.head)
    np.maximum(s.head, 0.0, out=s.head)
    np.putmask(s.head, np.logical_not(adm, out=s.mask), 0.0)
    level = water_level(s.head, left, s)
    np.minimum(s.head, level, out=s.head)
    left -= masked_sum(s.head, adm, s.y)
    np.add(s.x, s.head, out=s.x)
    np.putmask(limit_out, adm, s.x)
    # The others known: up to their comfortable share, their usable maximum (probed) or T_R.
    np.logical_not(adm, out=other)
    np.logical_and(other, s.known, out=other)
    np.maximum(s.comfy, s.base, out=s.top)
    np.multiply(s.usable, 1.0 + PROBE, out=s.x)
    np.minimum(s.top, s.x, out=s.top)
    np.minimum(s.top, T_R, out=s.top)
    np.subtract(s.top, s.base, out=s.head)
    np.maximum(s.head, 0.0, out=s.head)
    np.putmask(s.head, np.logical_not(other, out=s.mask), 0.0)
    level = water_level(s.head, left, s)
    np.minimum(s.head, level, out=s.x)
    np.add(s.x, s.base, out=s.x)
    np.putmask(limit_out, other, s.x)


def fit_bases(room: float, floor: float, s: Scratch) -> None:
    """Bases of the known slots that add up to at most `room` (the budget less what the idle
    slots hold): where open-loop services' arrivals ask for more than that, each keeps the
    floor and the same fraction of what it asks beyond it (the node is overloaded: none of
    them can be held at its arrivals anyway)."""
    np.subtract(s.base, floor, out=s.x)
    beyond = masked_sum(s.x, s.known, s.y)
    n_known = int(np.count_nonzero(s.known))
    spare = room - n_known * floor
    if beyond > 0.0 and beyond > spare:
        np.multiply(s.x, max(spare, 0.0) / beyond, out=s.x)
        np.add(s.x, floor, out=s.base)
        np.subtract(s.lean, s.base, out=s.cost)


def normal_cdf_into(z: FloatArray, out: FloatArray) -> None:
    """Phi(z), the standard normal's distribution function, to within 2e-4 (the tanh form of
    Page 1977: numpy has no erf); out is not z."""
    np.square(z, out=out)
    np.multiply(out, 0.044715, out=out)
    np.add(out, 1.0, out=out)
    np.multiply(out, z, out=out)
    np.multiply(out, math.sqrt(2.0 / math.pi), out=out)
    np.tanh(out, out=out)
    np.add(out, 1.0, out=out)
    np.multiply(out, 0.5, out=out)


def expected_in_band(limits: FloatArray, target: FloatArray, alpha: float,
                     cpus: float | None, mem: Memory, node: NodeSpeed, s: Scratch) -> float:
    """How many known containers a window is expected to find in S under these limits:
    each one's latency at its cap (delivered; a queue's at its arrivals for an open-loop
    service, served one request at a time), scattered in logs as its work and the node's
    speed scatter from window to window, amplified by the queue near its knee, against its
    band (an open-loop service's slow edge alone: faster, it is in S). Reads s.work, s.lam
    and s.delivered as shares_into left them."""
    share, log_p, sigma, k = s.share, s.log_latency, s.sigma, s.z
    np.fmin(limits, T_R, out=share)
    np.multiply(share, s.delivered, out=share)
    if cpus:
        np.minimum(share, 1.0 / cpus, out=share, where=mem.open)
    np.divide(s.work, share, out=s.x, where=s.known)  # x: the service time
    np.multiply(s.lam, s.x, out=s.y)  # rho
    np.exp(mem.log_queue, out=k)
    np.putmask(k, np.isnan(k, out=s.mask), QUEUE_PRIOR)
    # latency = x (1 + K rho / (1 - rho)); its log's sensitivity to log x is
    # 1 + K rho / ((1 - rho)(1 - rho + K rho)).
    np.multiply(k, s.y, out=k)  # K rho
    np.subtract(1.0, s.y, out=s.d)  # 1 - rho
    np.greater(s.d, 0.0, out=s.mask)
    np.logical_and(s.mask, s.known, out=s.mask)
    np.divide(k, s.d, out=log_p, where=s.mask)
    np.add(log_p, 1.0, out=log_p)
    np.multiply(log_p, s.x, out=log_p)
    np.log(log_p, out=log_p, where=s.mask)
    np.putmask(log_p, np.logical_not(s.mask, out=s.mask), math.inf)  # past its knee
    np.add(s.d, k, out=s.gain)
    np.multiply(s.gain, s.d, out=s.gain)
    np.divide(k, s.gain, out=s.gain, where=s.known)
    np.fmax(s.gain, 0.0, out=s.gain)  # past the knee: its latency is infinite anyway
    np.add(s.gain, 1.0, out=s.gain)
    np.add(mem.log_var, node.log_var, out=sigma)
    np.sqrt(sigma, out=sigma)
    np.maximum(sigma, MARGIN_MIN, out=sigma)
    np.multiply(sigma, s.gain, out=sigma)
    # P(in S) = Phi((ln o(1 + alpha) - ln p) / sigma) - Phi((ln o(1 - alpha) - ln p) / sigma)
    np.log(target, out=s.x, where=s.known)
    np.subtract(s.x, log_p, out=s.x)
    np.add(s.x, math.log1p(alpha), out=s.y)
    np.divide(s.y, sigma, out=s.y)
    normal_cdf_into(s.y, share)  # P(under its slow edge)
    np.add(s.x, math.log1p(-alpha), out=s.d)
    np.divide(s.d, sigma, out=s.d)
    normal_cdf_into(s.d, log_p)  # P(under its fast edge)
    np.putmask(log_p, mem.open, 0.0)
    np.subtract(share, log_p, out=share)
    return masked_sum(share, s.known, s.x)


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
        self._node = NodeSpeed()
        self._last_round = -math.inf  # when the last round ran: the window's length
        self._reach = 0  # the index in REACH of last round's plan
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

    def _plan_into(self, limits: FloatArray, obs: Observation, floor: float,
                   room: float) -> None:
        """The admitted set (s.admitted) and the limits of one round: planned with the
        margins reaching REACH[0] of the way to the middle of the band and, where some would
        reach further than REACH[1], with them bound there too, which lets more containers
        in nearer their slow edge. The other plan than last round's is taken only if a
        window is expected to find REACH_SWITCH more containers in S under it, so that the
        admitted set does not flip on small changes."""
        s = self._s
        largest = self._plan_at(REACH[0], limits, obs, floor, room)
        if largest <= REACH[1] * math.atanh(self.alpha):
            self._reach = 0  # the two plans are the same
            return
        wide = expected_in_band(limits, obs.target, self.alpha, obs.cpus, self._mem,
                                self._node, s)
        np.copyto(s.wide_admitted, s.admitted)
        self._plan_at(REACH[1], s.narrow_limits, obs, floor, room)
        narrow = expected_in_band(s.narrow_limits, obs.target, self.alpha, obs.cpus,
                                  self._mem, self._node, s)
        if (narrow - wide if self._reach == 0 else wide - narrow) >= REACH_SWITCH:
            self._reach = 1 - self._reach
        if self._reach == 0:
            np.copyto(s.admitted, s.wide_admitted)
        else:
            np.copyto(limits, s.narrow_limits)

    def _plan_at(self, reach: float, limits: FloatArray, obs: Observation, floor: float,
                 room: float) -> float:
        """One plan (s.admitted, and the known slots' limits into `limits`) with the margins
        reaching at most `reach`; returns the largest margin before that bound."""
        s = self._s
        largest = shares_into(obs.target, self.alpha, floor, reach, self._mem, self._node, s)
        fit_bases(room, floor, s)
        budget = max(room - masked_sum(s.base, s.known, s.x), 0.0)
        left = admit_into(budget, self._mem, s)
        np.copyto(limits, obs.limit)
        allocate_into(limits, left, s)
        return largest

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
        span = now - self._last_round if math.isfinite(self._last_round) else 1.0
        self._last_round = now
        learn_into(obs, span, ws.valid, mem, self._node, s)
        floor = T_R / (2 * n) if n else 0.0
        np.greater(obs.target, 0.0, out=s.known)
        np.logical_and(s.known, ws.valid, out=s.known)
        np.logical_and(s.known, np.isfinite(mem.log_work, out=s.mask), out=s.known)
        # What the unknown (idle) slots hold: their limit, else their usage, at least f.
        held = s.held
        np.copyto(held, obs.limit)
        np.putmask(held, np.isnan(held, out=s.mask), obs.usage)
        np.fmax(held, floor, out=held)
        np.putmask(held, s.known, 0.0)
        room = T_R - float(held.sum())
        self._plan_into(d.limits, obs, floor, room)
        # An idle slot under the floor gets it (held out of E already); NaN (unlimited) stays.
        np.logical_not(s.known, out=s.mask)
        np.maximum(d.limits, floor, out=d.limits, where=s.mask)
        np.copyto(mem.admitted, s.admitted)
        # An open-loop service faster than its band is satisfied: its users wait no longer
        # than its target allows (README, "What satisfied means").
        np.logical_and(mem.open, ws.g, out=s.mask)
        np.putmask(d.classes, s.mask, np.int8(Cls.S))
        pressure_wanted(obs, d, s)
        self.listener.observe(totals.q_g, totals.q_b, totals.satisfied)
        self.listener.schedule(now)
        d.totals = {**totals._asdict(), "admitted": int(np.count_nonzero(s.admitted))}
        d.interval = self.listener.interval
        return d
