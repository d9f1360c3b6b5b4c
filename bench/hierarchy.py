"""The kernel's cost of one cpu.max write against the size of the hierarchy: T cgroups
with the cpu controller. On every write of cpu.max the kernel checks that each task group's
bandwidth still fits within its parent's (tg_set_cfs_bandwidth -> __cfs_schedulable, a
walk of the whole task-group tree from the root), so one write costs O(T), and writing N
limits O(N·T), whoever writes them. A read of cpu.stat is timed beside it: no walk. Both
are bare system calls from C (cgroup_floor.c) on the first SAMPLED of T cgroups made for
the purpose, each T on its own, on a real cgroup v2 hierarchy only (a fake tree has no
task groups)."""

from __future__ import annotations

from pathlib import Path

from bench.cgroups import Cgroups
from bench.timing import Row, Stats

PART = "hierarchy"
WRITE = "C: pwrite of a cpu.max"
READ = "C: pread of a cpu.stat"
SAMPLED = 100


def run(mount: Path, ts: list[int], passes: int) -> list[Row]:
    rows = []
    for t in ts:
        with Cgroups(t, mount, processes=0) as cgroups:
            dirs = cgroups.dirs[:SAMPLED]
            for case, mode in ((WRITE, "write"), (READ, "read")):
                whole = cgroups.floor(dirs, mode, passes)
                per_call = Stats(*(s / len(dirs) for s in (whole.median, whole.p10, whole.p90)),
                                 whole.repeats)
                rows.append(Row.of(PART, case, per_call, where=cgroups.where, n=t, role="floor",
                                   note=f"each of {len(dirs)} of the {t:,} cgroups"))
    return rows
