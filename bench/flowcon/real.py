"""FlowCon's 3-job run on a real cgroup v2 kernel (the guest, on hosts without one), scaled
to it: real training jobs (lab.training) on a node of one CPU, with dqoesd marking each as
a training job when it arrives, or on the default platform (no daemon, no limits).

Jobs are started ahead and held (a Python start is seconds on an emulated CPU), released at
their arrival times, and train a fixed number of epochs; a job's completion time runs from
its release to its exit. An Observer (lab.testbed) records every job's CPU use window by
window, with the daemon or without it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.testbed import Observer, Testbed, cap_cpus

NODE_CPUS = 1.0
WINDOW_S = 2.0
DAEMON_ARGS = ("--sample-interval", "0.5", "--interval", "2", "--max-interval", "8")


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


def run(workdir: Path, jobs: list[RealJob], flowcon: bool, timeout_s: float) -> dict[str, Any]:
    """One run: each job's arrival, completion time and CPU use per window."""
    with Testbed(f"dqoes-flowcon-{os.getpid()}", workdir, cpus=NODE_CPUS) as bed:
        cap_cpus(bed.root, NODE_CPUS)
        if flowcon:
            bed.start_daemon(*DAEMON_ARGS)
        for i, j in enumerate(jobs):
            bed.add_trainer(j.name, j.model, epochs=j.epochs, seed=i, training=False,
                            hold=True)
        bed.wait_held()
        observer = Observer(bed, [j.name for j in jobs])
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
                    bed.release(j.name, training=flowcon)
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
                                "limit_cores": [None if x != x else x
                                                for x in w.limit_cores.tolist()]})
                next_window += WINDOW_S
            time.sleep(0.1)
        observer.close()
    return {"flowcon": flowcon,
            "jobs": [{"name": j.name, "model": j.model, "epochs": j.epochs,
                      "arrival_s": released[j.name],
                      "completion_s": finished[j.name] - released[j.name]} for j in jobs],
            "makespan_s": max(finished.values()),
            "windows": windows}
