"""Latency rings, daemon side (sense): create each container's ring, drain all of them in
one C call per tick, and turn the window since the last `take_window` into per-container
latency statistics.

The daemon owns the rings: it creates `<run_dir>/rings/<name>/ring` with `create_ring`, and
the user bind-mounts that directory into the container at /run/dqoes, where the producers
(`dqoes_cg.probe`, `csrc/dqoes_probe.h`) find it. A ring is hostile input: the reader never
maps it, never follows a symlink there, and a ring that fails only changes its own entry's
status and counters. `RingSet` re-creates a failed ring itself, at most once per
`recreate_interval`; producers switch to the new file within a second. Format, protocol
and error bounds: docs/ring-format.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from types import TracebackType

import numpy as np

from dqoes_cg._native import ffi, lib

log = logging.getLogger(__name__)

DEFAULT_RUN_DIR = Path("/run/dqoes")
RING_FILE = "ring"
"""The ring's name in its container's directory (inside the container: /run/dqoes/ring)."""
DEFAULT_CAPACITY = 1 << 16
"""Slots per ring: 2 MiB, a second of 65,536 requests per second between two drains."""
MIN_CAPACITY = lib.DQOES_RING_MIN_CAPACITY
MAX_CAPACITY = lib.DQOES_RING_MAX_CAPACITY
RECREATE_INTERVAL = 10.0
"""Seconds between two re-creations of the same failed ring."""

STATS = ("mean", "p50", "p90", "p95", "p99", "max")
"""The rows of `RingSet.stats` (the C `DQ_RING_*` rows), which `WindowStats` names."""

RECORD_DTYPE = np.dtype(
    [("ring", "<u4"), ("reserved", "<u4"), ("end_ns", "<u8"), ("latency_ns", "<u8")])
"""One record as captured by `RingSet.drain(records=...)` (C `struct dq_ring_record`)."""


class Status(IntEnum):
    """Per-ring state after the last call (the C `DQ_RING_*` codes). From CLOSED on, the
    ring is closed until it is re-created."""

    OK = lib.DQ_RING_OK
    UNUSED = lib.DQ_RING_UNUSED
    RESYNCED = lib.DQ_RING_RESYNCED
    MISSING = lib.DQ_RING_MISSING
    NOT_REGULAR = lib.DQ_RING_NOT_REGULAR
    BAD_SIZE = lib.DQ_RING_BAD_SIZE
    BAD_HEADER = lib.DQ_RING_BAD_HEADER
    REPLACED = lib.DQ_RING_REPLACED
    IO_ERROR = lib.DQ_RING_IO_ERROR


CLOSED = lib.DQ_RING_CLOSED


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def ring_dir_name(name: str) -> str:
    """A container's ring directory: its name where that is a plain file name, else a
    readable slug made unique by a hash (paths, unit names with odd characters)."""
    if _PLAIN_NAME.fullmatch(name) and name not in (".", ".."):
        return name
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")[:40] or "container"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def ring_path(run_dir: Path, name: str) -> Path:
    """`<run_dir>/rings/<name>/ring`; ValueError unless `name` is one plain path component."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"not a valid ring name: {name!r}")
    return Path(run_dir) / "rings" / name / RING_FILE


def create_ring(path: Path, capacity: int = DEFAULT_CAPACITY) -> None:
    """Creates a fresh, empty ring at `path`, replacing whatever is there (a ring, a symlink
    or a FIFO is replaced, not followed; a directory is removed), and its directory (mode
    0755) if needed. The file is built under a temporary name and renamed into place, so a
    producer never sees it half made; mode 0666 lets any user in the container record."""
    size = lib.dq_ring_file_size(capacity)
    if size == 0:
        raise ValueError(f"ring capacity must be a power of two in [{MIN_CAPACITY}, "
                         f"{MAX_CAPACITY}], not {capacity}")
    path = Path(path)
    directory = path.parent
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(directory).st_mode):
        raise NotADirectoryError(f"{directory} is not a directory")
    os.chmod(directory, 0o755)  # whatever the umask: any uid in the container reaches the ring
    header = ffi.new("char[]", lib.DQOES_RING_HEADER_SIZE)
    lib.dq_ring_format_header(header, capacity)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666)
        os.ftruncate(fd, size)
        os.pwrite(fd, ffi.buffer(header), 0)
        if _is_directory(path):
            shutil.rmtree(path)  # a rename cannot replace a directory
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the container may have moved it
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


def _is_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


@dataclass(eq=False)
class WindowStats:
    """Per-ring latency over one window, in seconds (NaN where `count` is 0): exact count,
    mean and max; percentiles within 1.6% (docs/ring-format.md). `take_window` refills the
    same arrays: copy what must outlive the next call."""

    count: np.ndarray
    mean: np.ndarray
    p50: np.ndarray
    p90: np.ndarray
    p95: np.ndarray
    p99: np.ndarray
    max: np.ndarray
    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9


class RingSet:
    """Readers for a fixed list of rings, indexed like `paths` (None: no ring there).

    `drain()` every sample tick reads all rings in one C call; `take_window()` when the
    policy runs gives the statistics of the records drained since the previous one. The
    per-ring counters (`records`, `lost_overrun`, `torn`, `invalid`, `faults`,
    `producer_dropped`, uint64) only grow; `status` and `last_fault` hold `Status` codes
    (`last_fault` 0: none yet). `stats` holds the last window's statistics, one row per
    name in STATS. Arrays are updated in place, never rebound. Membership
    changes build a new set with `adopt=old`, which carries the open rings, positions,
    counters and current window of the paths that both sets share.
    """

    def __init__(self, paths: Sequence[Path | str | None], capacity: int = DEFAULT_CAPACITY,
                 *, recreate: bool = True, recreate_interval: float = RECREATE_INTERVAL,
                 adopt: RingSet | None = None, now_ns: int | None = None) -> None:
        now = time.monotonic_ns() if now_ns is None else now_ns
        self.paths: list[Path | None] = [None if p is None else Path(p) for p in paths]
        self.capacity = capacity
        n = len(self.paths)
        self._counters = np.zeros((lib.DQ_RING_NCOUNTERS, n), np.uint64)
        self.status = np.full(n, Status.UNUSED, np.int8)
        self.last_fault = np.zeros(n, np.int8)
        self._ptrs = (ffi.from_buffer("uint64_t[]", self._counters),
                      ffi.from_buffer("int8_t[]", self.status),
                      ffi.from_buffer("int8_t[]", self.last_fault))
        table = lib.dq_ring_table_new(n, capacity, *self._ptrs)
        if table == ffi.NULL:
            if lib.dq_ring_file_size(capacity) == 0:
                raise ValueError(f"bad ring capacity {capacity}")
            raise MemoryError("ring table")
        self._table = table
        self._free = weakref.finalize(self, lib.dq_ring_table_free, table)
        (self.records, self.lost_overrun, self.torn, self.invalid, self.faults,
         self.producer_dropped) = (self._counters[row] for row in (
             lib.DQ_RING_RECORDS, lib.DQ_RING_LOST_OVERRUN, lib.DQ_RING_TORN,
             lib.DQ_RING_INVALID, lib.DQ_RING_FAULTS, lib.DQ_RING_PRODUCER_DROPPED))

        opened = now if adopt is None else adopt._window.end_ns  # the current window's start
        self.stats = np.full((len(STATS), n), np.nan)
        count = np.zeros(n, np.int64)
        self._window_ptrs = (ffi.from_buffer("int64_t[]", count),
                             ffi.from_buffer("double[]", self.stats))
        self._window = WindowStats(count, *self.stats, start_ns=opened, end_ns=opened)
        self._recreate = recreate
        self._recreate_interval_ns = int(recreate_interval * 1e9)
        self._retry_ns = np.zeros(n, np.int64)

        shared = {} if adopt is None else {p: j for j, p in enumerate(adopt.paths) if p}
        for i, path in enumerate(self.paths):
            if path is None:
                continue
            if path in shared and lib.dq_ring_adopt(table, i, adopt._table, shared[path]) == 0:
                continue
            if recreate and not os.path.lexists(path):
                with contextlib.suppress(OSError):  # else _recover retries and logs
                    create_ring(path, capacity)  # a new container: not a fault
            lib.dq_ring_attach(table, i, os.fsencode(path), now)
        if adopt is not None:
            adopt.close()
        self._recover(now)

    def __len__(self) -> int:
        return len(self.paths)

    def drain(self, now_ns: int | None = None, records: np.ndarray | None = None) -> int:
        """Reads every ring's new records into the current window; returns how many were
        accepted. `records` (a RECORD_DTYPE array) also receives the first len(records)
        of them. `now_ns`: CLOCK_MONOTONIC (time.monotonic_ns), the default."""
        self._check_open()
        now = time.monotonic_ns() if now_ns is None else now_ns
        if records is None:
            accepted = lib.dq_ring_drain(self._table, now, ffi.NULL, 0)
        else:
            if records.dtype != RECORD_DTYPE or not records.flags.c_contiguous:
                raise TypeError("records must be a contiguous RECORD_DTYPE array")
            out = ffi.from_buffer("struct dq_ring_record[]", records, require_writable=True)
            accepted = lib.dq_ring_drain(self._table, now, out, len(records))
        if self.status.max(initial=0) >= CLOSED:
            self._recover(now)
        return accepted

    def take_window(self, now_ns: int | None = None) -> WindowStats:
        """Statistics of the records drained since the previous call (or the set's
        creation), then starts the next window. Call `drain` first in the same tick."""
        self._check_open()
        lib.dq_ring_take_window(self._table, *self._window_ptrs)
        window = self._window
        window.start_ns = window.end_ns
        window.end_ns = time.monotonic_ns() if now_ns is None else now_ns
        return window

    def _recover(self, now_ns: int) -> None:
        """Re-opens the closed rings that are due, re-creating those whose path holds no
        valid ring. Only failed rings are visited: a healthy set costs one array test."""
        if not self._recreate:
            return
        due = np.flatnonzero((self.status >= CLOSED) & (self._retry_ns <= now_ns))
        for i in due:
            path, fault = self.paths[i], Status(self.status[i]).name
            self._retry_ns[i] = now_ns + self._recreate_interval_ns
            if lib.dq_ring_attach(self._table, i, os.fsencode(path), now_ns) == Status.OK:
                log.info("ring %s: %s, re-opened", path, fault)  # replaced by a valid ring
                continue
            try:
                create_ring(path, self.capacity)
            except OSError as e:
                log.warning("ring %s: %s, cannot re-create it: %s", path, fault, e)
                continue
            status = Status(lib.dq_ring_attach(self._table, i, os.fsencode(path), now_ns))
            log.warning("ring %s: %s, re-created (%s)", path, fault, status.name)

    def _check_open(self) -> None:
        if not self._free.alive:
            raise ValueError("the ring set is closed")

    def close(self) -> None:
        """Closes every ring. The arrays stay readable."""
        self._free()

    def __enter__(self) -> RingSet:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
