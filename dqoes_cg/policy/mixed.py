"""One host, both kinds: inference services by the daemon's inference policy (DQoES, or
whichever `--policy` names), training jobs by FlowCon (flowcon.py), on one CPU budget T_R.

The loop sees one policy. With only inference services it is the inference policy, and
with only training jobs FlowCon, each exactly as on its own; with both, a round runs the
inference policy (when its listener is due) and then FlowCon (at every round), and the
budget is split as follows.

The budget split: inference first, each kind guaranteed a share
---------------------------------------------------------------
With n slots of both kinds, n_T of them training jobs, and L_i the inference services'
limits (this round's decision, else the limit in force, else the CPU used):

    f   = T_R / (2n)                       every container's floor, of either kind
    g_T = n_T · f                          the training jobs' guarantee
    B   = clip(min(T_R - Σ_inference L_i, C), g_T, T_R)         the training budget
    a training job's cap = f + its max-min fair share of B - g_T by FlowCon's limits

The inference services have targets to meet, so they come first: the training jobs use
what their limits leave, shared by growth efficiency. The inference policy sees every slot;
a training job is a slot without a target (target and measured NaN): no class, limit
untouched, its usage counted as used CPU, so that the inference policy decides as on a host
whose training CPU is busy, not idle, and its floors count every container.

C, the training ceiling, is how training gives way to a service that misses its target.
At each round of the inference policy:
- a service is in B and uses at least 90% of its limit (CPU is what it lacks), and none is
  in G (no service has CPU to give): C = max(g_T, (1 - β) · min(C, U_T)), U_T the CPU the
  training jobs used. Training gives up β of what it used; the inference policy finds that
  CPU idle at its next round and gives it to B (DQoES: its idle term). β is the daemon's step.
- no service is in B using its limit: C = T_R (no ceiling).
- otherwise (B, while a G has CPU to give, which the inference policy moves): C stays.

Why neither starves:
- Training: its caps add up to B >= g_T = n_T/(2n) of T_R, each at least f = T_R/(2n), half
  the even share. Sibling cgroups share the CPUs by weight under CFS, so a running job gets
  at least min(its cap, its even share) >= f, whatever the services' caps.
- Inference: the training caps add up to at most max(T_R - Σ L_i, g_T). The services can
  use their limits in full as long as these add up to T_R - g_T or less, and otherwise share
  at least T_R - g_T >= T_R/2 among them; each keeps the inference policy's own floor
  (DQoES: f).
- Training gives way by β a round, and only to a service that lacks CPU when no other
  service has any to give: the inference policy's own moves (G to B) come first, and a
  service that cannot use more CPU (below 90% of its limit) takes nothing from training.

Hot path: `decide` writes into arrays preallocated by `resize` and allocates no arrays.
"""

from __future__ import annotations

import math

import numpy as np

from .base import BETA, T_R, Cls, Decision, IndexArray, Observation, Policy, PolicyParams
from .dqoes import masked_sum
from .flowcon import FlowCon

_G, _B = np.int8(Cls.G), np.int8(Cls.B)  # int8 scalars: see flowcon.NL
SLACK = 0.10
"""A service using at least 1 - SLACK of its limit lacks CPU (measured usage of a capped
container stays a little under its cap)."""


class Mixed:
    """Inference services by `inference`, training jobs by `training`, on one budget."""

    def __init__(self, inference: Policy, training: FlowCon, beta: float = BETA) -> None:
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"beta must be in (0, 1], got {beta}")
        self.inference = inference
        self.training = training
        self.beta = beta
        self.name = inference.name
        self.resize(0)

    @classmethod
    def around(cls, inference: Policy, params: PolicyParams) -> Mixed:
        """`inference` beside FlowCon, both with the daemon's parameters."""
        return cls(inference, FlowCon.from_params(params), params.beta)

    def resize(self, n: int, carried: IndexArray | None = None) -> None:
        self.inference.resize(n, carried)
        self.training.resize(n, carried)
        self._pressure = np.ones(n, bool)  # the inference policy's last Decision.pressure
        self._decision = Decision(limits=np.full(n, np.nan),
                                  classes=np.zeros(n, dtype=np.int8), score=np.full(n, np.nan),
                                  pressure=self._pressure)
        self._held = np.zeros(n)  # scratch: each service's limit
        self._x = np.zeros(n)
        self._serving = np.zeros(n, dtype=bool)  # the services: not training jobs
        self._flag = np.zeros(n, dtype=bool)
        self._b = np.zeros(n, dtype=bool)
        self._jobs = 0  # training jobs among the slots, as of the last decide
        self._services = 0
        self._ceiling = T_R  # C
        self._inference_totals: dict[str, float] = {}
        self._inference_interval = self.training.interval
        self.reset()

    def reset(self) -> None:
        self.inference.reset()
        self.training.reset()

    def due(self, now: float) -> bool:
        if not self._jobs:
            return self.inference.due(now)
        if not self._services:
            return self.training.due(now)
        return self.inference.due(now) or self.training.due(now)

    @property
    def ceiling(self) -> float:
        """C, the training ceiling (fraction of T_R)."""
        return self._ceiling

    def decide(self, obs: Observation, now: float) -> Decision | None:
        d = self._decision
        n = d.limits.shape[0]
        mask = obs.training
        jobs = 0 if mask is None else int(np.count_nonzero(mask))
        self._jobs, self._services = jobs, n - jobs
        self.name = (self.inference.name if not jobs else self.training.name if jobs == n
                     else f"{self.inference.name}+{self.training.name}")
        if mask is None or jobs == 0:
            return self.inference.decide(obs, now)
        if jobs == n:
            return self.training.decide(obs, now)
        if not self.due(now):
            return None
        services = np.logical_not(mask, out=self._serving)
        inference = self.inference.decide(obs, now)
        if inference is None:
            d.limits.fill(np.nan)  # the services keep their limits, classes and scores
        else:
            np.copyto(d.limits, inference.limits)
            np.copyto(d.classes, inference.classes)
            np.copyto(d.score, inference.score)
            if inference.pressure is None:
                self._pressure.fill(True)
            else:
                np.copyto(self._pressure, inference.pressure)
            self._inference_totals = inference.totals
            self._inference_interval = inference.interval
            self._give_way(obs, d, mask, services)
        floor = T_R / (2 * n)
        budget = min(T_R - self._held_by_services(obs, d, services), self._ceiling)
        budget = min(max(budget, jobs * floor), T_R)
        totals = self.training.run(obs, mask, d, now, budget=budget, floor=floor, fill=True)
        d.totals = {**self._inference_totals,
                    **{k: float(v) for k, v in totals._asdict().items() if math.isfinite(v)},
                    "training_ceiling": self._ceiling}
        d.interval = min(self._inference_interval, self.training.interval)
        return d

    def _held_by_services(self, obs: Observation, d: Decision, services: np.ndarray) -> float:
        """Σ L_i over the services: this round's limit, else the one in force, else the CPU
        used."""
        held, flag = self._held, self._flag
        np.copyto(held, d.limits)
        for fallback in (obs.limit, obs.usage):
            np.isnan(held, out=flag)
            np.copyto(held, fallback, where=flag)
        np.isfinite(held, out=flag)
        np.logical_and(flag, services, out=flag)
        return masked_sum(held, flag, self._x)

    def _give_way(self, obs: Observation, d: Decision, mask: np.ndarray,
                  services: np.ndarray) -> None:
        """The training ceiling C after a round of the inference policy (see the module)."""
        held, flag, b = self._held, self._flag, self._b
        np.equal(d.classes, _G, out=flag)
        np.logical_and(flag, services, out=flag)
        giving = bool(flag.any())
        np.equal(d.classes, _B, out=b)
        np.logical_and(b, services, out=b)
        np.multiply(obs.limit, 1.0 - SLACK, out=held)
        with np.errstate(invalid="ignore"):
            np.less(obs.usage, held, out=flag)  # False for a limit never set (NaN): as far
        np.logical_not(flag, out=flag)  # as anyone knows, it lacks CPU
        np.logical_and(flag, b, out=flag)
        if not flag.any():
            self._ceiling = T_R
        elif not giving:
            used = masked_sum(obs.usage, mask, self._x)
            guarantee = int(np.count_nonzero(mask)) * T_R / (2 * mask.shape[0])
            self._ceiling = max(guarantee, (1.0 - self.beta) * min(self._ceiling, used))
