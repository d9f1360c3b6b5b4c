"""The daemon-side ring reader (dqoes_cg.ring) against the format and the C producer."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from dqoes_cg._native import lib

from dqoes_cg.probe import Probe
from dqoes_cg.ring import (
    RECORD_DTYPE,
    STATS,
    RingSet,
    Status,
    WindowStats,
    create_ring,
    ring_path,
)
from tests.ringfile import HEADER, SLOT, RawWriter

ROOT = Path(__file__).resolve().parent.parent
PRODUCER_SRC = ROOT / "bench" / "ring_producer.c"


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    path = ring_path(tmp_path, "web")
    create_ring(path, 64)
    return path


@pytest.fixture(scope="module")
def producer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C producer (bench/ring_producer.c), compiled for this test run."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    exe = tmp_path_factory.mktemp("producer") / "ring_producer"
    subprocess.run(["gcc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread",
                    f"-I{ROOT / 'csrc'}", str(PRODUCER_SRC), "-o", str(exe)], check=True)
    return exe


def run_producer(exe: Path, path: Path, threads: int, records: int, ident: int) -> str:
    out = subprocess.run([str(exe), str(path), str(threads), str(records), str(ident)],
                         check=True, capture_output=True, text=True).stdout
    assert "attached=1" in out, out
    return out


def captured(rings: RingSet, size: int = 1 << 16) -> np.ndarray:
    records = np.zeros(size, RECORD_DTYPE)
    n = rings.drain(records=records)
    assert n <= size
    return records[:n]


# ---- files --------------------------------------------------------------------------------

def test_create_ring_lays_out_an_empty_ring(tmp_path: Path) -> None:
    path = ring_path(tmp_path, "web")
    create_ring(path, 1024)
    st = path.stat()
    assert st.st_size == HEADER + 1024 * SLOT
    assert st.st_mode & 0o777 == 0o666
    assert path.parent.stat().st_mode & 0o777 == 0o755
    magic, version, header_size, slot_size, _, capacity = struct.unpack(
        "<QIIIIQ", path.read_bytes()[:32])
    assert magic.to_bytes(8, "little") == b"DQOESRNG"
    assert (version, header_size, slot_size, capacity) == (1, HEADER, SLOT, 1024)
    assert path.read_bytes()[32:] == bytes(len(path.read_bytes()) - 32)
    assert [p.name for p in path.parent.iterdir()] == ["ring"]


@pytest.mark.parametrize("capacity", [0, 8, 1000, 1 << 25])
def test_create_ring_refuses_a_bad_capacity(tmp_path: Path, capacity: int) -> None:
    with pytest.raises(ValueError):
        create_ring(tmp_path / "ring", capacity)
    with pytest.raises(ValueError):
        RingSet([tmp_path / "ring"], capacity)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x\0"])
def test_ring_path_takes_one_plain_component(name: str) -> None:
    with pytest.raises(ValueError):
        ring_path(Path("/run/dqoes"), name)


@pytest.mark.parametrize("planted", ["symlink", "fifo", "directory", "file"])
def test_create_ring_replaces_what_a_container_planted(tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    path = tmp_path / "rings" / "web" / "ring"
    path.parent.mkdir(parents=True)
    if planted == "symlink":
        path.symlink_to(victim)
    elif planted == "fifo":
        os.mkfifo(path)
    elif planted == "directory":
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "escape").symlink_to(victim)
    else:
        path.write_bytes(b"garbage")
    create_ring(path, 64)
    assert victim.read_bytes() == b"precious"
    assert path.is_file() and not path.is_symlink() and path.stat().st_size == HEADER + 64 * SLOT


# ---- reading ------------------------------------------------------------------------------

def test_python_records_are_read_once_with_exact_values(ring: Path) -> None:
    with RingSet([ring], 64) as rings, Probe.open(ring) as probe:
        assert probe.attached and rings.status[0] == Status.OK
        for ms in range(1, 41):
            probe.record(ms / 1000)
        got = captured(rings)
        assert got["latency_ns"].tolist() == [ms * 1_000_000 for ms in range(1, 41)]
        assert (got["ring"] == 0).all()
        assert (np.diff(got["end_ns"].astype(np.int64)) >= 0).all()
        assert len(captured(rings)) == 0
        assert rings.records[0] == 40 and rings.faults[0] == 0


def test_window_statistics_match_the_exact_ones(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    latencies = np.exp(rng.uniform(np.log(2e-6), np.log(30.0), 5000))
    paths = [ring_path(tmp_path, "a"), None, ring_path(tmp_path, "b")]
    with RingSet(paths, 1 << 13) as rings:
        probe = Probe.open(paths[0])
        for s in latencies:
            probe.record(float(s))
        probe.close()
        rings.drain()
        window = rings.take_window()
        assert isinstance(window, WindowStats) and window.seconds >= 0
        ns = np.round(latencies * 1e9)
        assert window.count.tolist() == [5000, 0, 0]
        assert window.mean[0] == pytest.approx(ns.mean() * 1e-9, rel=1e-12)
        assert window.max[0] == ns.max() * 1e-9
        for q, got in ((50, window.p50), (90, window.p90), (95, window.p95), (99, window.p99)):
            exact = np.sort(ns)[int(np.ceil(q / 100 * len(ns))) - 1] * 1e-9
            assert got[0] == pytest.approx(exact, rel=1 / 64)
        for a in (window.mean, window.p50, window.p99, window.max):
            assert np.isnan(a[1:]).all()

        first_end = window.end_ns
        again = rings.take_window()
        assert again is window  # the same arrays, refilled
        assert again.count.tolist() == [0, 0, 0] and np.isnan(again.p50).all()
        assert again.start_ns == first_end


def test_the_stats_rows_are_the_c_rows_and_the_window_fields() -> None:
    assert [getattr(lib, f"DQ_RING_{name.upper()}") for name in STATS] == list(range(6))
    assert len(STATS) == lib.DQ_RING_NSTATS
    assert [f.name for f in fields(WindowStats)][1:len(STATS) + 1] == list(STATS)
    with RingSet([None, None]) as rings:
        window = rings.take_window()
        for row, name in enumerate(STATS):
            assert np.shares_memory(getattr(window, name), rings.stats[row])


def test_percentiles_are_exact_for_tiny_latencies(ring: Path) -> None:
    with RingSet([ring], 64) as rings:
        probe = Probe.open(ring)
        for ns in (1, 2, 3, 63):
            probe.record_ns(ns)
        rings.drain()
        w = rings.take_window()
        assert (w.p50[0], w.p90[0], w.max[0]) == (2e-9, 63e-9, 63e-9)


def test_overrun_keeps_the_newest_lap_and_counts_the_rest(ring: Path) -> None:
    with RingSet([ring], 64) as rings, Probe.open(ring) as probe:
        for ns in range(1, 201):
            probe.record_ns(ns * 1000)
        got = captured(rings)
        assert got["latency_ns"].tolist() == [ns * 1000 for ns in range(137, 201)]
        assert (rings.records[0], rings.lost_overrun[0]) == (64, 136)


def test_a_claimed_slot_is_waited_for_then_given_up(ring: Path) -> None:
    raw = RawWriter(ring, 64)
    with RingSet([ring], 64) as rings:
        raw.record(1000)
        stuck = raw.claim()
        raw.record(2000)
        now = time.monotonic_ns()
        assert captured_at(rings, now)["latency_ns"].tolist() == [1000]
        # Still unpublished at the next drain, but not for long: wait.
        assert len(captured_at(rings, now + 10_000_000)) == 0
        raw.publish(stuck, 1500)
        assert captured_at(rings, now + 20_000_000)["latency_ns"].tolist() == [1500, 2000]
        assert rings.torn[0] == 0

        raw.claim()
        raw.record(3000)
        assert len(captured_at(rings, now + 30_000_000)) == 0
        got = captured_at(rings, now + 200_000_000)
        assert got["latency_ns"].tolist() == [3000]
        assert (rings.torn[0], rings.records[0]) == (1, 4)


def captured_at(rings: RingSet, now_ns: int) -> np.ndarray:
    records = np.zeros(64, RECORD_DTYPE)
    return records[:rings.drain(now_ns, records)]


def test_nonsense_values_are_dropped_and_counted(ring: Path) -> None:
    raw = RawWriter(ring, 64)
    with RingSet([ring], 64) as rings:
        now = time.monotonic_ns()
        raw.record(0)
        raw.record(3600 * 10**9 + 1)
        raw.record(5000, end_ns=now + 10 * 10**9)
        raw.record(7000, end_ns=now)
        pos = raw.claim()
        raw.publish(pos, 9000)
        raw._pwrite(struct.pack("<Q", 9001), HEADER + pos * SLOT + 16)  # torn
        assert captured_at(rings, now)["latency_ns"].tolist() == [7000]
        assert rings.invalid[0] == 3
        captured_at(rings, now + 500_000_000)
        assert rings.torn[0] == 1 and rings.faults[0] == 0


def test_producer_drops_bad_latencies_and_the_reader_reports_them(ring: Path) -> None:
    with RingSet([ring], 64) as rings, Probe.open(ring) as probe:
        for bad in (-1.0, 0.0, float("nan"), float("inf"), 3601.0):
            probe.record(bad)
        probe.record_ns(-5)
        assert rings.drain() == 0
        assert rings.producer_dropped[0] == 6 and rings.invalid[0] == 0


@pytest.mark.parametrize("jump", [-10, 10**15])
def test_a_counter_that_jumps_is_resynced(ring: Path, jump: int) -> None:
    raw = RawWriter(ring, 64)
    with RingSet([ring], 64) as rings:
        for _ in range(20):
            raw.record(1000)
        assert rings.drain() == 20
        raw.set_counter(raw.counter() + jump)
        assert rings.drain() == 0
        assert rings.status[0] == Status.RESYNCED and rings.last_fault[0] == Status.RESYNCED
        assert rings.faults[0] == 1 and rings.lost_overrun[0] == 0
        raw.record(4000)
        assert captured(rings)["latency_ns"].tolist() == [4000]
        assert rings.status[0] == Status.OK


def test_adopt_carries_positions_and_the_window(tmp_path: Path) -> None:
    a, b, c = (ring_path(tmp_path, name) for name in "abc")
    first = RingSet([a, b], 64)
    for path, ns in ((a, 1000), (b, 2000)):
        with Probe.open(path) as probe:
            probe.record_ns(ns)
    first.drain()
    with Probe.open(b) as probe:
        probe.record_ns(3000)
    second = RingSet([c, b], 64, adopt=first)
    assert second.status.tolist() == [Status.OK, Status.OK]
    assert second.records.tolist() == [0, 1]
    assert captured(second)["latency_ns"].tolist() == [3000]
    window = second.take_window()
    assert window.count.tolist() == [0, 2] and window.max[1] == 3e-6
    with pytest.raises(ValueError, match="closed"):
        first.drain()
    second.close()


def test_none_entries_are_unused(tmp_path: Path) -> None:
    with RingSet([None, None]) as rings:
        assert rings.drain() == 0
        assert rings.status.tolist() == [Status.UNUSED] * 2
        assert rings.take_window().count.tolist() == [0, 0]
    with RingSet([]) as empty:
        assert empty.drain() == 0 and len(empty.take_window().count) == 0


def test_missing_rings_are_created_and_read(tmp_path: Path) -> None:
    path = ring_path(tmp_path, "late")
    with RingSet([path], 64) as rings:
        assert path.is_file() and rings.status[0] == Status.OK
        assert rings.last_fault[0] == 0 and rings.faults[0] == 0
        with Probe.open(path) as probe:
            probe.record_ns(10)
        assert rings.drain() == 1
    with RingSet([ring_path(tmp_path, "passive")], 64, recreate=False) as passive:
        assert passive.status[0] == Status.MISSING


# ---- the C producer -----------------------------------------------------------------------

@pytest.mark.parametrize("compiler,std", [("gcc", "c11"), ("gcc", "gnu17"), ("g++", "c++11"),
                                          ("g++", "c++20")])
def test_the_c_header_compiles_cleanly(tmp_path: Path, compiler: str, std: str) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    src = tmp_path / ("main.c" if compiler == "gcc" else "main.cpp")
    src.write_text('#include "dqoes_probe.h"\n'
                   "int main(void) {\n"
                   "    struct dqoes_probe *p = dqoes_probe_open(NULL);\n"
                   "    dqoes_probe_record(p, 1000);\n"
                   "    dqoes_probe_record_end(p, dqoes_probe_now_ns(), 2000);\n"
                   "    int attached = dqoes_probe_attached(p);\n"
                   "    dqoes_probe_close(p);\n"
                   "    return attached;\n"
                   "}\n")
    subprocess.run([compiler, f"-std={std}", "-Wall", "-Wextra", "-Werror", "-pedantic",
                    f"-I{ROOT / 'csrc'}", str(src), "-o", str(tmp_path / "main")], check=True)
    env = {**os.environ, "DQOES_RING": str(tmp_path / "absent")}
    assert subprocess.run([str(tmp_path / "main")], env=env).returncode == 0


def test_c_records_reach_the_python_reader(ring: Path, producer: Path) -> None:
    with RingSet([ring], 64) as rings:
        run_producer(producer, ring, 1, 50, 0)
        assert captured(rings)["latency_ns"].tolist() == list(range(1, 51))
        run_producer(producer, ring, 2, 20, 5)
        assert sorted(captured(rings)["latency_ns"].tolist()) == list(range(201, 241))


PYTHON_PRODUCER = """
import sys, threading
from dqoes_cg._native import lib
from dqoes_cg.probe import Probe
path, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
probe = Probe.open(path)
assert probe.attached
def work(t):
    for k in range(count):
        probe.record_ns(first + t * count + k)
threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_concurrent_c_and_python_producers_lose_nothing_below_overrun(
        tmp_path: Path, producer: Path) -> None:
    """Two C processes of two threads and a Python process of two threads write at full
    speed while the reader drains: every record is read exactly once, but for those of a
    producer preempted over 100 ms between claim and publish, which the reader gives up on
    and counts as torn (docs/ring-format.md; a loaded host does that now and then)."""
    path = ring_path(tmp_path, "busy")
    c_records, py_records = 150_000, 20_000  # per thread
    with RingSet([path], 1 << 20) as rings:
        seen: list[np.ndarray] = []
        stop = threading.Event()

        def drain_loop() -> None:
            while not stop.is_set():
                seen.append(captured(rings, 1 << 20).copy())
                time.sleep(0.0005)

        reader = threading.Thread(target=drain_loop)
        reader.start()
        procs = [subprocess.Popen([str(producer), str(path), "2", str(c_records), str(ident)])
                 for ident in (0, 1)]
        procs.append(subprocess.Popen(
            [sys.executable, "-c", PYTHON_PRODUCER, str(path), str(4 * c_records + 1),
             str(py_records)], cwd=ROOT))
        codes = [p.wait() for p in procs]
        stop.set()
        reader.join()
        seen.append(captured(rings, 1 << 20))

    assert codes == [0, 0, 0]
    assert any(len(part) for part in seen[:-1])  # the reader drained while they wrote
    got = np.sort(np.concatenate(seen)["latency_ns"])
    written = np.arange(1, 4 * c_records + 2 * py_records + 1)
    assert len(np.unique(got)) == len(got) and np.isin(got, written).all()
    assert len(written) - len(got) == rings.torn[0] <= len(written) // 1000  # stalls are rare
    assert rings.lost_overrun[0] == 0 and rings.invalid[0] == 0


def test_overrunning_producers_never_make_up_records(tmp_path: Path, producer: Path) -> None:
    """A small ring lapped by four threads: what is read was written, once; the rest is
    counted lost."""
    path = ring_path(tmp_path, "small")
    with RingSet([path], 256) as rings:
        proc = subprocess.Popen([str(producer), str(path), "4", "200000", "0"],
                                stdout=subprocess.PIPE)
        parts = []
        while proc.poll() is None:
            parts.append(captured(rings, 256).copy())
        parts.append(captured(rings, 256))
        time.sleep(0.15)
        parts.append(captured(rings, 256))
        got = np.concatenate(parts)["latency_ns"]
    assert proc.returncode == 0
    assert len(np.unique(got)) == len(got)
    assert got.min() >= 1 and got.max() <= 800_000
    total = rings.records[0] + rings.lost_overrun[0] + rings.torn[0] + rings.invalid[0]
    assert total == 800_000 and rings.records[0] == len(got)
    assert rings.invalid[0] == 0 and rings.faults[0] == 0
