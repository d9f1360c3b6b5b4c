"""A private testbed on a real cgroup v2 host: a cgroup subtree of its own, a dqoesd
managing it, and inference workers (lab.workload) and training jobs (lab.training) in their
own cgroups, each recording into the ring the daemon made for it. The demo, the
real-kernel tests and the experiments all run on it.

    with Testbed("dqoes-demo", workdir) as bed:
        bed.start_daemon("--interval", "3")
        bed.add_worker("w1", "small", target_s=0.2, metric="mean")
        bed.status()

Scheduled arrivals: `add_worker(..., hold=True)` starts a worker that loads its model and
stops before serving; `wait_held()` waits for all of them, and `release(name, target_s)`
sets the target (a container joining, for the daemon) and lets the worker serve.
`Observer` measures every worker window by window, beside the daemon or without one (the
default platform), from its own reads of the rings and of cpu.stat and cpu.max.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dqoes_cg.actuator import format_cpu_max
from dqoes_cg.cgroup import find_cgroup2_mount
from dqoes_cg.cgtable import DEFAULT_PERIOD_USEC, MAX_QUOTA, CgroupTable
from dqoes_cg.control import DaemonUnavailable, request
from dqoes_cg.ring import RingSet, ring_dir_name, ring_path
from dqoes_cg.status import Status
from lab import REPO
from lab.cgroups import remove_cgroup_tree

CONTROLLERS = "+cpu"


@dataclass
class Worker:
    name: str  # the target's name: the cgroup path relative to the mount
    cgroup: Path
    model: str
    proc: subprocess.Popen[bytes]


class Testbed:
    def __init__(self, subtree: str, workdir: Path, cpus: float | None = None) -> None:
        self.mount = find_cgroup2_mount()
        self.root = self.mount / subtree
        self.subtree = subtree
        self.workdir = workdir
        self.run_dir = workdir / "run"
        self.state_dir = workdir / "state"
        self.socket = self.run_dir / "dqoes.sock"
        self.cpus = cpus
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_log = workdir / "dqoesd.log"
        self.workers: dict[str, Worker] = {}

    def __enter__(self) -> Testbed:
        self.workdir.mkdir(parents=True, exist_ok=True)
        _enable_cpu(self.mount, self.root)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for w in self.workers.values():
            _stop(w.proc, signal.SIGKILL)
        self.workers.clear()
        if self.daemon is not None:
            self.stop_daemon()
        remove_cgroup_tree(self.root)

    # --- the daemon ------------------------------------------------------------------

    def start_daemon(self, *args: str) -> None:
        if self.cpus is not None:
            args = (*args, "--cpus", str(self.cpus))
        self.daemon = start_dqoesd(self.run_dir, self.state_dir, self.daemon_log, *args)

    def stop_daemon(self, sig: int = signal.SIGTERM) -> int:
        assert self.daemon is not None
        rc = _stop(self.daemon, sig)
        self.daemon = None
        return rc

    def request(self, op: str, **args: Any) -> Any:
        """What `dqoesctl` would send, sent from this process (a Python start per request
        is seconds on an emulated CPU)."""
        return request(self.socket, op, timeout=60, **args)

    def status(self) -> Status:
        return Status.from_json(self.request("status"))

    # --- workers ---------------------------------------------------------------------

    def add_worker(self, name: str, model: str, target_s: float | None = None,
                   metric: str = "mean", seed: int = 0, hold: bool = False,
                   rate: float | None = None) -> Worker:
        """An inference worker (lab.workload) in cgroup <subtree>/<name>; its target, if
        any, is set before it starts, so that its ring is there from its first request.
        With `hold`, it stops before serving until `release`. With `rate`, requests arrive
        at random at that mean rate per second (lab.workload --rate) instead of back to
        back."""
        target_name = self._cgroup(name)
        if target_s is not None:
            self.set_target(target_name, target_s, metric)
        rate_args = [] if rate is None else ["--rate", str(rate)]
        return self._spawn(name, model, "lab.workload", "--model", model, "--seed", str(seed),
                           *rate_args, *["--hold"] * hold)

    def add_trainer(self, name: str, model: str, epochs: int | None = None, seed: int = 0,
                    training: bool = True, hold: bool = False) -> Worker:
        """A training job (lab.training) in cgroup <subtree>/<name>, reporting its loss;
        with `training`, marked as a training job before it starts. With `hold`, it stops
        before training until `release`."""
        target_name = self._cgroup(name)
        if training:
            self.set_training(target_name)
        epochs_args = [] if epochs is None else ["--epochs", str(epochs)]
        return self._spawn(name, model, "lab.training", "--model", model, "--seed", str(seed),
                           *epochs_args, *["--hold"] * hold)

    def add_metrics_service(self, name: str, model: str, rate: float, port: int,
                            seed: int = 0) -> Worker:
        """An inference service (lab.metrics_service) in cgroup <subtree>/<name> and a
        network namespace of its own, its requests arriving at `rate` per second, exporting
        their latencies as a Prometheus histogram at :`port`/metrics; it has no ring."""
        self._cgroup(name)
        return self._spawn(name, model, "lab.metrics_service", "--port", str(port), "--model",
                           model, "--rate", str(rate), "--seed", str(seed), "--own-netns")

    def _cgroup(self, name: str) -> str:
        """Create cgroup <subtree>/<name> (if missing); its target's name."""
        (self.root / name).mkdir(exist_ok=True)
        return f"{self.subtree}/{name}"

    def _spawn(self, name: str, model: str, module: str, *args: str) -> Worker:
        """`python -m module args` started inside cgroup <subtree>/<name>, recording into
        the ring the daemon makes for it."""
        cgroup = self.root / name
        env = {**os.environ, "DQOES_RING": str(self.ring_of(name))}
        procs = str(cgroup / "cgroup.procs")

        def enter_cgroup() -> None:  # in the child, before exec: start inside the cgroup
            with open(procs, "w") as f:
                f.write("0")

        proc = subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                                preexec_fn=enter_cgroup, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        worker = Worker(f"{self.subtree}/{name}", cgroup, model, proc)
        self.workers[name] = worker
        return worker

    def set_target(self, name: str, target_s: float, metric: str = "mean") -> dict[str, Any]:
        return self.request("set-target", container=name, target_s=target_s, metric=metric,
                            pending=False)

    def set_training(self, name: str) -> dict[str, Any]:
        return self.request("set-target", container=name, training=True, pending=False)

    def cpu_max(self, name: str) -> str:
        return (self.root / name / "cpu.max").read_text().strip()

    def observer(self, names: Sequence[str], start: float | None = None) -> Observer:
        """An observer of the workers `names`, indexed in that order."""
        return Observer([self.root / n for n in names], [self.ring_of(n) for n in names],
                        start)

    def ring_of(self, name: str) -> Path:
        """The ring the daemon makes for worker `name` (its target's name is
        <subtree>/<name>); the worker records there, target or not."""
        return ring_path(self.run_dir, ring_dir_name(f"{self.subtree}/{name}"))

    def wait_held(self, timeout: float = 300.0) -> None:
        """Wait until every worker started with hold=True has loaded and stopped itself."""
        deadline = time.monotonic() + timeout
        for w in self.workers.values():
            while not _stopped(w.proc):
                if w.proc.poll() is not None:
                    raise RuntimeError(f"worker {w.name} exited with {w.proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {w.name} not ready within {timeout:.0f} s")
                time.sleep(0.1)

    def release(self, name: str, target_s: float | None = None, metric: str = "mean",
                training: bool = False) -> None:
        """A held worker arrives: its target (if any) is set, or it is marked as a training
        job (`training`), then it starts serving or training."""
        worker = self.workers[name]
        if training:
            self.set_training(worker.name)
        elif target_s is not None:
            self.set_target(worker.name, target_s, metric)
        worker.proc.send_signal(signal.SIGCONT)


@dataclass
class Window:
    """What each observed worker did over one window; arrays indexed like the observer's
    names."""

    t: float  # end of the window, seconds since the observer started
    latency_s: np.ndarray  # mean latency of the requests completed in it (NaN: none)
    requests: np.ndarray  # how many completed
    usage_cores: np.ndarray  # CPU used, in CPUs
    limit_cores: np.ndarray  # cpu.max at its end, in CPUs (NaN: max)


class Observer:
    """Measures workers window by window with its own readers of their rings and cgroup
    files, whether a daemon runs or not (the default platform), so that both are measured
    alike. A missing ring is created, as the daemon would; one the daemon made is shared
    (readers keep their own position)."""

    def __init__(self, cgroups: Sequence[Path], rings: Sequence[Path],
                 start: float | None = None) -> None:
        self.table = CgroupTable(list(cgroups))
        self.rings = RingSet(list(rings))
        self.start = time.monotonic() if start is None else start
        self.table.sample()
        self.rings.drain()
        self.rings.take_window()
        self._usage = self.table.usage_usec.copy()
        self._last = time.monotonic()

    def window(self) -> Window:
        """Close the window that began at the previous call (or at the start)."""
        now = time.monotonic()
        self.table.sample()
        self.table.read_back()
        self.rings.drain()
        w = self.rings.take_window()
        used = (self.table.usage_usec - self._usage) * 1e-6 / max(now - self._last, 1e-6)
        self._usage[:] = self.table.usage_usec
        self._last = now
        quota, period = self.table.max_quota_usec, self.table.max_period_usec
        limit = np.where(quota == MAX_QUOTA, np.nan, quota / np.maximum(period, 1))
        return Window(t=now - self.start, latency_s=w.mean.copy(), requests=w.count.copy(),
                      usage_cores=used, limit_cores=limit)

    def close(self) -> None:
        self.table.close()
        self.rings.close()


def start_dqoesd(run_dir: Path, state_dir: Path, log_path: Path,
                 *args: str) -> subprocess.Popen[bytes]:
    """dqoesd of this checkout with its own run and state directories, logging to
    `log_path`; returns once its control socket answers."""
    cmd = [sys.executable, "-m", "dqoes_cg.daemon", "--run-dir", str(run_dir),
           "--state-dir", str(state_dir), *args]
    with open(log_path, "ab") as log:
        daemon = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=REPO)
    deadline = time.monotonic() + 120
    while True:
        try:
            request(run_dir / "dqoes.sock", "list", timeout=60)
            return daemon
        except DaemonUnavailable:
            if daemon.poll() is not None:
                raise RuntimeError(f"dqoesd exited: {log_path.read_text()[-2000:]}") from None
            if time.monotonic() > deadline:
                _stop(daemon, signal.SIGTERM)
                raise RuntimeError("dqoesd did not answer within 120 s") from None
            time.sleep(0.2)


def solo_latency(model: str, seconds: float = 2.0) -> float:
    """Mean latency of one request of `model` alone on an idle machine (in this process)."""
    from lab.workload import build_model

    infer = build_model(model)
    infer()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        infer()
        n += 1
    return (time.perf_counter() - start) / n


def _stopped(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the process is stopped by a signal (state T in /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def _enable_cpu(mount: Path, cgroup: Path) -> None:
    """Create `cgroup`, with the cpu controller passed down from the mount to its children."""
    cgroup.mkdir(parents=True, exist_ok=True)
    parts = cgroup.relative_to(mount).parts
    for d in [*(mount.joinpath(*parts[:i]) for i in range(len(parts))), cgroup]:
        control = d / "cgroup.subtree_control"
        if "cpu" not in control.read_text().split():
            control.write_text(CONTROLLERS)


def _stop(proc: subprocess.Popen[bytes], sig: int) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def cap_cpus(cgroup: Path, cpus: float) -> None:
    """Write a cgroup's cpu.max by hand: at most `cpus` CPUs (the root of a testbed's
    subtree: a worker node of its own, beside others on the same kernel)."""
    period = DEFAULT_PERIOD_USEC
    (cgroup / "cpu.max").write_text(format_cpu_max(round(cpus * period), period))
