"""A table of cgroups sampled and limited in one C call per operation (sense and act I/O).

`CgroupTable(dirs)` opens each cgroup's cpu.stat, cpu.max, cpu.weight and its pressure files
(cpu, memory, io) once and owns one numpy array per quantity, indexed by slot (the position
in `dirs`; a row per pressure file first, for the stalls). The
per-tick methods pass cached pointers to those arrays to C and allocate nothing; callers
read the arrays in place and fill requests in place (or pass them to `apply`). Membership
changes build a new table.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path
from types import TracebackType

import numpy as np

from dqoes_cg._native import ffi, lib


class Status(IntEnum):
    """Per-slot outcome of the last operation (the C `DQ_CG_*` codes)."""

    OK = lib.DQ_CG_OK
    GONE = lib.DQ_CG_GONE
    MALFORMED = lib.DQ_CG_MALFORMED
    ERROR = lib.DQ_CG_ERROR
    SKIPPED = lib.DQ_CG_SKIPPED  # pressure(): not read, as `pressure_wanted` asked


_OK = int(Status.OK)  # numpy compares an array with an IntEnum through an array of its own

MAX_QUOTA = -1
"""A quota below 0 in `apply` (and -1 from `read_back`) stands for cpu.max's "max"."""

PERIOD_UNKNOWN = 0
"""A last-written period of 0 means "unknown": the next `apply` writes that slot."""

LEAVE_ALONE = 0
"""A requested period of 0 in `apply`: that slot's cpu.max is not touched."""

DEFAULT_PERIOD_USEC = 100_000
"""The kernel's default cpu.max period."""

WEIGHT_MIN, WEIGHT_MAX = lib.DQ_CG_WEIGHT_MIN, lib.DQ_CG_WEIGHT_MAX
"""The range of cpu.weight; a requested (or last-written) weight of 0 is LEAVE_ALONE
(WEIGHT_UNKNOWN), as for the period."""

WEIGHT_UNKNOWN = 0
"""A last-written weight of 0 means "unknown": the next `apply` writes that slot's weight."""

PSI_RESOURCES = ("cpu", "memory", "io")
"""The pressure files read, in the order of the stall arrays' rows."""
assert len(PSI_RESOURCES) == lib.DQ_PSI_RESOURCES

FDS_PER_CGROUP = 6
FD_MARGIN = 64

_CTYPES = {np.dtype(np.uint64): "uint64_t[]", np.dtype(np.int64): "int64_t[]",
           np.dtype(np.int32): "int32_t[]", np.dtype(np.uint32): "uint32_t[]",
           np.dtype(np.bool_): "uint8_t[]"}


def raise_fd_limit(needed: int, *, hard: bool = False) -> int:
    """Makes room for `needed` more descriptors: lifts the soft RLIMIT_NOFILE towards the
    hard one (the usual soft limit, 1024, holds about 160 cgroups at six descriptors each),
    and with `hard` the hard one too, as far as this process may. Returns how many more
    descriptors may be opened."""
    in_use = len(os.listdir("/proc/self/fd")) + FD_MARGIN
    want = in_use + needed
    soft, ceiling = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard and ceiling != resource.RLIM_INFINITY and want > ceiling:
        top = min(want, int(Path("/proc/sys/fs/nr_open").read_text()))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, top))
        except (ValueError, OSError):  # not privileged: stay within the hard limit
            pass
        soft, ceiling = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and want > soft:
        soft = want if ceiling == resource.RLIM_INFINITY else min(want, ceiling)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, ceiling))
    return soft - in_use


def open_file_limit() -> int:
    """RLIMIT_NOFILE, with the soft limit first lifted to the hard one where it is lower
    (the loop waits with epoll, not select: descriptors above 1,024 are fine)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return (1 << 30) if soft == resource.RLIM_INFINITY else soft


class _Array:
    """A per-slot numpy array of `CgroupTable`, readable in place but never rebound
    (C writes through a pointer to the array allocated at construction)."""

    def __init__(self, dtype: type, fill: int = 0, rows: int = 0) -> None:
        self.dtype, self.fill, self.rows = np.dtype(dtype), fill, rows  # rows: (rows, n)

    def new(self, n: int) -> np.ndarray:
        return np.full((self.rows, n) if self.rows else n, self.fill, self.dtype)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, table: CgroupTable | None, owner: type | None = None) -> np.ndarray:
        if table is None:
            raise AttributeError(f"{self.name} is a per-table array")
        return table._arrays[self.name]

    def __set__(self, table: CgroupTable, value: object) -> None:
        raise AttributeError(f"{self.name} is filled in place, not rebound")


class CgroupTable:
    """Open cpu.stat/cpu.max/cpu.weight/cpu.pressure descriptors for a fixed list of cgroup
    directories.

    A slot whose operation failed keeps its previous values in that operation's arrays.
    """

    # sample(): cpu.stat counters and the per-slot Status
    usage_usec = _Array(np.uint64)
    throttled_usec = _Array(np.uint64)
    nr_periods = _Array(np.uint64)
    nr_throttled = _Array(np.uint64)
    status = _Array(np.int32, Status.ERROR)
    # apply(): the request, what this table last wrote (quota -1: max), the Status, and
    # whether a slot written held someone else's value instead of our last one
    quota_usec = _Array(np.int64, MAX_QUOTA)
    period_usec = _Array(np.int64, DEFAULT_PERIOD_USEC)
    last_quota_usec = _Array(np.int64, MAX_QUOTA)
    last_period_usec = _Array(np.int64, PERIOD_UNKNOWN)
    apply_status = _Array(np.int32, Status.ERROR)
    foreign = _Array(np.bool_, False)
    # read_back(): cpu.max as found, the Status, and slots that differ from the last write
    max_quota_usec = _Array(np.int64, MAX_QUOTA)
    max_period_usec = _Array(np.int64)
    read_back_status = _Array(np.int32, Status.ERROR)
    drifted = _Array(np.bool_, False)
    # cpu.weight, in the same apply() and read_back() calls: the request (LEAVE_ALONE: not
    # touched), the last write, the Status and foreign flag of apply(); as found by
    # read_back() (and by apply() where foreign), its Status there, and the drifted slots
    weight = _Array(np.int64, LEAVE_ALONE)
    last_weight = _Array(np.int64, WEIGHT_UNKNOWN)
    weight_apply_status = _Array(np.int32, Status.ERROR)
    weight_foreign = _Array(np.bool_, False)
    found_weight = _Array(np.int64, WEIGHT_UNKNOWN)
    weight_read_back_status = _Array(np.int32, Status.ERROR)
    weight_drifted = _Array(np.bool_, False)
    # pressure(): the request (read this slot?), then the time a task of the cgroup waited
    # for a CPU (cpu.pressure "some") and the Status
    pressure_wanted = _Array(np.bool_, True)
    waited_usec = _Array(np.uint64)
    pressure_status = _Array(np.int32, Status.ERROR)
    # pressure(stalls=True): every slot's "some" line of each pressure file, a row per
    # PSI_RESOURCES: the total stalled time, avg10 in hundredths of a percent, the Status
    stall_usec = _Array(np.uint64, rows=len(PSI_RESOURCES))
    stall_avg10_centi = _Array(np.uint32, rows=len(PSI_RESOURCES))
    stall_status = _Array(np.int32, Status.ERROR, rows=len(PSI_RESOURCES))

    def __init__(self, dirs: Sequence[str | os.PathLike[str]],
                 adopt: CgroupTable | None = None) -> None:
        """Opens every cgroup of `dirs`; those that `adopt` (a table about to be closed)
        holds open are taken over from it instead of opened again, and their arrays
        copied."""
        self.dirs: tuple[Path, ...] = tuple(Path(d) for d in dirs)
        n = len(self.dirs)
        specs = [a for a in vars(CgroupTable).values() if isinstance(a, _Array)]
        self._arrays = {a.name: a.new(n) for a in specs}
        self._ptr = {a.name: ffi.from_buffer(_CTYPES[a.dtype], self._arrays[a.name])
                     for a in specs}
        self._scratch = np.zeros(n, bool)

        shared = {} if adopt is None or adopt.closed else \
            {d: j for j, d in enumerate(adopt.dirs)}
        raise_fd_limit(FDS_PER_CGROUP * (n - len(shared)))
        paths = [ffi.NULL if d in shared else ffi.new("char[]", os.fsencode(d))
                 for d in self.dirs]
        table = lib.dq_cgtable_open(ffi.new("char *[]", paths), n)
        if table == ffi.NULL:
            raise MemoryError("cannot allocate the cgroup table")
        self._table = ffi.gc(table, lib.dq_cgtable_close)
        self.closed = False
        pairs = [(i, shared[d]) for i, d in enumerate(self.dirs) if d in shared]
        if pairs:
            assert adopt is not None
            for i, j in pairs:
                lib.dq_cgtable_adopt(table, i, adopt._table, j)
            new, old = (np.array(x, dtype=np.intp) for x in zip(*pairs, strict=True))
            for name, array in self._arrays.items():
                array[..., new] = adopt._arrays[name][..., old]

    def __len__(self) -> int:
        return len(self.dirs)

    def sample(self) -> int:
        """Reads every cpu.stat into the counter arrays; returns the number of OK slots."""
        p = self._ptr
        return lib.dq_cgtable_sample(self._handle(), p["usage_usec"], p["throttled_usec"],
                                     p["nr_periods"], p["nr_throttled"], p["status"])

    def pressure(self, stalls: bool = False) -> int:
        """Reads the CPU pressure total of every cgroup that `pressure_wanted` (filled in
        place; every slot at construction) asks for into `waited_usec`; returns the number
        of OK slots. A slot not asked for is not read: Status.SKIPPED, its total left as it
        was (but a slot without the file, as on a kernel without pressure stall
        information, reports that failure either way: it costs no read).

        With `stalls`, every slot's three pressure files are read too, in the same call
        and each once, into `stall_usec`, `stall_avg10_centi` and `stall_status`."""
        p = self._ptr
        return lib.dq_cgtable_pressure(
            self._handle(), p["pressure_wanted"], p["waited_usec"], p["pressure_status"],
            p["stall_usec"] if stalls else ffi.NULL,
            p["stall_avg10_centi"] if stalls else ffi.NULL,
            p["stall_status"] if stalls else ffi.NULL)

    def apply(self, quota_usec: np.ndarray | int | None = None,
              period_usec: np.ndarray | int | None = None) -> int:
        """Writes cpu.max where the request differs from the last write, and cpu.weight
        likewise (the request in `weight`, LEAVE_ALONE at construction); returns the number
        of files written.
        `foreign` flags the slots written that held someone else's value instead (which is
        then in `max_quota_usec`, `max_period_usec`), `weight_foreign` likewise (the value
        in `found_weight`).

        The request is `quota_usec`/`period_usec` (arrays or scalars, copied into the
        table's request arrays), or what those arrays already hold when omitted.
        """
        if quota_usec is not None:
            np.copyto(self._arrays["quota_usec"], quota_usec, casting="same_kind")
        if period_usec is not None:
            np.copyto(self._arrays["period_usec"], period_usec, casting="same_kind")
        p = self._ptr
        return lib.dq_cgtable_apply(self._handle(), p["quota_usec"], p["period_usec"],
                                    p["last_quota_usec"], p["last_period_usec"],
                                    p["apply_status"], p["foreign"], p["max_quota_usec"],
                                    p["max_period_usec"], p["weight"], p["last_weight"],
                                    p["weight_apply_status"], p["weight_foreign"],
                                    p["found_weight"])

    def read_back(self, weights: bool = False) -> int:
        """Reads every cpu.max (and with `weights` every cpu.weight); returns how many
        slots drifted from what was last written, counting each file.

        A drifted slot (someone else wrote cpu.max, e.g. systemd on daemon-reload) is
        flagged in `drifted` (`weight_drifted` for cpu.weight); `invalidate(table.drifted)`
        (`invalidate_weight`) makes the next `apply` rewrite it.
        """
        p = self._ptr
        lib.dq_cgtable_read_back(self._handle(), p["max_quota_usec"], p["max_period_usec"],
                                 p["read_back_status"],
                                 p["found_weight"] if weights else ffi.NULL,
                                 p["weight_read_back_status"] if weights else ffi.NULL)
        a, drifted, known = self._arrays, self._arrays["drifted"], self._scratch
        np.not_equal(a["max_quota_usec"], a["last_quota_usec"], out=drifted)
        np.not_equal(a["max_period_usec"], a["last_period_usec"], out=known)
        np.logical_or(drifted, known, out=drifted)
        np.not_equal(a["last_period_usec"], PERIOD_UNKNOWN, out=known)
        np.logical_and(drifted, known, out=drifted)
        np.equal(a["read_back_status"], _OK, out=known)
        np.logical_and(drifted, known, out=drifted)
        count = int(np.count_nonzero(drifted))
        if weights:
            drifted = a["weight_drifted"]
            np.not_equal(a["found_weight"], a["last_weight"], out=drifted)
            np.not_equal(a["last_weight"], WEIGHT_UNKNOWN, out=known)
            np.logical_and(drifted, known, out=drifted)
            np.equal(a["weight_read_back_status"], _OK, out=known)
            np.logical_and(drifted, known, out=drifted)
            count += int(np.count_nonzero(drifted))
        else:  # not read: nothing is known to have drifted
            a["weight_drifted"].fill(False)
        return count

    def invalidate(self, mask: np.ndarray | None = None) -> None:
        """Forgets what was written to the masked slots' cpu.max (all when None), forcing a
        rewrite."""
        _forget(self._arrays["last_period_usec"], mask, PERIOD_UNKNOWN)

    def invalidate_weight(self, mask: np.ndarray | None = None) -> None:
        """Forgets what was written to the masked slots' cpu.weight (all when None)."""
        _forget(self._arrays["last_weight"], mask, WEIGHT_UNKNOWN)

    def error(self, slot: int, *, weight: bool = False) -> str:
        """Explains the last non-OK status of `slot` (of its cpu.weight with `weight`), for
        logs and error messages."""
        errno_of = lib.dq_cgtable_weight_errno if weight else lib.dq_cgtable_errno
        code = errno_of(self._handle(), slot)
        if code == 0:
            return "ok"
        if code == errno.EBADMSG:
            return "malformed content"
        return os.strerror(code)

    def close(self) -> None:
        """Closes every descriptor; the arrays stay readable."""
        if not self.closed:
            ffi.release(self._table)
            self.closed = True

    def _handle(self) -> object:
        if self.closed:
            raise ValueError("operation on a closed CgroupTable")
        return self._table

    def __enter__(self) -> CgroupTable:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _forget(last: np.ndarray, mask: np.ndarray | None, unknown: int) -> None:
    if mask is None:
        last.fill(unknown)
    else:
        last[mask] = unknown
