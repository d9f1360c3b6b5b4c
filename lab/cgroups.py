"""Find a usable cgroup v2 hierarchy with the cpu controller, and make and remove the
throwaway cgroups that kernel tests work in."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

_names = itertools.count()


def cgroup2_cpu_mount() -> Path | None:
    """The mount point of a cgroup v2 hierarchy whose root delegates the cpu controller to
    its children (enabling it if it can), or None: e.g. on a v1/v2 hybrid host, where cpu is
    bound to v1."""
    for mount in _cgroup2_mounts():
        try:
            if "cpu" not in (mount / "cgroup.controllers").read_text().split():
                continue
            subtree = mount / "cgroup.subtree_control"
            if "cpu" not in subtree.read_text().split():
                subtree.write_text("+cpu")
        except OSError:
            continue
        return mount
    return None


def _cgroup2_mounts() -> list[Path]:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype == "cgroup2":
            mounts.append(Path(fields[4].replace("\\040", " ")))
    return mounts


def make_test_cgroup(parent: Path) -> Path:
    """A fresh child cgroup of `parent` whose own children get the cpu controller."""
    path = parent / f"dqoes-test-{os.getpid()}-{next(_names)}"
    path.mkdir()
    try:
        (path / "cgroup.subtree_control").write_text("+cpu")
    except OSError:
        path.rmdir()
        raise
    return path


def remove_cgroup_tree(path: Path, timeout: float = 10.0) -> None:
    """Kill every process left in the subtree, then remove it, children first."""
    if not path.exists():
        return
    kill_file = path / "cgroup.kill"
    if kill_file.exists():
        kill_file.write_text("1")
    deadline = time.monotonic() + timeout
    while _populated(path):
        if not kill_file.exists():  # kernels before 5.14: kill one by one
            for procs in path.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    _kill(int(pid))
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes in {path} did not die within {timeout} s")
        time.sleep(0.01)
    for dirpath, _, _ in os.walk(path, topdown=False):
        os.rmdir(dirpath)


def _populated(path: Path) -> bool:
    events = dict(line.split() for line in (path / "cgroup.events").read_text().splitlines())
    return events.get("populated") == "1"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
