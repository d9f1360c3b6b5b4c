"""A whole tick of the daemon's loop, timed through the real controller (Controller.tick):
sample every cpu.stat, drain every ring, and when the policy runs, decide and write the
limits. The read-back of every cpu.max (reconcile) runs every 2 s, so hardly ever within
the timed ticks: it is timed on its own, and a tick that reconciles costs that much more.

The controller is built as dqoesd builds it after a restart: a state file lists the targets,
each bound to one of the benchmark's cgroups, and the controller re-adopts them. Before each
timed tick a producer puts RECORDS_PER_TICK latencies in every ring (a third of the
containers beat their target, a third meet it, a third miss it), so each container has a
measurement. Variants:
- sense only: the policy is not due (what most ticks are);
- with decide: the policy forced to run (policy.reset()); on idle cgroups the limits settle
  after the first round, so few cpu.max writes happen;
- with decide, all N limits written: as above, and every cpu.max rewritten (the table's
  record of what it wrote is forgotten first), the worst case. The policy limits only
  containers that use CPU: on a fake tree each cgroup's usage_usec is advanced (and read by
  an untimed tick, so that the timed one does not read freshly written files) before these
  ticks; on real cgroups, whose processes sleep, fewer may be written (each row says how
  many were).
Within the same timed ticks, the parts are timed too (PartClock wraps the fleet's and the
policy's methods that the tick calls): where each microsecond of a tick goes, the rest being
Python around them. A tick and its parts are timed in the thread's CPU time: what they cost
the daemon, whatever else the machine runs (a tick that another process preempted took
longer, not more); the wall-clock time of the same ticks is reported beside. Beside them:
the read-back of every cpu.max, and the status line dqoesd builds after every tick
(Controller.summary), on their own; and the kernel's floor of a tick at that N from C, each
pass warm: bare reads of every cpu.stat, and a read and a write of every cpu.max (what apply
asks of the kernel for each limit it changes).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.cgroups import FDS_PER_CONTAINER, Cgroups, tmpfs_dir
from bench.timing import MIN_REPEATS, NotMeasured, Row, measure, summarize
from dqoes_cg.config import Config
from dqoes_cg.controller import FD_RESERVE, Controller
from dqoes_cg.membership.objective import Target
from dqoes_cg.policy import PolicyParams
from dqoes_cg.probe import Probe
from dqoes_cg.ring import ring_dir_name, ring_path
from dqoes_cg.state import StateStore
from lab.fakecg import CPU_STAT, write

PART = "tick"
SENSE = "tick, sense only (sample + drain)"
DECIDE = "tick with decide (+ policy, apply what changed)"
WRITE_ALL = "tick with decide, all N cpu.max written"
WALL = " (wall clock)"
SUMMARY = "Controller.summary() (dqoesd calls it every tick)"
PART_READ_BACK = "every 2 s within a tick: CgroupTable.read_back (reconcile)"
# The parts of a tick that PartClock times: (label, object, method).
SAMPLE, DRAIN, WINDOW, PRESSURE, POLICY, APPLY, READ_BACK = (
    "CgroupTable.sample (C)", "RingSet.drain (C)", "RingSet.take_window (C)",
    "CgroupTable.pressure (C)", "policy.decide (numpy)", "CgroupTable.apply (C)",
    "CgroupTable.read_back (C)")
PARTS = (SAMPLE, DRAIN, WINDOW, PRESSURE, POLICY, APPLY, READ_BACK)
REST = "Python around them (controller, fleet)"
KERNEL_CALLS = (SAMPLE, PRESSURE, APPLY, READ_BACK)  # system calls, and our parsing around them
OURS_ALONE = (DRAIN, WINDOW, POLICY, REST)  # memory and CPU, no system call
FLOOR_READ = "the kernel's floor: a bare pread of each cpu.stat from C"
FLOOR_WRITE = "the kernel's floor: a bare pread, then pwrite of each cpu.max from C"
PROFILED = (SENSE, WRITE_ALL)
TARGET_S = 0.1
LATENCIES_S = (0.05, 0.1, 0.2)  # beats, meets, misses TARGET_S
RECORDS_PER_TICK = 4
RING_CAPACITY = 1024


def write_state(state_dir: Path, dirs: list[Path]) -> list[str]:
    """A state file binding one target per cgroup; the target names."""
    targets = {f"c{i:05d}": Target(f"c{i:05d}", TARGET_S, "p95", cgroup=str(d))
               for i, d in enumerate(dirs)}
    state_dir.mkdir(parents=True, exist_ok=True)
    StateStore(state_dir).compact(targets)
    return list(targets)


class Producers:
    """A probe on every container's ring, recording latencies on demand."""

    def __init__(self, run_dir: Path, names: list[str]) -> None:
        self.probes = [Probe.open(ring_path(run_dir, ring_dir_name(name))) for name in names]
        self.latencies = [LATENCIES_S[i % len(LATENCIES_S)] for i in range(len(names))]

    def record(self, count: int = 1) -> None:
        for probe, latency in zip(self.probes, self.latencies, strict=True):
            for _ in range(count):
                probe.record(latency)

    def close(self) -> None:
        for probe in self.probes:
            probe.close()


@contextmanager
def controller_for(dirs: list[Path], mount: Path) -> Iterator[tuple[Controller, Producers]]:
    """A controller managing `dirs` (state and rings on tmpfs), with a producer per ring.
    The policy runs only when forced (a listener interval of a day)."""
    work = Path(tempfile.mkdtemp(prefix="dqoes-bench-tick-", dir=tmpfs_dir()))
    try:
        names = write_state(work / "state", dirs)
        cfg = Config(state_dir=work / "state", run_dir=work / "run", mount=mount,
                     cpus=float(os.cpu_count() or 1), ring_capacity=RING_CAPACITY,
                     params=PolicyParams(iv_initial=86400.0, iv_max=86400.0))
        controller = Controller(cfg)
        producers = Producers(cfg.run_dir, names)
        try:
            if len(controller.fleet) != len(dirs):
                raise RuntimeError(f"the controller bound {len(controller.fleet)} of "
                                   f"{len(dirs)} cgroups")
            yield controller, producers
        finally:
            producers.close()
            controller.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def part_case(case: str, part: str) -> str:
    """The row of one part of the ticks of `case`."""
    return f"{part}, within: {case}"


def use_cpu(dirs: list[Path], usage_usec: int) -> None:
    """Gives every cgroup of a fake tree this total CPU usage in its cpu.stat."""
    content = CPU_STAT.replace("usage_usec 1000\n", f"usage_usec {usage_usec}\n")
    for d in dirs:
        write(d / "cpu.stat", content)


class PartClock:
    """Times the parts of Controller.tick in the thread's CPU time: wraps the methods that
    the tick calls on the controller's fleet and policy (instance attributes hide the
    class's methods). `written` counts the cpu.max writes of the last tick."""

    def __init__(self, controller: Controller) -> None:
        f = controller.fleet
        self.spent = dict.fromkeys(PARTS, 0)
        self.written = 0
        apply = f.table.apply

        def counted(*args: object, **kwargs: object) -> int:
            written = apply(*args, **kwargs)
            self.written += written
            return written
        f.table.apply = counted  # type: ignore[method-assign]
        for label, obj, name in ((SAMPLE, f.table, "sample"), (DRAIN, f.rings, "drain"),
                                 (WINDOW, f.rings, "take_window"),
                                 (PRESSURE, f.table, "pressure"),
                                 (POLICY, controller.policy, "decide"),
                                 (APPLY, f.table, "apply"), (READ_BACK, f.table, "read_back")):
            setattr(obj, name, self._timed(label, getattr(obj, name)))

    def _timed(self, label: str, method: Callable[..., object]) -> Callable[..., object]:
        spent = self.spent

        def timed(*args: object, **kwargs: object) -> object:
            start = time.thread_time_ns()
            try:
                return method(*args, **kwargs)
            finally:
                spent[label] += time.thread_time_ns() - start
        return timed

    def reset(self) -> None:
        self.written = 0
        for label in self.spent:
            self.spent[label] = 0


def profile(tick: Callable[[], None], setup: Callable[[], object], clock: PartClock,
            repeats: int, budget_s: float,
            ) -> tuple[list[float], list[float], dict[str, list[float]], list[int]]:
    """CPU and wall-clock seconds of each timed tick (one per repeat, after `setup`), CPU
    seconds of each part in it, and the cpu.max writes it made."""
    setup()
    tick()  # warm-up
    cpu: list[float] = []
    wall: list[float] = []
    written: list[int] = []
    parts: dict[str, list[float]] = {label: [] for label in (*PARTS, REST)}
    deadline = time.perf_counter() + budget_s
    while len(cpu) < repeats and (len(cpu) < MIN_REPEATS or time.perf_counter() < deadline):
        setup()
        clock.reset()
        start, start_wall = time.thread_time_ns(), time.perf_counter_ns()
        tick()
        spent, spent_wall = time.thread_time_ns() - start, time.perf_counter_ns() - start_wall
        cpu.append(spent * 1e-9)
        wall.append(spent_wall * 1e-9)
        written.append(clock.written)
        for label, ns in clock.spent.items():
            parts[label].append(ns * 1e-9)
        parts[REST].append((spent - sum(clock.spent.values())) * 1e-9)
    return cpu, wall, parts, written


def run(cgroups: Cgroups, ns: list[int], repeats: int, budget_s: float,
        ) -> list[Row | NotMeasured]:
    rows: list[Row | NotMeasured] = []
    for n in ns:
        if FDS_PER_CONTAINER * n + FD_RESERVE > cgroups.fd_room:
            rows.append(NotMeasured(
                PART, f"a whole tick at N={n:,} on {cgroups.where}",
                f"needs {FDS_PER_CONTAINER * n:,} open files (cpu.stat, cpu.max, cpu.pressure "
                f"and the ring of each container) and the controller's reserve of "
                f"{FD_RESERVE}; the limit here leaves {cgroups.fd_room:,}",
                "the other place's figures at this N"))
            continue
        dirs = cgroups.dirs[:n]
        with controller_for(dirs, cgroups.mount) as (controller, producers):
            def tick(c: Controller = controller) -> None:
                c.tick(time.monotonic())

            def fill(p: Producers = producers) -> None:
                p.record(RECORDS_PER_TICK)

            def force_decide(c: Controller = controller) -> None:
                fill()
                c.policy.reset()

            usage = itertools.count(1_000, 50_000)  # 50 ms more CPU each round

            def force_write_all(c: Controller = controller, dirs: list[Path] = dirs,
                                used: Iterator[int] = usage) -> None:
                if cgroups.fake:  # and a tick reads it, as the daemon's last one would have
                    use_cpu(dirs, next(used))
                    tick()
                force_decide()
                c.fleet.table.invalidate()

            force_decide()
            tick()  # the first round also saves each cgroup's original cpu.max
            clock = PartClock(controller)
            cases: list[tuple[str, Callable[[], object]]] = [
                (SENSE, fill), (DECIDE, force_decide), (WRITE_ALL, force_write_all)]
            for case, setup in cases:
                decisions = controller.counters.decisions
                cpu, wall, parts, written = profile(tick, setup, clock, repeats, budget_s)
                decided = controller.counters.decisions - decisions
                if (case == SENSE) != (decided == 0):
                    raise RuntimeError(f"{case}: {decided} policy rounds ran")
                if case == WRITE_ALL and cgroups.fake and min(written) < n:
                    raise RuntimeError(f"{case}: {min(written)} of {n} cpu.max written")
                note = f"{RECORDS_PER_TICK} records per ring per tick"
                if case == WRITE_ALL:
                    note += f", {min(written):,} to {max(written):,} cpu.max written"
                rows.append(Row.of(PART, case, summarize(cpu), where=cgroups.where, n=n,
                                   per="tick", note=note))
                rows.append(Row.of(PART, case + WALL, summarize(wall), where=cgroups.where,
                                   n=n, per="tick", note=note))
                if case in PROFILED:
                    rows += [Row.of(PART, part_case(case, label), summarize(spent),
                                    where=cgroups.where, n=n, per="tick", role="part")
                             for label, spent in parts.items()]
            for case, fn in ((SUMMARY, controller.summary),
                             (PART_READ_BACK, controller.fleet.table.read_back)):
                rows.append(Row.of(PART, case, measure(fn, repeats=repeats, budget_s=budget_s),
                                   where=cgroups.where, n=n, per="call"))
        rows += [Row.of(PART, case, cgroups.floor(dirs, mode, repeats), where=cgroups.where,
                        n=n, per="tick", role="floor")
                 for case, mode in ((FLOOR_READ, "read"), (FLOOR_WRITE, "check-write"))]
    return rows
