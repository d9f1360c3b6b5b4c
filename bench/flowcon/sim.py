"""A fluid model of training jobs on one worker, driving the daemon's own FlowCon object, so
that the paper's single-worker runs (minutes to an hour of training) simulate in seconds.

The model
- A worker has `cpus` CPUs, its budget T_R. A training job needs `work_s` seconds of the
  whole worker to finish (its epochs) and can use at most `demand` of the worker alone
  (the paper's jobs used 65-75% of a worker alone: threads, framework overhead).
- CPU: over each tick a running job gets min(its cap, its demand, its water-filling fair
  share), as CFS shares the CPUs among runnable cgroups (bench.experiments.sim.water_fill).
- Its evaluation value is a loss falling with the work done, w (seconds of the worker):
  E(w) = floor + (start - floor) * exp(-w / tau). A job with a small tau flattens early.
- Completion: the moment w reaches work_s (interpolated within the tick).

The daemon is dqoesd's loop on the simulated clock: a tick every sample interval; a job
joining or finishing resizes the policy (a round at once, the interval back to its first
value); a decision window runs from one round to the next, over which a job's usage and
its evaluation interval (the value at the window's start, or at its arrival, to the value
now) are measured; its list follows it from round to round (the fleet's classes). The
policy is dqoes_cg.policy.FlowCon itself, on its own (every slot a training job): a job's
limit is a cap of its fraction of T_R. The default platform sets no limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.experiments.sim import water_fill
from dqoes_cg.policy import IV_INITIAL_S, IV_MAX_S, Cls, FlowCon, Observation


@dataclass(frozen=True)
class Model:
    """A type of training job."""

    work_s: float  # seconds of the whole worker to finish
    tau_s: float  # work after which its loss has fallen by a factor e towards its floor
    demand: float  # fraction of the worker it can use alone
    start: float = 2.3  # its loss at the first step
    floor: float = 0.1  # ... and where it converges

    def loss(self, work: np.ndarray) -> np.ndarray:
        return self.floor + (self.start - self.floor) * np.exp(-work / self.tau_s)


@dataclass(frozen=True)
class Job:
    name: str
    model: str
    arrival_s: float


@dataclass
class Result:
    """One run: per-job completion times and, per tick, what each job received."""

    completion_s: np.ndarray  # (n,) finish - arrival
    finish_s: np.ndarray  # (n,) absolute
    t: np.ndarray  # (T,) tick ends
    cores: np.ndarray  # (T, n) CPUs each job got over the tick (0: not running)
    limit: np.ndarray  # (T, n) its cap in CPUs (NaN: none)
    lists: np.ndarray  # (T, n) its list (Cls code; 0 when not running or no policy)

    @property
    def makespan_s(self) -> float:
        return float(self.finish_s.max())


def simulate(jobs: list[Job], models: dict[str, Model], cpus: float = 1.0,
             flowcon: bool = True, sample_interval: float = 1.0,
             iv_initial: float = IV_INITIAL_S, iv_max: float = IV_MAX_S,
             limit_s: float = 100_000.0) -> Result:
    """Run `jobs` on one worker of `cpus` CPUs with FlowCon (or the default platform) until
    every job has finished (at most `limit_s` simulated seconds)."""
    n, dt = len(jobs), sample_interval
    spec = [models[j.model] for j in jobs]
    work_s = np.array([m.work_s for m in spec])
    demand = np.array([m.demand for m in spec]) * cpus
    arrival = np.array([j.arrival_s for j in jobs])
    policy = FlowCon(iv_initial, iv_max) if flowcon else None

    work = np.zeros(n)
    finish = np.full(n, np.nan)
    limit = np.full(n, np.nan)  # fraction of T_R; NaN: no cap
    classes = np.full(n, int(Cls.IDLE), dtype=np.int8)  # each job's list, carried by job
    win_cpu, win_start = np.zeros(n), np.zeros(n)
    eval_start = np.full(n, np.nan)
    slots: list[int] = []
    rows: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []

    t = 0.0
    while np.isnan(finish).any() and t < limit_s:
        now = t + dt
        running = (arrival <= t + 1e-9) & np.isnan(finish)
        members = [int(i) for i in np.flatnonzero(running)]
        members.sort(key=lambda i: (arrival[i], i))
        if members != slots:
            for i in set(members) - set(slots):  # a new job: its window starts now
                win_cpu[i], win_start[i] = 0.0, t
                eval_start[i] = float(spec[i].loss(np.array(0.0)))
            slots = members
            if policy is not None:
                policy.resize(len(slots))

        caps = np.where(np.isnan(limit), demand, np.minimum(limit * cpus, demand))
        cores = water_fill(cpus, np.where(running, caps, 0.0))
        before = work.copy()
        work += cores * dt / cpus
        done = running & (work >= work_s)
        finish[done] = t + (work_s[done] - before[done]) / (cores[done] / cpus)
        work = np.minimum(work, work_s)
        win_cpu += cores * dt

        if policy is not None and slots and policy.due(now):
            idx = np.array(slots)
            loss = np.array([spec[i].loss(work[i]) for i in idx])
            span = np.maximum(now - win_start[idx], 1e-9)
            obs = Observation(
                target=np.full(len(idx), np.nan), measured=np.full(len(idx), np.nan),
                usage=win_cpu[idx] / (span * cpus), limit=limit[idx],
                training=np.ones(len(idx), bool), classes=classes[idx].copy(),
                eval_prev=eval_start[idx].copy(), eval_prev_at=win_start[idx].copy(),
                eval_last=loss, eval_last_at=np.full(len(idx), now))
            decision = policy.decide(obs, now)
            assert decision is not None  # it was due
            limit[idx] = decision.limits
            classes[idx] = decision.classes
            win_cpu[idx], win_start[idx], eval_start[idx] = 0.0, now, loss

        shown = np.where(running, classes, 0)
        rows.append((now, cores, np.where(running, limit * cpus, np.nan), shown))
        t = now

    return Result(completion_s=finish - arrival, finish_s=finish,
                  t=np.array([r[0] for r in rows]),
                  cores=np.array([r[1] for r in rows]).reshape(-1, n),
                  limit=np.array([r[2] for r in rows]).reshape(-1, n),
                  lists=np.array([r[3] for r in rows]).reshape(-1, n))
