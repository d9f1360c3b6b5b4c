"""Sampling N cgroups' cpu.stat: our one C call (CgroupTable.sample) against Python reading
each file, and against psutil summing the CPU times of each cgroup's processes. Docker's
`docker stats` is measured on running containers by docker.py. Beside them, the floor: the
same system calls from C with nothing parsed, the kernel's part of ours."""

from __future__ import annotations

import os

import numpy as np
import psutil

from bench.cgroups import Cgroups
from bench.timing import Row, Stats, measure
from dqoes_cg.cgtable import CgroupTable

PART = "sampling"
OURS = "C, one call for all (CgroupTable.sample)"
PER_FILE = "Python: open, read, parse each cpu.stat"
KEPT_OPEN = "Python: os.pread each cpu.stat kept open, parse"
PSUTIL = "psutil: cgroup.procs, sum cpu_times() of each process"
FLOOR = "C: pread of each cpu.stat kept open, nothing parsed (the kernel's part)"
KEYS = (b"usage_usec", b"throttled_usec", b"nr_periods", b"nr_throttled")


def parse_cpu_stat(data: bytes, out: np.ndarray, i: int) -> None:
    """The four counters the daemon keeps, into column i of out (shape (4, n))."""
    fields = dict(line.split() for line in data.splitlines())
    for k, key in enumerate(KEYS):
        out[k, i] = int(fields[key])


def python_per_file(paths: list[str], out: np.ndarray) -> None:
    for i, path in enumerate(paths):
        with open(path, "rb") as f:
            parse_cpu_stat(f.read(), out, i)


def python_kept_open(fds: list[int], out: np.ndarray) -> None:
    for i, fd in enumerate(fds):
        parse_cpu_stat(os.pread(fd, 4096, 0), out, i)


def psutil_cpu(procs_files: list[str], out: np.ndarray) -> None:
    """How a psutil user measures a container: its processes' user + system CPU seconds."""
    for i, procs in enumerate(procs_files):
        total = 0.0
        with open(procs) as f:
            pids = f.read().split()
        for pid in pids:
            try:
                times = psutil.Process(int(pid)).cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        out[i] = total


def run(cgroups: Cgroups, ns: list[int], repeats: int, budget_s: float) -> list[Row]:
    results: list[Row] = []
    for n in ns:
        dirs = cgroups.dirs[:n]
        stat_files = [str(d / "cpu.stat") for d in dirs]
        out = np.zeros((len(KEYS), n), np.uint64)
        with CgroupTable(dirs) as table:
            ok = table.sample()
            if ok != n:
                raise RuntimeError(f"CgroupTable.sample read {ok} of {n} cgroups")
            timings: list[tuple[str, Stats]] = [
                (OURS, measure(table.sample, repeats=repeats, budget_s=budget_s))]
        timings.append((PER_FILE, measure(lambda f=stat_files, o=out: python_per_file(f, o),
                                          repeats=repeats, budget_s=budget_s)))
        fds = [os.open(f, os.O_RDONLY | os.O_CLOEXEC) for f in stat_files]
        try:
            timings.append((KEPT_OPEN, measure(lambda f=fds, o=out: python_kept_open(f, o),
                                               repeats=repeats, budget_s=budget_s)))
        finally:
            for fd in fds:
                os.close(fd)
        procs_files = [str(d / "cgroup.procs") for d in dirs]
        cpu = np.zeros(n)
        timings.append((PSUTIL, measure(lambda f=procs_files, o=cpu: psutil_cpu(f, o),
                                        repeats=repeats, budget_s=budget_s)))
        timings.append((FLOOR, cgroups.floor(dirs, "read", repeats)))
        with_process = min(n, cgroups.processes)
        for case, stats in timings:
            ours = case == OURS
            role = "ours" if ours else "floor" if case == FLOOR else "baseline"
            results.append(Row.of(
                PART, case, stats, where=cgroups.where, n=n, role=role,
                per=f"{n} cgroups", versus=None if ours else OURS,
                note=f"{with_process} of the {n} cgroups hold one process" if case == PSUTIL
                else ""))
    return results
