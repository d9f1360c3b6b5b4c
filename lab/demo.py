"""The demo: dqoesd meeting as many latency targets as the CPUs allow.

    python3 -m lab.demo [--out DIR] [--duration S] [--workers auto|docker|processes]

It starts four single-threaded inference workers and a dqoesd: three serve requests back
to back, one (search-api) is a service whose requests arrive on their own, at random, and
wait their turn (an open loop: its latency runs from a request's arrival to its answer).
Where Docker can run them (the project's systemd guest, or a host whose engine answers), the
workers are Docker containers set up as a Docker user sets them up: a ring from the dqoes
volume driver and the target as a label (lab.docker_fleet); elsewhere they are processes
(lab.workload) in cgroups of a private subtree, their targets set as `dqoesctl set-target`
sets them. For the first seconds no worker has a target: the default platform, where CFS
gives each an even share; the demo measures each one's latency there. Then each gets a
target relative to that latency: two looser (the worker can give CPU away; the service
needs what its arrivals and its queue need, more than it used at the even share), one
tighter (it needs more), and one that even a whole CPU cannot meet. The live table is
`dqoesctl status`'s, refreshed every couple of seconds while the controller converges; at
the end come a summary and a plot of latency and CPU over time, written to DIR (default
demo-output/).

Needs root and a cgroup v2 hierarchy with the cpu controller (`make demo` runs it in a
qemu guest with a real kernel, systemd and Docker's engine where the host has none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dqoes_cg.cgroup import CgroupError
from dqoes_cg.ctl import format_duration, format_status
from dqoes_cg.policy import Cls, classify
from dqoes_cg.status import Status
from lab.docker_fleet import DockerUnavailable, docker_fleet
from lab.guest.routing import IN_GUEST_ENV
from lab.testbed import Observer, Testbed, solo_latency

DAEMON_ARGS = ("--sample-interval", "0.5", "--interval", "4", "--max-interval", "8",
               "--beta", "0.3")
# CPU left outside dqoesd's budget for what runs beside the workers (the engine and its
# shims, dqoesd, the demo itself): with a budget of every CPU, the caps would add up to
# more than the workers can get.
RESERVED_CPUS = 0.25
DEFAULT_PHASE_S = 14.0
REFRESH_S = 2.0


@dataclass(frozen=True)
class Service:
    name: str
    ratio: float  # target / its latency at the default platform's even share
    note: str
    load_cpu: float | None = None  # open loop: requests arriving at a rate needing this CPU


SERVICES = (
    Service("photo-tagger", 1.5, "loose: can give CPU away"),
    # Uncapped, a service's rare requests each get a whole CPU; under any cap of a few
    # tenths each one is served slower, so its target allows for that.
    Service("search-api", 3.0, "open loop: requests arrive on their own (0.15 CPU of them)",
            load_cpu=0.15),
    Service("face-unlock", 0.9, "tight: needs more than an even share"),
    Service("ar-overlay", 0.4, "unachievable: needs more than a whole CPU"),
)
OPEN = np.array([s.load_cpu is not None for s in SERVICES])
WORKER_MODEL = "tiny"  # lab.workload's model, for workers that run as processes


class Fleet(Protocol):
    """Where the demo's workers run, with the dqoesd that manages them."""

    description: str

    def start(self, names: Sequence[str], loads: Sequence[float | None]) -> None:
        """dqoesd, and one worker per name serving without a target: back to back, or
        (a load) receiving requests at a rate that needs that many CPUs."""

    def observer(self, start: float | None = None) -> Observer:
        """Measures the workers (indexed like the names) from now on; `start`: the time
        its windows count from."""

    def set_targets(self, targets: Sequence[float]) -> None:
        """Each worker's target (seconds, mean latency), in dqoesd's hands on return."""

    def status(self) -> Status:
        """dqoesd's status."""


class ProcessFleet:
    """Workers as processes (lab.workload) in cgroups of a private subtree, targets set
    over dqoesd's control socket as `dqoesctl set-target` sets them."""

    description = "processes in cgroups of their own (targets by `dqoesctl set-target`)"

    def __init__(self, bed: Testbed, daemon_args: Sequence[str]) -> None:
        self.bed = bed
        self.daemon_args = tuple(daemon_args)
        self.names: list[str] = []

    def start(self, names: Sequence[str], loads: Sequence[float | None]) -> None:
        self.bed.start_daemon(*self.daemon_args)
        self.names = list(names)
        cost = solo_latency(WORKER_MODEL) if any(x is not None for x in loads) else 1.0
        for i, (name, load) in enumerate(zip(self.names, loads, strict=True)):
            self.bed.add_worker(name, WORKER_MODEL, hold=True, seed=i,
                                rate=None if load is None else load / cost)
        print("starting the workers (loading their models)...", flush=True)
        self.bed.wait_held()
        for name in self.names:
            self.bed.release(name)

    def observer(self, start: float | None = None) -> Observer:
        return self.bed.observer(self.names, start)

    def set_targets(self, targets: Sequence[float]) -> None:
        for name, target in zip(self.names, targets, strict=True):
            self.bed.set_target(self.bed.workers[name].name, float(target), "mean")

    def status(self) -> Status:
        return self.bed.status()


def choose_fleet(workers: str, workdir: Path, daemon_args: Sequence[str],
                 stack: ExitStack) -> Fleet:
    """Docker containers where Docker can run them (`workers` auto or docker), else
    processes; closed with `stack`."""
    if workers != "processes":
        try:
            fleet = docker_fleet(workdir, daemon_args)
            stack.callback(fleet.close)
            return fleet
        except DockerUnavailable as e:
            if workers == "docker":
                raise
            print(f"{e}: the workers run as processes instead", flush=True)
    bed = stack.enter_context(Testbed(f"dqoes-demo-{os.getpid()}", workdir))
    return ProcessFleet(bed, daemon_args)


@dataclass
class History:
    """What the observer saw, window by window."""

    t: list[float]
    latency: list[np.ndarray]
    usage: list[np.ndarray]
    limit: list[np.ndarray]
    satisfied: list[int]  # the daemon's |S| (the default phase: classified here)
    targets_at: float = DEFAULT_PHASE_S  # when dqoesd had every target

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
    p.add_argument("--workers", choices=("auto", "docker", "processes"), default="auto",
                   help="Docker containers with labels (auto: where a Docker engine answers, "
                        "or where it can be started in the project's guest), or processes "
                        "in cgroups of their own (default: auto)")
    p.add_argument("--redraw", action=argparse.BooleanOptionalAction, default=None,
                   help="redraw the table in place (default: when stdout is a terminal)")
    args = p.parse_args(argv)
    redraw = sys.stdout.isatty() if args.redraw is None else args.redraw
    args.out.mkdir(parents=True, exist_ok=True)
    where = ("a qemu guest (real Linux kernel, emulated CPUs)"
             if os.environ.get(IN_GUEST_ENV) == "1" else "this host")
    try:
        with tempfile.TemporaryDirectory(prefix="dqoes-demo-") as work, ExitStack() as stack:
            daemon_args = (*DAEMON_ARGS, "--cpus", f"{(os.cpu_count() or 1) - RESERVED_CPUS:g}")
            fleet = choose_fleet(args.workers, Path(work), daemon_args, stack)
            print(f"dqoes-cg demo on {where}, {os.cpu_count()} CPUs: {len(SERVICES)} "
                  f"inference workers as {fleet.description}; dqoesd {' '.join(daemon_args)}",
                  flush=True)
            history, targets, even = run(fleet, args.duration, redraw)
            final = fleet.status()
    except DockerUnavailable as e:
        print(f"demo: {e} (`--workers processes` needs no Docker)", file=sys.stderr)
        return 1
    except (CgroupError, OSError, RuntimeError) as e:
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


def run(fleet: Fleet, duration: float, redraw: bool
        ) -> tuple[History, np.ndarray, np.ndarray]:
    """The default phase, then the targets and the controller at work."""
    fleet.start([s.name for s in SERVICES], [s.load_cpu for s in SERVICES])
    observer = fleet.observer()
    history = History([], [], [], [], [])
    print(f"default platform, no targets: measuring each worker's latency at CFS's even "
          f"share for {DEFAULT_PHASE_S:.0f} s", flush=True)
    while time.monotonic() - observer.start < DEFAULT_PHASE_S:
        time.sleep(REFRESH_S)
        w = observer.window()
        history.add(w.t, w.latency_s, w.usage_cores, w.limit_cores, 0)
        latencies = "  ".join(f"{s.name} {format_duration(x)}"
                              for s, x in zip(SERVICES, w.latency_s, strict=True))
        print(f"  t={w.t:3.0f}s  {latencies}", flush=True)
    observer.close()
    even = np.nanmedian(np.array(history.latency[1:] or history.latency), axis=0)
    if not np.isfinite(even).all():
        silent = [s.name for s, x in zip(SERVICES, even, strict=True) if not np.isfinite(x)]
        raise RuntimeError(f"no request measured in the default phase: {', '.join(silent)}")
    targets = np.array([s.ratio for s in SERVICES]) * even
    history.satisfied[:] = [_satisfied(targets, lat) for lat in history.latency]
    print("targets set: dqoesd takes over", flush=True)
    fleet.set_targets(targets.tolist())
    observer = fleet.observer(observer.start)
    history.targets_at = time.monotonic() - observer.start
    gap = np.full(len(SERVICES), np.nan)  # no line drawn across the change of targets
    history.add(history.targets_at, gap, gap, gap, 0)
    phase_end = time.monotonic() + duration
    while time.monotonic() < phase_end:
        time.sleep(REFRESH_S)
        w = observer.window()
        status = fleet.status()
        history.add(w.t, w.latency_s, w.usage_cores, w.limit_cores, status.host.S)
        table = format_status(status)
        left = max(0.0, phase_end - time.monotonic())
        header = f"dqoes-cg demo  t={w.t:.0f}s  ({left:.0f}s left)"
        if redraw:
            print(f"\x1b[H\x1b[2J{header}\n\n{table}", flush=True)
        else:
            print(f"--- {header}\n{table}", flush=True)
    observer.close()
    return history, targets, even


def _satisfied(targets: np.ndarray, latency: np.ndarray) -> int:
    return int((classify(targets, latency, open_loop=OPEN) == Cls.S).sum())


def summarize(h: History, targets: np.ndarray, even: np.ndarray, final: dict[str, Any],
              where: str) -> str:
    """Final classes from each worker's median latency over the last stretch of the run
    (single windows scatter widely on a busy or emulated CPU), against the default's."""
    t = np.array(h.t)
    managed = t > h.targets_at
    tail = managed & (t >= t[-1] - max(20.0, 0.2 * (t[-1] - h.targets_at)))
    settled = np.nanmedian(np.array(h.latency)[tail], axis=0) if tail.any() \
        else np.full(len(SERVICES), np.nan)
    classes = classify(targets, settled, open_loop=OPEN)
    final_s = int((classes == Cls.S).sum())
    default_s = _satisfied(targets, even)
    satisfied = np.array(h.satisfied)
    reached = next((x - h.targets_at for x, n, m in zip(t, satisfied, managed, strict=True)
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
            "default_phase_s": DEFAULT_PHASE_S, "targets_at_s": h.targets_at, "t": h.t,
            "latency_s": clean(h.latency),
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
        ax.axvline(h.targets_at, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
    top.text(h.targets_at, 0.97, " targets in\n dqoesd's hands", ha="left", va="top",
             transform=top.get_xaxis_transform(), fontsize=8)
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
