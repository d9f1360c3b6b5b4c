"""The demo: dqoesd meeting as many latency targets as the CPUs allow.

    python3 -m lab.demo [--out DIR] [--duration S]

On a private cgroup subtree it starts four inference workers (lab.workload) and a
dqoesd. For the first seconds no worker has a target: the default platform, where CFS gives
each an even share; the demo measures each one's latency there. Then each gets a target
relative to that latency: two looser (they can give CPU away), one tighter (it needs
more), and one that even a whole CPU cannot meet. The live table is `dqoesctl status`'s,
refreshed every couple of seconds while the controller converges; at the end come a
summary and a plot of latency and CPU over time, written to DIR (default demo-output/).

Needs root and a cgroup v2 hierarchy with the cpu controller (`make demo` runs it in a
qemu guest with a real kernel where the host has none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dqoes_cg.cgroup import CgroupError
from dqoes_cg.ctl import format_duration, format_status
from dqoes_cg.policy import Cls, classify
from lab.testbed import Observer, Testbed

DAEMON_ARGS = ("--sample-interval", "0.5", "--interval", "4", "--max-interval", "8",
               "--beta", "0.3")
DEFAULT_PHASE_S = 14.0
REFRESH_S = 2.0


@dataclass(frozen=True)
class Service:
    name: str
    model: str
    ratio: float  # target / its latency at the default platform's even share
    note: str


SERVICES = (
    Service("photo-tagger", "tiny", 1.5, "loose: can give CPU away"),
    Service("recommender", "tiny", 1.25, "loose: can give CPU away"),
    Service("face-unlock", "tiny", 0.8, "tight: needs more than an even share"),
    Service("ar-overlay", "tiny", 0.4, "unachievable: needs more than a whole CPU"),
)


@dataclass
class History:
    """What the observer saw, window by window."""

    t: list[float]
    latency: list[np.ndarray]
    usage: list[np.ndarray]
    limit: list[np.ndarray]
    satisfied: list[int]  # the daemon's |S| (the default phase: classified here)

    def add(self, t: float, latency: np.ndarray, usage: np.ndarray, limit: np.ndarray,
            satisfied: int) -> None:
        self.t.append(t)
        self.latency.append(latency)
        self.usage.append(usage)
        self.limit.append(limit)
        self.satisfied.append(satisfied)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m lab.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("demo-output"))
    p.add_argument("--duration", type=float, default=90.0,
                   help="seconds the controller runs after the targets are set")
    p.add_argument("--redraw", action=argparse.BooleanOptionalAction, default=None,
                   help="redraw the table in place (default: when stdout is a terminal)")
    args = p.parse_args(argv)
    redraw = sys.stdout.isatty() if args.redraw is None else args.redraw
    args.out.mkdir(parents=True, exist_ok=True)
    where = ("a qemu guest (real Linux kernel, emulated CPUs)"
             if os.environ.get("DQOES_GUEST") == "1" else "this host")
    print(f"dqoes-cg demo on {where}, {os.cpu_count()} CPUs: {len(SERVICES)} inference "
          f"workers, dqoesd {' '.join(DAEMON_ARGS)}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="dqoes-demo-") as work, \
                Testbed(f"dqoes-demo-{os.getpid()}", Path(work)) as bed:
            history, targets, even = run(bed, args.duration, redraw)
            final = bed.status()
    except (CgroupError, OSError) as e:
        print(f"demo: {e}\n(it needs root and cgroup v2 with the cpu controller; "
              "`make demo` runs it in a real-kernel guest where the host has none)",
              file=sys.stderr)
        return 1
    summary = summarize(history, targets, even, final, where)
    print("\n" + summary)
    (args.out / "summary.txt").write_text(summary + "\n")
    (args.out / "demo.json").write_text(json.dumps(_as_json(history, targets)) + "\n")
    plot(history, targets, args.out / "demo.png")
    print(f"\nsummary: {args.out / 'summary.txt'}\nplot:    {args.out / 'demo.png'}")
    return 0


def run(bed: Testbed, duration: float, redraw: bool
        ) -> tuple[History, np.ndarray, np.ndarray]:
    """The default phase, then the targets and the controller at work."""
    bed.start_daemon(*DAEMON_ARGS)
    for i, s in enumerate(SERVICES):
        bed.add_worker(s.name, s.model, hold=True, seed=i)
    print("starting the workers (loading their models)...", flush=True)
    bed.wait_held()
    observer = Observer(bed, [s.name for s in SERVICES])
    history = History([], [], [], [], [])
    for s in SERVICES:
        bed.release(s.name)
    print(f"default platform, no targets: measuring each worker's latency at CFS's even "
          f"share for {DEFAULT_PHASE_S:.0f} s", flush=True)
    start = time.monotonic()
    while time.monotonic() - start < DEFAULT_PHASE_S:
        time.sleep(REFRESH_S)
        w = observer.window()
        history.add(w.t, w.latency_s, w.usage_cores, w.limit_cores, 0)
        latencies = "  ".join(f"{s.name} {format_duration(x)}"
                              for s, x in zip(SERVICES, w.latency_s, strict=True))
        print(f"  t={w.t:3.0f}s  {latencies}", flush=True)
    even = np.nanmedian(np.array(history.latency[1:] or history.latency), axis=0)
    targets = np.array([s.ratio for s in SERVICES]) * even
    history.satisfied[:] = [_satisfied(targets, lat) for lat in history.latency]
    for s, target in zip(SERVICES, targets, strict=True):
        bed.set_target(bed.workers[s.name].name, float(target), "mean")
    print("targets set: dqoesd takes over", flush=True)
    phase_end = time.monotonic() + duration
    while time.monotonic() < phase_end:
        time.sleep(REFRESH_S)
        w = observer.window()
        status = bed.status()
        history.add(w.t, w.latency_s, w.usage_cores, w.limit_cores, status.host.S)
        table = format_status(status)
        header = f"dqoes-cg demo  t={w.t:.0f}s  ({phase_end - time.monotonic():.0f}s left)"
        if redraw:
            print(f"\x1b[H\x1b[2J{header}\n\n{table}", flush=True)
        else:
            print(f"--- {header}\n{table}", flush=True)
    observer.close()
    return history, targets, even


def _satisfied(targets: np.ndarray, latency: np.ndarray) -> int:
    return int((classify(targets, latency) == Cls.S).sum())


def summarize(h: History, targets: np.ndarray, even: np.ndarray, final: dict[str, Any],
              where: str) -> str:
    """Final classes from each worker's median latency over the last stretch of the run
    (single windows scatter widely on a busy or emulated CPU), against the default's."""
    t = np.array(h.t)
    managed = t > DEFAULT_PHASE_S + REFRESH_S / 2
    tail = managed & (t >= t[-1] - max(20.0, 0.2 * (t[-1] - DEFAULT_PHASE_S)))
    settled = np.nanmedian(np.array(h.latency)[tail], axis=0) if tail.any() \
        else np.full(len(SERVICES), np.nan)
    classes = classify(targets, settled)
    final_s = int((classes == Cls.S).sum())
    default_s = _satisfied(targets, even)
    satisfied = np.array(h.satisfied)
    reached = next((x - DEFAULT_PHASE_S for x, n, m in zip(t, satisfied, managed, strict=True)
                    if m and n >= final_s), None) if final_s else None
    rows = [("WORKER", "TARGET", "DEFAULT LATENCY", "LATENCY (LAST "
             f"{t[tail][-1] - t[tail][0] + REFRESH_S:.0f} S)" if tail.any() else "LATENCY",
             "CLASS", "CPU LIMIT", "CPU USAGE", "")]
    by_name = {c.name.rsplit("/", 1)[-1]: c for c in final.containers}
    usage = np.nanmean(np.array(h.usage)[tail], axis=0) if tail.any() \
        else np.full(len(SERVICES), np.nan)
    for i, (s, target, e) in enumerate(zip(SERVICES, targets, even, strict=True)):
        limit = by_name[s.name].cpu_limit_cores if s.name in by_name else None
        rows.append((s.name, format_duration(target), format_duration(e),
                     format_duration(settled[i]), Cls(int(classes[i])).name,
                     "max" if limit is None else f"{limit:.2f}", f"{usage[i]:.2f}", s.note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip()
                      for r in rows)
    when = "" if reached is None else \
        f"; the daemon first counted {final_s} in S {reached:.0f} s after the targets were set"
    return (f"dqoes-cg demo on {where}\n\n{table}\n\n"
            f"satisfied (class S): default even share {default_s} of {len(SERVICES)}, "
            f"dqoes-cg {final_s} of {len(SERVICES)}{when}.\n"
            f"The best possible is {len(SERVICES) - 1}: ar-overlay's target needs more than "
            "the whole CPU a single-threaded worker can use, so dqoes-cg gives it what the "
            "others can spare. Watch the CPU move in the plot: a busy host or an emulated "
            "CPU makes latencies scatter by tens of percent, more than the 10% band.")


def _as_json(h: History, targets: np.ndarray) -> dict[str, Any]:
    def clean(rows: list[np.ndarray]) -> list[list[float | None]]:
        return [[float(x) if np.isfinite(x) else None for x in r] for r in rows]

    return {"workers": [s.name for s in SERVICES], "targets_s": targets.tolist(),
            "default_phase_s": DEFAULT_PHASE_S, "t": h.t, "latency_s": clean(h.latency),
            "usage_cores": clean(h.usage), "limit_cores": clean(h.limit),
            "satisfied": h.satisfied}


# --- the plot (also used by bench/experiments) --------------------------------------------


def draw_latency(ax: Any, t: np.ndarray, ratio: np.ndarray, names: list[str],
                 alpha: float = 0.10) -> None:
    """Latency / target per container over time, log scale, the S band shaded."""
    ax.axhspan(1 - alpha, 1 + alpha, color="tab:green", alpha=0.15, label="S band")
    for i, name in enumerate(names):
        ax.plot(t, ratio[:, i], lw=1.2, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("latency / target")


def draw_cpu(ax: Any, t: np.ndarray, usage: np.ndarray, limit: np.ndarray,
             names: list[str]) -> None:
    """CPU usage (solid) and cpu.max limit (dashed) per container over time, in CPUs."""
    for i, name in enumerate(names):
        (line,) = ax.plot(t, usage[:, i], lw=1.2, label=name)
        ax.plot(t, limit[:, i], lw=1.0, ls="--", color=line.get_color())
    ax.set_ylabel("CPUs (usage; dashed: limit)")
    ax.set_ylim(bottom=0)


def plot(h: History, targets: np.ndarray, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array(h.t)
    names = [s.name for s in SERVICES]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    draw_latency(top, t, np.array(h.latency) / targets, names)
    draw_cpu(bottom, t, np.array(h.usage), np.array(h.limit), names)
    for ax in (top, bottom):
        ax.axvline(DEFAULT_PHASE_S, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
    top.text(DEFAULT_PHASE_S / 2, 0.97, "default\n(even share)", ha="center", va="top",
             transform=top.get_xaxis_transform(), fontsize=8)
    top.legend(loc="upper right", fontsize=8, ncol=3)
    top.set_title("dqoes-cg demo: latency against target, and CPU, over time")
    bottom.set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
