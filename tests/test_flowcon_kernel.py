"""Training jobs beside an inference service under dqoesd, on a real cgroup v2 kernel.

The testbed is a node of one CPU (its subtree capped, the daemon's budget 1): an inference
worker with a target of 2.5 times its solo latency and two training jobs (lab.training,
reporting their loss), three single-threaded processes. The training jobs are guaranteed
n_T/(2n) = 1/3 of the budget together, and the service may have the rest, more than the 0.4
CPU or so its target needs (policy/mixed.py). The test waits for conditions, not times:
the jobs get caps of the daemon's and show their lists, evaluation values and growth
efficiencies in status and in dqoesctl's table, and the service meets its target beside
them (on a loaded emulated CPU, whether it starts above or below its target varies).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from dqoes_cg.ctl import format_status
from dqoes_cg.status import ContainerStatus
from lab import REPO, testbed
from lab.shell import wait_for
from lab.testbed import cap_cpus, solo_latency

pytestmark = pytest.mark.kernel

MODEL = "tiny"  # ~0.1 s a request on an emulated CPU
JOBS = {"fast": "fast", "wide": "wide"}  # name: lab.training model
T = TypeVar("T")


def _wait_for(bed: testbed.Testbed, predicate: Callable[[], T], timeout: float,
              what: str) -> T:
    def explain() -> str:
        return (f"--- status ---\n{format_status(bed.status())}\n--- dqoesd's log ---\n"
                f"{bed.daemon_log.read_text()[-4000:]}")

    return wait_for(predicate, timeout, what, explain, every=0.5)


def _by_name(bed: testbed.Testbed) -> dict[str, ContainerStatus]:
    return {c.name.rsplit("/", 1)[1]: c for c in bed.status().containers}


def test_training_jobs_share_what_the_service_leaves(tmp_path: Path) -> None:
    target = 2.5 * solo_latency(MODEL)
    with testbed.Testbed(f"dqoes-flowcon-{os.getpid()}", tmp_path, cpus=1.0) as bed:
        cap_cpus(bed.root, 1.0)
        bed.start_daemon("--sample-interval", "0.5", "--interval", "2", "--max-interval", "4",
                         "--beta", "0.5")
        bed.add_worker("web", MODEL, target_s=target, metric="mean")
        for i, (name, model) in enumerate(JOBS.items()):
            bed.add_trainer(name, model, seed=i)

        # FlowCon caps both jobs, and status shows what it decided from: their lists, their
        # latest losses, their growth efficiencies.
        def jobs_decided() -> dict[str, ContainerStatus] | None:
            s = _by_name(bed)
            ok = all(s[n].kind == "training" and s[n].cls in ("NL", "WL", "CL")
                     and s[n].evaluation is not None and s[n].growth_efficiency is not None
                     and s[n].cpu_limit_cores is not None and bed.cpu_max(n) != "max 100000"
                     for n in JOBS)
            return s if ok else None

        s = _wait_for(bed, jobs_decided, 480,
                      "both training jobs capped, with a growth efficiency")
        log = bed.daemon_log.read_text
        floor = 1.0 / (2 * 3)  # T_R/(2n) of a 1-CPU budget, n = 3
        for n in JOBS:
            assert s[n].target_s is None and s[n].q_s is None and s[n].evaluation > 0, s[n]
            assert s[n].cpu_limit_cores >= floor * 0.99, (s[n], log())

        # The service is not starved: it meets its target beside the training jobs (one
        # moment in S or G is enough; an emulated CPU is noisy), while they keep their caps.
        met = _wait_for(bed, lambda: (s := _by_name(bed))["web"].cls in ("S", "G") and s, 300,
                        "the service meeting its target beside the training jobs")
        assert met["web"].samples > 0 and met["web"].kind == "inference", met["web"]
        for n in JOBS:
            assert met[n].cpu_limit_cores is not None, (met[n], log())
            assert bed.workers[n].proc.poll() is None  # still training
        jobs_total = sum(met[n].cpu_limit_cores or 0.0 for n in JOBS)
        assert jobs_total <= 1.0 + 1e-6, (met, log())

        # dqoesctl shows the jobs in a table of their own, with the host's lists.
        out = subprocess.run(
            [sys.executable, "-m", "dqoes_cg.ctl", "--socket", str(bed.socket), "status"],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout
        assert "TRAINING JOB" in out and "NL " in out, out
        for n in JOBS:
            row = next(line for line in out.splitlines() if line.startswith(bed.subtree + "/" + n))
            assert row.split()[1].rstrip("!") in ("NL", "WL", "CL"), out
        assert bed.stop_daemon() == 0
        assert all(bed.cpu_max(n) == "max 100000" for n in ["web", *JOBS])
