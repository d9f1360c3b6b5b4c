"""Docker's own tools against ours, on the same running containers: `docker stats
--no-stream` (the paper's way to sample) and `docker update --cpus` (its way to act), against
CgroupTable.sample and CgroupTable.apply on those containers' cgroups, in the same run, with
Docker's engine on each cgroup driver (cgroupfs, systemd), at each N of running containers.
All in wall-clock time: Docker's tools do their work in other processes (dockerd, runc).

It needs an engine it may configure and restart: it runs in the systemd guest of lab/guest
(`python3 -m bench --part docker`, which boots one), never on a host's own engine. It starts
containers of its own only (dqoes-bench-<k>, an idle process each, from a one-file image
imported locally) and removes them afterwards.
"""

from __future__ import annotations

import io
import itertools
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench.timing import NotMeasured, Row, Stats, measure
from dqoes_cg.cgtable import DEFAULT_PERIOD_USEC, MAX_QUOTA, CgroupTable
from lab.guest.e2e import DOCKER, Docker, cgroup_of
from lab.images import BUSYBOX

PART = "docker"
STATS = "docker stats --no-stream (one call for all N)"
SAMPLE = "C, one call for all (CgroupTable.sample)"
UPDATE_EACH = "docker update --cpus (one call per container)"
UPDATE_ALL = "docker update --cpus (one call for all N)"
APPLY = "C, one call for all (CgroupTable.apply)"
DRIVERS = ("cgroupfs", "systemd")
IMAGE = "dqoes-bench-idle:latest"
NAME = "dqoes-bench-{}"
CPUS = ("0.5", "0.6")  # every update changes the limit
UPDATE_EACH_TIMED = 10
QUOTAS_USEC = (50_000, 60_000)
STATS_REFERENCE_S = 2.0
UPDATE_REFERENCE_S = 0.025


def place(driver: str) -> str:
    return f"guest (qemu TCG), cgroup v2, Docker {driver} driver"


def not_measured(why: str) -> list[NotMeasured]:
    """The reference figures of the paper's method, in place of a run."""
    return [NotMeasured(PART, STATS, why, "about 2 s per sample (the paper's method, figure "
                        "quoted in the issue)", STATS_REFERENCE_S),
            NotMeasured(PART, UPDATE_EACH, why, "about 25 ms per change (the paper's method, "
                        "figure quoted in the issue)", UPDATE_REFERENCE_S)]


def docker(*args: str, timeout: float = 600) -> str:
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])}... exited {result.returncode}: "
                           f"{result.stderr.strip()[-500:]}")
    return result.stdout


def import_idle_image() -> None:
    """An image holding a static busybox alone; its containers run `sleep`."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        tar.add(BUSYBOX, arcname="busybox")
    subprocess.run([DOCKER, "import", "-", IMAGE], input=data.getvalue(), check=True,
                   capture_output=True, timeout=600)


def start(names: list[str]) -> None:
    """Runs the containers, a few `docker run` at a time (each waits for its container)."""
    def run(name: str) -> str:
        return docker("run", "-d", "--name", name, "--network", "none", IMAGE,
                      "/busybox", "sleep", "2147483647")

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(run, names))


def cgroups_of(names: list[str]) -> list[Path]:
    pids = docker("inspect", "--format", "{{.State.Pid}}", *names).split()
    return [cgroup_of(int(pid)) for pid in pids]


def _sequence(calls: list[list[str]]) -> Callable[[], None]:
    """One timed run: every docker command of `calls`, one after the other."""
    turn = itertools.cycle(CPUS)

    def run() -> None:
        cpus = next(turn)
        for args in calls:
            docker(*(cpus if a == "{cpus}" else a for a in args))
    return run


def measure_at(names: list[str], driver: str, repeats: int, budget_s: float) -> list[Row]:
    """Each case over the same N running containers; ratios are per container."""
    n, where = len(names), place(driver)
    cases: list[tuple[str, str, Stats]] = []
    stats = measure(lambda: docker("stats", "--no-stream", *names), repeats=repeats,
                    budget_s=budget_s, wall=True)
    cases.append((STATS, "baseline", stats))
    # One call per container costs the same whatever N is: timed over the first few, and
    # counted for all N, so that its ratio is per container like the others'.
    each = names[:UPDATE_EACH_TIMED]
    one_by_one = measure(_sequence([["update", "--cpus", "{cpus}", name] for name in each]),
                         repeats=repeats, budget_s=budget_s, wall=True)
    scale = n / len(each)
    cases.append((UPDATE_EACH, "baseline", Stats(one_by_one.median * scale,
                                                 one_by_one.p10 * scale,
                                                 one_by_one.p90 * scale, one_by_one.repeats)))
    cases.append((UPDATE_ALL, "baseline", measure(
        _sequence([["update", "--cpus", "{cpus}", *names]]), repeats=repeats,
        budget_s=budget_s, wall=True)))
    with CgroupTable(cgroups_of(names)) as table:
        if table.sample() != n:
            raise RuntimeError(f"CgroupTable.sample read {table.sample()} of {n} containers")
        cases.append((SAMPLE, "ours", measure(table.sample, repeats=repeats,
                                              budget_s=budget_s, wall=True)))
        requests = itertools.cycle([np.full(n, q, np.int64) for q in QUOTAS_USEC])

        def apply() -> None:
            if table.apply(next(requests), DEFAULT_PERIOD_USEC) != n:
                raise RuntimeError(f"CgroupTable.apply failed: {table.error(0)}")

        cases.append((APPLY, "ours", measure(apply, repeats=repeats, budget_s=budget_s,
                                             wall=True)))
        table.apply(MAX_QUOTA, DEFAULT_PERIOD_USEC)
    versus = {STATS: SAMPLE, UPDATE_EACH: APPLY, UPDATE_ALL: APPLY}
    note = {UPDATE_EACH: f"timed over {len(each)} of the {n} containers, counted for all {n}"}
    return [Row.of(PART, case, s, where=where, n=n, role=role, per=f"{n} containers",
                   versus=versus.get(case), note=note.get(case, ""))
            for case, role, s in cases]


def run(ns: list[int], repeats: int, budget_s: float) -> tuple[list[Row | NotMeasured],
                                                              dict[str, str]]:
    """Both drivers at each N (in increasing order, adding containers). Returns the rows
    and a description of each place."""
    if shutil.which("systemctl") is None or not Path(DOCKER).exists():
        return list(not_measured("no Docker engine where the bench ran")), {}
    results: list[Row | NotMeasured] = []
    places = {}
    engine = Docker()
    for driver in DRIVERS:
        engine.start(driver)
        version = docker("version", "--format", "{{.Server.Version}}").strip()
        places[place(driver)] = (f"Docker {version}, {driver} cgroup driver, in a qemu guest "
                                 f"under TCG with systemd as PID 1; {os.cpu_count()} CPUs")
        import_idle_image()
        names: list[str] = []
        try:
            for n in sorted(ns):
                started = time.monotonic()
                start([NAME.format(k) for k in range(len(names), n)])
                names = [NAME.format(k) for k in range(n)]
                print(f"docker ({driver}): {n} containers running after "
                      f"{time.monotonic() - started:.0f} s", flush=True)
                results += measure_at(names, driver, repeats, budget_s)
        finally:
            if names:
                docker("rm", "-f", *names)
    return results, places
