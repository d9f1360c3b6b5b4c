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
  record of what it wrote is forgotten first), the worst case.
Beside them: the tick's three C calls on their own, and the status line dqoesd builds after
every tick (Controller.summary).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.cgroups import Cgroups, tmpfs_dir
from bench.timing import Row, measure
from dqoes_cg.config import Config
from dqoes_cg.controller import Controller
from dqoes_cg.policy import PolicyParams
from dqoes_cg.probe import Probe
from dqoes_cg.ring import ring_dir_name, ring_path
from dqoes_cg.state import StateStore, Target

PART = "tick"
SENSE = "tick, sense only (sample + drain)"
DECIDE = "tick with decide (+ policy, apply what changed)"
WRITE_ALL = "tick with decide, all N cpu.max written"
SUMMARY = "Controller.summary() (dqoesd calls it every tick)"
PART_SAMPLE = "within a tick: CgroupTable.sample"
PART_DRAIN = "within a tick: RingSet.drain"
PART_READ_BACK = "every 2 s within a tick: CgroupTable.read_back (reconcile)"
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


def run(cgroups: Cgroups, ns: list[int], repeats: int, budget_s: float) -> list[Row]:
    rows = []
    for n in ns:
        with controller_for(cgroups.dirs[:n], cgroups.mount) as (controller, producers):
            def tick(c: Controller = controller) -> None:
                c.tick(time.monotonic())

            def fill(p: Producers = producers) -> None:
                p.record(RECORDS_PER_TICK)

            def force_decide(c: Controller = controller) -> None:
                fill()
                c.policy.reset()

            def force_write_all(c: Controller = controller) -> None:
                force_decide()
                c.fleet.table.invalidate()

            force_decide()
            tick()  # the first round also saves each cgroup's original cpu.max
            cases: list[tuple[str, Callable[[], None], Callable[[], object]]] = [
                (SENSE, tick, fill), (DECIDE, tick, force_decide),
                (WRITE_ALL, tick, force_write_all)]
            for case, fn, setup in cases:
                decisions = controller.counters.decisions
                stats = measure(fn, setup=setup, repeats=repeats, budget_s=budget_s)
                decided = controller.counters.decisions - decisions
                if (case == SENSE) != (decided == 0):
                    raise RuntimeError(f"{case}: {decided} policy rounds ran")
                rows.append(Row.of(PART, case, stats, where=cgroups.where, n=n, per="tick",
                                   note=f"{RECORDS_PER_TICK} records per ring per tick"))
            fleet = controller.fleet
            parts = [(SUMMARY, controller.summary, None),
                     (PART_SAMPLE, fleet.table.sample, None),
                     (PART_DRAIN, fleet.rings.drain, fill),
                     (PART_READ_BACK, fleet.table.read_back, None)]
            for case, fn, setup in parts:
                rows.append(Row.of(PART, case, measure(fn, setup=setup, repeats=repeats,
                                                       budget_s=budget_s),
                                   where=cgroups.where, n=n, per="call"))
    return rows
