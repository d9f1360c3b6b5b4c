"""The pure-Python producer (probe/dqoes_probe.py, the dqoes-probe distribution): its records
as the daemon's reader (dqoes_cg.ring) reads them, its refusals, and what it imports."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dqoes_probe
import numpy as np
import pytest
from dqoes_probe import Probe

from dqoes_cg.ring import RECORD_DTYPE, RingSet, Status, create_ring, ring_path

ROOT = Path(__file__).resolve().parent.parent
C_HEADER = ROOT / "csrc" / "dqoes_probe.h"


@pytest.fixture
def rings(tmp_path: Path) -> Iterator[RingSet]:
    """The daemon's reader on a ring of 64 slots, which it creates (at rings.paths[0])."""
    with RingSet([ring_path(tmp_path, "web")], 64) as rings:
        yield rings


def latencies(rings: RingSet) -> list[int]:
    records = np.zeros(1 << 16, RECORD_DTYPE)
    return records[:rings.drain(records=records)]["latency_ns"].tolist()


def _wait(condition: object, what: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize(("name", "value"), [
    ("DQOES_RING_MAGIC", "MAGIC"), ("DQOES_RING_VERSION", "VERSION"),
    ("DQOES_RING_HEADER_SIZE", "HEADER_SIZE"), ("DQOES_RING_SLOT_SIZE", "SLOT_SIZE"),
    ("DQOES_RING_MIN_CAPACITY", "MIN_CAPACITY"), ("DQOES_RING_MAX_CAPACITY", "MAX_CAPACITY"),
    ("DQOES_RING_MAX_LATENCY_NS", "MAX_LATENCY_NS"), ("DQOES_PROBE_RECHECK_NS", "RECHECK_NS"),
    ("DQOES_RING_DEFAULT_PATH", "DEFAULT_PATH"), ("DQOES_RING_ENV", "ENV_VAR"),
])
def test_the_format_is_the_c_headers(name: str, value: str) -> None:
    match = re.search(rf"#define {name}\s+(\([^)]*\)|\S+)", C_HEADER.read_text())
    assert match, name
    literal = match[1].strip('"')
    if (shift := re.fullmatch(r"\((\d+)u << (\d+)\)", literal)):
        literal = str(int(shift[1]) << int(shift[2]))
    expected = getattr(dqoes_probe, value)
    assert (literal if isinstance(expected, str) else
            int(literal.removesuffix("ULL").removesuffix("u"), 0)) == expected


def test_records_reach_the_reader_with_exact_values(rings: RingSet) -> None:
    ring = rings.paths[0]
    with Probe.open(ring) as probe:
        assert probe.attached
        probe.record(0.25)
        probe.record_ns(1234)
        with probe.measure():
            pass

        @probe.measure()
        def handle() -> None:
            pass

        @probe.measure()
        async def handle_async() -> None:
            await asyncio.sleep(0)

        handle()
        asyncio.run(handle_async())
        for value in (2.5, -1e-300, 0.0):
            probe.progress(value)
    got = latencies(rings)
    assert got[:2] == [250_000_000, 1234] and len(got) == 5 and all(ns > 0 for ns in got)
    window = rings.take_window()
    assert (window.count[0], window.progress[0]) == (5, 3)
    assert (window.first_value[0], window.last_value[0]) == (2.5, 0.0)
    assert (rings.invalid[0], rings.torn[0], rings.producer_dropped[0]) == (0, 0, 0)


def test_bad_values_are_dropped_and_counted(rings: RingSet) -> None:
    ring = rings.paths[0]
    with Probe.open(ring) as probe:
        for bad in (-1.0, 0.0, math.nan, math.inf, 3601.0):
            probe.record(bad)
        probe.record_ns(-5)
        probe.record_ns(3600 * 10**9 + 1)
        probe.progress(math.nan)
        probe.progress(-math.inf)
    assert rings.drain() == 0
    assert rings.producer_dropped[0] == 9 and rings.invalid[0] == 0


def test_an_overrun_keeps_the_newest_lap(rings: RingSet) -> None:
    ring = rings.paths[0]
    with Probe.open(ring) as probe:
        for ns in range(1, 201):
            probe.record_ns(ns * 1000)
    assert latencies(rings) == [ns * 1000 for ns in range(137, 201)]
    assert (rings.records[0], rings.lost_overrun[0]) == (64, 136)


def _record_many(probe: Probe, first: int, n: int) -> None:
    threads = [threading.Thread(target=lambda t=t: [probe.record_ns(first + t * n + i + 1)
                                                     for i in range(n)]) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_forked_workers_and_threads_lose_nothing(tmp_path: Path) -> None:
    """Four processes forked after the open, two threads each, all at once: every record
    arrives once (Python has no atomic add: the lock makes the claims whole)."""
    path = ring_path(tmp_path, "workers")
    create_ring(path, 1 << 16)
    n = 2000
    with RingSet([path], 1 << 16) as rings, Probe.open(path) as probe:
        context = multiprocessing.get_context("fork")
        workers = [context.Process(target=_record_many, args=(probe, w * 2 * n, n))
                   for w in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
            assert w.exitcode == 0
        assert sorted(latencies(rings)) == list(range(1, 8 * n + 1))
        assert (rings.torn[0], rings.lost_overrun[0], rings.invalid[0]) == (0, 0, 0)


def test_two_probes_on_one_ring_in_one_process_lose_nothing(tmp_path: Path) -> None:
    """Record locks are the process's, not a thread's: the probes share one thread lock.
    (Threads switch every microsecond here, to meet between a claim's read and write.)"""
    path = ring_path(tmp_path, "two")
    create_ring(path, 1 << 16)
    n = 2000
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with RingSet([path], 1 << 16) as rings, Probe.open(path) as first, \
                Probe.open(path) as second:
            threads = [threading.Thread(target=_record_many, args=(probe, k * 2 * n, n))
                       for k, probe in enumerate((first, second))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(latencies(rings)) == list(range(1, 4 * n + 1))
            assert (rings.torn[0], rings.lost_overrun[0]) == (0, 0)
    finally:
        sys.setswitchinterval(interval)


def test_without_a_ring_it_records_nothing_and_says_so_once(
        tmp_path: Path, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dqoes_probe.QUIET_ENV_VAR, raising=False)
    probe = Probe.open(tmp_path / "absent")
    for _ in range(3):
        probe.record(0.01)
        probe.progress(1.0)
    assert not probe.attached
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and f"no ring at {tmp_path / 'absent'}" in err
    Probe.open(tmp_path / "absent", quiet=True).record(0.01)
    monkeypatch.setenv(dqoes_probe.QUIET_ENV_VAR, "1")
    Probe.open(tmp_path / "absent").record(0.01)
    assert capfd.readouterr().err == ""


def _not_a_ring(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
        return
    if kind == "directory":
        path.mkdir()
        return
    create_ring(path, 64)
    data = bytearray(path.read_bytes())
    if kind == "bad magic":
        data[0] ^= 0xFF
    elif kind == "version 2":
        data[8] = 2
    elif kind == "capacity not a power of two":
        struct.pack_into("=Q", data, 24, 48)
    elif kind == "capacity beyond the file":
        struct.pack_into("=Q", data, 24, 128)
    elif kind == "short":
        data = data[:200]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["fifo", "directory", "bad magic", "version 2",
                                  "capacity not a power of two", "capacity beyond the file",
                                  "short"])
def test_it_refuses_what_is_not_a_ring_and_writes_nothing(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ring"
    _not_a_ring(path, kind)
    before = path.read_bytes() if path.is_file() else None
    with Probe.open(path, quiet=True) as probe:
        assert not probe.attached
        probe.record(0.01)
        probe.progress(1.0)
    assert (path.read_bytes() if path.is_file() else None) == before


def test_a_header_scribbled_after_the_open_changes_nothing_it_writes(rings: RingSet) -> None:
    """The producer keeps its own copy of the capacity: a container that writes a huge one
    into the mapped header does not send records out of the mapping; the reader reports
    the header and re-creates the ring."""
    ring = rings.paths[0]
    with Probe.open(ring) as probe:
        with open(ring, "r+b") as f:
            f.seek(24)
            f.write(struct.pack("=Q", 1 << 24))
        for ns in range(1, 200):
            probe.record_ns(ns)
        rings.drain()
        assert rings.last_fault[0] == Status.BAD_HEADER


def test_it_attaches_to_a_ring_that_appears_or_is_recreated(tmp_path: Path) -> None:
    path = ring_path(tmp_path, "late")
    with Probe.open(path, quiet=True) as probe:
        create_ring(path, 64)

        def attached() -> bool:
            probe.record_ns(1)
            return probe.attached

        _wait(attached, "the probe never attached (it looks once a second)")
        with RingSet([path], 64) as rings:
            probe.record_ns(3)
            assert latencies(rings) == [3]
            create_ring(path, 64)  # the daemon re-creates a broken ring

            def moved() -> bool:
                rings.drain()
                probe.record_ns(7)
                return latencies(rings) == [7]

            _wait(moved, "the probe never moved to the re-created ring")
            assert rings.last_fault[0] == Status.REPLACED


def test_it_imports_only_the_standard_library() -> None:
    script = ("import sys, dqoes_probe\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "{'numpy', 'cffi', 'dqoes_cg'}))")
    run = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT / "probe")}, timeout=60, check=True)
    assert run.stdout.strip() == "[]"
