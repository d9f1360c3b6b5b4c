"""Whether caps that add up to a node's CPUs are delivered to single-threaded workers, on
the real kernel: the CPU each busy worker gets under its cpu.max, with every cpu.weight
equal (the default, and what dqoesd leaves without `--weights`) and with cpu.weight in
proportion to the cap (what dqoesd writes with it, there at 100 per CPU of the cap:
tests/test_weights.py measures that rule through the actuator; here the weights average
100).

    python3 -m bench.packing [--quick] [--seconds S] [--reps N] [--out DIR]

A single-threaded worker runs on one CPU at a time, and CFS places tasks by their load, not
by their caps: caps that add up to the CPUs are delivered only if the scheduler keeps each
CPU's sum of caps under one CPU, moving tasks between CPUs where no placement does. The
load it balances is weighted by cpu.weight, so weights in proportion to the caps make an
even load mean an even sum of caps. Each set of caps is the admit policy's in a real run (or
one with slack), one busy loop per cgroup, both weightings alternating, `reps` times.

On a host without a cgroup v2 cpu controller, the runs go to a qemu guest (lab.guest).
Results: DIR/packing.json and DIR/packing.md (default bench/results).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lab.cgroups import cgroup2_cpu_mount, make_test_cgroup, remove_cgroup_tree

from . import real_kernel

CAP_SETS = {  # CPUs, on a node of 2: the admit policy's caps over a real run's tail
    "r1-identical-unachievable": (0.76, 0.74, 0.25, 0.25),
    "r3-varied-burst": (0.60, 0.49, 0.36, 0.30, 0.25),
    "r4-multi-model": (0.62, 0.51, 0.37, 0.28, 0.21),
    "r4-multi-model's, 8% left over": (0.57, 0.47, 0.34, 0.26, 0.19),
}
WEIGHTINGS = ("equal", "in proportion to the cap")
PERIOD_US = 100_000
SETTLE_S = 3.0


def usage_usec(cgroup: Path) -> int:
    for line in (cgroup / "cpu.stat").read_text().splitlines():
        key, value = line.split()
        if key == "usage_usec":
            return int(value)
    raise ValueError(f"{cgroup}: no usage_usec in cpu.stat")


def delivered(parent: Path, caps: tuple[float, ...], weighting: str, seconds: float,
              ) -> list[float]:
    """The CPU each of len(caps) busy loops gets over `seconds`, capped at `caps`."""
    cgroups, loops = [], []
    try:
        for i, cap in enumerate(caps):
            cg = parent / f"w{i}"
            cg.mkdir()
            cgroups.append(cg)
            (cg / "cpu.max").write_text(f"{round(cap * PERIOD_US)} {PERIOD_US}")
            weight = 100 if weighting == "equal" else round(100 * len(caps) * cap / sum(caps))
            (cg / "cpu.weight").write_text(str(weight))
            loops.append(subprocess.Popen(["sh", "-c", "while :; do :; done"]))
            (cg / "cgroup.procs").write_text(str(loops[-1].pid))
        time.sleep(SETTLE_S)
        start, t0 = [usage_usec(cg) for cg in cgroups], time.monotonic()
        time.sleep(seconds)
        end, t1 = [usage_usec(cg) for cg in cgroups], time.monotonic()
        return [(b - a) * 1e-6 / (t1 - t0) for a, b in zip(start, end, strict=True)]
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        for cg in cgroups:
            cg.rmdir()


def run_here(out: Path, seconds: float, reps: int, quick: bool = False) -> None:
    mount = cgroup2_cpu_mount()
    assert mount is not None
    parent = make_test_cgroup(mount)
    try:
        points = [{"set": name, "caps": caps, "weighting": weighting, "round": r,
                   "got": delivered(parent, caps, weighting, seconds)}
                  for r in range(reps) for name, caps in CAP_SETS.items()
                  for weighting in WEIGHTINGS]
    finally:
        remove_cgroup_tree(parent)
    where = ("qemu guest, real cgroup v2 kernel" if os.environ.get("DQOES_GUEST") == "1"
             else "this host's cgroup v2 kernel") + f", {os.cpu_count()} CPUs"
    (out / "packing.json").write_text(json.dumps(
        {"where": where, "seconds": seconds, "points": points}, indent=1) + "\n")
    (out / "packing.md").write_text(markdown(points, where, seconds))


def markdown(points: list[dict[str, Any]], where: str, seconds: float) -> str:
    lines = ["# Caps that add up to the CPUs, delivered to single-threaded workers", "",
             f"Made by `python3 -m bench.packing` ({where}): one busy single-threaded loop "
             f"per cgroup, each capped by cpu.max, {seconds:g} s per point, the weightings "
             "alternating. Each cell: the CPU the loop with the largest cap got over its "
             "cap, then the least and the mean of got / cap over the loops, one line per "
             "round. bench/packing.py says why.", "",
             "| caps (CPUs) | " + " | ".join(f"cpu.weight {w}" for w in WEIGHTINGS) + " |",
             "|---" * (1 + len(WEIGHTINGS)) + "|"]
    for name, caps in CAP_SETS.items():
        cells = []
        for weighting in WEIGHTINGS:
            ratios = [[g / c for g, c in zip(p["got"], caps, strict=True)] for p in points
                      if p["set"] == name and p["weighting"] == weighting]
            top = caps.index(max(caps))
            cells.append("<br>".join(f"{r[top]:.2f}; {min(r):.2f}, {sum(r) / len(r):.2f}"
                                     for r in ratios))
        lines.append(f"| {name}: {', '.join(f'{c:g}' for c in caps)} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return real_kernel.main("bench.packing", __doc__, run_here, 30.0, 2.0, argv)


if __name__ == "__main__":
    sys.exit(main())
