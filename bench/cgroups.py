"""The cgroups the kernel benchmarks work on, made once per run and shared by the parts.

`Cgroups(n, mount)` makes n sibling cgroups under a fresh parent: on a real cgroup v2 mount
with the cpu controller, or (mount None) as a fake tree of plain files on tmpfs shaped like
cgroupfs (lab/fakecg.py), which runs the same code paths on the host's CPU but not the
kernel's cgroup handlers. The first IDLE_PROCESSES cgroups get one sleeping process each,
so that the psutil baseline has processes to look at. `floor` times the kernel's part of
sampling or limiting them (cgroup_floor.c: bare system calls from C).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType

from bench.timing import FAKE, Stats, kernel_place, summarize
from dqoes_cg.cgtable import (
    DEFAULT_PERIOD_USEC,
    FDS_PER_CGROUP,
    MAX_QUOTA,
    CgroupTable,
    raise_fd_limit,
)
from dqoes_cg.controller import FD_RESERVE
from lab.cgroups import remove_cgroup_tree
from lab.fakecg import make_cgroup

IDLE_PROCESSES = 1000
FLOOR_SRC = Path(__file__).with_name("cgroup_floor.c")
FDS_PER_CONTAINER = FDS_PER_CGROUP + 1
"""What the tick holds per container: one more, its ring (a probe holds none). The limit
is raised for that many and the controller's reserve, where it may be."""

# Forks the idle processes (a bare interpreter forks fast, even on an emulated CPU), prints
# their pids, and on SIGTERM kills and reaps them before it exits.
_HOLDER = """
import os, signal, sys
pids = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        while True:
            signal.pause()
    pids.append(pid)

def stop(*_):
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        os.waitpid(pid, 0)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
print(*pids, flush=True)
while True:
    signal.pause()
"""


def tmpfs_dir() -> str | None:
    """A tmpfs to work in (rings, fake trees), or None for the default temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


class Cgroups:
    """n cgroups `dirs` under `mount` (or a fake tree), removed by `close`, an idle process
    in each of the first `processes`; `fd_room`: how many descriptors this process may
    still open."""

    def __init__(self, n: int, mount: Path | None, processes: int = IDLE_PROCESSES) -> None:
        self.fd_room = raise_fd_limit(FDS_PER_CONTAINER * n + FD_RESERVE, hard=True)
        self.fake = mount is None
        self.where = FAKE if self.fake else kernel_place()
        self._holder: subprocess.Popen[str] | None = None
        self._floor: Path | None = None
        if mount is None:
            self.mount = Path(tempfile.mkdtemp(prefix="dqoes-bench-", dir=tmpfs_dir()))
            self.parent = self.mount / "bench"
        else:
            self.mount = mount
            self.parent = mount / f"dqoes-bench-{os.getpid()}"
        self.dirs = [self.parent / f"c{i:05d}" for i in range(n)]
        try:
            self._make()
            self.processes = self._start_processes(min(n, processes))
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        if self.fake:
            for d in self.dirs:
                make_cgroup(self.mount, str(d.relative_to(self.mount)))
            return
        self.parent.mkdir()
        (self.parent / "cgroup.subtree_control").write_text("+cpu")
        for d in self.dirs:
            d.mkdir()

    def _start_processes(self, count: int) -> int:
        """One idle process in each of the first `count` cgroups (on a fake tree its pid is
        written to the plain cgroup.procs file). Returns count."""
        if count == 0:
            return 0
        self._holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(count)],
                                        stdout=subprocess.PIPE, text=True,
                                        start_new_session=True)
        assert self._holder.stdout is not None
        pids = self._holder.stdout.readline().split()
        if len(pids) != count:
            raise RuntimeError(f"the idle-process holder started {len(pids)} of {count}")
        for d, pid in zip(self.dirs, pids, strict=False):
            (d / "cgroup.procs").write_text(pid)
        return count

    def floor(self, dirs: list[Path], mode: str, passes: int) -> Stats:
        """Seconds of one pass of bare system calls over the dirs' cpu.stat ("read") or
        cpu.max ("write", or "check-write": a read, then a write), from C, nothing parsed or
        formatted: the kernel's part. A cpu.max written is left unlimited."""
        if self._floor is None:
            self._floor = Path(tempfile.mkdtemp(prefix="dqoes-bench-floor-")) / "cgroup_floor"
            subprocess.run([shutil.which("gcc") or "cc", "-O2", "-std=c11", str(FLOOR_SRC),
                            "-o", str(self._floor)], check=True)
        out = subprocess.run([str(self._floor), mode, str(passes + 1)],
                             input="".join(f"{d}\n" for d in dirs), capture_output=True,
                             text=True, check=True).stdout
        if mode != "read":
            with CgroupTable(dirs) as table:
                table.apply(MAX_QUOTA, DEFAULT_PERIOD_USEC)  # unlimited again, as before
        return summarize([float(s) for s in out.split()[1:]])  # the first pass warms up

    def describe(self) -> str:
        kind = "fake cgroupfs tree on tmpfs" if self.fake else f"cgroup v2 at {self.mount}"
        return (f"{len(self.dirs)} cgroups ({kind}); one idle process in each of the first "
                f"{self.processes}")

    def close(self) -> None:
        if self._floor is not None:
            shutil.rmtree(self._floor.parent, ignore_errors=True)
            self._floor = None
        if self._holder is not None:
            self._holder.terminate()
            try:
                self._holder.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self._holder.pid, signal.SIGKILL)
                self._holder.wait()
            self._holder = None
        if self.fake:
            shutil.rmtree(self.mount, ignore_errors=True)
        elif self.parent.exists():
            remove_cgroup_tree(self.parent, timeout=120)

    def __enter__(self) -> Cgroups:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
