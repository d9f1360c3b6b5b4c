"""What the loop and a policy know of each other.

The loop hands a policy an `Observation` (per-slot numpy arrays it owns) and gets back a
`Decision` (per-slot arrays the policy owns), or None when the policy is not due. Slots are
0..n-1, as in the loop's tables; `resize(n, carried)` follows a membership change. CPU limits and
usages are fractions of the worker budget T_R (1.0 = every CPU the managed containers may
use). A container's first limit is the policy's choice: the loop passes NaN for a limit it
never set, and writes nothing for a NaN in the decision.

A slot is an inference service (a latency target) or a training job (no target: FlowCon
manages it by the progress of its evaluation function, policy/flowcon.py); the training
fields of the `Observation` say which, and carry what a training job reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Int8Array = npt.NDArray[np.int8]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]

T_R = 1.0  # the worker budget, in the fraction units of limits and usages: the cap of any limit
ALPHA, BETA = 0.10, 0.10  # the paper's tolerance band and step
IV_INITIAL_S = 10.0  # the paper's initial listener interval
# The listener's ceiling (the paper gives none). Rounds cost microseconds here, and each one
# moves a limit by about (q_i/Q_G)·R_G·β, a percent or two: at 160 s the paper's varied
# scenario is still far from converged after 3000 s, at 20 s it reaches 7 of the 8 possible
# (bench/experiments, sensitivity table).
IV_MAX_S = 20.0
# The most of its cap an open-loop service (requests arriving at their own pace, queueing) is
# held at: past it, its mean latency rises as 1/(1 - rho), so a few percent more work or a
# burst of arrivals would take it far out of its band (the knee of its queueing curve). The
# evaluation's oracle counts a service in S at no less than the share that keeps it there.
RHO_MAX = 0.75


class Cls(IntEnum):
    """Class codes of a container (int8 arrays), shared by policy, daemon and CLI."""

    IDLE = 0  # no usable measurement in the window: no class, limit untouched
    G = 1  # faster than its target by more than alpha·o
    S = 2  # within alpha·o of its target: satisfied
    B = 3  # slower than its target by more than alpha·o
    # A training job's list (FlowCon)
    NL = 4  # new: growing fast
    WL = 5  # watching: its growth efficiency fell below the threshold once
    CL = 6  # completing: below the threshold again; converging


@dataclass(slots=True)
class Observation:
    """What the loop measured over the last window; float64 arrays of shape (n,), one slot a
    container. The loop owns them and may refill them in place between calls."""

    target: FloatArray  # the container's objective (DQoES: latency target, s; NaN: none)
    measured: FloatArray  # its metric over the window (same unit; NaN: no requests)
    usage: FloatArray  # CPU used over the window, fraction of T_R
    limit: FloatArray  # current CPU limit, fraction of T_R; NaN: never set (the policy
    #                    chooses a container's first limit)
    waited: FloatArray | None = None  # CPU time its tasks spent runnable but waiting for a
    #                                  CPU over the window (cpu.pressure "some"), fraction
    #                                  of T_R like usage; NaN: unknown; +inf: not read, as
    #                                  the last Decision.pressure asked (count it as having
    #                                  waited); None: not measured
    rate: FloatArray | None = None  # requests completed per second over the window (NaN:
    #                                unknown); None: not measured. With usage it gives the
    #                                CPU of one request, usage / rate
    cpus: float | None = None  # the CPUs that T_R stands for; None: not known
    # Training jobs. None (the default): every slot is an inference service.
    training: BoolArray | None = None  # the slot is a training job (its target and
    #                                    measured are NaN)
    classes: Int8Array | None = None  # each slot's class (Cls) at the last decision, IDLE
    #                                   if none yet; it follows the container across
    #                                   membership changes: a training job's list
    eval_prev: FloatArray | None = None  # a training job's evaluation value at the start
    #                                      of the interval: its last report before this
    #                                      window (none: its first in it); NaN: none
    eval_prev_at: FloatArray | None = None  # when it was made, s (CLOCK_MONOTONIC)
    eval_last: FloatArray | None = None  # its last report in this window; NaN: none
    eval_last_at: FloatArray | None = None  # when it was made, s (CLOCK_MONOTONIC)


@dataclass(slots=True)
class Decision:
    """One round's outcome. The policy owns the arrays; they stay valid until its next
    `decide` or `resize`."""

    limits: FloatArray  # new limit per slot, fraction of T_R; NaN: leave the cgroup alone
    classes: Int8Array  # Cls code per slot
    score: FloatArray  # what the classes come from (DQoES: q_i = o_i - p_i; FlowCon: the
    #                    growth efficiency G_i); not for IDLE
    totals: dict[str, float] = field(default_factory=dict)  # per-round scalars, for status
    interval: float = 0.0  # seconds until the policy is due again
    pressure: BoolArray | None = None  # the slots whose Observation.waited the policy will
    #                                    use at the end of the next window: only theirs is
    #                                    measured (each read costs a system call); None: all


class Policy(Protocol):
    """All the loop knows of a policy."""

    name: str

    def resize(self, n: int, carried: IndexArray | None = None) -> None:
        """Membership changed: n slots from now on. Implies `reset()`. `carried[i]` is the
        slot that new slot i had before the change, -1 for a container that just joined;
        None: nothing carries over (a policy with per-container memory starts afresh)."""

    def reset(self) -> None:
        """A target changed (or membership did): run at the next `decide`, whatever the time."""

    def due(self, now: float) -> bool:
        """Whether `decide(obs, now)` would run a round (so the loop can skip the window)."""
        ...

    def decide(self, obs: Observation, now: float) -> Decision | None:
        """Run a round if due at `now` (monotonic seconds); None if not due."""
        ...


@dataclass(frozen=True)
class PolicyParams:
    """The daemon's policy parameters (dqoesd's options), which every policy is built from."""

    alpha: float = ALPHA  # tolerance band: within alpha·target is satisfied
    beta: float = BETA  # step amplitude
    iv_initial: float = IV_INITIAL_S  # the listener's first interval, seconds
    iv_max: float = IV_MAX_S  # its ceiling, seconds
