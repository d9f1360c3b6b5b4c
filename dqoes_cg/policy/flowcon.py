"""FlowCon's worker side (the paper's section 5, Algorithms 1-3): training jobs share the CPU
by growth efficiency, the progress of their evaluation function per unit of CPU used.

A training job has no latency target: it reports its evaluation value E (a loss, an
accuracy) after its steps or epochs (`Probe.progress`), and the loop hands the policy, per
job, the value at the start and at the end of the interval (policy/base.py, Observation).

One round, over the training jobs of a worker
---------------------------------------------
    P_i = |E_i(t_i) - E_i(t_{i-1})| / (t_i - t_{i-1})     progress per second (Eq. 1)
    G_i = P_i / R_i                                       growth efficiency (Eq. 2), R_i its
                                                          CPU usage over the window

Algorithm 3, the threshold (from the lists as they stand, over the jobs with a measured G):
    alpha = -1                              every job is in CL
    alpha = (mean_NL G + mean_WL G) / 2     otherwise; an empty list's mean counts 0

Algorithm 1, the lists (skipped when alpha = -1), for each job with a measured G:
    G >= alpha:            to NL, from wherever it is
    G <  alpha, in NL:     to WL
    G <  alpha, in WL:     to CL        (in CL: stays)

Algorithm 1, the limits (fractions of the training budget; 1 = all of it):
    every job in CL:       1 for all: free competition; the interval doubles
    otherwise:             NL, WL: 1       CL: max(G_i / Σ G, 1/(2n))      n: the jobs

Algorithm 2, the listener: a job joining or leaving (any membership change, `resize`) puts
the interval back to its first value and runs a round at once; a new job joins NL. A
departed job's limit goes with it. The interval doubles (up to iv_max) after each round in
which every job is in CL, and is otherwise left as it is.

On their own (`FlowCon`, every slot a training job), a job's limit is its fraction of T_R
(at least T_R/(2n)), a cap as in the paper, which CFS shares out. Beside inference
services (policy/mixed.py), the jobs' caps must add up to the training budget B they are
given, so they are the shares CFS would give them with those caps on B CPUs: each job's
floor first, then a max-min fair split of the rest (`round_into` with `fill`).

Readings taken where the paper is loose
---------------------------------------
- The threshold is made of growth efficiencies, not of progress. The paper's Algorithm 3
  averages P_i while Algorithm 1 compares G_i = P_i/R_i with it: the outcome would then
  depend on the unit of R (a fraction of the worker, CPUs, percent: a factor of 100 moves
  every job to one side), and a job held at a small cap, whose G is large for its P, would
  be compared with the others' P. Both sides in G are unit-free, and G is what the lists
  rank: the slope of the job's curve per unit of CPU, whatever share it got.
- An empty list counts 0 in the threshold's mean. With one job in NL, alpha is half its G,
  the paper's one-container rule (half its per-second progress) in the same units: the
  general formula covers it. A list whose members have no measured G yet (a job that just
  joined, alone in NL) leaves the threshold undefined: no job changes list in that round,
  rather than being compared with a mean that counts the newcomer as 0.
- The floor of a CL job is 1/(2n), not the 1/n of the paper's text: at 1/n a CL job's cap
  is its even share, which CFS gives it anyway, and FlowCon would change nothing; the
  paper's own figure of its 3-job run shows the CL job at 25% beside one NL job (75%),
  which is 1/(2n) with n = 2. It is also DQoES's floor (policy/dqoes.py).
- Σ G runs over every job with a measured G, the CL job's own included. While a job in NL
  has no G yet (it just joined), the CL jobs get their floor: the newcomer is presumed to
  grow fast, as the paper's placement presumes, and as its 3-job run shows (the CL job is
  limited at once when the new one arrives), rather than the CL job's share being counted
  against the measured jobs alone (all of it, if it were the only one).
- WL keeps its limit: a job only enters WL from NL, whose limit is 1, so a WL job's limit
  is 1.
- A job without a measurement in the window (no new report, no usage, or a value or time
  that makes no sense) keeps its list and takes no part in the threshold or Σ G; in NL or
  WL its limit is 1 (no G needed), in CL the floor. A job that never reports stays in NL:
  it competes as a new job does.
- A job that has gone quiet (it reported before, but made no report and used no CPU in
  the window: it finished, or is stopped, in a cgroup that outlives it) is left out of the
  round, as the paper removes a finished job: it counts in no list, no n and no floor, its
  limit is left alone and its class is IDLE. Otherwise a finished job whose cgroup stays
  would keep its list for ever, and the last job running, in CL, would stay at the floor
  of n jobs, the CPU idle. When it reports again it joins NL, as a new job.
- "Free competition" when every job is in CL: every limit 1 on their own; beside inference
  services, the training budget shared evenly (the caps must add up to it).
- The interval's ceiling is the daemon's iv_max (the paper gives none); its first value is
  IV_initial, as for DQoES.
- The evaluation value is whatever the job reports, and only its changes count: a loss
  falling or an accuracy rising are progress alike.

Hostile input: a job's reports are its own measurement, like an inference container's
latencies. A job that lies about its progress can claim NL's share of the training budget,
no more: the floors of the other jobs and the inference services' budget stay.

Hot path: `round_into` writes into arrays preallocated by `resize` and allocates no arrays
(the water-fill sorts a preallocated copy in place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ..membership.objective import TRAINING_POLICY
from .base import (
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
from .dqoes import Listener, masked_sum

# The lists as int8 scalars: an IntEnum compared with an int8 array is cast in buffers.
NL, WL, CL, IDLE = (np.int8(c) for c in (Cls.NL, Cls.WL, Cls.CL, Cls.IDLE))


class Round(NamedTuple):
    """The per-round scalars of FlowCon."""

    threshold: float  # alpha of Algorithm 3 (-1: every job was in CL)
    growth_sum: float  # Σ G over the jobs with a measured G
    completing: int  # 1 when every job is in CL after the round (free competition), else 0
    training_budget: float  # what the training jobs' caps add up to at most (of T_R)


@dataclass(slots=True)
class Workspace:
    """Scratch arrays of one round for n slots, allocated once per membership."""

    progress: FloatArray  # P_i
    growth: FloatArray  # G_i
    nominal: FloatArray  # Algorithm 1's limit, a fraction of the training budget
    x: FloatArray
    ordered: FloatArray  # the water-fill's demands, sorted
    prefix: FloatArray  # ... their exclusive prefix sums
    level: FloatArray  # ... what the water-fill hands out at each candidate level
    ramp: FloatArray  # n - k at index k
    lists: Int8Array
    everyone: BoolArray  # all True: the training mask of a FlowCon on its own
    active: BoolArray  # the training jobs of the round: not gone quiet
    quiet: BoolArray
    valid: BoolArray  # a training job with a measured G
    low: BoolArray
    nl: BoolArray
    wl: BoolArray
    cl: BoolArray
    flag: BoolArray

    @classmethod
    def sized(cls, n: int) -> Workspace:
        def zeros() -> FloatArray:
            return np.zeros(n)

        def flags() -> BoolArray:
            return np.zeros(n, dtype=bool)

        return cls(progress=zeros(), growth=zeros(), nominal=zeros(), x=zeros(),
                   ordered=zeros(), prefix=zeros(), level=zeros(),
                   ramp=np.arange(n, 0, -1, dtype=np.float64), lists=np.zeros(n, np.int8),
                   everyone=np.ones(n, dtype=bool), active=flags(), quiet=flags(),
                   valid=flags(), low=flags(), nl=flags(),
                   wl=flags(), cl=flags(), flag=flags())


def _nan_unless(values: FloatArray, keep: BoolArray) -> None:
    """values[i] = NaN where not keep[i]; `keep` is negated in place (scratch)."""
    np.logical_not(keep, out=keep)
    np.copyto(values, np.nan, where=keep)


def progress_into(eval_prev: FloatArray, eval_prev_at: FloatArray, eval_last: FloatArray,
                  eval_last_at: FloatArray, out: FloatArray, scratch: FloatArray,
                  flag: BoolArray) -> None:
    """Eq. (1): P = |E(t_i) - E(t_{i-1})| / (t_i - t_{i-1}) per slot, NaN where it cannot be
    measured: a value or a time missing, no time between the two, or values so large that
    their difference is not finite. Allocates no arrays."""
    np.subtract(eval_last_at, eval_prev_at, out=scratch)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        np.greater(scratch, 0.0, out=flag)  # NaN compares false
        np.subtract(eval_last, eval_prev, out=out)
        np.abs(out, out=out)
        np.divide(out, scratch, out=out)
    _nan_unless(out, flag)
    np.isfinite(out, out=flag)
    _nan_unless(out, flag)


def growth_into(progress: FloatArray, usage: FloatArray, out: FloatArray,
                flag: BoolArray) -> None:
    """Eq. (2): G = P / R per slot, R the CPU used over the window (any unit: the lists
    compare G with G); NaN where either is not measured or no CPU was used."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        np.divide(progress, usage, out=out)
        np.greater(usage, 0.0, out=flag)
    _nan_unless(out, flag)
    np.isfinite(out, out=flag)
    _nan_unless(out, flag)


def threshold(growth: FloatArray, valid: BoolArray, nl: BoolArray, wl: BoolArray,
              flag: BoolArray, scratch: FloatArray) -> float:
    """Algorithm 3 over the jobs as listed before the round: -1 when none is in NL or WL;
    NaN (no list changes this round) when NL or WL has members but none with a measured G
    (a job that just joined); else (mean_NL G + mean_WL G) / 2 over the measured jobs, an
    empty list counting 0."""
    if not (nl.any() or wl.any()):
        return -1.0
    means = []
    for members in (nl, wl):
        np.logical_and(valid, members, out=flag)
        measured = int(np.count_nonzero(flag))
        if measured == 0 and members.any():
            return math.nan
        means.append(masked_sum(growth, flag, scratch) / measured if measured else 0.0)
    return (means[0] + means[1]) / 2.0


def water_fill_into(total: float, demand: FloatArray, out: FloatArray, ws: Workspace) -> None:
    """Max-min fair shares of `total` among `demand` (each >= 0, finite): out_i =
    min(demand_i, level), the level such that the shares add up to `total`, or every demand
    in full when they add up to less. Allocates no arrays (sorts a copy in place)."""
    n = demand.shape[0]
    if n == 0:
        return
    s, prefix, level = ws.ordered, ws.prefix, ws.level
    np.copyto(s, demand)
    s.sort()
    np.cumsum(s, out=prefix)
    np.subtract(prefix, s, out=prefix)  # Σ_{j<k} s_j
    np.multiply(s, ws.ramp, out=level)
    np.add(level, prefix, out=level)  # handed out at level s_k: nondecreasing in k
    total = max(total, 0.0)
    k = int(np.searchsorted(level, total))  # the first level that hands out enough
    if k >= n:
        np.copyto(out, demand)
    else:
        np.minimum(demand, (total - prefix[k]) / (n - k), out=out)


def lists_into(classes: Int8Array | None, mask: BoolArray, ws: Workspace) -> None:
    """Each training job's list as it stands: its class at the last decision, NL for a job
    that has none yet (Algorithm 2: a new job joins NL). Fills ws.lists, ws.nl, ws.wl and
    ws.cl (masked to the training jobs)."""
    lists, flag = ws.lists, ws.flag
    if classes is None:
        lists.fill(NL)
    else:
        np.copyto(lists, classes)
        np.less(lists, NL, out=flag)  # IDLE, or an inference class: not a list
        np.copyto(lists, NL, where=flag)
    _masks(mask, ws)


QUIET_USAGE = 1e-3
"""A job that used at most this share of T_R over a window used no CPU (an empty cgroup
reads a few microseconds at most)."""


def quiet_into(obs: Observation, mask: BoolArray, ws: Workspace) -> BoolArray:
    """The jobs of `mask` that have gone quiet (ws.quiet: reported before, no report and no
    CPU in the window) and those of the round (returned: ws.active, the rest of `mask`)."""
    assert obs.eval_prev is not None and obs.eval_last is not None
    quiet, flag = ws.quiet, ws.flag
    np.isnan(obs.eval_last, out=quiet)
    np.isfinite(obs.eval_prev, out=flag)
    np.logical_and(quiet, flag, out=quiet)
    with np.errstate(invalid="ignore"):
        np.less_equal(obs.usage, QUIET_USAGE, out=flag)
    np.logical_and(quiet, flag, out=quiet)
    np.logical_and(quiet, mask, out=quiet)
    np.logical_not(quiet, out=ws.active)
    np.logical_and(ws.active, mask, out=ws.active)
    return ws.active


def _masks(mask: BoolArray, ws: Workspace) -> None:
    for code, out in ((NL, ws.nl), (WL, ws.wl), (CL, ws.cl)):
        np.equal(ws.lists, code, out=out)
        np.logical_and(out, mask, out=out)


def round_into(obs: Observation, mask: BoolArray, ws: Workspace, limits_out: FloatArray,
               classes_out: Int8Array, score_out: FloatArray, *, budget: float, floor: float,
               fill: bool) -> Round:
    """One FlowCon round over the training jobs (`mask`) of `obs`: their lists into
    classes_out, their growth efficiencies into score_out and their caps (fractions of
    T_R) into limits_out; other slots are not written. `budget` is what the caps may add
    up to, `floor` each job's least cap. `fill`: the caps are max-min fair shares of the
    budget (beside inference services); else each job's limit times the budget, at least
    the floor (caps that CFS shares out). Jobs gone quiet are left out (quiet_into): class
    IDLE, score NaN, limit NaN (untouched). Allocates no arrays."""
    assert obs.eval_prev is not None and obs.eval_prev_at is not None
    assert obs.eval_last is not None and obs.eval_last_at is not None
    p, g, nominal, x, valid, low, flag = (ws.progress, ws.growth, ws.nominal, ws.x, ws.valid,
                                          ws.low, ws.flag)
    mask = quiet_into(obs, mask, ws)
    np.copyto(classes_out, IDLE, where=ws.quiet)
    np.copyto(score_out, np.nan, where=ws.quiet)
    np.copyto(limits_out, np.nan, where=ws.quiet)
    jobs = int(np.count_nonzero(mask))
    lists_into(obs.classes, mask, ws)
    progress_into(obs.eval_prev, obs.eval_prev_at, obs.eval_last, obs.eval_last_at, p, x,
                  flag)
    growth_into(p, obs.usage, g, flag)
    np.isfinite(g, out=valid)
    np.logical_and(valid, mask, out=valid)

    alpha = threshold(g, valid, ws.nl, ws.wl, flag, x)
    if alpha != -1.0 and not math.isnan(alpha):  # Algorithm 1, lines 2-13
        with np.errstate(invalid="ignore"):
            np.less(g, alpha, out=low)
        np.logical_and(low, valid, out=low)
        np.logical_and(ws.wl, low, out=flag)
        np.copyto(ws.lists, CL, where=flag)  # WL -> CL
        np.logical_and(ws.nl, low, out=flag)
        np.copyto(ws.lists, WL, where=flag)  # NL -> WL
        np.logical_xor(valid, low, out=flag)  # measured, G >= alpha
        np.copyto(ws.lists, NL, where=flag)  # -> NL
        _masks(mask, ws)
    completing = jobs > 0 and int(np.count_nonzero(ws.cl)) == jobs
    growth_sum = masked_sum(g, valid, x)

    # Algorithm 1, lines 14-26: the limits, fractions of the budget.
    nominal.fill(1.0)  # NL and WL; everyone when all are completing
    if not completing and ws.cl.any():
        least = 1.0 / (2 * jobs)
        np.logical_not(valid, out=flag)
        np.logical_and(flag, ws.nl, out=flag)
        if growth_sum > 0.0 and not flag.any():
            np.multiply(g, 1.0 / growth_sum, out=x)
            np.copyto(x, least, where=_negated(valid, flag))
            np.maximum(x, least, out=x)
        else:
            x.fill(least)
        np.copyto(nominal, x, where=ws.cl)

    # The caps, fractions of T_R.
    if fill:
        np.multiply(nominal, budget, out=x)
        np.subtract(x, floor, out=x)
        np.maximum(x, 0.0, out=x)
        np.copyto(x, 0.0, where=_negated(mask, flag))
        water_fill_into(budget - jobs * floor, x, nominal, ws)
        np.add(nominal, floor, out=nominal)
    else:
        np.multiply(nominal, budget, out=nominal)
        np.maximum(nominal, floor, out=nominal)
    np.copyto(limits_out, nominal, where=mask)
    np.copyto(classes_out, ws.lists, where=mask)
    np.copyto(score_out, g, where=mask)
    return Round(threshold=alpha, growth_sum=growth_sum, completing=int(completing),
                 training_budget=budget)


def _negated(mask: BoolArray, out: BoolArray) -> BoolArray:
    return np.logical_not(mask, out=out)


class BackOff(Listener):
    """FlowCon's interval (itval): IV_initial after a reset, doubled by `back_off` up to
    iv_max (DQoES's listener, with FlowCon's rule for doubling)."""

    def back_off(self) -> None:
        self._interval = min(2.0 * self._interval, self.iv_max)


class FlowCon:
    """FlowCon on its own: every slot a training job (or those obs.training marks), each
    limit its fraction of T_R, at least T_R/(2n)."""

    name = TRAINING_POLICY

    def __init__(self, iv_initial: float = IV_INITIAL_S, iv_max: float = IV_MAX_S) -> None:
        self.listener = BackOff(iv_initial, iv_max)
        self.resize(0)

    @classmethod
    def from_params(cls, params: PolicyParams) -> FlowCon:
        return cls(params.iv_initial, params.iv_max)

    def resize(self, n: int, carried: IndexArray | None = None) -> None:
        # Every job's curve starts afresh: a rebuild is rare beside a job's epochs.
        self.ws = Workspace.sized(n)
        self._decision = Decision(limits=np.full(n, np.nan),
                                  classes=np.zeros(n, dtype=np.int8), score=np.full(n, np.nan),
                                  pressure=np.zeros(n, bool))  # never used
        self.reset()

    def reset(self) -> None:
        self.listener.reset()

    @property
    def interval(self) -> float:
        return self.listener.interval

    def due(self, now: float) -> bool:
        return self.listener.due(now)

    def decide(self, obs: Observation, now: float) -> Decision | None:
        if not self.listener.due(now):
            return None
        d = self._decision
        n = d.limits.shape[0]
        mask = self.ws.everyone if obs.training is None else obs.training
        if mask.shape != (n,):
            raise ValueError(f"observation arrays must have shape ({n},), got {mask.shape}")
        d.limits.fill(np.nan)
        d.classes.fill(Cls.IDLE)
        d.score.fill(np.nan)
        totals = self.run(obs, mask, d, now, budget=T_R, floor=T_R / (2 * max(n, 1)),
                          fill=False)
        d.totals = totals._asdict()
        d.interval = self.listener.interval
        return d

    def run(self, obs: Observation, mask: BoolArray, out: Decision, now: float, *,
            budget: float, floor: float, fill: bool) -> Round:
        """A round now, whether due or not, into `out`'s training slots (see `round_into`),
        then the listener: the interval doubles when every job is completing, and the next
        round is due one interval later."""
        totals = round_into(obs, mask, self.ws, out.limits, out.classes, out.score,
                            budget=budget, floor=floor, fill=fill)
        if totals.completing:
            self.listener.back_off()
        self.listener.schedule(now)
        return totals


def water_fill(total: float, demand: npt.ArrayLike) -> FloatArray:
    """`water_fill_into` on fresh arrays (tests, simulations)."""
    d = np.asarray(demand, dtype=np.float64)
    out = np.empty(d.shape[0])
    water_fill_into(total, d, out, Workspace.sized(d.shape[0]))
    return out


__all__ = ["BackOff", "FlowCon", "Round", "growth_into", "progress_into",
           "round_into", "threshold", "water_fill", "water_fill_into"]
