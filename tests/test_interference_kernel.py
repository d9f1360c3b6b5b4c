"""What slows a container, as dqoesd reports it on a real cgroup v2 kernel: a CPU hog beside
a managed worker raises the worker's and the node's CPU pressure over a quiet baseline
measured in the same test. The daemon only recommends (`--recommend`): no limit of its own
throttles the worker, so what the worker waits for is the hog's doing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dqoes_cg.ctl import format_interference
from dqoes_cg.status import ContainerStatus, Status
from lab import testbed
from lab.shell import wait_for

pytestmark = pytest.mark.kernel

MODEL = "tiny"  # a back-to-back worker keeps one CPU busy
WINDOW_S = 2.0  # the daemon's decision interval, fixed: each window holds one phase
WINDOWS = ("--sample-interval", "0.5", "--interval", str(WINDOW_S), "--max-interval",
           str(WINDOW_S))


def _worker(status: Status) -> ContainerStatus:
    [worker] = [c for c in status.containers if c.name.endswith("/svc")]
    return worker


def _cpu_some(pressure: dict[str, dict[str, float | None]]) -> float | None:
    return pressure.get("cpu", {}).get("some_ratio")


def _hog(cgroup: Path) -> subprocess.Popen[bytes]:
    """A process spinning on one CPU, started inside `cgroup` (not managed)."""
    script = f"echo $$ > {cgroup / 'cgroup.procs'} && exec sh -c 'while :; do :; done'"
    return subprocess.Popen(["sh", "-c", script], start_new_session=True)


def test_a_cpu_hog_raises_the_pressure_dqoesd_reports(tmp_path: Path) -> None:
    cpus = os.cpu_count() or 1
    hogs: list[subprocess.Popen[bytes]] = []
    with testbed.Testbed(f"dqoes-test-{os.getpid()}", tmp_path) as bed:
        try:
            bed.start_daemon("--recommend", *WINDOWS)
            bed.add_worker("svc", MODEL, target_s=10.0)
            seen: list[Status] = []

            def explain() -> str:
                last = format_interference(seen[-1]) if seen else "no status"
                return (f"--- dqoesctl status --interference ---\n{last}\n"
                        f"--- dqoesd's log ---\n{bed.daemon_log.read_text()[-4000:]}")

            def window_after(start: float) -> Status | None:
                """A status whose last window ended after `start` and knows both pressures
                (the worker's and the node's)."""
                status = bed.status()
                seen.append(status)
                h, w = status.host, _worker(status)
                if (h.last_decision_unix or 0) < start or w.cls == "pending" \
                        or _cpu_some(h.pressure) is None or _cpu_some(w.pressure) is None:
                    return None
                return status

            # Quiet: the worker alone on its CPU, over a window in which it served throughout.
            wait_for(lambda: _worker(bed.status()).samples > 0, 300, "the worker to serve",
                     explain=explain, every=0.5)
            serving = time.time()
            quiet = wait_for(lambda: window_after(serving + WINDOW_S), 300,
                             "a quiet window with pressure known", explain=explain, every=0.5)
            base_worker, base_node = _cpu_some(_worker(quiet).pressure), \
                _cpu_some(quiet.host.pressure)
            assert base_worker is not None and base_node is not None

            # Noisy: more spinning tasks than CPUs beside it, in a cgroup of their own.
            (bed.root / "hog").mkdir()
            for _ in range(cpus + 1):
                hogs.append(_hog(bed.root / "hog"))
            hogged = time.time()

            def raised() -> Status | None:
                status = window_after(hogged + WINDOW_S)
                if status is None:
                    return None
                worker, node = _cpu_some(_worker(status).pressure), _cpu_some(status.host.pressure)
                assert worker is not None and node is not None
                return status if worker > max(2 * base_worker, base_worker + 0.05) and \
                    node > max(2 * base_node, base_node + 0.05) else None

            noisy = wait_for(raised, 300, f"the hog to raise the CPU pressure over the quiet "
                             f"window's (worker {base_worker:.3f}, node {base_node:.3f})",
                             explain=explain, every=0.5)
            w = _worker(noisy)
            print(f"quiet: worker cpu some {base_worker:.3f}, node {base_node:.3f}; "
                  f"hogged: worker {_cpu_some(w.pressure):.3f}, "
                  f"node {_cpu_some(noisy.host.pressure):.3f}")
            print(format_interference(noisy))
            # The rest of what slows it is sensed too: memory and io pressure, throttling.
            assert all(w.pressure[r]["some_ratio"] is not None for r in ("memory", "io")), \
                w.pressure
            assert w.throttled_window_ratio is not None
            # Hardware counters: one line at start, whichever way this host has them.
            log = bed.daemon_log.read_text()
            said = noisy.host.hardware_counters
            assert said and log.count(said) == 1, log[-2000:]
            assert said.startswith(("perf_event_open: ", "hardware counters: "))
        finally:
            for hog in hogs:
                os.killpg(hog.pid, signal.SIGKILL)
                hog.wait()
