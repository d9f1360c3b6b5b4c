"""A container can do anything to its ring: scribble over it, truncate or grow it, swap it
for a symlink, a FIFO, a directory or another file, move its counter anywhere. The reader
survives, reports, recovers, and the other containers' measurements never change."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dqoes_cg._native import lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqoes_cg.probe import Probe
from dqoes_cg.ring import (
    JUNK_DIR,
    RECORD_DTYPE,
    SWEEP_BUDGET,
    RingSet,
    Status,
    create_ring,
    ring_path,
)
from tests.ringfile import HEADER, SLOT, RawWriter

CAPACITY = 64
SIZE = HEADER + CAPACITY * SLOT
MAX_LATENCY_NS = 3600 * 10**9
TICK_NS = 10**9
ROOT = Path(__file__).resolve().parent.parent
TMPFS = "/dev/shm" if os.path.isdir("/dev/shm") else None  # where rings live: /run is tmpfs


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
        assert self.rings._counters[:, 1].tolist() == [self.sent, 0, 0, 0, 0, 0, 0]
        assert set(self.rings.status.tolist()) <= set(Status)
        grown = self.rings._counters.astype(np.int64) - self.counters.astype(np.int64)
        grown[lib.DQ_RING_PRODUCER_DROPPED] = 0  # the header's counter, as read
        assert (grown >= 0).all()
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
        some = w.progress > 0
        assert np.isfinite(w.first_value[some]).all() and np.isfinite(w.last_value[some]).all()
        assert (w.first_ns[some] <= w.last_ns[some]).all()
        assert np.isnan(w.first_value[~some]).all() and (w.last_ns[~some] == 0).all()

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
    with tempfile.TemporaryDirectory(dir=TMPFS) as tmp:
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
    st.tuples(st.just("progress"), st.lists(st.floats(), max_size=20)),
    st.tuples(st.just("kind"), st.integers(0, 15), st.integers(-2 * 10**9, 3 * 10**9),
              st.integers(0, 2**64 - 1)),
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
    elif kind == "progress":
        with Probe.open(path) as probe:
            for value in op[1]:
                probe.progress(value)
    elif kind == "kind" and regular and os.path.getsize(path) >= HEADER:
        # A well-formed slot of any kind, time (around the reader's clock) and payload.
        raw = RawWriter(path, CAPACITY)
        at = max(host.now_ns + TICK_NS + op[2], 0)
        raw.publish(raw.claim(), op[3], end_ns=op[1] << 60 | at)
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


def test_a_ring_with_holes_is_reported_and_recovered(host: Host) -> None:
    """A file of a ring's size whose pages are not allocated (a hole, which a full
    filesystem could fail to back when a producer first touches it) is refused, as a
    truncated ring is."""
    host.tick()
    sparse = host.hostile.with_name("sparse")
    with open(sparse, "wb") as f:
        f.truncate(SIZE)
    assert os.stat(sparse).st_blocks * 512 < SIZE
    os.rename(sparse, host.hostile)
    host.tick()
    assert host.rings.last_fault[0] == Status.BAD_SIZE
    assert os.stat(host.hostile).st_blocks * 512 >= SIZE  # made again, fully allocated
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


# ---- what a container plants at its ring path ---------------------------------------------

def plant_deep_tree(path: Path, depth: int) -> None:
    """A directory `depth` levels deep at path, built through directory descriptors (its
    full path is longer than PATH_MAX), with a symlink out and a FIFO at the bottom."""
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.symlink("/", "root", dir_fd=fd)
    os.mkfifo("fifo", dir_fd=fd)
    os.close(fd)


def plant_many_files(path: Path, count: int, victim: Path) -> None:
    """A directory of count files at path, with a symlink to a directory outside, a
    symlink to a file outside and a FIFO."""
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    for k in range(count):
        os.close(os.open(f"f{k}", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.symlink(victim, "dir-out", dir_fd=fd)
    os.symlink(victim / "precious", "file-out", dir_fd=fd)
    os.mkfifo("fifo", dir_fd=fd)
    os.close(fd)


def entries(path: Path) -> int:
    """Entries under path (not following symlinks), counted without recursion."""
    count, stack = 0, [os.open(path, os.O_RDONLY | os.O_DIRECTORY)]
    while stack:
        fd = stack.pop()
        for entry in os.scandir(fd):
            count += 1
            if entry.is_dir(follow_symlinks=False):
                stack.append(os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                     dir_fd=fd))
        os.close(fd)
    return count


@pytest.fixture
def tmpfs() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir=TMPFS) as tmp:
        yield Path(tmp)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A directory outside every ring's, which nothing may touch."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"precious")
    return outside


def drain_until_swept(rings: RingSet, junk: Path, checked: int = 3) -> int:
    """Drains until the junk is gone, checking over the first `checked` drains that none
    removes more than SWEEP_BUDGET entries of it; returns the number of drains."""
    left = entries(junk)
    for drains in range(1, left + 2):
        rings.drain()
        if not junk.exists():
            return drains
        if drains <= checked:
            now = entries(junk)
            assert left - now <= SWEEP_BUDGET  # bounded work per drain
            left = now
    raise AssertionError(f"{junk} is still there after {left + 1} drains")


def test_a_deep_tree_at_the_ring_path_is_set_aside_then_removed_bit_by_bit(
        host: Host, victim: Path) -> None:
    """1,500 levels: re-creating the ring is one rename (no recursion), and each drain
    removes a bounded part of the tree, however deep, without following its symlink."""
    host.tick()
    _remove(host.hostile)
    plant_deep_tree(host.hostile, 1500)
    host.tick()  # re-creates the ring: the tree is set aside, a first part removed
    assert host.rings.last_fault[0] == Status.NOT_REGULAR
    assert host.hostile.is_file() and os.path.getsize(host.hostile) == SIZE
    junk = host.hostile.parent / JUNK_DIR
    assert 1503 - SWEEP_BUDGET <= entries(junk) < 1503
    assert drain_until_swept(host.rings, junk) > 1
    assert sorted(p.name for p in host.hostile.parent.iterdir()) == ["ring"]
    assert (victim / "precious").read_bytes() == b"precious"
    host.recovers()


def test_a_directory_of_100000_files_at_the_ring_path_costs_a_bounded_amount_per_drain(
        host: Host, victim: Path) -> None:
    host.tick()
    _remove(host.hostile)
    plant_many_files(host.hostile, 100_000, victim)
    host.tick()
    assert host.hostile.is_file() and host.rings.status[0] == Status.OK
    junk = host.hostile.parent / JUNK_DIR
    assert 100_004 - SWEEP_BUDGET <= entries(junk) < 100_004
    drain_until_swept(host.rings, junk)
    assert sorted(victim.iterdir()) == [victim / "precious"]
    assert (victim / "precious").read_bytes() == b"precious"
    host.recovers()


@pytest.mark.parametrize("depth", [1500, 5000])
def test_the_daemon_starts_over_a_deep_tree_at_a_ring_path(tmpfs: Path, depth: int) -> None:
    """What dqoesd does at start-up: create_ring where no valid ring is, then a ring set
    over the paths; neither recurses into the tree."""
    path = ring_path(tmpfs, "planted")
    path.parent.mkdir(parents=True)
    plant_deep_tree(path, depth)
    create_ring(path, CAPACITY)
    assert path.is_file()
    _remove(path)
    plant_deep_tree(path, depth)
    with RingSet([path], CAPACITY) as rings:
        assert rings.status[0] == Status.OK
        with Probe.open(path) as probe:
            probe.record_ns(42)
        assert rings.drain() == 1
        drain_until_swept(rings, path.parent / JUNK_DIR)


@pytest.mark.parametrize("planted", ["symlink to a directory", "file", "fifo"])
def test_a_junk_name_planted_in_advance_leads_nowhere(host: Host, victim: Path,
                                                      planted: str) -> None:
    """Something else than a directory where the junk goes is replaced, never followed."""
    host.tick()
    junk = host.hostile.parent / JUNK_DIR
    if planted == "symlink to a directory":
        junk.symlink_to(victim)
    elif planted == "file":
        junk.write_bytes(b"x")
    else:
        os.mkfifo(junk)
    _remove(host.hostile)
    plant_deep_tree(host.hostile, 300)  # more than one drain removes
    host.tick()
    assert host.hostile.is_file() and junk.is_dir() and not junk.is_symlink()
    drain_until_swept(host.rings, junk)
    assert sorted(victim.iterdir()) == [victim / "precious"]
    host.recovers()


def test_no_exception_from_one_ring_leaves_the_drain(host: Host,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever re-creating a ring raises, the drain goes on: that ring stays faulted and
    is tried again at the next interval."""
    def broken(path: Path, capacity: int) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    host.tick()
    monkeypatch.setattr("dqoes_cg.ring.create_ring", broken)
    _remove(host.hostile)
    host.tick()
    host.tick()
    assert host.rings.status[0] == Status.MISSING
    monkeypatch.undo()
    host.recovers()


# ---- a container that fills the rings' filesystem -----------------------------------------

# In a mount namespace of its own, on a 1 MiB tmpfs: two containers' rings; container b
# fills the filesystem; then container a's producer writes every slot of its ring.
_FULL_FILESYSTEM = """
import errno, os, subprocess, sys
from pathlib import Path
from dqoes_cg.probe import Probe
from dqoes_cg.ring import create_ring
root, capacity = Path(sys.argv[1]), int(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "rings", str(root)], check=True)
a, b = root / "a" / "ring", root / "b" / "ring"
create_ring(a, capacity)
create_ring(b, capacity)
fd = os.open(root / "b" / "filler", os.O_WRONLY | os.O_CREAT)
try:
    while os.write(fd, bytes(65536)):
        pass
except OSError as e:
    assert e.errno == errno.ENOSPC
probe = Probe.open(a)
assert probe.attached
for k in range(capacity):
    probe.record_ns(k + 1)
print("recorded", capacity)
"""


def test_a_full_filesystem_cannot_fault_a_neighbours_producer(tmp_path: Path) -> None:
    """Rings are fully allocated when made: a producer never touches a page that the
    filesystem would have to find room for."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to make a mount namespace")
    command = [unshare, "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        command.insert(1, "--map-root-user")
    capacity = 1 << 13  # 256 KiB: two rings take half of the filesystem
    result = subprocess.run([*command, sys.executable, "-c", _FULL_FILESYSTEM, str(tmp_path),
                             str(capacity)], cwd=ROOT, capture_output=True, text=True)
    if "mount:" in result.stderr or "unshare:" in result.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert result.stdout.split() == ["recorded", str(capacity)]
