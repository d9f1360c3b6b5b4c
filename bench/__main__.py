"""python3 -m bench: every overhead benchmark that can run here, then the report.

    python3 -m bench [--quick] [--out DIR] [--no-guest]

Parts: "host" is what runs on this machine's CPU: the ring and the policy, and the kernel
parts (sampling, applying, whole tick, daemon) over a fake cgroupfs tree on tmpfs. "kernel"
is those kernel parts on a real cgroup v2 hierarchy with the cpu controller, and the cost
of one cpu.max write against the hierarchy's size (hierarchy.py): on this host if
it has one, else inside a qemu guest (`python3 -m lab.guest`), which runs `python3 -m
bench --part kernel --json FILE` with FILE in a host directory it may write to. "docker" is
Docker's tools against ours on the same containers (docker.py): always in a guest with
systemd and Docker's engine (`python3 -m lab.guest --systemd`), whose engine it may
restart. The report goes to DIR (default bench/results): results.json, REPORT.md,
tick_cost.png, tick_per_container.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench import (
    applying,
    daemon_overhead,
    docker,
    hierarchy,
    policy_loop,
    report,
    ring_bench,
    sampling,
    tick,
)
from bench.cgroups import FDS_PER_CGROUP, Cgroups
from bench.report import Results
from bench.timing import FAKE, HOST, NotMeasured, format_table
from lab.cgroups import cgroup2_cpu_mount

ROOT = Path(__file__).resolve().parents[1]
GUEST_TIMEOUT_S = 3600.0
GUEST_MEMORY_MIB = 4096  # 10,000 cgroups and 1,000 idle processes; 100 containers


@dataclass(frozen=True)
class Sizes:
    ns: tuple[int, ...]  # containers, for sampling and applying
    tick_ns: tuple[int, ...]
    policy_ns: tuple[int, ...]
    repeats: int
    budget_s: float  # per case, once MIN_REPEATS are done
    daemon_ns: tuple[int, ...]
    daemon_s: float
    docker_ns: tuple[int, ...]  # running containers
    docker_repeats: int
    docker_budget_s: float
    hierarchy_ts: tuple[int, ...]  # cgroups with the cpu controller, on a real hierarchy


# 4,000: the most a tick holds the descriptors of (four each) under a hard limit of 20,000
FULL = Sizes((10, 100, 1000, 4000, 10000), (100, 1000, 4000, 10000), policy_loop.NS, 15, 3.0,
             (100, 1000), 60.0, (10, 100), 5, 20.0, (100, 1000, 3000, 10000))
QUICK = Sizes((2, 5), (2,), (10, 100), 3, 0.1, (5,), 2.0, (2,), 3, 0.1, (2, 5))


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.machine()


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}")


def describe_place(cgroups: Cgroups) -> str:
    if cgroups.fake:
        kind = ("the host's CPU, the kernel's cgroup files replaced by plain files on tmpfs "
                "(the same code paths and system calls, not the kernel's cgroup handlers)")
    elif os.environ.get("DQOES_GUEST") == "1":
        kind = ("a qemu-system-x86_64 -M microvm guest under TCG (an emulated CPU, several "
                "times slower than the host), real cgroup v2")
    else:
        kind = "this host's real cgroup v2"
    return f"{kind}; {machine()}; {cgroups.describe()}"


def kernel_parts(sizes: Sizes, mount: Path | None) -> Results:
    """Sampling, applying, tick and daemon on one set of cgroups: under `mount`, or a fake
    tree; under a real `mount`, first the cost of a write against the hierarchy's size."""
    res = Results()
    if mount is not None:
        res.add(hierarchy.run(mount, list(sizes.hierarchy_ts), sizes.repeats))
    n = max(*sizes.ns, *sizes.tick_ns, *sizes.daemon_ns)
    with Cgroups(n, mount) as cgroups:
        res.places[cgroups.where] = describe_place(cgroups)
        ns = [n for n in sizes.ns if FDS_PER_CGROUP * n <= cgroups.fd_room]
        for skipped in sizes.ns[len(ns):]:
            res.not_measured.append(NotMeasured(
                "sampling, applying", f"N={skipped:,} on {cgroups.where}",
                f"needs {FDS_PER_CGROUP * skipped:,} open files; the limit here leaves "
                f"{cgroups.fd_room:,}", "the other place's figures at this N"))
        res.add(sampling.run(cgroups, ns, sizes.repeats, sizes.budget_s))
        res.add(applying.run(cgroups, ns, sizes.repeats, sizes.budget_s))
        res.add(tick.run(cgroups, list(sizes.tick_ns), sizes.repeats, sizes.budget_s))
        for daemon_n in sizes.daemon_ns:
            res.daemon.append(daemon_overhead.run(cgroups, daemon_n, sizes.daemon_s))
    return res


def docker_part(sizes: Sizes) -> Results:
    """Docker's tools against ours, here (this must be a guest: the engine is restarted)."""
    rows, places = docker.run(list(sizes.docker_ns), sizes.docker_repeats,
                              sizes.docker_budget_s)
    res = Results(places=places)
    res.add(rows)
    return res


def host_parts(sizes: Sizes, quick: bool) -> Results:
    res = Results(places={HOST: f"this host's CPU; {machine()}"})
    res.add(ring_bench.run(quick))
    res.add(policy_loop.run(sizes.policy_ns, sizes.repeats, sizes.budget_s))
    res.merge(kernel_parts(sizes, None))
    return res


def in_guest(part: str, quick: bool, systemd: bool = False) -> Results:
    """A part in a qemu guest (lab/guest), which writes its results into a host directory
    shared writable with it; its output streams to ours."""
    with tempfile.TemporaryDirectory(prefix="dqoes-bench-guest-") as shared:
        out = Path(shared) / f"{part}.json"
        command = [sys.executable, "-m", "lab.guest", *(["--systemd"] if systemd else []),
                   "--memory", str(GUEST_MEMORY_MIB), "--timeout", str(GUEST_TIMEOUT_S),
                   "--writable", shared, "--", sys.executable, "-m", "bench", "--part", part,
                   "--json", str(out), *(["--quick"] if quick else [])]
        status = subprocess.run(command, cwd=ROOT, check=False).returncode
        if status != 0 or not out.exists():
            raise RuntimeError(f"the bench's {part} part in the guest failed (status {status})")
        return Results.from_json(json.loads(out.read_text()))


def kernel_where(no_guest: bool) -> tuple[str, Path | None, str]:
    """Where the kernel parts can run: ("here", mount, ""), ("guest", None, "") or
    ("nowhere", None, why)."""
    mount = cgroup2_cpu_mount()
    if mount is not None:
        return "here", mount, ""
    why = "this host has no cgroup v2 hierarchy with the cpu controller"
    if no_guest:
        return "nowhere", None, f"{why}, and --no-guest"
    from lab.guest.prereqs import missing_guest_packages

    missing = missing_guest_packages()
    if missing:
        return "nowhere", None, f"{why}, and no guest (missing {' '.join(missing)})"
    return "guest", None, ""


def docker_where(no_guest: bool) -> str:
    """Why the docker part cannot run in a systemd guest here, or "" if it can."""
    if no_guest:
        return "--no-guest (it runs only in a guest, whose Docker engine it may restart)"
    from lab.guest.systemd_guest import missing_systemd_guest_packages

    missing = missing_systemd_guest_packages()
    return f"no systemd guest (missing {' '.join(missing)})" if missing else ""


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head} with uncommitted changes" if git("status", "--porcelain") else head


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="tiny N, few repeats: a smoke run of every part, figures meaningless")
    p.add_argument("--part", choices=("all", "host", "kernel", "docker"), default="all")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results",
                   help="where the report goes")
    p.add_argument("--json", type=Path, default=None,
                   help="write only the raw results here, no report (what the guest does)")
    p.add_argument("--no-guest", action="store_true",
                   help="never boot a guest: without cgroup v2 here, the kernel parts are "
                        "reported as not measured")
    args = p.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    res = Results(meta={
        "command": shlex.join(["python3", "-m", "bench", *(argv if argv is not None
                                                            else sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(), "sizes": asdict(sizes)})

    if args.part in ("all", "host"):
        res.merge(host_parts(sizes, args.quick))
    if args.part == "kernel":
        mount = cgroup2_cpu_mount()
        if mount is None:
            p.error("--part kernel needs cgroup v2 with the cpu controller here")
        res.merge(kernel_parts(sizes, mount))
    elif args.part == "docker":
        if os.environ.get("DQOES_GUEST") != "1":
            p.error("--part docker restarts Docker's engine: it runs in a guest only "
                    "(python3 -m bench boots one)")
        res.merge(docker_part(sizes))
    elif args.part == "all":
        where, mount, why = kernel_where(args.no_guest)
        if where == "here":
            res.merge(kernel_parts(sizes, mount))
        elif where == "guest":
            res.merge(in_guest("kernel", args.quick))
        else:
            res.not_measured.append(NotMeasured(
                "kernel", "sampling, applying, tick and daemon on a real cgroup v2", why,
                f"see the figures of {FAKE!r}"))
        why = docker_where(args.no_guest)
        if why:
            res.not_measured += docker.not_measured(why)
        else:
            res.merge(in_guest("docker", args.quick, systemd=True))

    print(format_table(res.rows))
    if args.json is not None:
        args.json.write_text(json.dumps(res.to_json()))
        return 0
    report.write(res, args.out)
    print(f"\nreport: {args.out / 'REPORT.md'}")
    for check in report.check_targets(res):
        verdict = {True: "met", False: "MISSED", None: "no verdict"}[check.met]
        print(f"  {verdict:12} {check.target} [{check.where}]: {check.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
