"""A memory soak of dqoesd under heavy churn: does its memory grow without bound (a leak),
or up to a level it then keeps (a high-water mark)?

    python3 -m bench.soak [--minutes 15] [--traced-minutes 5] [--fake] [--out DIR]

A real dqoesd (0.25 s ticks, rings of the default size) over a cgroup tree (this machine's
cgroup v2 hierarchy if it has one with the cpu controller, else, or with --fake, a tree of
plain files on tmpfs) keeps STABLE targets whose rings a producer fills all along, while
the bench churns, CYCLES_PER_S times a second:

- a new cgroup gets a target by path (bound at once);
- a new container ID gets a target with --pending; its cgroup (docker/<id>) appears, and
  the daemon's look for pending containers binds it;
- one live target's ring is overwritten with garbage (the daemon re-creates it);
- the targets of LIVE cycles ago go: unset-target, then their cgroups are removed; on a
  real kernel every other cgroup of a path target is removed first, so that the daemon
  finds it gone and sends its target back to pending before it is unset (a fake tree
  cannot show a cgroup gone under an open file);
- every STATUS_EVERY cycles, status and list of all.

Every SAMPLE_S the daemon's VmRSS, RssAnon (its private memory), open descriptors and
threads are sampled. The verdict compares the growth of RssAnon over the first and the
second half of the run: a leak keeps its slope, a high-water mark flattens. Then a second
daemon goes through the same churn under tracemalloc (--traced-minutes): snapshots after
the first third and at the end, and the source lines whose allocations grew most between
them, say where any growth of the Python heap comes from.

Writes DIR/soak-<place>.json, then DIR/SOAK.md and DIR/soak.png from every soak-*.json in
DIR (default bench/results).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.cgroups import Cgroups, tmpfs_dir
from bench.dqoesd import Dqoesd, interrupt_on_sigterm
from bench.scale import place
from bench.timing import FAKE
from dqoes_cg.control import DaemonUnavailable, RequestError
from dqoes_cg.probe import Probe
from dqoes_cg.ring import ring_dir_name, ring_path
from lab.cgroups import cgroup2_cpu_mount
from lab.fakecg import make_cgroup

ROOT = Path(__file__).resolve().parents[1]
MINUTES = 15.0
TRACED_MINUTES = 5.0
STABLE = 100
LIVE = 40  # cycles a churned target lives
CYCLES_PER_S = 4.0
STATUS_EVERY = 20
SAMPLE_S = 5.0
TICK_S = 0.25
LATENCY_S = 0.05
TOP_LINES = 12
DAEMON_ARGS = ("--sample-interval", str(TICK_S), "--cpus", "2")
LEAK_MB_PER_HOUR = 3.0
"""Growth of RssAnon over the second half above which the verdict is a leak."""

# Runs dqoesd with tracemalloc on; SIGUSR1 dumps a snapshot to PREFIX.<n> (renamed into
# place when whole). argv: PREFIX, then dqoesd's arguments.
_TRACED = """
import os, signal, sys, tracemalloc
tracemalloc.start(8)
prefix = sys.argv.pop(1)
dumped = []
def dump(signum, frame):
    path = f"{prefix}.{len(dumped)}"
    tracemalloc.take_snapshot().dump(path + ".tmp")
    os.rename(path + ".tmp", path)
    dumped.append(path)
signal.signal(signal.SIGUSR1, dump)
from dqoes_cg.daemon import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    rss_anon_mb: float
    fds: int
    threads: int
    cycles: int


@dataclass
class Growth:
    """Where the Python heap grew between two tracemalloc snapshots."""

    first_s: float  # when the first snapshot was taken, into the traced run
    last_s: float
    traced_first_mb: float
    traced_last_mb: float
    top: list[str] = field(default_factory=list)  # "file:line: +size (+count)"


@dataclass
class Soak:
    where: str
    minutes: float
    cycles: int
    requests: int
    samples: list[Sample]
    failures: dict[str, str]
    ring_recreations: int
    growth: Growth | None = None

    def anon_slope_mb_per_hour(self, half: int) -> float:
        """Least-squares slope of RssAnon over the first (0) or second (1) half."""
        points = self.samples[len(self.samples) // 2:] if half else \
            self.samples[:len(self.samples) // 2 + 1]
        if len(points) < 2:
            return float("nan")
        t = np.array([s.t_s for s in points]) / 3600
        return float(np.polyfit(t, [s.rss_anon_mb for s in points], 1)[0])

    @property
    def verdict(self) -> str:
        late = self.anon_slope_mb_per_hour(1)
        if late != late:
            return "too short to tell"
        if late > LEAK_MB_PER_HOUR:
            return f"growing: {late:+.1f} MB/hour over the second half (a leak?)"
        return (f"high-water mark: {self.anon_slope_mb_per_hour(0):+.1f} MB/hour over the "
                f"first half, {late:+.1f} MB/hour over the second")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Soak:
        growth = Growth(**doc["growth"]) if doc.get("growth") else None
        return cls(**{**doc, "samples": [Sample(**s) for s in doc["samples"]],
                      "growth": growth})


class Tree:
    """Cgroups made and removed under `parent` of `mount`: a real cgroup v2 hierarchy, or
    a fake tree of plain files."""

    def __init__(self, mount: Path, parent: str, fake: bool) -> None:
        self.mount = mount
        self.parent = parent
        self.fake = fake
        self.make(parent)

    def make(self, rel: str) -> None:
        """The cgroup `rel` and its ancestors; each gets the cpu controller for its
        children."""
        if self.fake:
            make_cgroup(self.mount, rel)
            return
        path = self.mount
        for part in Path(rel).parts:
            path = path / part
            if not path.exists():
                path.mkdir()
                (path / "cgroup.subtree_control").write_text("+cpu")

    def remove(self, rel: str) -> None:
        path = self.mount / rel
        if self.fake:
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.rmdir()

    def close(self) -> None:
        """Removes the parent and all below it."""
        if self.fake:
            shutil.rmtree(self.mount / self.parent, ignore_errors=True)
            return
        for dirpath, _, _ in os.walk(self.mount / self.parent, topdown=False):
            os.rmdir(dirpath)


class Churn:
    """The churn of the module's docstring, one `cycle` at a time; cycles are numbered
    from `first` (so that a second run makes new cgroups)."""

    def __init__(self, d: Dqoesd, tree: Tree, stable: list[str], live: int,
                 first: int = 0) -> None:
        self.d = d
        self.tree = tree
        self.live = live
        self.k = first
        self.cycles = 0
        self.requests = 0
        self.failures: dict[str, str] = {}
        self.rings = d.work / "run"
        for name in stable:
            self._request("set-target", container=name, target_s=LATENCY_S * 2,
                          metric="p95")
        self.probes = [Probe.open(self._ring(name)) for name in stable]
        self.paths: dict[int, str] = {}  # cycle -> the path target made then
        self.containers: dict[int, str] = {}  # cycle -> the container ID given a target
        self.orphans: dict[int, str] = {}  # cycle -> a path target to unset, its cgroup gone

    def _ring(self, name: str) -> Path:
        return ring_path(self.rings, ring_dir_name(name))

    def _request(self, op: str, **args: Any) -> Any:
        self.requests += 1
        try:
            return self.d.request(op, **args)
        except (RequestError, DaemonUnavailable) as e:
            count, _, first = self.failures.get(op, f"0 failed: {e}").partition(" failed: ")
            self.failures[op] = f"{int(count) + 1} failed: {first}"
            return None

    def cycle(self) -> None:
        k = self.k
        self.k += 1
        self.cycles += 1
        for probe in self.probes:
            probe.record(LATENCY_S)
        path = self.paths[k] = f"{self.tree.parent}/churn/g{k:07d}"
        self.tree.make(path)
        self._request("set-target", container=path, target_s=0.1, metric="p95")
        container = self.containers[k] = f"{k + 1:064x}"
        self._request("set-target", container=container, target_s=0.1, metric="mean",
                      pending=True)
        self.tree.make(f"{self.tree.parent}/docker/{container}")
        self._break_ring(self.paths.get(k - self.live // 2))
        self._retire(k - self.live)
        if k % STATUS_EVERY == 0:
            self._request("status")
            self._request("list")

    def _break_ring(self, name: str | None) -> None:
        if name is None:
            return
        try:
            fd = os.open(self._ring(name), os.O_WRONLY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            os.pwrite(fd, b"\xff" * 64, 0)
        finally:
            os.close(fd)

    def _retire(self, k: int) -> None:
        """The targets of cycle k go. On a real kernel, every other path target loses its
        cgroup first, and is unset LIVE/2 cycles later, pending by then."""
        container = self.containers.pop(k, None)
        if container is not None:
            self._request("unset-target", container=container)
            self.tree.remove(f"{self.tree.parent}/docker/{container}")
        path = self.paths.pop(k, None)
        if path is not None and (self.tree.fake or k % 2):
            self._request("unset-target", container=path)
            self.tree.remove(path)
        elif path is not None:
            self.tree.remove(path)
            self.orphans[k + self.live // 2] = path
        orphan = self.orphans.pop(k, None)
        if orphan is not None:
            self._request("unset-target", container=orphan)

    def close(self) -> None:
        for probe in self.probes:
            probe.close()


def _count(pid: int, what: str) -> int:
    return len(os.listdir(f"/proc/{pid}/{what}"))


def churn_for(d: Dqoesd, tree: Tree, stable: list[str], seconds: float, live: int,
              first: int = 0, at: dict[float, Callable[[], None]] | None = None,
              min_cycles: int = 0) -> tuple[Churn, list[Sample]]:
    """Churns for `seconds`, and `min_cycles` at least, sampling the daemon every SAMPLE_S;
    `at` maps a fraction of the run to a call made when it is reached."""
    churn = Churn(d, tree, stable, live, first)
    calls = sorted((at or {}).items())
    samples: list[Sample] = []

    def sample() -> None:
        memory = d.memory_mb()
        samples.append(Sample(time.monotonic() - start, memory["VmRSS"], memory["RssAnon"],
                              _count(d.proc.pid, "fd"), _count(d.proc.pid, "task"),
                              churn.cycles))

    start = time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < seconds or churn.cycles < min_cycles:
            if elapsed >= len(samples) * SAMPLE_S:
                sample()
            while calls and elapsed >= calls[0][0] * seconds:
                calls.pop(0)[1]()
            churn.cycle()
            time.sleep(max(0.0, start + churn.cycles / CYCLES_PER_S - time.monotonic()))
        sample()
        for _, call in calls:
            call()
    finally:
        churn.close()
    return churn, samples


def soak(mount: Path | None, minutes: float, traced_minutes: float, stable: int,
         live: int = LIVE, min_cycles: int = 0) -> Soak:
    with (Cgroups(stable, mount, processes=0) as cgroups,
          tempfile.TemporaryDirectory(prefix="dqoes-bench-soak-", dir=tmpfs_dir()) as tmp):
        work = Path(tmp)
        names = [str(p.relative_to(cgroups.mount)) for p in cgroups.dirs]
        tree = Tree(cgroups.mount, f"dqoes-soak-{os.getpid()}", cgroups.fake)
        try:
            (work / "plain").mkdir()
            with Dqoesd(work / "plain", cgroups.mount, *DAEMON_ARGS) as d:
                churn, samples = churn_for(d, tree, names, minutes * 60, live,
                                           min_cycles=min_cycles)
                recreated = d.log.read_text().count("re-created")
            result = Soak(place(cgroups.fake), minutes, churn.cycles, churn.requests, samples,
                          churn.failures, recreated)
            if traced_minutes > 0:
                result.growth = traced(work / "traced", tree, names, traced_minutes * 60,
                                       live, churn.cycles)
            return result
        finally:
            tree.close()


def traced(work: Path, tree: Tree, names: list[str], seconds: float, live: int,
           first: int) -> Growth:
    """The same churn under tracemalloc, with a snapshot after a third and at the end."""
    work.mkdir()
    prefix = work / "snapshot"
    command = [sys.executable, "-c", _TRACED, str(prefix)]
    taken: list[float] = []
    with Dqoesd(work, tree.mount, *DAEMON_ARGS, command=command) as d:

        def snapshot() -> None:
            taken.append(time.monotonic())
            d.proc.send_signal(signal.SIGUSR1)
            path = Path(f"{prefix}.{len(taken) - 1}")
            deadline = time.monotonic() + 300
            while not path.exists():
                if time.monotonic() > deadline or d.proc.poll() is not None:
                    raise RuntimeError(f"no tracemalloc snapshot:\n{d.log_tail()}")
                time.sleep(0.1)

        start = time.monotonic()
        churn_for(d, tree, names, seconds, live, first, {1 / 3: snapshot, 1.0: snapshot})
    ignore = [tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
              tracemalloc.Filter(False, tracemalloc.__file__)]
    before, after = (tracemalloc.Snapshot.load(f"{prefix}.{i}").filter_traces(ignore)
                     for i in (0, 1))
    top = [f"{_short(s.traceback[0].filename)}:{s.traceback[0].lineno}: "
           f"{s.size_diff / 1024:+.1f} KiB ({s.count_diff:+d} blocks)"
           for s in after.compare_to(before, "lineno")[:TOP_LINES]]
    total = [sum(t.size for t in snap.traces) / 1e6 for snap in (before, after)]
    return Growth(taken[0] - start, taken[1] - start, total[0], total[1], top)


def _short(filename: str) -> str:
    """A source file as the report names it: from the package (or the library) down."""
    parts = Path(filename).parts
    for anchor in ("dqoes_cg", "bench", "lab"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor):])
    return "/".join(parts[-2:])


# --- the report ---------------------------------------------------------------------------


def markdown(soaks: list[tuple[dict[str, Any], Soak]]) -> str:
    lines = ["# Memory under churn (bench/soak.py)", "",
             "A real dqoesd under heavy churn: cgroups made and removed, targets set and "
             "unset, pending and bound, rings broken and re-created, status and list of all. "
             "RssAnon is the daemon's private memory. Generated by `python3 -m bench.soak`.",
             ""]
    for meta, s in soaks:
        first, last = s.samples[0], s.samples[-1]
        peak = max(x.rss_anon_mb for x in s.samples)
        tunables = meta.get("glibc_tunables")
        lines += [f"## {s.where}" + (f", GLIBC_TUNABLES={tunables}" if tunables else ""), "",
                  f"{meta.get('date', '?')}, commit {meta.get('commit', '?')}, "
                  f"`{meta.get('command', '?')}`; {meta.get('machine', '')}", "",
                  f"- {s.minutes:g} minutes, {s.cycles:,} cycles, {s.requests:,} requests, "
                  f"{s.ring_recreations:,} rings re-created by the daemon",
                  f"- RssAnon {first.rss_anon_mb:.1f} MB at the start, peak {peak:.1f} MB, "
                  f"{last.rss_anon_mb:.1f} MB at the end; VmRSS {first.rss_mb:.1f} → "
                  f"{last.rss_mb:.1f} MB",
                  f"- descriptors {first.fds} → {last.fds} (max "
                  f"{max(x.fds for x in s.samples)}), threads {first.threads} → "
                  f"{last.threads} (max {max(x.threads for x in s.samples)})",
                  f"- **verdict: {s.verdict}**"]
        lines += [f"- failed requests: {op}: {what}" for op, what in s.failures.items()]
        if s.growth is not None:
            g = s.growth
            lines += ["", f"Under tracemalloc (a second daemon, the same churn): the Python "
                      f"heap held {g.traced_first_mb:.2f} MB at {g.first_s:.0f} s and "
                      f"{g.traced_last_mb:.2f} MB at {g.last_s:.0f} s. Lines that grew most "
                      "between the two snapshots:", "", "```", *g.top, "```"]
        lines.append("")
    lines += ["![RssAnon over time](soak.png)", ""]
    return "\n".join(lines)


def plot(soaks: list[tuple[dict[str, Any], Soak]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for meta, s in soaks:
        t = [x.t_s / 60 for x in s.samples]
        label = s.where + (f", {meta['glibc_tunables']}" if meta.get("glibc_tunables") else "")
        line, = ax.plot(t, [x.rss_anon_mb for x in s.samples], label=f"RssAnon [{label}]")
        ax.plot(t, [x.rss_mb for x in s.samples], "--", color=line.get_color(),
                label=f"VmRSS [{label}]")
    ax.set_xlabel("minutes of churn")
    ax.set_ylabel("MB")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out: Path) -> None:
    docs = [json.loads(p.read_text()) for p in sorted(out.glob("soak-*.json"))]
    soaks = [(doc["meta"], Soak.from_json(doc["soak"])) for doc in docs]
    (out / "SOAK.md").write_text(markdown(soaks))
    if soaks:
        plot(soaks, out / "soak.png")


def main(argv: list[str] | None = None) -> int:
    from bench.__main__ import commit, machine

    p = argparse.ArgumentParser(prog="python3 -m bench.soak",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=MINUTES)
    p.add_argument("--traced-minutes", type=float, default=TRACED_MINUTES,
                   help="the churn again under tracemalloc (0: not)")
    p.add_argument("--stable", type=int, default=STABLE, help="targets that stay")
    p.add_argument("--live", type=int, default=LIVE, help="cycles a churned target lives")
    p.add_argument("--min-cycles", type=int, default=0,
                   help="cycles the untraced churn makes at least, however long they take")
    p.add_argument("--fake", action="store_true",
                   help="a fake tree on tmpfs even where a real cgroup v2 hierarchy is")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    interrupt_on_sigterm()
    mount = None if args.fake else cgroup2_cpu_mount()
    result = soak(mount, args.minutes, args.traced_minutes, args.stable, args.live,
                  args.min_cycles)
    meta = {"machine": machine(), "commit": commit(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["python3 -m bench.soak",
                                 *(sys.argv[1:] if argv is None else argv)]),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}
    print(f"{result.where}: {result.cycles:,} cycles; verdict: {result.verdict}")
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "guest" if os.environ.get("DQOES_GUEST") == "1" else "host"
    slug += "-fake" if result.where.endswith(FAKE.split(", ", 1)[1]) else "-cgroup2"
    slug += "-tuned" if meta["glibc_tunables"] else ""
    (args.out / f"soak-{slug}.json").write_text(
        json.dumps({"meta": meta, "soak": asdict(result)}, indent=1))
    write_report(args.out)
    print(f"report: {args.out / 'SOAK.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
