"""How a CPU limit is applied, measured on the real kernel: the latency (mean, p95, p99) a
worker gets for the same guaranteed CPU share under each way of giving it.

    python3 -m bench.limit_modes [--quick] [--seconds S] [--reps N] [--out DIR]

Ways of giving a worker a share of c CPUs:
- `cpu.max` with a period of 100 ms (the kernel's default and the daemon's), 20 ms or 5 ms:
  quota = c x period. A worker that spends its quota early in a period stalls for the rest
  of it; a shorter period makes the stalls shorter and more frequent.
- `cpu.max` with a period of 100 ms and `cpu.max.burst` = the quota: quota left unused in
  a period can be spent later, up to one more period's worth.
- `cpu.weight` alone, no cap: work-conserving, c when every CPU is busy and more when some
  CPU is idle; a cap would only be a guard.
Every worker's cpu.weight is in proportion to its share, so that CFS's sharing of a busy node
agrees with the caps; the caps add up to at most the node's CPUs, so each is a guarantee.

The emulated CPUs of the guest change speed with the host's load, by far more than the
effects measured here, so modes are compared side by side, at the same moments: each phase
runs one reference worker (`cpu.max`, 100 ms) beside three workers given their share another
way, plus ballast workers that keep every CPU busy with what is left (capped at it in the
`cpu.max` phase; weighted, uncapped, in the `cpu.weight` phase, as a node of weighted
containers would be). Each mode's latency is reported as a ratio to the reference's in the
same interval, whose median over the repetitions is the figure that counts.

Two workloads, with worker model tiny: `closed`, requests back to back (the experiments'
workers), and `open`, requests arriving at random (a Poisson process; latency counts the
wait in the queue, as a client sees it) at a rate that makes OPEN_LOAD of a worker's share
busy. The work per request (CPU-seconds) is measured from the closed runs: CPU use times
latency, which does not depend on the share. Each point gives every recorded latency (ring
records, not window statistics), the workers' CPU use and their throttled periods.

On a host without a cgroup v2 cpu controller, the runs go to a qemu guest (lab.guest).
Results: DIR/limit_modes.json and DIR/limit_modes.md (default bench/results).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import real_kernel

MODEL = "tiny"
SHARES = (0.3, 0.45)  # CPUs each measured worker is guaranteed: 4 of them fit in 2 CPUs
OPEN_LOAD = 0.5  # open loop: a worker's mean CPU demand, as a fraction of its smallest share
BALLAST = ("b1", "b2")
SETTLE_S = 3.0


@dataclass(frozen=True)
class Mode:
    name: str
    period_us: int = 100_000
    burst: bool = False
    capped: bool = True

    def apply(self, cgroup: Path, cpus: float, node_cpus: float) -> None:
        """Give `cgroup` `cpus` CPUs this way, on a node of `node_cpus` CPUs."""
        (cgroup / "cpu.weight").write_text(str(max(1, round(1000 * cpus / node_cpus))))
        quota = max(1000, round(cpus * self.period_us))
        (cgroup / "cpu.max").write_text(f"{quota} {self.period_us}" if self.capped
                                        else "max 100000")
        burst = cgroup / "cpu.max.burst"
        if burst.exists():
            burst.write_text(str(quota if self.capped and self.burst else 0))


REFERENCE = Mode("cpu.max, period 100 ms")
WEIGHT = Mode("cpu.weight, no cap", capped=False)
PHASES = (  # what runs beside the reference worker, one worker each
    ("cpu.max", (Mode("cpu.max, period 20 ms", 20_000), Mode("cpu.max, period 5 ms", 5_000),
                 Mode("cpu.max 100 ms + burst", burst=True))),
    ("cpu.weight", (WEIGHT, WEIGHT, WEIGHT)),
)
MODES = (REFERENCE, *PHASES[0][1], WEIGHT)


@dataclass
class Point:
    workload: str
    phase: str
    mode: str
    worker: str
    share: float  # CPUs guaranteed
    rep: int
    requests: int
    mean_s: float
    p50_s: float
    p95_s: float
    p99_s: float
    usage_cpus: float
    throttled: float  # periods throttled / periods


def _cpu_stat(cgroup: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in
                                   (cgroup / "cpu.stat").read_text().splitlines())}


def measure(workload: str, shares: tuple[float, ...], seconds: float, reps: int,
            workdir: Path, work_s: float) -> list[Point]:
    """Both phases at every share, `reps` times, with one set of workers: `ref` and w1-w3
    measured, the ballast beside them (open loop: requests of `work_s` CPU-seconds arrive
    at a rate that keeps OPEN_LOAD of the smallest share busy)."""
    from dqoes_cg.ring import RECORD_DTYPE, RingSet
    from lab.testbed import Testbed

    node_cpus = float(os.cpu_count() or 1)
    names = ("ref", "w1", "w2", "w3")
    points = []
    with Testbed(f"dqoes-limits-{os.getpid()}", workdir) as bed:
        ballast = bed.root / "ballast"
        ballast.mkdir()
        (ballast / "cgroup.subtree_control").write_text("+cpu")
        rate = OPEN_LOAD * min(shares) / work_s if workload == "open" else None
        for i, name in enumerate(names):
            bed.add_worker(name, MODEL, hold=True, seed=i, rate=rate)
        for name in BALLAST:
            bed.add_worker(f"ballast/{name}", MODEL, hold=True)
        bed.wait_held()
        rings = RingSet([bed.ring_of(n) for n in names])
        records = np.zeros(1 << 14, RECORD_DTYPE)
        try:
            for name in bed.workers:
                bed.release(name)
            for rep, share, (phase, modes) in itertools.product(range(reps), shares, PHASES):
                for name, mode in zip(names, (REFERENCE, *modes), strict=True):
                    mode.apply(bed.root / name, share, node_cpus)
                Mode("ballast", capped=phase == "cpu.max").apply(
                    ballast, node_cpus - share * len(names), node_cpus)
                time.sleep(SETTLE_S)  # requests under the previous settings drain
                rings.drain()
                before = [_cpu_stat(bed.root / n) for n in names]
                start = time.monotonic()
                got: list[np.ndarray] = []
                while time.monotonic() - start < seconds:
                    time.sleep(0.5)
                    n = min(rings.drain(records=records), len(records))
                    got.append(records[:n].copy())
                elapsed = time.monotonic() - start
                after = [_cpu_stat(bed.root / n) for n in names]
                recs = np.concatenate(got)
                for i, (name, mode) in enumerate(zip(names, (REFERENCE, *modes), strict=True)):
                    lat = recs["latency_ns"][recs["ring"] == i] * 1e-9
                    points.append(_point(workload, phase, mode, name, share, rep, lat,
                                         before[i], after[i], elapsed))
                ref = points[-len(names)]
                print(f"{workload} {phase} {share:g} CPU rep {rep}: p95 " + ", ".join(
                    f"{p.mode} {p.p95_s / ref.p95_s:.2f}" for p in points[-len(names):]),
                    file=sys.stderr, flush=True)
        finally:
            rings.close()
    return points


def _point(workload: str, phase: str, mode: Mode, worker: str, share: float, rep: int,
           lat: np.ndarray, before: dict[str, int], after: dict[str, int],
           elapsed: float) -> Point:
    periods = after["nr_periods"] - before["nr_periods"]
    q = np.percentile(lat, [50, 95, 99]) if lat.size else np.full(3, np.nan)
    return Point(workload, phase, mode.name, worker, share, rep, int(lat.size),
                 float(lat.mean()) if lat.size else float("nan"), *map(float, q),
                 (after["usage_usec"] - before["usage_usec"]) * 1e-6 / elapsed,
                 (after["nr_throttled"] - before["nr_throttled"]) / periods if periods else 0.0)


# --- the summary -------------------------------------------------------------------------


STATS = ("mean_s", "p95_s", "p99_s")


def ratios(points: list[Point]) -> dict[tuple[str, str, float], dict[str, float]]:
    """Per (workload, mode, share): the median over repetitions (and over the workers of a
    mode) of each statistic divided by the reference worker's in the same interval, with
    the medians of the absolute values, CPU use and throttling."""
    groups: dict[tuple[str, str, float], list[tuple[Point, Point]]] = {}
    for p in points:
        ref = next(r for r in points if (r.workload, r.phase, r.share, r.rep, r.worker) ==
                   (p.workload, p.phase, p.share, p.rep, "ref"))
        groups.setdefault((p.workload, p.mode, p.share), []).append((p, ref))
    out = {}
    for key, pairs in groups.items():
        row = {f"{s}_ratio": float(np.median([getattr(p, s) / getattr(r, s) for p, r in pairs]))
               for s in STATS}
        row.update({s: float(np.median([getattr(p, s) for p, _ in pairs]))
                    for s in (*STATS, "usage_cpus", "throttled")})
        row["requests"] = float(sum(p.requests for p, _ in pairs))
        out[key] = row
    return out


def markdown(points: list[Point], where: str, work_s: float) -> str:
    table = ratios(points)
    lines = ["# How a limit is applied: latency at the same guaranteed CPU share", "",
             f"Made by `python3 -m bench.limit_modes` ({where}). Workers of model {MODEL} "
             f"({work_s * 1e3:.0f} ms of CPU a request), each guaranteed the share in the "
             "column; every other CPU kept busy. Each cell: the mode's mean / p95 / p99 "
             "latency as a ratio to the reference worker's (cpu.max, period 100 ms) in the "
             "same interval, median over repetitions (< 1: better at the same share); then "
             "its median absolute p95, CPU used and periods throttled. bench/limit_modes.py "
             "says how.", ""]
    for workload, title in (("closed", "requests back to back (closed loop)"),
                            ("open", "requests arriving at random (open loop, "
                                     f"{OPEN_LOAD:.0%} of the smaller share busy)")):
        shares = sorted({s for w, _, s in table if w == workload})
        if not shares:
            continue
        lines += [f"## {title}", "",
                  "| mode | " + " | ".join(f"{s:g} CPU: mean / p95 / p99 ratio; p95; CPU used; "
                                          "throttled" for s in shares) + " |",
                  "|---" * (len(shares) + 1) + "|"]
        for mode in MODES:
            cells = []
            for s in shares:
                r = table.get((workload, mode.name, s))
                cells.append("-" if r is None else
                             f"{r['mean_s_ratio']:.2f} / {r['p95_s_ratio']:.2f} / "
                             f"{r['p99_s_ratio']:.2f}; {r['p95_s'] * 1e3:.0f} ms; "
                             f"{r['usage_cpus']:.2f}; {r['throttled']:.0%}")
            lines.append(f"| {mode.name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def run_here(out: Path, seconds: float, reps: int, quick: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="dqoes-limit-modes-"))
    shares = SHARES[:1] if quick else SHARES
    points = measure("closed", shares, seconds, reps, work / "closed", float("nan"))
    work_s = float(np.median([p.usage_cpus * p.mean_s for p in points]))
    points += measure("open", shares, seconds, reps, work / "open", work_s)
    where = ("qemu guest, real cgroup v2 kernel, 2 emulated CPUs"
             if os.environ.get("DQOES_GUEST") == "1" else "this host's cgroup v2 kernel")
    (out / "limit_modes.json").write_text(json.dumps(
        {"where": where, "seconds": seconds, "reps": reps, "work_s": work_s,
         "points": [asdict(p) for p in points]}, indent=1) + "\n")
    (out / "limit_modes.md").write_text(markdown(points, where, work_s))


def main(argv: list[str] | None = None) -> int:
    return real_kernel.main("bench.limit_modes", __doc__, run_here, 45.0, 3.0, argv)


if __name__ == "__main__":
    sys.exit(main())
