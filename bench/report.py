"""The bench's outputs: results.json (everything measured, machine-readable), REPORT.md (the
tables and the targets of the issue, met or missed) and tick_cost.png (cost per tick against
the number of containers, log-log, ours and each baseline)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import applying, policy_loop, sampling, tick
from bench.daemon_overhead import DaemonOverhead
from bench.timing import NotMeasured, Row, fmt_time, ratio

TICK_TARGET_S = 2e-3
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


@dataclass
class Check:
    """One target of the issue against the figure measured for it."""

    target: str
    where: str
    figure: str
    met: bool | None  # None: not measured
    note: str = ""


def check_targets(res: Results) -> list[Check]:
    checks = []
    n = TARGET_N
    for where in res.places_of(tick.PART):
        whole = res.find(tick.PART, tick.WRITE_ALL, where, n)
        sense = res.find(tick.PART, tick.SENSE, where, n)
        checks.append(Check(
            f"whole tick at N={n} < {fmt_time(TICK_TARGET_S)}", where,
            _missing(n) if whole is None else fmt_time(whole.median_s),
            None if whole is None else whole.median_s < TICK_TARGET_S,
            "" if whole is None or sense is None else
            f"sample + drain + decide + all {n} cpu.max written; sense-only tick "
            f"{fmt_time(sense.median_s)}"))
    for where in res.places_of(sampling.PART):
        checks.append(_speedup(res, sampling.PART, sampling.PER_FILE, where, SAMPLING_VS_PYTHON,
                               "sampling", "pure-Python reads"))
        checks.append(_docker_check(res, where))
    for where in res.places_of(policy_loop.PART):
        checks.append(_speedup(res, policy_loop.PART, policy_loop.LOOP, where, POLICY_VS_LOOP,
                               "vectorized policy", "the loop"))
    for d in res.daemon:
        at = "" if d.n == DAEMON_N else f"; ran at N={d.n}, so no verdict"
        checks.append(Check(
            f"daemon < {DAEMON_CPU_PERCENT}% of one core at N={DAEMON_N}", d.where,
            f"{d.cpu_percent:.3f}%", None if at else d.cpu_percent < DAEMON_CPU_PERCENT,
            f"{d.cpu_seconds:.2f} s CPU over {d.seconds:.0f} s, {d.ticks} ticks{at}"))
        checks.append(Check(
            f"daemon < {DAEMON_RSS_MB:.0f} MB resident at N={DAEMON_N}", d.where,
            f"{d.rss_mb:.1f} MB", None if at else d.rss_mb < DAEMON_RSS_MB,
            f"private (RssAnon) {d.rss_anon_mb:.1f} MB; peak (VmHWM) {d.hwm_mb:.1f} MB{at}"))
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


def _docker_check(res: Results, where: str) -> Check:
    """Per container: `docker stats` (measured, or the reference figure) over our sample."""
    target = f"sampling >= {SAMPLING_VS_DOCKER:,.0f}x faster per container than docker stats"
    ours = max((r for r in res.rows if (r.part, r.case, r.where) ==
                (sampling.PART, sampling.OURS, where)), key=lambda r: r.n or 0, default=None)
    measured = next((r for r in res.rows if (r.part, r.case, r.where) ==
                     (sampling.PART, sampling.DOCKER_STATS, where)), None)
    reference = next((m for m in res.not_measured if m.case == sampling.DOCKER_STATS), None)
    if ours is None or ours.n is None or (measured is None and reference is None):
        return Check(target, where, "not measured", None)
    per_ours = ours.median_s / ours.n
    if measured is not None and measured.n:
        x, note = measured.median_s / measured.n / per_ours, "docker stats measured here"
    else:
        assert reference is not None and reference.reference_s is not None
        x = reference.reference_s / per_ours
        note = (f"docker stats NOT measured ({reference.reason}); against the reference "
                f"{fmt_time(reference.reference_s)} per container sample")
    return Check(target, where, f"{x:,.0f}x", x >= SAMPLING_VS_DOCKER,
                 f"ours {fmt_time(per_ours)} per cgroup at N={ours.n}; {note}")


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
    """One table of the part's rows per place."""
    out = []
    for where in res.places_of(part):
        rows = [r for r in res.rows if r.part == part and r.where == where]
        out += [f"**{where}**\n", _table(header, (line(r) for r in rows)), ""]
    return "\n".join(out) if out else "Not run.\n"


def _per_n_section(res: Results, part: str, ratio_header: str) -> str:
    return _per_place(
        res, part, ["N", "case", "median", "p10 - p90", "per container", ratio_header, "repeats"],
        lambda r: [f"{r.n:,}", r.case + (f" ({r.note})" if r.note else ""),
                   fmt_time(r.median_s), _spread(r), fmt_time(r.median_s / r.n) if r.n else "",
                   _x(r, res.rows), str(r.repeats)])


def _ring_section(res: Results) -> str:
    return _per_place(
        res, "ring", ["case", "median", "p10 - p90", "per second", "x its floor", "repeats"],
        lambda r: [r.case, f"{fmt_time(r.median_s)} per {r.per}", _spread(r),
                   f"{1 / r.median_s:,.3g} {r.per}s", _x(r, res.rows), str(r.repeats)])


def _daemon_section(res: Results) -> str:
    if not res.daemon:
        return "Not run.\n"
    return _table(
        ["where", "N", "sampling", "window", "ticks", "CPU time", "CPU, % of one core",
         "VmRSS", "RssAnon", "VmHWM"],
        ([d.where, str(d.n), f"{d.sample_interval_s:g} s", f"{d.seconds:.1f} s", str(d.ticks),
          f"{d.cpu_seconds:.2f} s", f"{d.cpu_percent:.3f}%", f"{d.rss_mb:.1f} MB",
          f"{d.rss_anon_mb:.1f} MB", f"{d.hwm_mb:.1f} MB"] for d in res.daemon)) + "\n"


def sections(res: Results) -> list[tuple[str, str, str]]:
    """(title, introduction, tables) of each measured part."""
    return [
        ("1. Sampling N cgroups' cpu.stat",
         "One timed call samples all N cgroups; the ratio is the baseline's time over ours.",
         _per_n_section(res, sampling.PART, "x ours")),
        ("2. Applying N limits to cpu.max",
         "Every timed call changes all N limits (two quotas take turns), so each writes N "
         "files.", _per_n_section(res, applying.PART, "x ours")),
        ("3. The latency ring",
         "Per record (producers, drain) or per ring (a drain with nothing new); the ratio is "
         "over the floor beside it (a clock read, a Python call into C, a memory copy). The "
         "reader's drain rate is the \"per second\" of the drain row.", _ring_section(res)),
        ("4. The policy",
         "One round of Algorithms 1 and 2 on N containers; both forms give the same limits, "
         "classes and totals (checked before timing).",
         _per_n_section(res, policy_loop.PART, "x ours")),
        ("5. A whole tick, and the daemon",
         "`Controller.tick` of the real controller; see bench/tick.py for the variants.",
         _per_n_section(res, tick.PART, "") + "\n" + _daemon_section(res)),
    ]


def markdown(res: Results, plot_name: str | None) -> str:
    meta = res.meta
    checks = check_targets(res)
    verdict = {True: "met", False: "**missed**", None: "not measured"}
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
    if plot_name:
        parts += ["## Cost per tick against N", "", f"![cost per tick]({plot_name})", ""]
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
        references = [m for m in res.not_measured if m.reference_s is not None]
        for m, color in zip(references, ("black", "grey"), strict=False):
            if xs:
                ax.plot(xs, [m.reference_s * n for n in xs], ":", color=color,
                        label=f"{m.case}: {fmt_time(m.reference_s)} per container "
                              "(reference, not measured)")
        ax.set(xscale="log", yscale="log", xlabel="containers N", ylabel="seconds per tick",
               title=where)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.suptitle("dqoes-cg: cost per tick against the number of containers")
    fig.savefig(path, dpi=110)
    return True


def write(res: Results, out_dir: Path) -> None:
    """results.json, tick_cost.png and REPORT.md into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(res.to_json(), indent=1) + "\n")
    plotted = plot(res, out_dir / "tick_cost.png")
    (out_dir / "REPORT.md").write_text(markdown(res, "tick_cost.png" if plotted else None))

