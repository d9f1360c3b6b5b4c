"""The control plane at scale: how a real dqoesd answers requests as the number of its
targets N grows.

    python3 -m bench.scale [--ns 100,1000,10000] [--pending 3] [--fake] [--out DIR]

For each N, over N cgroups (bench/cgroups.py: this machine's cgroup v2 hierarchy if it has
one with the cpu controller, else, or with --fake, a tree of plain files on tmpfs) and a
daemon started with no target (1 s ticks, the default policy):

1. PENDING container names that exist nowhere get targets with --pending: for as long as
   they are pending, the daemon looks for them with a walk of the whole cgroup tree every
   2 s, off its loop. (That walk once ran inside the tick, once per name, and with 2,000
   targets the daemon stopped answering.)
2. All N cgroups get a target, by path, one request at a time, as a script calling
   dqoesctl in a loop would (without the interpreter's start-up): the latency of each
   request, the median and p90 of the first and of the last hundred (a request's cost must
   not grow with N: the last hundred cost what the first did), the time for all N, the
   ticks meanwhile (how many, and the longest gap between two: the loop kept running), and
   how long after the last reply every target was in the loop's tables.
3. At N, the requests of every kind, each REPEATS times: a new objective for a target,
   unset-target and set-target again of a bound cgroup, set-target --pending of a new
   container name, status of one container; list and status of all (fewer times: their
   replies hold N entries, so they grow with N by nature).
4. The walk for pending names: small requests (status of one container) every 0.1 s for
   WINDOW_S with the PENDING names, then as long again after they are unset, and the
   daemon's CPU over each window. One walk is also timed in this process.

Each run writes DIR/scale-<place>.json, then DIR/SCALE.md and DIR/scale.png from every
scale-*.json in DIR (default bench/results): run it on the host, then in the guest
(`python3 -m lab.guest --memory 4096 --writable bench/results -- python3 -m bench.scale
--ns 2000`), and the report holds both.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.cgroups import Cgroups, tmpfs_dir
from bench.dqoesd import Dqoesd, interrupt_on_sigterm
from bench.timing import FAKE, Stats, fmt_time, kernel_place, summarize
from dqoes_cg.cgroup import resolve_many
from dqoes_cg.cgtable import raise_fd_limit
from dqoes_cg.control import DaemonUnavailable, RequestError
from dqoes_cg.controller import FD_RESERVE, FDS_PER_TARGET
from lab.cgroups import cgroup2_cpu_mount

ROOT = Path(__file__).resolve().parents[1]
NS = (100, 1000, 10000)
PENDING = 3
REPEATS = 50
BIG_REPEATS = 5  # list and status of all
EDGE = 100  # the first and the last EDGE requests of step 2
WINDOW_S = 20.0
SPACING_S = 0.1
TARGET_S = 0.1
BOUND_TIMEOUT_S = 600.0

CHANGE = "set-target, new objective"
UNSET = "unset-target (bound)"
RESET = "set-target again (bound)"
PENDING_NAME = "set-target --pending, container name"
STATUS_ONE = "status of one container"
LIST = "list (N entries)"
STATUS = "status (N entries)"
REQUEST_KINDS = (CHANGE, UNSET, RESET, PENDING_NAME, STATUS_ONE, LIST, STATUS)
SET_ALL = "set-target, each of the N"
WALK_ON = "status of one container, while walking"
WALK_OFF = "status of one container, no pending name"


@dataclass
class ScaleRun:
    where: str
    n: int
    pending: int
    set_all_s: float  # N set-target requests, one after the other
    set_first: Stats  # the first EDGE of them
    set_last: Stats  # the last EDGE
    bound_after_s: float  # from the last reply until every target was in the loop's tables
    ticks: int  # during the N requests
    longest_tick_gap_s: float
    requests: dict[str, Stats]  # at N, by kind
    walk_on: Stats  # status of one container, pending names walked for
    walk_off: Stats  # the same without pending names
    cpu_percent_walk: float  # of one core, over WINDOW_S with the pending names
    cpu_percent_quiet: float  # the same without
    walk_s: float  # one walk of the tree for a pending name, timed in the bench's process
    rss_mb: float
    hwm_mb: float
    failures: dict[str, str] = field(default_factory=dict)  # kind -> how many, first error
    tick_interval_s: float = 1.0

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ScaleRun:
        stats = {k: Stats(**doc[k]) for k in ("set_first", "set_last", "walk_on", "walk_off")}
        requests = {k: Stats(**v) for k, v in doc["requests"].items()}
        return cls(**{**doc, **stats, "requests": requests})


@dataclass
class Report:
    runs: list[ScaleRun] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # Ns that could not run, and why
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "runs": [asdict(r) for r in self.runs],
                "skipped": self.skipped}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Report:
        return cls([ScaleRun.from_json(r) for r in doc["runs"]], doc["skipped"], doc["meta"])


def place(fake: bool) -> str:
    if not fake:
        return kernel_place()
    if os.environ.get("DQOES_GUEST") == "1":
        return "guest (qemu TCG), fake cgroupfs on tmpfs"
    return FAKE


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _longest_gap(times: list[float]) -> float:
    return float(np.diff(times).max()) if len(times) > 1 else float("nan")


class Requests:
    """The latency of each request by kind, and the requests that failed."""

    def __init__(self, d: Dqoesd) -> None:
        self.d = d
        self.samples: dict[str, list[float]] = {}
        self.failures: dict[str, str] = {}  # kind -> how many failed, and the first error

    def time(self, kind: str, op: str, **args: Any) -> None:
        samples = self.samples.setdefault(kind, [])
        start = time.perf_counter()
        try:
            self.d.request(op, **args)
        except (RequestError, DaemonUnavailable) as e:
            count, _, first = self.failures.get(kind, f"0 failed: {e}").partition(" failed: ")
            self.failures[kind] = f"{int(count) + 1} failed: {first}"
            return
        samples.append(time.perf_counter() - start)

    def stats(self, kind: str) -> Stats:
        return summarize(self.samples[kind] or [math.nan])


def set_args(name: str, target_s: float = TARGET_S, pending: bool = False) -> dict[str, Any]:
    return {"container": name, "target_s": target_s, "metric": "p95", "pending": pending}


def run_one(n: int, pending: int, mount: Path | None, repeats: int, window_s: float) -> ScaleRun:
    with (Cgroups(n, mount, processes=0) as cgroups,
          tempfile.TemporaryDirectory(prefix="dqoes-bench-scale-", dir=tmpfs_dir()) as tmp,
          Dqoesd(Path(tmp), cgroups.mount, "--sample-interval", "1") as d):
        names = [str(p.relative_to(cgroups.mount)) for p in cgroups.dirs]
        ghosts = [f"absent-{k}" for k in range(pending)]
        req = Requests(d)

        # 1-2: the pending names, then every cgroup one by one.
        for ghost in ghosts:
            d.request("set-target", **set_args(ghost, pending=True))
        start = time.monotonic()
        for name in names:
            req.time(SET_ALL, "set-target", **set_args(name))
        end = time.monotonic()
        ticks = d.ticks_between(start, end)
        while not d.status_line.startswith(f"{n} bound,"):
            if time.monotonic() > end + BOUND_TIMEOUT_S:
                raise RuntimeError(f"not every target was bound after {BOUND_TIMEOUT_S} s: "
                                   f"{d.status_line}")
            time.sleep(0.05)
        bound_after = time.monotonic() - end

        # 3: every kind of request at N.
        for k in range(repeats):
            name = names[k * n // repeats]
            req.time(CHANGE, "set-target", **set_args(name, TARGET_S * (2 + k % 2)))
            req.time(STATUS_ONE, "status", container=name)
            req.time(UNSET, "unset-target", container=name)
            req.time(RESET, "set-target", **set_args(name))
            req.time(PENDING_NAME, "set-target", **set_args(f"absent-new-{k}", pending=True))
        for k in range(repeats):
            req.time("cleanup", "unset-target", container=f"absent-new-{k}")
        for _ in range(min(repeats, BIG_REPEATS)):
            req.time(LIST, "list")
            req.time(STATUS, "status")

        # 4: small requests and the daemon's CPU, with the pending names' walks and without.
        def window(kind: str) -> float:
            cpu, t0 = d.cpu_seconds(), time.monotonic()
            k = 0
            while (now := time.monotonic()) < t0 + window_s:
                req.time(kind, "status", container=names[k % n])
                k += 1
                time.sleep(max(0.0, min(SPACING_S, t0 + window_s - now)))
            return 100 * (d.cpu_seconds() - cpu) / (time.monotonic() - t0)

        cpu_walk = window(WALK_ON)
        for ghost in ghosts:
            d.request("unset-target", container=ghost)
        cpu_quiet = window(WALK_OFF)
        walk_s = float(np.median([_timed(partial(
            resolve_many, ["absent-x"], cgroups.mount))
            for _ in range(3)]))
        memory = d.memory_mb()
        latency = req.samples[SET_ALL]
        return ScaleRun(
            place(cgroups.fake), n, pending, end - start, summarize(latency[:EDGE]),
            summarize(latency[-EDGE:]), bound_after, len(ticks),
            _longest_gap([start, *ticks, end]),
            {k: req.stats(k) for k in REQUEST_KINDS}, req.stats(WALK_ON), req.stats(WALK_OFF),
            cpu_walk, cpu_quiet, walk_s, memory["VmRSS"], memory["VmHWM"], req.failures)


def fd_room_for(n: int, more: int) -> tuple[bool, str]:
    """Whether a daemon started from here may open the descriptors of n targets and `more`
    pending ones (it inherits this process's limit, raised as far as allowed)."""
    need = FDS_PER_TARGET * (n + more) + FD_RESERVE
    room = raise_fd_limit(need, hard=True)
    if room >= need:
        return True, ""
    return False, (f"N = {n:,}: the daemon needs {need:,} open files ({FDS_PER_TARGET} per "
                   f"target); this machine's hard limit leaves {room:,}")


# --- the report ---------------------------------------------------------------------------


def _ms(s: Stats) -> str:
    return "failed" if math.isnan(s.median) else f"{fmt_time(s.median)} / {fmt_time(s.p90)}"


def _places(reports: list[Report]) -> list[tuple[str, list[ScaleRun]]]:
    by_place: dict[str, list[ScaleRun]] = {}
    for rep in reports:
        for run in rep.runs:
            by_place.setdefault(run.where, []).append(run)
    return [(w, sorted(runs, key=lambda r: r.n)) for w, runs in by_place.items()]


def markdown(reports: list[Report]) -> str:
    lines = ["# The control plane at scale (bench/scale.py)", "",
             "A real dqoesd; N targets set one request at a time by cgroup path, with "
             "pending container names that exist nowhere (looked for with a walk of the "
             "cgroup tree every 2 s). Times are median / p90 of each request as the client "
             "sees it (connect, request, reply). Generated by `python3 -m bench.scale`.", ""]
    for rep in reports:
        m = rep.meta
        lines.append(f"- {m.get('place', '?')}: {m.get('date', '?')}, commit "
                     f"{m.get('commit', '?')}, `{m.get('command', '?')}`; {m.get('machine', '')}")
        lines += [f"  - not run: {s}" for s in rep.skipped]
    for where, runs in _places(reports):
        lines += ["", f"## {where}", "",
                  "### Setting N targets one by one", "",
                  "| N | pending names | first 100 | last 100 | last/first (median) | all N "
                  "| per request | in the loop's tables after | ticks (longest gap) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in runs:
            lines.append(
                f"| {r.n:,} | {r.pending} | {_ms(r.set_first)} | {_ms(r.set_last)} | "
                f"{r.set_last.median / r.set_first.median:.2f}x | {r.set_all_s:.1f} s | "
                f"{fmt_time(r.set_all_s / r.n)} | {r.bound_after_s:.1f} s | {r.ticks} "
                f"({r.longest_tick_gap_s:.2f} s) |")
        kinds = list(runs[0].requests)
        lines += ["", "### Requests at N (median / p90)", "",
                  "| request | " + " | ".join(f"N = {r.n:,}" for r in runs) + " |",
                  "|---|" + "---|" * len(runs)]
        for kind in kinds:
            lines.append(f"| {kind} | " + " | ".join(_ms(r.requests[kind]) for r in runs)
                         + " |")
        lines += ["", "### The walk for pending names", "",
                  "| N | one walk | status of one, while walking | without pending names | "
                  "daemon CPU, walking | without |", "|---|---|---|---|---|---|"]
        for r in runs:
            lines.append(f"| {r.n:,} | {fmt_time(r.walk_s)} | {_ms(r.walk_on)} | "
                         f"{_ms(r.walk_off)} | {r.cpu_percent_walk:.1f}% | "
                         f"{r.cpu_percent_quiet:.1f}% |")
        lines += [f"- {r.where}, N = {r.n:,}: {kind}: {what}" for r in runs
                  for kind, what in r.failures.items()]
        lines += ["", "Daemon memory at the end: " + ", ".join(
            f"N = {r.n:,}: {r.rss_mb:.0f} MB (peak {r.hwm_mb:.0f} MB)" for r in runs) + "."]
    lines += ["", "![request latency against N](scale.png)", ""]
    return "\n".join(lines)


def plot(reports: list[Report], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for where, runs in _places(reports):
        ns = [r.n for r in runs]
        for label, values, style in (
                ("set-target, last 100", [r.set_last.median for r in runs], "o-"),
                (STATUS_ONE, [r.requests[STATUS_ONE].median for r in runs], "s-"),
                (STATUS, [r.requests[STATUS].median for r in runs], "^--")):
            ax.plot(ns, values, style, label=f"{label} [{where}]")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("targets N")
    ax.set_ylabel("seconds per request (median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out: Path) -> None:
    reports = [Report.from_json(json.loads(p.read_text()))
               for p in sorted(out.glob("scale-*.json"))]
    (out / "SCALE.md").write_text(markdown(reports))
    if any(rep.runs for rep in reports):
        plot(reports, out / "scale.png")


def main(argv: list[str] | None = None) -> int:
    from bench.__main__ import commit, machine

    p = argparse.ArgumentParser(prog="python3 -m bench.scale",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ns", default=",".join(map(str, NS)),
                   help="numbers of targets, comma-separated")
    p.add_argument("--pending", type=int, default=PENDING)
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--window", type=float, default=WINDOW_S, help="seconds of step 4, twice")
    p.add_argument("--fake", action="store_true",
                   help="a fake tree on tmpfs even where a real cgroup v2 hierarchy is")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    interrupt_on_sigterm()
    ns = [int(x) for x in args.ns.split(",")]
    mount = None if args.fake else cgroup2_cpu_mount()
    rep = Report(meta={"place": place(mount is None), "machine": machine(), "commit": commit(),
                       "date": datetime.datetime.now(datetime.UTC).strftime(
                           "%Y-%m-%d %H:%M UTC"),
                       "command": " ".join(["python3 -m bench.scale",
                                            *(sys.argv[1:] if argv is None else argv)])})
    for n in ns:
        fits, why = fd_room_for(n, args.pending + args.repeats)
        if not fits:
            print(f"skipped: {why}", flush=True)
            rep.skipped.append(why)
            continue
        run = run_one(n, args.pending, mount, args.repeats, args.window)
        print(f"{run.where}, N = {n:,}: set-target first {_ms(run.set_first)}, last "
              f"{_ms(run.set_last)}, all in {run.set_all_s:.1f} s; status "
              f"{_ms(run.requests[STATUS])}", flush=True)
        rep.runs.append(run)
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "-".join(w for w in rep.meta["place"].replace(",", " ").split()
                    if w.isalnum())[:40].lower()
    (args.out / f"scale-{slug}.json").write_text(json.dumps(rep.to_json(), indent=1))
    write_report(args.out)
    print(f"report: {args.out / 'SCALE.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
