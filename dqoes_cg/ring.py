"""Latency rings, daemon side (sense): create each container's ring, drain all of them in
one C call per tick, and turn the window since the last `take_window` into per-container
latency statistics and, for training jobs, their progress records.

The daemon owns the rings: it creates `<run_dir>/rings/<name>/ring` with `create_ring`, and
the user bind-mounts that directory into the container at /run/dqoes, where the producers
(`dqoes_cg.probe`, `csrc/dqoes_probe.h`) find it. A ring is hostile input: the reader maps
it read-only and turns a container truncating it under the mapping into a fault of that
ring, never follows a symlink there, and a ring that fails only changes its own entry's
status and counters. `RingSet` re-creates a failed ring itself, at most once per
`recreate_interval`; producers switch to the new file within a second. What a container
leaves in its ring's place is set aside in one rename and removed a bounded amount per
drain. Format, protocol and error bounds: docs/ring-format.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import stat
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

RING_FILE = "ring"
"""The ring's name in its container's directory (inside the container: /run/dqoes/ring)."""
DEFAULT_CAPACITY = 1 << 16
"""Slots per ring: 2 MiB, a second of 65,536 requests per second between two drains."""
MIN_CAPACITY = lib.DQOES_RING_MIN_CAPACITY
MAX_CAPACITY = lib.DQOES_RING_MAX_CAPACITY
RECREATE_INTERVAL = 10.0
"""Seconds between two re-creations of the same failed ring."""
JUNK_DIR = ffi.string(lib.DQ_RING_JUNK_DIR).decode()
"""Where `create_ring` sets aside, in the ring's directory, a directory found in its place."""
SWEEP_BUDGET = 128
"""Entries of set-aside junk one drain may remove or move (dq_ring_sweep)."""

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
    digest = hashlib.sha256(name.encode(errors="surrogatepass"))  # a lone surrogate too
    return f"{slug}-{digest.hexdigest()[:10]}"


def ring_path(run_dir: Path, name: str) -> Path:
    """`<run_dir>/rings/<name>/ring`; ValueError unless `name` is one plain path component."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"not a valid ring name: {name!r}")
    return Path(run_dir) / "rings" / name / RING_FILE


def create_ring(path: Path, capacity: int = DEFAULT_CAPACITY) -> None:
    """Creates a fresh, empty ring at `path`, and its directory (mode 0755) if needed.

    The file is fully allocated (a page first touched once the filesystem is full would
    fault a producer), built under a temporary name and renamed into place, so that a
    producer never sees it half made; mode 0666 lets any user in the container record.
    Whatever is at `path` is replaced without being followed or opened: a file, symlink or
    FIFO by the rename; a directory, however large or deep, is first moved into JUNK_DIR
    (one rename), which `sweep_junk` empties later a bounded amount at a time. Everything
    happens inside the ring's directory, which may be a filesystem of its own: it needs
    room for two rings while the old one is still mapped. OSError if the ring cannot be
    made (ENOSPC: then nothing at `path` has changed)."""
    size = lib.dq_ring_file_size(capacity)
    if size == 0:
        raise ValueError(f"ring capacity must be a power of two in [{MIN_CAPACITY}, "
                         f"{MAX_CAPACITY}], not {capacity}")
    path = Path(path)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    header = ffi.new("char[]", lib.DQOES_RING_HEADER_SIZE)
    lib.dq_ring_format_header(header, capacity)
    dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(dirfd, 0o755)  # whatever the umask: any uid in the container reaches the ring
        tmp = f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dirfd)
        try:
            os.fchmod(fd, 0o666)
            os.posix_fallocate(fd, 0, size)
            os.pwrite(fd, ffi.buffer(header), 0)
            if stat.S_ISDIR(_lstat_mode(path.name, dirfd)):
                _set_aside(path.name, dirfd)  # a rename cannot replace a directory
            os.rename(tmp, path.name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except BaseException:
            with contextlib.suppress(OSError):  # the container may have moved it
                os.unlink(tmp, dir_fd=dirfd)
            raise
        finally:
            os.close(fd)
    finally:
        os.close(dirfd)


def sweep_junk(directory: Path, budget: int = SWEEP_BUDGET) -> bool:
    """Removes up to about `budget` entries of what `create_ring` set aside in `directory`
    (no recursion, no symlink followed, however deep the tree). True while junk is left and
    this call made progress: call it again later."""
    return bool(lib.dq_ring_sweep(os.fsencode(directory), budget))


def _lstat_mode(name: str, dirfd: int) -> int:
    try:
        return os.lstat(name, dir_fd=dirfd).st_mode
    except FileNotFoundError:
        return 0


def _set_aside(name: str, dirfd: int) -> None:
    """Moves entry `name` of the directory into its JUNK_DIR, under a fresh name."""
    mode = _lstat_mode(JUNK_DIR, dirfd)
    if mode and not stat.S_ISDIR(mode):
        os.unlink(JUNK_DIR, dir_fd=dirfd)  # a file, symlink or FIFO planted there
    with contextlib.suppress(FileExistsError):
        os.mkdir(JUNK_DIR, 0o700, dir_fd=dirfd)
    junk = os.open(JUNK_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                   dir_fd=dirfd)
    try:
        os.rename(name, f"{name}.{secrets.token_hex(8)}", src_dir_fd=dirfd, dst_dir_fd=junk)
    finally:
        os.close(junk)


@dataclass(eq=False)
class WindowStats:
    """Per-ring records of one window. Latencies, in seconds (NaN where `count` is 0):
    exact count, mean and max; percentiles within 1.6% (docs/ring-format.md). Progress
    records (a training job's evaluation value): their number, and the value and time
    (CLOCK_MONOTONIC ns) of the earliest and the latest of them (NaN and 0 where
    `progress` is 0). `take_window` refills the same arrays: copy what must outlive the
    next call."""

    count: np.ndarray
    mean: np.ndarray
    p50: np.ndarray
    p90: np.ndarray
    p95: np.ndarray
    p99: np.ndarray
    max: np.ndarray
    start_ns: int
    end_ns: int
    progress: np.ndarray
    first_value: np.ndarray
    last_value: np.ndarray
    first_ns: np.ndarray
    last_ns: np.ndarray

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) * 1e-9


class RingSet:
    """Readers for a fixed list of rings, indexed like `paths` (None: no ring there).

    `drain()` every sample tick reads all rings in one C call; `take_window()` when the
    policy runs gives the statistics of the records drained since the previous one. The
    per-ring counters (`records` of latencies, `progress` records, `lost_overrun`, `torn`,
    `invalid`, `faults`, `producer_dropped`, uint64) only grow; `status` and `last_fault`
    hold `Status` codes
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
         self.producer_dropped, self.progress) = (self._counters[row] for row in (
             lib.DQ_RING_RECORDS, lib.DQ_RING_LOST_OVERRUN, lib.DQ_RING_TORN,
             lib.DQ_RING_INVALID, lib.DQ_RING_FAULTS, lib.DQ_RING_PRODUCER_DROPPED,
             lib.DQ_RING_PROGRESS))

        opened = now if adopt is None else adopt._window.end_ns  # the current window's start
        self.stats = np.full((len(STATS), n), np.nan)
        count, progress = np.zeros(n, np.int64), np.zeros(n, np.int64)
        values, times = np.full((2, n), np.nan), np.zeros((2, n), np.uint64)
        self._window_ptrs = (ffi.from_buffer("int64_t[]", count),
                             ffi.from_buffer("double[]", self.stats),
                             ffi.from_buffer("int64_t[]", progress),
                             ffi.from_buffer("double[]", values),
                             ffi.from_buffer("uint64_t[]", times))
        self._window = WindowStats(count, *self.stats, start_ns=opened, end_ns=opened,
                                   progress=progress, first_value=values[lib.DQ_RING_FIRST],
                                   last_value=values[lib.DQ_RING_LAST],
                                   first_ns=times[lib.DQ_RING_FIRST],
                                   last_ns=times[lib.DQ_RING_LAST])
        self._recreate = recreate
        self._recreate_interval_ns = int(recreate_interval * 1e9)
        self._retry_ns = np.zeros(n, np.int64)
        self._junk: set[int] = set()  # entries whose directory holds set-aside junk

        if adopt is not None and adopt.capacity == capacity:  # freed below, before this one
            lib.dq_ring_share_inotify(table, adopt._table)
        shared = {} if adopt is None else {p: j for j, p in enumerate(adopt.paths) if p}
        swept = set() if adopt is None else {adopt.paths[j] for j in adopt._junk}
        for i, path in enumerate(self.paths):
            if path is None:
                continue
            if path in shared and lib.dq_ring_adopt(table, i, adopt._table, shared[path]) == 0:
                if path in swept:
                    self._junk.add(i)
                continue
            if os.path.lexists(path.parent / JUNK_DIR):
                self._junk.add(i)
            if recreate and not os.path.lexists(path):
                try:
                    create_ring(path, capacity)  # a new container: not a fault
                except Exception as e:  # one ring's failure is that ring's alone
                    log.warning("ring %s: cannot create it: %s", path, e)
            lib.dq_ring_attach(table, i, os.fsencode(path), now)
        if adopt is not None:
            adopt.close()
        self._recover(now)

    def __len__(self) -> int:
        return len(self.paths)

    def drain(self, now_ns: int | None = None, records: np.ndarray | None = None) -> int:
        """Reads every ring's new records into the current window; returns how many latency
        records were accepted (progress records: see `progress`). `records` (a RECORD_DTYPE
        array) also receives the first len(records) of them. `now_ns`: CLOCK_MONOTONIC
        (time.monotonic_ns), the default."""
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
        if self._junk:
            self._sweep()
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
            except Exception as e:  # one ring's failure is that ring's alone
                log.warning("ring %s: %s, cannot re-create it: %s", path, fault, e)
                continue
            finally:
                self._junk.add(int(i))
            status = Status(lib.dq_ring_attach(self._table, i, os.fsencode(path), now_ns))
            log.warning("ring %s: %s, re-created (%s)", path, fault, status.name)

    def _sweep(self) -> None:
        """One bounded step of removing the junk set aside in one ring's directory."""
        i = min(self._junk)
        path = self.paths[i]
        try:
            more = path is not None and sweep_junk(path.parent)
        except Exception as e:  # one ring's failure is that ring's alone
            log.warning("ring %s: cannot remove what was set aside: %s", path, e)
            more = False
        if not more:
            self._junk.discard(i)

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
