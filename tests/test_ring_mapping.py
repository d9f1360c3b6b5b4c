"""The reader maps each ring read-only: a container that truncates its ring under the
mapping, in the moment between the reader's check and its read (or with the event lost),
makes the read fault (SIGBUS). That is a fault of that ring alone; a SIGBUS anywhere else
still crashes the process as it would have without the reader, with Python's faulthandler
report where faulthandler is on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dqoes_cg.probe import Probe
from dqoes_cg.ring import RECORD_DTYPE, RingSet, Status, ring_path
from tests.ringfile import HEADER, SLOT

ROOT = Path(__file__).resolve().parent.parent
CAPACITY = 1024  # nine pages: a truncation can keep the header's page and drop the slots'
PAGE = 4096


def lose_events() -> None:
    """Reads away what this process's inotify instances hold: the reader is not told."""
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify":
                while os.read(int(name), 65536):
                    pass


@pytest.mark.parametrize("size", [0, PAGE, 2 * PAGE])
@pytest.mark.parametrize("hostile_first", [True, False])
def test_a_ring_truncated_under_the_mapping_is_a_fault_of_that_ring(
        tmp_path: Path, size: int, hostile_first: bool) -> None:
    hostile, neighbour = ring_path(tmp_path, "hostile"), ring_path(tmp_path, "neighbour")
    paths = [hostile, neighbour] if hostile_first else [neighbour, hostile]
    h, n = paths.index(hostile), paths.index(neighbour)
    with RingSet(paths, CAPACITY, recreate_interval=0) as rings:
        rings.drain()
        with Probe.open(hostile) as bad, Probe.open(neighbour) as good:
            for k in range(1, 301):  # slots on the first three pages
                bad.record_ns(k)
                good.record_ns(k)
        os.truncate(hostile, size)
        lose_events()
        records = np.zeros(1000, RECORD_DTYPE)
        got = records[:rings.drain(records=records)]
        assert got[got["ring"] == n]["latency_ns"].tolist() == list(range(1, 301))
        assert rings.last_fault[h] == Status.BAD_SIZE and rings.faults[h] == 1
        assert rings.status[n] == Status.OK and rings.faults[n] == 0
        assert rings.status[h] == Status.OK  # re-created at once
        assert os.path.getsize(hostile) == HEADER + CAPACITY * SLOT
        with Probe.open(hostile) as bad:
            bad.record_ns(7)
        assert rings.drain(records=records) == 1 and records[0]["latency_ns"] == 7


# A process that maps a ring, then faults: in a drain (a ring truncated under the mapping,
# its event lost), then elsewhere (a Python mmap read past the end of its file), in the main
# thread or another one. argv: directory, where faulthandler goes on ("before", "between":
# after the first ring set and before a second one, "never"), thread of the foreign fault.
_FAULTS = """
import faulthandler, mmap, os, sys, threading
from pathlib import Path
from dqoes_cg.probe import Probe
from dqoes_cg.ring import RingSet, Status, ring_path
from tests.test_ring_mapping import lose_events
root, when, thread = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
if when == "before":
    faulthandler.enable()
path = ring_path(root, "hostile")
rings = RingSet([path], 1024, recreate_interval=0)
if when == "between":
    faulthandler.enable()
    rings = RingSet([path], 1024, recreate_interval=0, adopt=rings)
rings.drain()
with Probe.open(path) as probe:
    for k in range(1, 301):
        probe.record_ns(k)
os.truncate(path, 0)
lose_events()
rings.drain()
assert rings.last_fault[0] == Status.BAD_SIZE and rings.status[0] == Status.OK
print("drain survived", flush=True)

def foreign_fault():
    with open(root / "victim", "w+b") as f:
        f.truncate(2 * mmap.PAGESIZE)
        m = mmap.mmap(f.fileno(), 2 * mmap.PAGESIZE)
        f.truncate(0)
        m[mmap.PAGESIZE]  # SIGBUS

if thread == "other":
    worker = threading.Thread(target=foreign_fault, name="worker")
    worker.start()
    worker.join()
else:
    foreign_fault()
print("not reached", flush=True)
"""


@pytest.mark.parametrize("faulthandler_on", ["before", "between", "never"])
@pytest.mark.parametrize("thread", ["main", "other"])
def test_a_sigbus_elsewhere_still_crashes_as_before(tmp_path: Path, faulthandler_on: str,
                                                    thread: str) -> None:
    result = subprocess.run([sys.executable, "-c", _FAULTS, str(tmp_path), faulthandler_on,
                             thread], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines() == ["drain survived"], result.stderr
    assert result.returncode == -signal.SIGBUS, result.stderr
    reports = result.stderr.count("Fatal Python error: Bus error")
    assert reports == (0 if faulthandler_on == "never" else 1), result.stderr
    if reports:
        assert "foreign_fault" in result.stderr  # the faulting thread's stack
