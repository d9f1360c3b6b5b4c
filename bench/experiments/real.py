"""Real runs on a cgroup v2 kernel with the cpu controller (the guest, on hosts without
one): real inference workers in their own cgroups, a real dqoesd per node, and an
Observer that measures every run alike, with the daemon or without it (the default
platform: no limits, CFS's even share).

A node of a multi-node scenario is a cgroup subtree whose own cpu.max is the node's budget,
with a daemon of its own (--cpus set to that budget). Workers are started ahead and held
(a Python start is seconds on an emulated CPU), then released at their arrival times;
with the daemon, a release sets the container's target: it joins."""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import numpy as np

from dqoes_cg.cgroup import find_cgroup2_mount
from lab.cgroups import remove_cgroup_tree
from lab.testbed import Testbed, cap_cpus

from .scenarios import Scenario
from .sim import Curve, Node, Params, Windows
from .trace import Run

CALIBRATION_CORES = (0.25, 0.5, 1.0)  # cpu.max quotas (CPUs) at which each type is timed


def daemon_args(params: Params) -> list[str]:
    return ["--policy", params.policy, "--alpha", str(params.alpha), "--beta", str(params.beta),
            "--interval", str(params.iv_initial), "--max-interval", str(params.iv_max),
            "--sample-interval", str(params.sample_interval)]


def calibrate(models: tuple[str, ...], workdir: Path, seconds: float) -> dict[str, Curve]:
    """Each model type as a worker in a cgroup, at each quota of CALIBRATION_CORES (1.0: no
    limit, its solo latency): the curve the simulator uses. The kernel is kept fully busy
    meanwhile by ballast workers capped at what the measured one leaves: an emulated CPU
    runs slower when the other is busy too (the host's cores are shared), and in every
    scenario all CPUs are busy."""
    curves = {}
    with Testbed(f"dqoes-calibrate-{os.getpid()}", workdir) as bed:
        ballast = bed.root / "ballast"
        ballast.mkdir()
        (ballast / "cgroup.subtree_control").write_text("+cpu")
        cpus = os.cpu_count() or 1
        names = [*models, *(f"ballast/b{i}" for i in range(cpus))]
        for name in names:
            bed.add_worker(name, models[0] if name.startswith("ballast") else name, hold=True)
        bed.wait_held()
        observer = bed.observer(list(models))
        for name in names[len(models):]:
            bed.release(name)
        for i, m in enumerate(models):
            bed.release(m)
            latency = []
            for cores in CALIBRATION_CORES:
                cap_cpus(bed.root / m, cores)
                cap_cpus(ballast, cpus - cores)
                time.sleep(1.0)  # let the previous quota's requests drain
                observer.window()
                time.sleep(seconds)
                latency.append(float(observer.window().latency_s[i]))
            bed.workers[m].proc.send_signal(signal.SIGSTOP)  # measured one at a time
            solo = latency[-1]
            curves[m] = Curve(solo, CALIBRATION_CORES,
                              tuple(lat * c / solo for lat, c in zip(latency, CALIBRATION_CORES,
                                                                    strict=True)))
        observer.close()
    return curves


def run(scenario: Scenario, nodes: list[Node], params: Params | None, workdir: Path,
        window: float) -> Run:
    """One run on the kernel: with dqoesd (`params`, its policy among them) or on the
    default platform (None)."""
    duration = scenario.duration_s if params else scenario.default_duration_s
    root = f"dqoes-exp-{os.getpid()}"
    multi = len(nodes) > 1
    with ExitStack() as stack:
        if multi:  # removed last, once the nodes' subtrees are gone
            stack.callback(remove_cgroup_tree, find_cgroup2_mount() / root)
        beds = []
        for k, node in enumerate(nodes):
            subtree = f"{root}/node{k + 1}" if multi else root
            bed = stack.enter_context(Testbed(subtree, workdir / f"node{k + 1}", node.cpus))
            if multi:
                cap_cpus(bed.root, node.cpus)
            if params:
                bed.start_daemon(*daemon_args(params))
            for i, c in enumerate(node.containers):
                bed.add_worker(c.name, c.model, hold=True, seed=i, rate=c.rate)
            beds.append(bed)
        for bed in beds:
            bed.wait_held()
        observers = [bed.observer([c.name for c in node.containers])
                     for bed, node in zip(beds, nodes, strict=True)]
        for o in observers:
            stack.callback(o.close)
        arrivals = sorted(((c.arrival_s, k, c) for k, node in enumerate(nodes)
                           for c in node.containers), key=lambda a: a[0])
        rows: list[list[tuple[float, ...]]] = [[] for _ in nodes]
        start = time.monotonic()
        for o in observers:
            o.window()
        next_window = start + window
        while (now := time.monotonic()) < start + duration:
            while arrivals and arrivals[0][0] <= now - start:
                _, k, c = arrivals.pop(0)
                beds[k].release(c.name, c.target_s if params else None, "mean")
            if now >= next_window:
                for k, o in enumerate(observers):
                    w = o.window()
                    rows[k].append((now - start, w.latency_s, w.usage_cores, w.limit_cores))
                next_window += window
            time.sleep(max(0.0, min(0.05, next_window - time.monotonic())))
    windows = [Windows(t=np.array([r[0] for r in node_rows]),
                       latency_s=np.array([r[1] for r in node_rows]),
                       usage_cores=np.array([r[2] for r in node_rows]),
                       limit_cores=np.array([r[3] for r in node_rows]))
               for node_rows in rows]
    return Run.from_windows(scenario.key, params.policy if params else "default", "real",
                            asdict(params) if params else {}, nodes, windows)
