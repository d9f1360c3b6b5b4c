"""A burst of labelled containers on a real kernel: dqoesd follows an engine (a fake one,
tests/fakeengine.py) whose listing names N real cgroups at once, each holding a sleeping
process, then none of them. Every one is bound and, once its ring holds latencies (written
here, as its producer would), limited; then every one is given back, while `dqoesctl
status` is answered within its client deadline throughout and the ticks go on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dqoes_cg.control import request
from dqoes_cg.ring import DEFAULT_CAPACITY, ring_dir_name, ring_path
from dqoes_cg.status import Status
from lab import testbed
from lab.guest.initramfs import BUSYBOX
from tests.fakeengine import FakeEngine
from tests.ringfile import RawWriter

pytestmark = pytest.mark.kernel

N = 300
UNLIMITED = "max 100000"


def local_sleep(directory: Path) -> Path:
    """A static `sleep` in `directory` (the guest's own tmpfs). Run from the host's share, each
    sleeper held its binary and libraries open through 9p; the 300 killed at once by the
    testbed's cgroup.kill then closed them together, and in 3 of 6 runs at a host load of 8-19
    that storm of 9p requests left the guest's 9p client waiting with nothing outstanding at
    the host's end: every process closing a file of the share hung (the heartbeat's
    included), and the guest looked stopped."""
    sleep = directory / "sleep"
    shutil.copy(BUSYBOX, sleep)  # busybox runs the applet its name says
    return sleep


class StatusWatch:
    """Asks for `status` as dqoesctl does (its deadline: DaemonUnavailable fails the test),
    and keeps the longest wait for an answer, to be reported."""

    def __init__(self, bed: testbed.Testbed) -> None:
        self.bed = bed
        self.longest = 0.0

    def status(self) -> Status:
        start = time.monotonic()
        status = Status.from_json(request(self.bed.socket, "status"))
        self.longest = max(self.longest, time.monotonic() - start)
        return status

    def until(self, done: Callable[[Status], bool], timeout: float, what: str,
              between: Callable[[], None] = lambda: None) -> Status:
        """Polls until `done` holds, calling `between` after each look; the ticks must have
        gone on meanwhile."""
        first = self.status()
        deadline = time.monotonic() + timeout
        while not done(status := self.status()):
            between()
            assert time.monotonic() < deadline, (
                f"timed out after {timeout:.0f} s waiting for {what}: "
                f"{len(status.containers)} targets, "
                f"{sum(c.cls == 'pending' for c in status.containers)} pending\n"
                f"{self.bed.daemon_log.read_text()[-4000:]}")
            time.sleep(2.0)  # a status of N containers costs the emulated CPU
        assert status.host.ticks > first.host.ticks
        return status


def test_a_burst_of_containers_joins_and_leaves_while_status_answers(tmp_path: Path) -> None:
    names = [f"c{i:03d}" for i in range(N)]
    sleep = local_sleep(tmp_path)
    sleepers: list[subprocess.Popen[bytes]] = []
    engine = FakeEngine(tmp_path / "engine.sock")
    try:
        with testbed.Testbed(f"dqoes-burst-{os.getpid()}", tmp_path) as bed:
            cgroups = {name: bed.root / name for name in names}
            for i, (name, cgroup) in enumerate(cgroups.items()):
                cgroup.mkdir()
                sleeper = subprocess.Popen([sleep, "inf"])
                sleepers.append(sleeper)
                (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
                engine.add(f"{i:064x}", name, {"dqoes.target": "100ms"}, pid=sleeper.pid)
            start = time.monotonic()
            bed.start_daemon("--sample-interval", "0.5", "--interval", "2",
                             "--policy", "dqoes",  # a first limit for any that measured some
                             "--engine-socket", str(engine.path))
            watch = StatusWatch(bed)

            def cpu_max() -> list[str]:
                return [(cgroup / "cpu.max").read_text().strip() for cgroup in cgroups.values()]

            watch.until(lambda s: len(s.containers) == N
                        and all(c.cls != "pending" for c in s.containers), 600,
                        f"{N} containers bound")
            joined = time.monotonic() - start
            rings = [RawWriter(ring_path(bed.run_dir, ring_dir_name(name)), DEFAULT_CAPACITY)
                     for name in names]

            def record() -> None:  # a first limit comes to a container that measured some
                for ring in rings:
                    ring.record(10_000_000)

            watch.until(lambda _: UNLIMITED not in cpu_max(), 600, f"{N} containers limited",
                        record)
            limited = time.monotonic() - start

            engine.containers.clear()  # all stop at once: the next listing names none
            engine.restart()
            start = time.monotonic()
            watch.until(lambda s: not s.containers and set(cpu_max()) == {UNLIMITED}, 600,
                        f"{N} containers given back")
            left = time.monotonic() - start
            print(f"\n{N} containers: bound in {joined:.1f} s, limited in {limited:.1f} s, "
                  f"given back in {left:.1f} s; longest wait for a status "
                  f"{watch.longest:.2f} s")
            assert bed.stop_daemon() == 0
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        engine.close()
