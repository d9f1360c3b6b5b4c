"""FlowCon on a real cgroup v2 kernel (the guest, on hosts without one), scaled to it: real
training jobs (lab.training), and inference services (lab.workload) beside them, on a node
of one CPU. Three platforms:

- "default": no daemon, no limits (CFS's even share);
- "targets": dqoesd with the services' targets, the training jobs not its business;
- "flowcon": dqoesd with the services' targets and each job marked as a training job when
  it arrives (the mixed policy: services first, the jobs share the rest by growth
  efficiency).

The 3-job and the 10-job runs (jobs only) compare "default" and "flowcon"; the mixed run
(two services and two jobs) all three, with the services' targets set from their latency on
the default platform in the same session (an emulated CPU's speed is only known there).

Workers are started ahead and held (a Python start is seconds on an emulated CPU), released
at their arrival times; a job trains a fixed number of epochs, and its completion time runs
from its release to its exit. An Observer (lab.testbed) records every worker's CPU use and
every service's latency window by window, with the daemon or without it.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dqoes_cg.policy import Cls, classify
from lab.testbed import Testbed, cap_cpus

NODE_CPUS = 1.0
WINDOW_S = 2.0
DAEMON_ARGS = ("--sample-interval", "0.5", "--interval", "2", "--max-interval", "8")
PLATFORMS = ("default", "targets", "flowcon")
SETTLE_S = 30.0  # the mixed run judges the services from then until the first job ends
ALPHA = 0.10  # the band of S, the daemon's default
HELD_S_EACH = 60.0  # how long a worker may take to start and load, on an emulated CPU


@dataclass(frozen=True)
class RealJob:
    name: str
    model: str  # a lab.training model
    arrival_s: float
    epochs: int


def three_jobs(quick: bool) -> list[RealJob]:
    """The paper's 3-job run, scaled: the slowest-flattening job first (about 100 s alone on
    the guest's emulated CPU), then two that flatten early (about 40 and 50 s alone),
    arriving while it runs (the paper: at 40 s and 80 s). --quick: a tenth of the epochs."""
    scale = 10 if quick else 1
    return [RealJob("Job-1", "wide", 0.0, 120 // scale),
            RealJob("Job-2", "fast", 30.0, 250 // scale),
            RealJob("Job-3", "slow", 60.0, 200 // scale)]


@dataclass(frozen=True)
class RealService:
    name: str
    model: str  # a lab.workload model
    ratio: float  # its target / its latency on the default platform beside the jobs


def mixed(quick: bool) -> tuple[list[RealService], list[RealJob]]:
    """Two services whose targets are looser than CFS's even share gives them (1.6 and 1.25
    times that latency: they need 0.16 and 0.2 of the CPU, not 0.25) and two jobs arriving
    with them: the CPU the services beat their targets with is what FlowCon can give the
    jobs. --quick: a tenth of the epochs."""
    scale = 10 if quick else 1
    return ([RealService("svc-loose", "tiny", 1.6), RealService("svc-tight", "tiny", 1.25)],
            [RealJob("Job-2", "fast", 0.0, 250 // scale),
             RealJob("Job-3", "slow", 0.0, 200 // scale)])


TEN_JOB_EPOCHS = {"fast": 190, "slow": 120, "wide": 36}  # each about 30 s alone on the guest
TEN_JOB_ARRIVALS_S = 150.0


def ten_jobs(seed: int, quick: bool) -> list[RealJob]:
    """The paper's 10-job run, scaled: models drawn from lab.training's, arrivals at random in
    [0, 150 s] (the paper's: 200 s, for jobs of minutes), each job about 30 s alone on the
    guest's emulated CPU (about 300 s of work in all). --quick: a tenth of it."""
    rng = np.random.default_rng(seed)
    scale = 10 if quick else 1
    names = sorted(TEN_JOB_EPOCHS)
    arrivals = np.sort(rng.uniform(0.0, TEN_JOB_ARRIVALS_S / scale, 10))
    models = [names[int(rng.integers(len(names)))] for _ in arrivals]
    return [RealJob(f"Job-{i + 1}", m, float(a), TEN_JOB_EPOCHS[m] // scale)
            for i, (m, a) in enumerate(zip(models, arrivals, strict=True))]


def run(workdir: Path, jobs: list[RealJob], platform: str, timeout_s: float,
        services: dict[str, tuple[str, float]] | None = None) -> dict[str, Any]:
    """One run on `platform` (PLATFORMS) until every job has finished: each job's arrival
    and completion time, and per window every worker's CPU use and limit and every
    service's latency. `services`: name -> (lab.workload model, target in s), released at
    the start (their targets are set unless on the default platform)."""
    services = services or {}
    names = [*services, *(j.name for j in jobs)]
    with Testbed(f"dqoes-flowcon-{os.getpid()}", workdir, cpus=NODE_CPUS) as bed:
        cap_cpus(bed.root, NODE_CPUS)
        if platform != "default":
            bed.start_daemon(*DAEMON_ARGS)
        for i, (name, (model, _)) in enumerate(services.items()):
            bed.add_worker(name, model, seed=i, hold=True)
        for i, j in enumerate(jobs):
            bed.add_trainer(j.name, j.model, epochs=j.epochs, seed=i, training=False,
                            hold=True)
        bed.wait_held(timeout=HELD_S_EACH * len(names))  # they all start at once
        observer = bed.observer(names)
        for name, (_, target_s) in services.items():
            bed.release(name, None if platform == "default" else target_s)
        start = time.monotonic()
        released: dict[str, float] = {}
        finished: dict[str, float] = {}
        windows = []
        next_window = WINDOW_S
        while len(finished) < len(jobs):
            now = time.monotonic() - start
            if now > timeout_s:
                raise RuntimeError(f"jobs not finished within {timeout_s:.0f} s: "
                                   f"{sorted(set(released) - set(finished))}")
            for j in jobs:
                if j.name not in released and now >= j.arrival_s:
                    bed.release(j.name, training=platform == "flowcon")
                    released[j.name] = time.monotonic() - start
                elif j.name in released and j.name not in finished \
                        and bed.workers[j.name].proc.poll() is not None:
                    if bed.workers[j.name].proc.returncode != 0:
                        raise RuntimeError(f"{j.name} exited with "
                                           f"{bed.workers[j.name].proc.returncode}")
                    finished[j.name] = now
            if now >= next_window:
                w = observer.window()
                windows.append({"t": w.t, "usage_cores": w.usage_cores.tolist(),
                                "limit_cores": _nulls(w.limit_cores),
                                "latency_s": _nulls(w.latency_s[:len(services)])})
                next_window += WINDOW_S
            time.sleep(0.1)
        observer.close()
    return {"platform": platform,
            "services": [{"name": name, "model": model, "target_s": target_s}
                         for name, (model, target_s) in services.items()],
            "jobs": [{"name": j.name, "model": j.model, "epochs": j.epochs,
                      "arrival_s": released[j.name],
                      "completion_s": finished[j.name] - released[j.name]} for j in jobs],
            "makespan_s": max(finished.values()),
            "windows": windows}


def run_mixed(workdir: Path, quick: bool, timeout_s: float) -> dict[str, Any]:
    """The mixed run on each platform, the default first: it gives the services' latency
    beside the running jobs (the median over the judged span), hence their targets."""
    services, jobs = mixed(quick)
    untargeted = {s.name: (s.model, math.nan) for s in services}
    default = run(workdir / "default", jobs, "default", timeout_s, untargeted)
    even = np.nanmedian(_judged_latency(default), axis=0)
    targets = {s.name: (s.model, float(s.ratio * x)) for s, x in zip(services, even, strict=True)}
    for d in default["services"]:
        d["target_s"] = targets[d["name"]][1]
    runs = {"default": default, **{platform: run(workdir / platform, jobs, platform, timeout_s,
                                                 targets) for platform in PLATFORMS[1:]}}
    for r in runs.values():
        r["satisfied"] = satisfied(r)
    return runs


def satisfied(run_doc: dict[str, Any]) -> dict[str, Any]:
    """The services over the judged span (SETTLE_S until the first job ends): |S| window by
    window (median, least) and each one's median latency / target."""
    ratio = _judged_latency(run_doc) / np.array([s["target_s"] for s in run_doc["services"]])
    in_s = np.array([(classify(np.ones(len(r)), r, ALPHA) == Cls.S).sum() for r in ratio])
    return {"median": int(np.percentile(in_s, 50, method="lower")) if len(in_s) else 0,
            "least": int(in_s.min()) if len(in_s) else 0, "windows": len(in_s),
            "from_s": SETTLE_S,
            "latency_over_target": [float(x) for x in np.nanmedian(ratio, axis=0)]}


def _judged_latency(run_doc: dict[str, Any]) -> np.ndarray:
    """(windows, services) latency over the judged span; NaN where none completed."""
    first_done = min(j["arrival_s"] + j["completion_s"] for j in run_doc["jobs"])
    rows = [[np.nan if x is None else x for x in w["latency_s"]] for w in run_doc["windows"]
            if SETTLE_S <= w["t"] <= first_done]
    return np.array(rows, dtype=float).reshape(-1, len(run_doc["services"]))


def _nulls(x: np.ndarray) -> list[float | None]:
    """As JSON: NaN -> null."""
    return [None if v != v else float(v) for v in x.tolist()]
