"""Cost of the latency rings: one record from the C and the Python producer, alone and with
concurrent producers, the daemon's drain rate, and what a drain costs per ring with nothing
new, each beside a floor measured in the same run (a clock read, a Python call of a C
function, a memory copy, a system call). A drain's read system calls are counted too
(/proc/self/io).

    python3 -m bench.ring_bench [--quick]

`run(quick)` returns one `bench.timing.Row` per measurement (part "ring", per record), its
ratio taken against its floor.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from dqoes_cg._native import lib

from bench.timing import HOST, Row, format_table, summarize
from dqoes_cg.probe import Probe
from dqoes_cg.ring import RingSet, create_ring

ROOT = Path(__file__).resolve().parents[1]
PRODUCER_SRC = ROOT / "bench" / "ring_producer.c"
DRAIN_CAPACITY = 1 << 20
CONCURRENT_THREADS = (2, 4)
PYTHON_PROCESSES = 2
IDLE_RINGS = 1000
SMALL_CAPACITY = 1024
PART = "ring"
SYSCALL = "C getppid(), one system call (floor)"
IDLE_DRAIN = "RingSet.drain of {} rings with no new record, per ring"

# One Python producer process: waits for the common start time (CLOCK_MONOTONIC is
# system-wide), records, prints its wall time in ns.
_PY_PRODUCER = """
import sys, time
from dqoes_cg.probe import Probe
probe = Probe.open(sys.argv[1])
calls, start_at = int(sys.argv[2]), float(sys.argv[3])
time.sleep(max(0.0, start_at - time.monotonic()))
start = time.perf_counter_ns()
for _ in range(calls):
    probe.record(0.001)
print(time.perf_counter_ns() - start)
"""


def _row(name: str, samples_ns: list[float], floor: Row | None = None) -> Row:
    return Row.of(PART, name, summarize([ns * 1e-9 for ns in samples_ns]), where=HOST,
                  per="record", role="ours" if floor else "floor",
                  versus=floor.case if floor else None)


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


def _c_rows(exe: Path, ring: Path, repeats: int, records: int) -> list[Row]:
    clock, syscall, one = [], [], []
    concurrent: dict[int, list[float]] = {t: [] for t in CONCURRENT_THREADS}
    for _ in range(repeats):
        r = _produce(exe, ring, 1, records)
        clock.append(r["clock_ns"] / records)
        syscall.append(r["syscall_ns"] / records)
        one.append(r["wall_ns"] / records)
        # Threads on one ring: wall time per record written, all threads together.
        for threads, samples in concurrent.items():
            samples.append(_produce(exe, ring, threads, records)["wall_ns"]
                           / (threads * records))
    base = _row("C clock_gettime(CLOCK_MONOTONIC) (floor)", clock)
    return [base, _row(SYSCALL, syscall), _row("C dqoes_probe_record", one, base),
            *(_row(f"C dqoes_probe_record, {threads} threads, per record", samples, base)
              for threads, samples in concurrent.items())]


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def _python_rows(ring: Path, repeats: int, calls: int) -> list[Row]:
    attached, absent = Probe.open(ring), Probe.open(ring.parent / "absent")
    measure = attached.measure

    def record() -> None:
        attached.record(0.001)

    def record_no_ring() -> None:
        absent.record(0.001)

    def timed_block() -> None:
        with measure():
            pass

    cases = [("Python call of a C function (floor)", lib.dq_probe_now_ns),
             ("Python Probe.record", record), ("Python Probe.record, no ring", record_no_ring),
             ("Python `with probe.measure()`", timed_block)]
    samples: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(repeats):
        for name, fn in cases:
            samples[name].append(_per_call(fn, calls))
    attached.close()
    absent.close()
    concurrent = [_python_concurrent(ring, calls) for _ in range(repeats)]
    base = _row(cases[0][0], samples[cases[0][0]])
    return [base, *(_row(name, samples[name], base) for name, _ in cases[1:]),
            _row(f"Python Probe.record, {PYTHON_PROCESSES} processes, per record", concurrent,
                 base)]


def _python_concurrent(ring: Path, calls: int) -> float:
    """Wall time per record written by PYTHON_PROCESSES processes recording at once."""
    start_at = time.monotonic() + 1.5  # after every interpreter has started
    producers = [subprocess.Popen([sys.executable, "-c", _PY_PRODUCER, str(ring), str(calls),
                                   str(start_at)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
                 for _ in range(PYTHON_PROCESSES)]
    walls = [int(p.communicate()[0]) for p in producers]
    if any(p.returncode for p in producers):
        raise RuntimeError("a Python producer failed")
    return max(walls) / (PYTHON_PROCESSES * calls)


def _drain_rows(exe: Path, ring: Path, repeats: int, records: int) -> list[Row]:
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
    base = _row("copy of 32 bytes per record in memory (floor)", copy)
    return [base, _row("RingSet.drain, per record", drain, base)]


def read_syscalls() -> int:
    """read(2)-family system calls this process made so far (syscr of /proc/self/io)."""
    with open("/proc/self/io", "rb", buffering=0) as f:
        return int(f.read().split(b"syscr:")[1].split()[0])


def reads_per_call(fn: Callable[[], object], calls: int = 100) -> float:
    """read(2)-family system calls per call of fn, less those of reading /proc/self/io."""
    first = read_syscalls()
    overhead = read_syscalls() - first
    start = read_syscalls()
    for _ in range(calls):
        fn()
    return (read_syscalls() - start - overhead) / calls


def _idle_drain_row(workdir: Path, repeats: int, rings: int, syscall: Row) -> Row:
    """What a tick pays per ring with nothing new in it (reading its counter), and how many
    read system calls a drain of them all makes (one: the inotify instance)."""
    paths = [workdir / "idle" / f"c{i:05d}" / "ring" for i in range(rings)]
    for path in paths:
        create_ring(path, SMALL_CAPACITY)
    samples = []
    with RingSet(paths, SMALL_CAPACITY) as idle:
        idle.drain()
        for _ in range(repeats):
            start = time.perf_counter_ns()
            idle.drain()
            samples.append((time.perf_counter_ns() - start) / rings)
        reads = reads_per_call(idle.drain)
    return Row.of(PART, IDLE_DRAIN.format(rings), summarize([ns * 1e-9 for ns in samples]),
                  where=HOST, per="ring", versus=syscall.case,
                  note=f"{reads:g} read system calls per drain of all {rings}")


def run(quick: bool) -> list[Row]:
    repeats, records = (3, 20_000) if quick else (15, 2_000_000)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        workdir = Path(tmp)
        exe = _compile_producer(workdir)
        ring = workdir / "ring"
        create_ring(ring, 1 << 16)
        rows = _c_rows(exe, ring, repeats, records)
        syscall = next(r for r in rows if r.case == SYSCALL)
        rows += _python_rows(ring, repeats, records // 4)
        drained = workdir / "drained"
        create_ring(drained, DRAIN_CAPACITY)
        rows += _drain_rows(exe, drained, repeats, min(records, DRAIN_CAPACITY))
        rows.append(_idle_drain_row(workdir, repeats, 10 if quick else IDLE_RINGS, syscall))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench.ring_bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer and shorter repeats")
    args = p.parse_args()
    print(f"ring benchmarks on this host ({platform.node()}, {platform.machine()}, "
          f"Linux {platform.release()}), rings on tmpfs")
    print(format_table(run(args.quick)))


if __name__ == "__main__":
    main()
