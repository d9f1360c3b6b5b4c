"""Sampling N cgroups' cpu.stat: our one C call (CgroupTable.sample) against Python reading
each file, against psutil summing the CPU times of each cgroup's processes, and against
`docker stats --no-stream` where a Docker engine answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import numpy as np
import psutil

from bench.cgroups import Cgroups
from bench.timing import NotMeasured, Row, Stats, measure, summarize
from dqoes_cg.cgtable import CgroupTable

PART = "sampling"
OURS = "C, one call for all (CgroupTable.sample)"
PER_FILE = "Python: open, read, parse each cpu.stat"
KEPT_OPEN = "Python: os.pread each cpu.stat kept open, parse"
PSUTIL = "psutil: cgroup.procs, sum cpu_times() of each process"
DOCKER_STATS = "docker stats --no-stream"
DOCKER_STATS_REFERENCE_S = 2.0
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


def docker_engine() -> str | None:
    """None if a Docker engine answers here, else why not."""
    if shutil.which("docker") is None:
        return "no docker CLI where the bench ran"
    try:
        answer = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                                capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer within 30 s"
    if answer.returncode != 0:
        return "no Docker engine where the bench ran"
    return None


def _docker_stats(repeats: int, where: str) -> Row | NotMeasured:
    """`docker stats --no-stream` over the containers the engine already runs (read only:
    the bench starts and changes no container of its own)."""
    reference = "about 2 s per sample (the paper's method, figure quoted in the issue)"
    why = docker_engine()
    ids = [] if why else subprocess.run(["docker", "ps", "-q"], capture_output=True,
                                        text=True, check=True).stdout.split()
    if why or not ids:
        return NotMeasured(PART, DOCKER_STATS, why or "the Docker engine runs no container",
                           reference, DOCKER_STATS_REFERENCE_S)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(["docker", "stats", "--no-stream", *ids], capture_output=True,
                       check=True)
        samples.append(time.perf_counter() - start)
    return Row.of(PART, DOCKER_STATS, summarize(samples), where=where, n=len(ids),
                  role="baseline", per=f"{len(ids)} containers", versus=OURS)


def run(cgroups: Cgroups, ns: list[int], repeats: int, budget_s: float) -> list[Row | NotMeasured]:
    results: list[Row | NotMeasured] = []
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
        with_process = min(n, cgroups.processes)
        for case, stats in timings:
            ours = case == OURS
            results.append(Row.of(
                PART, case, stats, where=cgroups.where, n=n, role="ours" if ours else "baseline",
                per=f"{n} cgroups", versus=None if ours else OURS,
                note=f"{with_process} of the {n} cgroups hold one process" if case == PSUTIL
                else ""))
    results.append(_docker_stats(repeats, cgroups.where))
    return results
