"""Progress records: a training job reports its evaluation value through the probe (Python
and C), and the reader gives per ring and window their number, the earliest and the latest
value with their times; values and kinds that make no sense are counted invalid."""

from __future__ import annotations

import math
import shutil
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from dqoes_cg.probe import Probe
from dqoes_cg.ring import RECORD_DTYPE, RingSet, ring_path
from tests.ringfile import HEADER, SLOT, RawWriter, check

ROOT = Path(__file__).resolve().parent.parent
CAPACITY = 64
KIND_SHIFT = 60
PROGRESS = 8 << KIND_SHIFT


def bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    return ring_path(tmp_path, "train")


def test_python_progress_values_reach_the_window(ring: Path) -> None:
    with RingSet([ring, None], CAPACITY) as rings, Probe.open(ring) as probe:
        before = time.monotonic_ns()
        for loss in (2.5, 1.25, 0.75):
            probe.progress(loss)
        probe.record(0.010)  # a latency beside them
        after = time.monotonic_ns()
        records = np.zeros(8, RECORD_DTYPE)
        assert rings.drain(records=records) == 1  # latency records; progress counted apart
        assert records[0]["latency_ns"] == 10_000_000
        assert (rings.records.tolist(), rings.progress.tolist()) == ([1, 0], [3, 0])
        w = rings.take_window()
        assert w.count.tolist() == [1, 0] and w.max[0] == 0.010
        assert w.progress.tolist() == [3, 0]
        assert (w.first_value[0], w.last_value[0]) == (2.5, 0.75)
        assert before <= w.first_ns[0] <= w.last_ns[0] <= after
        assert np.isnan(w.first_value[1]) and w.first_ns[1] == 0 and w.last_ns[1] == 0
        w = rings.take_window()
        assert w.progress.tolist() == [0, 0] and np.isnan(w.last_value).all()


def test_the_window_orders_progress_by_time_not_by_slot(ring: Path) -> None:
    """Several producers publish out of order: first and last are the earliest and the
    latest evaluation."""
    with RingSet([ring], CAPACITY) as rings:
        raw, now = RawWriter(ring, CAPACITY), time.monotonic_ns()
        for at, value in ((now - 200, 3.0), (now - 300, 4.0), (now - 100, 2.0), (now - 250, 9.0)):
            raw.record(bits(value), end_ns=PROGRESS | at)
        rings.drain(now)
        w = rings.take_window(now)
        assert w.progress[0] == 4
        assert (w.first_ns[0], w.first_value[0]) == (now - 300, 4.0)
        assert (w.last_ns[0], w.last_value[0]) == (now - 100, 2.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_value_that_is_not_finite_is_dropped_by_the_producer(ring: Path, bad: float) -> None:
    with RingSet([ring], CAPACITY) as rings, Probe.open(ring) as probe:
        probe.progress(bad)
        probe.progress(-0.5)  # negative values are values (e.g. a log-likelihood)
        assert rings.drain() == 0
        assert rings.progress[0] == 1
        assert rings.producer_dropped[0] == 1 and rings.invalid[0] == 0
        assert rings.take_window().last_value[0] == -0.5


def test_nonsense_progress_records_are_invalid(ring: Path) -> None:
    """Published and well-formed, but: not a finite value, a time ahead of the reader's
    clock, or a kind nobody defined. Each is counted invalid and nothing else changes."""
    with RingSet([ring], CAPACITY) as rings:
        raw, now = RawWriter(ring, CAPACITY), time.monotonic_ns()
        for payload in (bits(math.nan), bits(math.inf), bits(-math.inf), 0x7FF0000000000001):
            raw.record(payload, end_ns=PROGRESS | now)
        raw.record(bits(1.0), end_ns=PROGRESS | (now + 10 * 10**9))  # 10 s ahead
        for kind in (*range(1, 8), *range(9, 16)):
            raw.record(bits(1.0), end_ns=kind << KIND_SHIFT | now)
            raw.record(1000, end_ns=kind << KIND_SHIFT | now)
        raw.record(bits(0.5), end_ns=PROGRESS | now)
        raw.record(2000, end_ns=now)
        assert rings.drain(now) == 1
        assert rings.invalid[0] == 5 + 2 * 14
        assert (rings.records[0], rings.progress[0], rings.faults[0]) == (1, 1, 0)
        w = rings.take_window(now)
        assert (w.count[0], w.max[0], w.progress[0], w.last_value[0]) == (1, 2e-6, 1, 0.5)


def test_a_progress_record_is_invalid_to_readers_that_predate_it(ring: Path) -> None:
    """What a version-1 reader without progress records sees (docs/ring-format.md): a slot
    published as its format says (seq, check), whose end time is more than 1 s ahead of
    any clock, so it counts it invalid and reads on; its latencies are untouched."""
    with RingSet([ring], CAPACITY), Probe.open(ring) as probe:
        probe.progress(0.25)
    seq, end, payload, word = struct.unpack("<4Q", ring.read_bytes()[HEADER:HEADER + SLOT])
    assert seq == 1 and word == check(seq, end, payload)
    assert end >= 1 << 63  # 292 years of uptime
    assert payload == bits(0.25)


def test_progress_survives_a_rebuilt_set(tmp_path: Path) -> None:
    a, b = ring_path(tmp_path, "a"), ring_path(tmp_path, "b")
    first = RingSet([a], CAPACITY)
    with Probe.open(a) as probe:
        probe.progress(1.0)
        first.drain()
        second = RingSet([b, a], CAPACITY, adopt=first)
        probe.progress(0.5)
    second.drain()
    w = second.take_window()
    assert w.progress.tolist() == [0, 2] and (w.first_value[1], w.last_value[1]) == (1.0, 0.5)
    assert second.progress.tolist() == [0, 2]
    second.close()


_C_TRAINER = """
#include "dqoes_probe.h"
#include <math.h>
int main(void) {
    struct dqoes_probe *p = dqoes_probe_open(NULL);
    uint64_t now = dqoes_probe_now_ns();
    if (!dqoes_probe_attached(p))
        return 1;
    dqoes_probe_progress(p, 0.9);
    dqoes_probe_progress_at(p, now - 1000, 1.5);
    dqoes_probe_progress(p, NAN);
    dqoes_probe_progress(p, INFINITY);
    dqoes_probe_record(p, 1234);
    dqoes_probe_progress(p, 0.7);
    dqoes_probe_close(p);
    return 0;
}
"""


def test_c_progress_records_reach_the_reader(ring: Path, tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    src, exe = tmp_path / "trainer.c", tmp_path / "trainer"
    src.write_text(_C_TRAINER)
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                    f"-I{ROOT / 'csrc'}", str(src), "-o", str(exe)], check=True)
    with RingSet([ring], CAPACITY) as rings:
        subprocess.run([str(exe)], env={"DQOES_RING": str(ring)}, check=True)
        assert rings.drain() == 1
        w = rings.take_window()
        assert (w.progress[0], w.first_value[0], w.last_value[0]) == (3, 1.5, 0.7)
        assert w.last_ns[0] - w.first_ns[0] >= 1000
        assert (w.count[0], w.max[0], rings.producer_dropped[0]) == (1, 1234e-9, 2)
