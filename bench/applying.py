"""Applying N CPU limits to cpu.max: our one C call (CgroupTable.apply) against Python
writing each file. Every timed call changes every limit (two quotas take turns), so each
one writes all N files; before it writes over a limit of ours, CgroupTable.apply reads the
value in place (someone else's would be a foreign write, which the reconcile would not see
once ours replaced it), which the Python baselines do not. Docker's `docker update --cpus` is
measured on running containers by docker.py. Beside them, the floor: the same system calls
from C (a read and a write of each cpu.max) with nothing parsed or formatted, the kernel's
part of ours."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import numpy as np

from bench.cgroups import Cgroups
from bench.timing import Row, measure
from dqoes_cg.cgtable import DEFAULT_PERIOD_USEC, CgroupTable

PART = "applying"
OURS = "C, one call for all (CgroupTable.apply)"
PER_FILE = "Python: open, write, close each cpu.max"
KEPT_OPEN = "Python: os.pwrite each cpu.max kept open"
FLOOR = ("C: pread, then pwrite of each cpu.max kept open, nothing parsed or formatted (the "
         "kernel's part)")
QUOTAS_USEC = (50_000, 60_000)


def python_per_file(paths: list[str], quota: int) -> None:
    for path in paths:
        with open(path, "w") as f:
            f.write(f"{quota} {DEFAULT_PERIOD_USEC}\n")


def python_kept_open(fds: list[int], quota: int) -> None:
    for fd in fds:
        os.pwrite(fd, f"{quota} {DEFAULT_PERIOD_USEC}\n".encode(), 0)


def run(cgroups: Cgroups, ns: list[int], repeats: int, budget_s: float) -> list[Row]:
    results: list[Row] = []
    for n in ns:
        dirs = cgroups.dirs[:n]
        max_files = [str(d / "cpu.max") for d in dirs]
        quotas = itertools.cycle(QUOTAS_USEC)
        timings = [(PER_FILE, measure(lambda f=max_files, q=quotas: python_per_file(f, next(q)),
                                      repeats=repeats, budget_s=budget_s))]
        fds = [os.open(f, os.O_WRONLY | os.O_CLOEXEC) for f in max_files]
        try:
            timings.append((KEPT_OPEN, measure(lambda f=fds, q=quotas: python_kept_open(f, next(q)),
                                               repeats=repeats, budget_s=budget_s)))
        finally:
            for fd in fds:
                os.close(fd)
        with CgroupTable(dirs) as table:
            requests = itertools.cycle([np.full(n, q, np.int64) for q in QUOTAS_USEC])

            def apply(table: CgroupTable = table, requests: Iterator[np.ndarray] = requests,
                      ) -> None:
                if table.apply(next(requests), DEFAULT_PERIOD_USEC) != len(table):
                    raise RuntimeError(f"CgroupTable.apply failed: {table.error(0)}")

            timings.insert(0, (OURS, measure(apply, repeats=repeats, budget_s=budget_s)))
        timings.append((FLOOR, cgroups.floor(dirs, "check-write", repeats)))  # unlimits all
        for case, stats in timings:
            ours = case == OURS
            role = "ours" if ours else "floor" if case == FLOOR else "baseline"
            results.append(Row.of(PART, case, stats, where=cgroups.where, n=n, role=role,
                                  per=f"{n} cgroups", versus=None if ours else OURS))
    return results
