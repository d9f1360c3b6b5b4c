"""Cost of the latency rings: one record from the C and the Python producer, concurrent C
producers, and the daemon's drain rate, each beside a baseline measured in the same run.

    python3 -m bench.ring_bench [--quick]

`run(quick)` returns one dict per measurement: name, median_ns (per record), spread_ns
(interquartile range of the repeats), n (repeats), baseline (the name of the row it is
compared with, or None) and ratio (median_ns / the baseline's median_ns).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from dqoes_cg._native import lib

from dqoes_cg.probe import Probe
from dqoes_cg.ring import RingSet, create_ring

ROOT = Path(__file__).resolve().parents[1]
PRODUCER_SRC = ROOT / "bench" / "ring_producer.c"
DRAIN_CAPACITY = 1 << 20


def _row(name: str, samples: list[float], baseline: dict | None = None) -> dict:
    median = statistics.median(samples)
    q = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else [median] * 3
    return {"name": name, "median_ns": median, "spread_ns": q[2] - q[0], "n": len(samples),
            "baseline": baseline["name"] if baseline else None,
            "ratio": median / baseline["median_ns"] if baseline else None}


def _compile_producer(workdir: Path) -> Path:
    exe = workdir / "ring_producer"
    subprocess.run([shutil.which("gcc") or "cc", "-O2", "-std=c11", "-pthread",
                    f"-I{ROOT / 'csrc'}", str(PRODUCER_SRC), "-o", str(exe)], check=True)
    return exe


def _produce(exe: Path, ring: Path, threads: int, records: int) -> dict[str, int]:
    out = subprocess.run([str(exe), str(ring), str(threads), str(records), "0"], check=True,
                         capture_output=True, text=True).stdout
    fields = dict(part.split("=") for part in out.split())
    if fields["attached"] != "1":
        raise RuntimeError(f"the C producer did not attach to {ring}")
    return {k: int(v) for k, v in fields.items()}


def _c_rows(exe: Path, ring: Path, repeats: int, records: int) -> list[dict]:
    clock, one, two = [], [], []
    for _ in range(repeats):
        r = _produce(exe, ring, 1, records)
        clock.append(r["clock_ns"] / records)
        one.append(r["wall_ns"] / records)
        # Two threads on one ring: wall time per record written, all threads together.
        two.append(_produce(exe, ring, 2, records)["wall_ns"] / (2 * records))
    base = _row("C clock_gettime(CLOCK_MONOTONIC) (baseline)", clock)
    return [base, _row("C dqoes_probe_record", one, base),
            _row("C dqoes_probe_record, 2 threads, per record", two, base)]


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def _python_rows(ring: Path, repeats: int, calls: int) -> list[dict]:
    attached, absent = Probe.open(ring), Probe.open(ring.parent / "absent")
    measure = attached.measure

    def record() -> None:
        attached.record(0.001)

    def record_no_ring() -> None:
        absent.record(0.001)

    def timed_block() -> None:
        with measure():
            pass

    cases = [("Python call of a C function (baseline)", lib.dq_probe_now_ns),
             ("Python Probe.record", record), ("Python Probe.record, no ring", record_no_ring),
             ("Python `with probe.measure()`", timed_block)]
    samples: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(repeats):
        for name, fn in cases:
            samples[name].append(_per_call(fn, calls))
    attached.close()
    absent.close()
    base = _row(cases[0][0], samples[cases[0][0]])
    return [base] + [_row(name, samples[name], base) for name, _ in cases[1:]]


def _drain_rows(exe: Path, ring: Path, repeats: int, records: int) -> list[dict]:
    """The reader's cost per record, full rings drained: against copying the same bytes."""
    drain, copy = [], []
    src = np.random.default_rng(0).integers(0, 2**63, records * 4, dtype=np.uint64)
    dst = np.empty_like(src)
    with RingSet([ring], DRAIN_CAPACITY) as rings:
        for _ in range(repeats):
            _produce(exe, ring, 1, records)
            start = time.perf_counter_ns()
            got = rings.drain()
            drain.append((time.perf_counter_ns() - start) / records)
            if got != records:
                raise RuntimeError(f"drained {got} of {records} records")
            start = time.perf_counter_ns()
            np.copyto(dst, src)
            copy.append((time.perf_counter_ns() - start) / records)
    base = _row("copy of 32 bytes per record in memory (baseline)", copy)
    return [base, _row("RingSet.drain, per record", drain, base)]


def run(quick: bool) -> list[dict]:
    repeats, records = (5, 200_000) if quick else (15, 2_000_000)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        workdir = Path(tmp)
        exe = _compile_producer(workdir)
        ring = workdir / "ring"
        create_ring(ring, 1 << 16)
        rows = _c_rows(exe, ring, repeats, records)
        rows += _python_rows(ring, repeats, records // 4)
        drained = workdir / "drained"
        create_ring(drained, DRAIN_CAPACITY)
        rows += _drain_rows(exe, drained, repeats, min(records, DRAIN_CAPACITY))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench.ring_bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer and shorter repeats")
    args = p.parse_args()
    print(f"ring benchmarks on this host ({platform.node()}, {platform.machine()}, "
          f"Linux {platform.release()}), rings on tmpfs")
    print(f"{'':52} {'median ns':>10} {'IQR ns':>8} {'n':>3} {'x baseline':>10}")
    for r in run(args.quick):
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else ""
        print(f"{r['name']:52} {r['median_ns']:10.1f} {r['spread_ns']:8.1f} {r['n']:3} "
              f"{ratio:>10}")


if __name__ == "__main__":
    main()
