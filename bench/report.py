"""The bench's outputs: results.json (everything measured, machine-readable), REPORT.md (the
tables and the targets of the issue, met or missed), tick_cost.png (cost per tick against
the number of containers, log-log, ours and each baseline) and tick_per_container.png (the
cost of a tick and of each of its parts per container, against the number of
containers)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import applying, docker, hierarchy, policy_loop, ring_bench, sampling, tick
from bench.daemon_overhead import DaemonOverhead
from bench.timing import NotMeasured, Row, fmt_time, ratio

TICK_TARGET_S = 2e-3
SENSE_TARGET_S = 1e-3
FLAT_WITHIN = 1.5  # the per-container cost of a tick at the largest N over that at FLAT_FROM
FLAT_FROM = 100
SAMPLING_VS_PYTHON = 20.0
SAMPLING_VS_DOCKER = 10_000.0
POLICY_VS_LOOP = 10.0
DAEMON_CPU_PERCENT = 0.2
DAEMON_RSS_MB = 50.0
TARGET_N = 1000
DAEMON_N = 100


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    daemon: list[DaemonOverhead] = field(default_factory=list)
    not_measured: list[NotMeasured] = field(default_factory=list)
    places: dict[str, str] = field(default_factory=dict)  # where -> what that place is
    meta: dict[str, Any] = field(default_factory=dict)

    def add(self, items: Iterable[Row | NotMeasured]) -> None:
        for item in items:
            (self.rows if isinstance(item, Row) else self.not_measured).append(item)

    def merge(self, other: Results) -> None:
        self.rows += other.rows
        self.daemon += other.daemon
        self.not_measured += other.not_measured
        self.places.update(other.places)

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "places": self.places,
                "rows": [asdict(r) for r in self.rows],
                "daemon": [asdict(d) for d in self.daemon],
                "not_measured": [asdict(m) for m in self.not_measured]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Results:
        return cls([Row(**r) for r in doc["rows"]], [DaemonOverhead(**d) for d in doc["daemon"]],
                   [NotMeasured(**m) for m in doc["not_measured"]], doc["places"],
                   doc.get("meta", {}))

    def find(self, part: str, case: str, where: str, n: int | None) -> Row | None:
        return next((r for r in self.rows if (r.part, r.case, r.where, r.n)
                     == (part, case, where, n)), None)

    def places_of(self, part: str) -> list[str]:
        return list(dict.fromkeys(r.where for r in self.rows if r.part == part))

    def ns_of(self, part: str, case: str, where: str) -> list[int]:
        return sorted({r.n for r in self.rows if (r.part, r.case, r.where) == (part, case, where)
                       and r.n})


@dataclass
class Check:
    """One target of the issue against the figure measured for it."""

    target: str
    where: str
    figure: str
    met: bool | None  # None: no verdict (not measured, or no target at that size)
    note: str = ""


def check_targets(res: Results) -> list[Check]:
    checks = []
    n = TARGET_N
    for where in res.places_of(tick.PART):
        for case, target, what in (
                (tick.WRITE_ALL, TICK_TARGET_S,
                 "sample + drain + decide + every limit the round set written"),
                (tick.SENSE, SENSE_TARGET_S, "sample + drain (most ticks)")):
            row = res.find(tick.PART, case, where, n)
            wall = res.find(tick.PART, case + tick.WALL, where, n)
            label = "whole tick" if case == tick.WRITE_ALL else "sense-only tick"
            checks.append(Check(
                f"{label} at N={n} < {fmt_time(target)}", where,
                _missing(n) if row is None else fmt_time(row.median_s),
                None if row is None else row.median_s < target,
                what + ("" if row is None else f" ({row.note}); CPU time: "
                        + _kernel_and_ours(res, case, where, n))
                + (_kernel_floor(res, where, n) if case == tick.WRITE_ALL else "")
                + ("" if wall is None else f"; wall clock {fmt_time(wall.median_s)}")))
        checks.append(_flat_check(res, where))
    for where in res.places_of(ring_bench.PART):
        idle = next((r for r in res.rows if r.part == ring_bench.PART and r.where == where
                     and r.versus == ring_bench.SYSCALL), None)
        x = None if idle is None else ratio(idle, res.rows)
        if idle is not None and x is not None:
            checks.append(Check(
                "ring drain: no system call per ring with nothing new", where,
                f"{fmt_time(idle.median_s)} per ring", x < 1,
                f"{x:.2g}x one system call (getppid, measured beside it); {idle.note}"))
    for where in res.places_of(sampling.PART):
        checks.append(_speedup(res, sampling.PART, sampling.PER_FILE, where, SAMPLING_VS_PYTHON,
                               "sampling", "pure-Python reads"))
    checks += _docker_checks(res)
    for where in res.places_of(policy_loop.PART):
        checks.append(_speedup(res, policy_loop.PART, policy_loop.LOOP, where, POLICY_VS_LOOP,
                               "vectorized policy", "the loop"))
    for d in res.daemon:
        # The targets are for N = DAEMON_N; other sizes are figures beside them.
        targeted = d.n == DAEMON_N
        checks.append(Check(
            f"daemon < {DAEMON_CPU_PERCENT}% of one core at N={d.n}" if targeted
            else f"daemon's CPU at N={d.n} (no target)", d.where,
            f"{d.cpu_percent:.3f}%", d.cpu_percent < DAEMON_CPU_PERCENT if targeted else None,
            f"{d.cpu_seconds:.2f} s CPU over {d.seconds:.0f} s, {d.ticks} ticks"))
        checks.append(Check(
            f"daemon < {DAEMON_RSS_MB:.0f} MB resident at N={d.n}" if targeted
            else f"daemon's memory at N={d.n} (no target)", d.where,
            f"{d.rss_mb:.1f} MB", d.rss_mb < DAEMON_RSS_MB if targeted else None,
            f"private (RssAnon) {d.rss_anon_mb:.1f} MB; peak (VmHWM) {d.hwm_mb:.1f} MB"))
    return checks


def _missing(n: int) -> str:
    return f"not measured at N={n}"


def _speedup(res: Results, part: str, baseline: str, where: str, at_least: float, ours: str,
             than: str) -> Check:
    """How many times the baseline row at N=TARGET_N is slower than ours."""
    row = res.find(part, baseline, where, TARGET_N)
    x = None if row is None else ratio(row, res.rows)
    return Check(f"{ours} >= {at_least:.0f}x faster than {than} at N={TARGET_N}", where,
                 _missing(TARGET_N) if x is None else f"{x:.1f}x",
                 None if x is None else x >= at_least)


def _kernel_and_ours(res: Results, case: str, where: str, n: int) -> str:
    """Those ticks' time in the C calls into the kernel against the rest, for the verdict."""
    def spent(labels: tuple[str, ...]) -> float:
        return sum(r.median_s for label in labels
                   if (r := res.find(tick.PART, tick.part_case(case, label), where, n)))

    return (f"the C calls into the kernel (sample, pressure, apply, read-back) "
            f"{fmt_time(spent(tick.KERNEL_CALLS))}, the rest (rings, policy, Python) "
            f"{fmt_time(spent(tick.OURS_ALONE))}")


def _tick_floor(res: Results, where: str, n: int) -> tuple[float, float] | None:
    """The kernel's floor of a tick at N, from C, warm: (reading every cpu.stat, reading and
    writing every cpu.max), if both were measured."""
    read, write = (res.find(tick.PART, case, where, n)
                   for case in (tick.FLOOR_READ, tick.FLOOR_WRITE))
    return None if read is None or write is None else (read.median_s, write.median_s)


def _kernel_floor(res: Results, where: str, n: int) -> str:
    floor = _tick_floor(res, where, n)
    if floor is None:
        return ""
    read, write = floor
    return (f"; the kernel's floor alone, from C, each pass warm: {n} bare reads of cpu.stat "
            f"{fmt_time(read)} + {n} reads and writes of cpu.max {fmt_time(write)} = "
            f"{fmt_time(read + write)}")


def _flat_check(res: Results, where: str) -> Check:
    """The per-container cost of a whole tick at the largest N against that at FLAT_FROM."""
    ns = res.ns_of(tick.PART, tick.WRITE_ALL, where)
    target = (f"tick cost per container flat from N={FLAT_FROM:,} up (within "
              f"{FLAT_WITHIN:g}x)")
    if FLAT_FROM not in ns or ns[-1] == FLAT_FROM:
        return Check(target, where, "not measured", None)
    low, high = (res.find(tick.PART, tick.WRITE_ALL, where, n) for n in (FLAT_FROM, ns[-1]))
    assert low is not None and high is not None
    x = (high.median_s / ns[-1]) / (low.median_s / FLAT_FROM)
    floors = [(n, _tick_floor(res, where, n)) for n in (FLAT_FROM, ns[-1])]
    floor = "" if any(f is None for _, f in floors) else (
        "; the kernel's floor alone (bare reads and writes from C, warm): " + ", ".join(
            f"{fmt_time(sum(f) / n)} per container at N={n:,}" for n, f in floors if f))
    return Check(target, where, f"{x:.2f}x at N={ns[-1]:,}", x <= FLAT_WITHIN,
                 f"{fmt_time(low.median_s / FLAT_FROM)} per container at N={FLAT_FROM:,}, "
                 f"{fmt_time(high.median_s / ns[-1])} at N={ns[-1]:,}" + floor)


def _docker_checks(res: Results) -> list[Check]:
    """Per container, at the largest N of each place: `docker stats` over our sample
    (measured, or else the reference figure against the host's sampling)."""
    target = f"sampling >= {SAMPLING_VS_DOCKER:,.0f}x faster per container than docker stats"
    checks = []
    for where in res.places_of(docker.PART):
        n = max(res.ns_of(docker.PART, docker.STATS, where))
        stats = res.find(docker.PART, docker.STATS, where, n)
        ours = res.find(docker.PART, docker.SAMPLE, where, n)
        assert stats is not None and ours is not None
        x = stats.median_s / ours.median_s
        checks.append(Check(target, where, f"{x:,.0f}x", x >= SAMPLING_VS_DOCKER,
                            f"docker stats {fmt_time(stats.median_s / n)} per container, ours "
                            f"{fmt_time(ours.median_s / n)}, over the same {n} running "
                            "containers"))
    reference = next((m for m in res.not_measured if m.case == docker.STATS), None)
    if not checks and reference is not None and reference.reference_s is not None:
        for where in res.places_of(sampling.PART):
            ours = max((r for r in res.rows if (r.part, r.case, r.where) ==
                        (sampling.PART, sampling.OURS, where)), key=lambda r: r.n or 0)
            assert ours.n
            x = reference.reference_s / (ours.median_s / ours.n)
            checks.append(Check(
                target, where, f"{x:,.0f}x", x >= SAMPLING_VS_DOCKER,
                f"docker stats NOT measured ({reference.reason}); against the reference "
                f"{fmt_time(reference.reference_s)} per container sample"))
    return checks


# --- Markdown -------------------------------------------------------------------------

def _table(header: list[str], lines: Iterable[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def _spread(r: Row) -> str:
    return f"{fmt_time(r.p10_s)} - {fmt_time(r.p90_s)}"


def _x(r: Row, rows: list[Row]) -> str:
    x = ratio(r, rows)
    return "" if x is None else f"{x:,.3g}x"


def _per_place(res: Results, part: str, header: list[str],
               line: Callable[[Row], list[str]]) -> str:
    """One table of the part's rows per place (parts of other rows aside)."""
    out = []
    for where in res.places_of(part):
        rows = [r for r in res.rows if r.part == part and r.where == where and r.role != "part"]
        out += [f"**{where}**\n", _table(header, (line(r) for r in rows)), ""]
    return "\n".join(out) if out else "Not run.\n"


def _per_n_section(res: Results, part: str, ratio_header: str) -> str:
    return _per_place(
        res, part, ["N", "case", "median", "p10 - p90", "per container", ratio_header, "repeats"],
        lambda r: [f"{r.n:,}", r.case + (f" ({r.note})" if r.note else ""),
                   fmt_time(r.median_s), _spread(r), fmt_time(r.median_s / r.n) if r.n else "",
                   _x(r, res.rows), str(r.repeats)])


def _hierarchy_section(res: Results) -> str:
    out = []
    for where in res.places_of(hierarchy.PART):
        ts = res.ns_of(hierarchy.PART, hierarchy.WRITE, where)
        lines = []
        for t in ts:
            write, read = (res.find(hierarchy.PART, case, where, t)
                           for case in (hierarchy.WRITE, hierarchy.READ))
            first = res.find(hierarchy.PART, hierarchy.WRITE, where, ts[0])
            assert write is not None and read is not None and first is not None
            lines.append([f"{t:,}", fmt_time(write.median_s), _spread(write),
                          f"{write.median_s / first.median_s:.3g}x", fmt_time(read.median_s),
                          _spread(read)])
        out += [f"**{where}**\n", _table(
            ["T (cgroups with the cpu controller)", "one cpu.max write", "p10 - p90",
             f"x at T={ts[0]:,}", "one cpu.stat read", "p10 - p90"], lines), ""]
    return "\n".join(out) if out else "Not run (a real cgroup v2 hierarchy only).\n"


def _ring_section(res: Results) -> str:
    return _per_place(
        res, ring_bench.PART, ["case", "median", "p10 - p90", "per second", "x its floor",
                               "repeats"],
        lambda r: [r.case + (f" ({r.note})" if r.note else ""),
                   f"{fmt_time(r.median_s)} per {r.per}", _spread(r),
                   f"{1 / r.median_s:,.3g} {r.per}s", _x(r, res.rows), str(r.repeats)])


def _profile_cells(res: Results, case: str, where: str, label: str) -> list[str]:
    """One part's row of a profile table: per N, per tick (per container, share)."""
    cells = [label]
    for n in res.ns_of(tick.PART, case, where):
        whole = res.find(tick.PART, case, where, n)
        part = res.find(tick.PART, tick.part_case(case, label), where, n)
        cells.append("" if part is None or whole is None else
                     f"{fmt_time(part.median_s)} ({fmt_time(part.median_s / n)}, "
                     f"{100 * part.median_s / whole.median_s:.0f}%)")
    return cells


def _floor_cells(res: Results, floor: str, where: str, ns: list[int],
                 wholes: list[Row | None]) -> list[str]:
    """One floor of the tick per N: bare system calls from C over all N files, warm."""
    cells = [floor + ", warm"]
    for n, whole in zip(ns, wholes, strict=True):
        row = res.find(tick.PART, floor, where, n)
        cells.append("" if whole is None or row is None else
                     f"{fmt_time(row.median_s)} ({fmt_time(row.median_s / n)}, "
                     f"{100 * row.median_s / whole.median_s:.0f}%)")
    return cells


def _profile_section(res: Results) -> str:
    """Where the time of a tick goes: each part's median over the same timed ticks, per N,
    and per container."""
    out = []
    for where in res.places_of(tick.PART):
        for case in tick.PROFILED:
            ns = res.ns_of(tick.PART, case, where)
            if not ns:
                continue
            lines = [_profile_cells(res, case, where, label)
                     for label in (*tick.PARTS, tick.REST)]
            wholes = [res.find(tick.PART, case, where, n) for n in ns]
            lines.append(["whole tick (median)"] + [
                "" if w is None else f"**{fmt_time(w.median_s)}** ({fmt_time(w.median_s / n)})"
                for w, n in zip(wholes, ns, strict=True)])
            floors = (tick.FLOOR_READ, tick.FLOOR_WRITE) if case == tick.WRITE_ALL else (
                tick.FLOOR_READ,)
            lines += [_floor_cells(res, floor, where, ns, wholes) for floor in floors]
            out += [f"**{where}: {case}** (per tick; in brackets per container and share of "
                    "the tick; the parts' medians need not add up to the whole's; the floors "
                    "are bare calls over all N files, whatever the ticks wrote)\n",
                    _table(["part", *(f"N={n:,}" for n in ns)], lines), ""]
    return "\n".join(out) if out else "Not run.\n"


def _docker_section(res: Results) -> str:
    out = []
    for where in res.places_of(docker.PART):
        lines = []
        for n in res.ns_of(docker.PART, docker.SAMPLE, where):
            for case in (docker.STATS, docker.SAMPLE, docker.UPDATE_EACH, docker.UPDATE_ALL,
                         docker.APPLY):
                r = res.find(docker.PART, case, where, n)
                if r is not None:
                    lines.append([f"{n:,}", case + (f" ({r.note})" if r.note else ""),
                                  fmt_time(r.median_s), _spread(r), fmt_time(r.median_s / n),
                                  _x(r, res.rows), str(r.repeats)])
        out += [f"**{where}**\n", _table(["N", "case", "median", "p10 - p90",
                                           "per container", "x ours", "repeats"], lines), ""]
    return "\n".join(out) if out else "Not run.\n"


def _daemon_section(res: Results) -> str:
    if not res.daemon:
        return "Not run.\n"
    return _table(
        ["where", "N", "sampling", "window", "ticks", "CPU time", "CPU, % of one core",
         "VmRSS", "RssAnon", "RssShmem (rings)", "VmHWM"],
        ([d.where, str(d.n), f"{d.sample_interval_s:g} s", f"{d.seconds:.1f} s", str(d.ticks),
          f"{d.cpu_seconds:.2f} s", f"{d.cpu_percent:.3f}%", f"{d.rss_mb:.1f} MB",
          f"{d.rss_anon_mb:.1f} MB", f"{d.rss_shmem_mb:.1f} MB", f"{d.hwm_mb:.1f} MB"]
         for d in res.daemon)) + "\n"


def sections(res: Results) -> list[tuple[str, str, str]]:
    """(title, introduction, tables) of each measured part."""
    return [
        ("1. Sampling N cgroups' cpu.stat",
         "One timed call samples all N cgroups; the ratio is the baseline's time over ours. "
         "The floor (bare `pread`s from C, nothing parsed) is the kernel's part: its ratio is "
         "the share of our time spent in the kernel.",
         _per_n_section(res, sampling.PART, "x ours")),
        ("2. Applying N limits to cpu.max",
         "Every timed call changes all N limits (two quotas take turns), so each writes N "
         "files. Before it writes over a limit of ours, `CgroupTable.apply` reads the value "
         "in place, to catch someone else's (a foreign write that the reconcile would not "
         "see once ours replaced it); the Python baselines do not. The floor (a bare `pread` "
         "and `pwrite` of each cpu.max from C, nothing parsed or formatted) is the kernel's "
         "part: its ratio is the share of our time spent in the kernel.",
         _per_n_section(res, applying.PART, "x ours") + "\n"
         + "**The kernel's cost of one write against the hierarchy's size** (bench/"
         "hierarchy.py). On every cpu.max write the kernel checks every task group's "
         "bandwidth against its parent's (`__cfs_schedulable` walks the whole tree), so one "
         "write costs O(T) with T the cgroups that have the cpu controller, and writing N "
         "limits O(N·T), whoever writes them; a read has no walk. Bare system calls from C "
         f"on up to {hierarchy.SAMPLED} of T cgroups made for the purpose, each T on its own.\n\n"
         + _hierarchy_section(res)),
        ("3. The latency ring",
         "Per record (producers, drain) or per ring (a drain with nothing new); the ratio is "
         "over the floor beside it (a clock read, a Python call into C, a memory copy). The "
         "reader's drain rate is the \"per second\" of the drain row.", _ring_section(res)),
        ("4. The policy",
         "One round of Algorithms 1 and 2 on N containers; both forms give the same limits, "
         "classes and totals (checked before timing).",
         _per_n_section(res, policy_loop.PART, "x ours")),
        ("5. A whole tick, and the daemon",
         "`Controller.tick` of the real controller; see bench/tick.py for the variants. A "
         "tick is timed in the thread's CPU time, what it costs the daemon; the \"(wall "
         "clock)\" rows give the same ticks' wall-clock time, which on a busy machine also "
         "counts the time the process waited for a CPU. On a real kernel the cgroups' "
         "processes sleep, so the policy limits few of them or none, and \"all N cpu.max "
         "written\" writes what each row's note says; the floor of writes says what all N "
         "would cost the kernel. "
         "Then where the time of those ticks goes: the C calls and the policy, timed "
         "within the same ticks, and the Python around them, beside the kernel's floor: "
         "bare calls from C over the same files. Then dqoesd itself, managing "
         "N containers for a minute (VmRSS counts the pages of the rings it has read, "
         "which are the producers' shared memory: RssShmem).",
         _per_n_section(res, tick.PART, "") + "\n" + _profile_section(res) + "\n"
         + _daemon_section(res)),
        ("6. Docker's tools against ours",
         "The same N running containers (an idle process each), Docker's engine on each "
         "cgroup driver: `docker stats --no-stream` against `CgroupTable.sample`, `docker "
         "update --cpus` against `CgroupTable.apply` on the containers' cgroups (every "
         "call changes every limit). The ratio is per container.", _docker_section(res)),
    ]


def markdown(res: Results, plots: list[str]) -> str:
    meta = res.meta
    checks = check_targets(res)
    verdict = {True: "met", False: "**missed**", None: "no verdict"}
    parts = [
        "# dqoes-cg overhead benchmarks",
        "",
        f"Made by `{meta.get('command', 'python3 -m bench')}` on {meta.get('date', '?')}, "
        f"commit {meta.get('commit', '?')}. Medians over the repeats, with the 10th and 90th "
        "percentiles; every figure says where it ran. The ratios compare figures measured "
        "in the same run and place; an emulated CPU is several times slower than the host, "
        "so compare ratios within one place, not figures across places.",
        "",
        "## Where the figures come from",
        "",
        _table(["place", "what it is"], ([w, d] for w, d in res.places.items())),
        "",
        "## Targets",
        "",
        _table(["target", "where", "figure", "verdict", "detail"],
               ([c.target, c.where, c.figure, verdict[c.met], c.note] for c in checks)),
        "",
    ]
    for title, intro, body in sections(res):
        parts += [f"## {title}", "", intro, "", body]
    parts += [
        "## Not measured",
        "",
        _table(["part", "what", "why", "reference figure (not measured here)"],
               ([m.part, m.case, m.reason, m.reference] for m in res.not_measured))
        if res.not_measured else "Everything was measured.",
        "",
    ]
    if plots:
        parts += ["## Cost per tick against N", ""]
        parts += [f"![{name.removesuffix('.png').replace('_', ' ')}]({name})\n"
                  for name in plots]
    return "\n".join(parts)


# --- Plot ---------------------------------------------------------------------------------

_PLOTTED = [  # (part, case, label, style)
    (tick.PART, tick.WRITE_ALL, "ours: whole tick, all N limits written", "-"),
    (tick.PART, tick.SENSE, "ours: tick, sense only", "-"),
    (sampling.PART, sampling.OURS, "ours: sample cpu.stat (C)", "-"),
    (applying.PART, applying.OURS, "ours: apply cpu.max (C)", "-"),
    (sampling.PART, sampling.PER_FILE, "Python: read each cpu.stat", "--"),
    (sampling.PART, sampling.PSUTIL, "psutil: CPU times per process", "--"),
    (applying.PART, applying.PER_FILE, "Python: write each cpu.max", "--"),
]


def plot(res: Results, path: Path) -> bool:
    """Writes the plot; False if there is nothing per-N to plot."""
    from matplotlib.figure import Figure  # here: it takes 20 s to import on an emulated CPU

    places = list(dict.fromkeys(res.places_of(sampling.PART) + res.places_of(tick.PART)))
    if not places:
        return False
    fig = Figure(figsize=(7 * len(places), 7), layout="constrained")
    axes = fig.subplots(1, len(places), squeeze=False)
    for ax, where in zip(axes[0], places, strict=True):
        ns: set[int] = set()
        for part, case, label, style in _PLOTTED:
            points = sorted((r.n, r.median_s) for r in res.rows
                            if (r.part, r.case, r.where) == (part, case, where) and r.n)
            if points:
                ns.update(n for n, _ in points)
                ax.plot(*zip(*points, strict=True), style, marker="o", label=label)
        xs = sorted(ns)
        for (label, per_container), color in zip(_docker_lines(res), _COLORS, strict=False):
            if xs:
                ax.plot(xs, [per_container * n for n in xs], ":", color=color, label=label)
        ax.set(xscale="log", yscale="log", xlabel="containers N", ylabel="seconds per tick",
               title=where)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.suptitle("dqoes-cg: cost per tick against the number of containers")
    fig.savefig(path, dpi=110)
    return True


_COLORS = ("black", "grey", "tab:brown", "tab:pink")


def _docker_lines(res: Results) -> list[tuple[str, float]]:
    """(label, seconds per container) of Docker's tools: measured at the largest N of each
    place, else the reference figures."""
    lines = []
    for where in res.places_of(docker.PART):
        n = max(res.ns_of(docker.PART, docker.STATS, where))
        for case in (docker.STATS, docker.UPDATE_EACH):
            r = res.find(docker.PART, case, where, n)
            if r is not None:
                lines.append((f"{case.split(' (')[0]}: {fmt_time(r.median_s / n)} per "
                              f"container (measured, {where.split(', ')[-1]})",
                              r.median_s / n))
    if not lines:
        lines = [(f"{m.case}: {fmt_time(m.reference_s)} per container (reference, not "
                  "measured)", m.reference_s) for m in res.not_measured
                 if m.reference_s is not None]
    return lines


_PER_CONTAINER = [  # (case, label, style): a whole tick, then each part within it
    (tick.WRITE_ALL, "whole tick, all N limits written", "-"),
    (tick.SENSE, "tick, sense only", "-"),
    *((tick.part_case(tick.WRITE_ALL, label), label, "--") for label in
      (tick.SAMPLE, tick.DRAIN, tick.POLICY, tick.APPLY, tick.REST)),
]


def plot_per_container(res: Results, path: Path) -> bool:
    """The cost of a tick and of its parts per container, against N; False if nothing."""
    from matplotlib.figure import Figure

    places = res.places_of(tick.PART)
    if not places:
        return False
    fig = Figure(figsize=(7 * len(places), 6), layout="constrained")
    axes = fig.subplots(1, len(places), squeeze=False)
    for ax, where in zip(axes[0], places, strict=True):
        for case, label, style in _PER_CONTAINER:
            points = sorted((r.n, r.median_s / r.n) for r in res.rows
                            if (r.part, r.case, r.where) == (tick.PART, case, where) and r.n)
            if points:
                ax.plot(*zip(*points, strict=True), style, marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="containers N",
               ylabel="seconds per container per tick", title=where)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.suptitle("dqoes-cg: cost of a tick per container against the number of containers "
                 "(parts: within the write-all ticks)")
    fig.savefig(path, dpi=110)
    return True


def write(res: Results, out_dir: Path) -> None:
    """results.json, the plots and REPORT.md into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(res.to_json(), indent=1) + "\n")
    plots = [name for name, draw in (("tick_cost.png", plot),
                                     ("tick_per_container.png", plot_per_container))
             if draw(res, out_dir / name)]
    (out_dir / "REPORT.md").write_text(markdown(res, plots))

