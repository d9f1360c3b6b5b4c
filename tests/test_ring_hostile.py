"""A container can do anything to its ring: scribble over it, truncate or grow it, swap it
for a symlink, a FIFO, a directory or another file, move its counter anywhere. The reader
survives, reports, recovers, and the other containers' measurements never change."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqoes_cg.probe import Probe
from dqoes_cg.ring import RECORD_DTYPE, RingSet, Status, create_ring, ring_path
from tests.ringfile import HEADER, SLOT, RawWriter

CAPACITY = 64
SIZE = HEADER + CAPACITY * SLOT
MAX_LATENCY_NS = 3600 * 10**9
TICK_NS = 10**9


class Host:
    """The daemon's reader of two containers' rings: `hostile` and a well-behaved
    `neighbour` whose every record must come through unchanged."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hostile = ring_path(root, "hostile")
        self.neighbour = ring_path(root, "neighbour")
        self.rings = RingSet([self.hostile, self.neighbour], CAPACITY, recreate_interval=0)
        self.neighbour_probe = Probe.open(self.neighbour)
        self.sent = 0
        self.received: list[int] = []
        self.counters = self.rings._counters.copy()
        self.now_ns = time.monotonic_ns()

    def tick(self) -> np.ndarray:
        """The neighbour records one request; a second later the host drains; invariants
        hold. Returns the hostile ring's records."""
        self.sent += 1
        self.neighbour_probe.record_ns(self.sent)
        self.now_ns += TICK_NS
        records = np.zeros(2 * CAPACITY, RECORD_DTYPE)
        records = records[:self.rings.drain(self.now_ns, records)]
        assert set(records["ring"].tolist()) <= {0, 1}
        lat = records["latency_ns"]
        assert ((lat > 0) & (lat <= MAX_LATENCY_NS)).all()
        self.received += records[records["ring"] == 1]["latency_ns"].tolist()
        assert self.received == list(range(1, self.sent + 1))
        assert self.rings.status[1] == Status.OK
        assert self.rings._counters[:, 1].tolist() == [self.sent, 0, 0, 0, 0, 0]
        assert set(self.rings.status.tolist()) <= set(Status)
        grown = self.rings._counters.astype(np.int64) - self.counters.astype(np.int64)
        assert (grown[:-1] >= 0).all()  # all but the header's dropped counter only grow
        self.counters = self.rings._counters.copy()
        return records[records["ring"] == 0]

    def check_window(self) -> None:
        w = self.rings.take_window(self.now_ns)
        assert (w.count >= 0).all()
        for i in np.flatnonzero(w.count):
            stats = [w.p50[i], w.p90[i], w.p95[i], w.p99[i], w.max[i]]
            assert np.isfinite(stats).all() and np.isfinite(w.mean[i])
            assert stats[0] > 0 and stats == sorted(stats) and stats[-1] <= 3600
            assert 0 < w.mean[i] <= w.max[i]
        assert np.isnan(w.p50[w.count == 0]).all()

    def recovers(self) -> None:
        """Once the container behaves again, its records come through exactly."""
        self.tick()  # re-creates a broken ring
        with Probe.open(self.hostile) as probe:
            assert probe.attached
            probe.record_ns(5)  # may be skipped if the counter was left anywhere odd
            self.tick()
            for ns in (11, 22, 33):
                probe.record_ns(ns)
            assert self.tick()["latency_ns"].tolist() == [11, 22, 33]
        assert self.rings.status[0] == Status.OK

    def close(self) -> None:
        self.neighbour_probe.close()
        self.rings.close()


@pytest.fixture
def host() -> Iterator[Host]:
    with tempfile.TemporaryDirectory() as tmp:
        h = Host(Path(tmp))
        yield h
        h.close()


# ---- what a container can do to its ring ------------------------------------------------

def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _pwrite(path: Path, data: bytes, at: int) -> None:
    """Writes as a container process would: through whatever the path is."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:  # a directory, a FIFO without reader, nothing
        assert e.errno in (errno.EISDIR, errno.ENXIO, errno.ENOENT)
        return
    try:
        os.pwrite(fd, data, at)
    finally:
        os.close(fd)


def plant(path: Path, kind: str) -> None:
    _remove(path)
    elsewhere = path.parent / "elsewhere"
    if kind == "symlink":
        create_ring(elsewhere, CAPACITY)
        path.symlink_to(elsewhere)
    elif kind == "dangling symlink":
        path.symlink_to("/nonexistent/ring")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        (path / "ring").mkdir(parents=True)
    elif kind == "other ring":
        create_ring(path, CAPACITY)
    elif kind == "bigger ring":
        create_ring(path, CAPACITY * 2)
    elif kind == "empty file":
        path.touch()


KINDS = ["symlink", "dangling symlink", "fifo", "directory", "other ring", "bigger ring",
         "empty file", "nothing"]

operations = st.one_of(
    st.tuples(st.just("scribble"), st.integers(0, SIZE + 64), st.binary(min_size=1,
                                                                          max_size=80)),
    st.tuples(st.just("counter"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("nudge counter"), st.integers(-2 * CAPACITY, 2 * CAPACITY)),
    st.tuples(st.just("slot"), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
              st.integers(0, 2**64 - 1)),
    st.tuples(st.just("records"), st.lists(st.integers(-5, 2 * MAX_LATENCY_NS), max_size=90)),
    st.tuples(st.just("truncate"), st.integers(0, 2 * SIZE)),
    st.tuples(st.just("swap"), st.sampled_from(KINDS)),
    st.tuples(st.just("window")),
)


def apply(host: Host, op: tuple) -> None:
    path, kind = host.hostile, op[0]
    regular = os.path.lexists(path) and stat.S_ISREG(os.lstat(path).st_mode)
    if kind == "scribble":
        _pwrite(path, op[2], op[1])
    elif kind == "counter" and regular:
        RawWriter(path, CAPACITY).set_counter(op[1])
    elif kind == "nudge counter" and regular and os.path.getsize(path) >= HEADER:
        raw = RawWriter(path, CAPACITY)
        raw.set_counter((raw.counter() + op[1]) % 2**64)
    elif kind == "slot" and regular and os.path.getsize(path) >= HEADER:
        # Well-formed (seq and check agree) but with whatever values.
        raw = RawWriter(path, CAPACITY)
        raw.publish(raw.claim(), op[2], end_ns=op[3])
    elif kind == "records":
        with Probe.open(path) as probe:  # never left mapped: a truncation would hit us
            for ns in op[1]:
                probe.record_ns(ns)
    elif kind == "truncate" and os.path.lexists(path):
        try:
            os.truncate(path, op[1])
        except OSError as e:
            assert e.errno in (errno.EISDIR, errno.EINVAL, errno.ENOENT)
    elif kind == "swap":
        plant(path, op[1])
    elif kind == "window":
        host.check_window()
    host.tick()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operations, max_size=25))
def test_the_reader_survives_any_writer(ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(Path(tmp))
        try:
            for op in ops:
                apply(host, op)
            host.check_window()
            host.recovers()
        finally:
            host.close()


# ---- each fault, reported and recovered --------------------------------------------------

@pytest.mark.parametrize("kind,fault", [
    ("symlink", Status.NOT_REGULAR), ("dangling symlink", Status.NOT_REGULAR),
    ("fifo", Status.NOT_REGULAR), ("directory", Status.NOT_REGULAR),
    ("other ring", Status.REPLACED), ("bigger ring", Status.BAD_SIZE),
    ("empty file", Status.BAD_SIZE), ("nothing", Status.MISSING)])
def test_a_swapped_ring_is_reported_and_recovered(host: Host, kind: str, fault: Status) -> None:
    """`fault` is what the reader last found at the path: a valid ring put in place of the
    old one is simply re-opened; anything else is replaced by a fresh ring."""
    host.tick()
    plant(host.hostile, kind)
    host.tick()
    assert host.rings.last_fault[0] == fault and host.rings.faults[0] == 1
    assert host.hostile.is_file() and not host.hostile.is_symlink()
    if kind == "symlink":
        assert (host.hostile.parent / "elsewhere").stat().st_size == SIZE  # not touched
    host.recovers()


@pytest.mark.parametrize("size,fault", [(0, Status.BAD_SIZE), (SIZE - 1, Status.BAD_SIZE),
                                        (SIZE + 4096, Status.BAD_SIZE)])
def test_a_truncated_or_grown_ring_is_reported_and_recovered(host: Host, size: int,
                                                              fault: Status) -> None:
    os.truncate(host.hostile, size)
    host.tick()
    assert host.rings.last_fault[0] == fault
    assert os.path.getsize(host.hostile) == SIZE
    host.recovers()


@pytest.mark.parametrize("offset", [0, 8, 12, 16, 24])
def test_a_scribbled_header_is_reported_and_recovered(host: Host, offset: int) -> None:
    _pwrite(host.hostile, b"\xff\xff\xff\x7f", offset)
    host.tick()
    assert host.rings.last_fault[0] == Status.BAD_HEADER
    host.recovers()


def test_a_ring_that_stops_being_written_is_simply_quiet(host: Host) -> None:
    with Probe.open(host.hostile) as probe:
        probe.record_ns(1000)
    host.tick()
    for _ in range(3):
        assert len(host.tick()) == 0
    assert host.rings.status[0] == Status.OK and host.rings.faults[0] == 0
    assert host.rings.take_window().count.tolist() == [1, 3 + 1]
