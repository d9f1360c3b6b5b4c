"""Hardware counters (cycles, instructions, last-level-cache misses) per container, through
perf_event_open, where the host exposes them; the instructions per cycle and LLC misses per
second over each decision window follow.

Many hosts do not (a VM without a virtual PMU, a TCG guest): `probe` finds that out once at
start, `HardwareCounters.start` says so in one log line, and interference is then judged
from pressure and throttling alone.

perf_event_open goes through ctypes: it is made only when a container joins. The readings
at each window's end go through the extension, every group in one call, and a host without
counters pays nothing but the probe.

Per container, one event group per online CPU (perf counts a cgroup only per CPU,
PERF_FLAG_PID_CGROUP on the cgroup directory's descriptor): cycles leading, instructions
and cache misses beside, read together (PERF_FORMAT_GROUP) with the times enabled and
running, by which multiplexed counts are scaled.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import math
import os
import platform
import struct
import time
from pathlib import Path

import numpy as np

from ._native import ffi, lib
from .logs import RateLimitedLog

log = logging.getLogger(__name__)

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
PERF_TYPE_HARDWARE = 0
CYCLES, INSTRUCTIONS, CACHE_MISSES = 0, 1, 3  # PERF_COUNT_HW_*; cache misses: the LLC's
EVENTS = (CYCLES, INSTRUCTIONS, CACHE_MISSES)  # in a group's order, the leader first
READ_FORMAT = 1 | 2 | 8  # TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING | GROUP
DISABLED, EXCLUDE_HV = 1 << 0, 1 << 6
PERF_FLAG_PID_CGROUP, PERF_FLAG_FD_CLOEXEC = 1 << 2, 1 << 3
IOC_ENABLE, IOC_FLAG_GROUP = 0x2400, 1  # PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP
ATTR = struct.Struct("=IIQQQQQIIQ")  # perf_event_attr up to config1: PERF_ATTR_SIZE_VER0
GROUP_WORDS = 3 + len(EVENTS)  # a group reading: nr, time enabled, time running, a value per event
NO_COUNTERS = "interference is judged from pressure and throttling alone"


def _attr(config: int, leader: bool) -> bytes:
    """A perf_event_attr counting `config` (a group's leader starts disabled)."""
    flags = EXCLUDE_HV | (DISABLED if leader else 0)
    return ATTR.pack(PERF_TYPE_HARDWARE, ATTR.size, config, 0, 0, READ_FORMAT, flags, 0, 0, 0)


def perf_event_open(config: int, pid: int, cpu: int, group_fd: int, flags: int,
                    leader: bool = True) -> int:
    """The descriptor of a new counter; OSError with the kernel's errno."""
    if SYS_PERF_EVENT_OPEN is None:
        raise OSError(errno.ENOSYS, f"perf_event_open unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.create_string_buffer(_attr(config, leader), ATTR.size)
    fd = libc.syscall(SYS_PERF_EVENT_OPEN, attr, ctypes.c_int(pid), ctypes.c_int(cpu),
                      ctypes.c_int(group_fd), ctypes.c_ulong(flags | PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return fd


def probe() -> str | None:
    """None if this host counts cycles for this process, else why not (one line)."""
    try:
        os.close(perf_event_open(CYCLES, 0, -1, -1, 0))
    except OSError as e:
        name = errno.errorcode.get(e.errno or 0, str(e.errno))
        why = {errno.ENOENT: "this host exposes no hardware counters",
               errno.EOPNOTSUPP: "this host exposes no hardware counters",
               errno.ENOSYS: "this kernel has no perf events",
               errno.EACCES: "not allowed (kernel.perf_event_paranoid)",
               errno.EPERM: "not allowed (kernel.perf_event_paranoid, or a seccomp filter)",
               }.get(e.errno or 0, e.strerror or "failed")
        return f"perf_event_open: {name} — {why}; {NO_COUNTERS}"
    return None


class CounterGroups:
    """Counter groups, one per online CPU, of a cgroup (`cgroup` a path: PERF_FLAG_PID_CGROUP)
    or of the whole node (`cgroup` None)."""

    def __init__(self, cgroup: Path | None, cpus: int) -> None:
        self._fds: list[int] = []
        self.leaders: list[int] = []
        dirfd = -1 if cgroup is None else os.open(
            cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        flags = 0 if cgroup is None else PERF_FLAG_PID_CGROUP
        try:
            for cpu in range(cpus):
                leader = perf_event_open(EVENTS[0], dirfd, cpu, -1, flags)
                self._fds.append(leader)
                self.leaders.append(leader)
                for config in EVENTS[1:]:
                    self._fds.append(perf_event_open(config, dirfd, cpu, leader, flags,
                                                     leader=False))
            for leader in self.leaders:
                fcntl.ioctl(leader, IOC_ENABLE, IOC_FLAG_GROUP)
        except OSError:
            self.close()
            raise
        finally:
            if dirfd >= 0:
                os.close(dirfd)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds, self.leaders = [], []


class HardwareCounters:
    """Each managed container's instructions per cycle and LLC misses per second over the
    last window (`ipc`, `llc_misses_per_s`, by name), or the node's alone (under the name
    NODE) where the kernel refuses to count a cgroup.

    A window's end reads every group leader in one call (dq_perf_read) into arrays laid out
    when the containers change (`follow`), and works the rates out over them as a whole."""

    NODE = ""

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.per_node = False
        self._groups: dict[str, CounterGroups] = {}
        self._last_at = math.nan
        self._lay_out({})

    @classmethod
    def start(cls) -> tuple[HardwareCounters | None, str]:
        """Counters for this host, or None where it has none; and what it said of them in
        its one log line."""
        why = probe()
        if why is not None:
            log.info("%s", why)
            return None, why
        said = "hardware counters: instructions per cycle and LLC misses per container"
        log.info("%s", said)
        return cls(os.cpu_count() or 1), said

    @property
    def ipc(self) -> dict[str, float]:
        return dict(zip(self._names, self._ipc.tolist(), strict=True))

    @property
    def llc_misses_per_s(self) -> dict[str, float]:
        return dict(zip(self._names, self._misses.tolist(), strict=True))

    def follow(self, cgroups: dict[str, Path]) -> None:
        """Counts the containers of `cgroups` (name: cgroup directory) from now on, and no
        others; at the first refusal of a cgroup, the node instead."""
        if self.per_node:
            return
        last = self._last_by_name()
        for name in set(self._groups) - set(cgroups):
            self._groups.pop(name).close()
        for name, cgroup in cgroups.items():
            if name in self._groups:
                continue
            try:
                self._groups[name] = CounterGroups(cgroup, self.cpus)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.EACCES, errno.EPERM):
                    log.warning("hardware counters of %s: %s", name, e.strerror)
                    continue
                self._count_the_node(e)
                return
        self._lay_out(last)

    def _count_the_node(self, refusal: OSError) -> None:
        for group in self._groups.values():
            group.close()
        self._groups, self.per_node = {}, True
        try:
            self._groups[self.NODE] = CounterGroups(None, self.cpus)
        except OSError as e:
            log.warning("hardware counters: cgroups refused (%s), the node too (%s); %s",
                        refusal.strerror, e.strerror, NO_COUNTERS)
        else:
            log.warning("hardware counters: cgroups refused (%s): the node's are counted",
                        refusal.strerror)
        self._lay_out({})

    def _last_by_name(self) -> dict[str, np.ndarray]:
        return {name: self._last[i] for i, name in enumerate(self._names)}

    def _lay_out(self, last: dict[str, np.ndarray]) -> None:
        """The arrays a sample reads into and computes over, for the groups followed now (a
        group, a row; a CPU of it, a row of the readings); `last` keeps the counts of the
        groups that stay, so that their window goes on."""
        self._names = list(self._groups)
        n, cpus = len(self._names), self.cpus
        self._fds = np.array([fd for g in self._groups.values() for fd in g.leaders], np.int32)
        self._raw = np.zeros((n, cpus, GROUP_WORDS), np.uint64)
        self._fds_c = ffi.from_buffer("int32_t[]", self._fds)
        self._raw_c = ffi.from_buffer("uint64_t[]", self._raw)
        self._readings = np.zeros((n, cpus, GROUP_WORDS))
        self._scale = np.zeros((n, cpus))
        self._ran = np.zeros((n, cpus), bool)
        self._bad = np.zeros((n, cpus), bool)
        self._counts = np.zeros((n, len(EVENTS)))
        self._last = np.full((n, len(EVENTS)), np.nan)  # NaN: no reading yet
        for i, name in enumerate(self._names):
            if name in last:
                self._last[i] = last[name]
        self._delta = np.zeros((n, len(EVENTS)))
        self._valid = np.zeros(n, bool)
        self._ok = np.zeros(n, bool)
        self._ipc = np.full(n, np.nan)
        self._misses = np.full(n, np.nan)

    def sample(self, now: float | None = None) -> None:
        """Closes the window: the rates since the last sample of each group (NaN where
        either end was unreadable, nothing ran, or a counter went back)."""
        now = time.monotonic() if now is None else now
        if not self._names:
            return
        failed = lib.dq_perf_read(self._fds_c, len(self._fds), self._raw_c, GROUP_WORDS)
        if failed:
            _unreadable.log(logging.WARNING, "read", "hardware counters: %d of %d groups "
                            "unreadable", failed, len(self._fds))
        r = self._readings
        np.copyto(r, self._raw, casting="unsafe")
        # scaled up by enabled / running where multiplexed; zeros where never run
        np.greater(r[..., 2], 0, out=self._ran)
        self._scale.fill(0.0)
        np.divide(r[..., 1], r[..., 2], out=self._scale, where=self._ran)
        values = r[..., 3:]
        np.multiply(values, self._scale[..., None], out=values)
        np.not_equal(r[..., 0], len(EVENTS), out=self._bad)  # unreadable, or not our group
        np.copyto(values, np.nan, where=self._bad[..., None])
        np.sum(values, axis=1, out=self._counts)
        d, valid = self._delta, self._valid
        np.subtract(self._counts, self._last, out=d)
        np.greater(d[:, 0], 0, out=valid)  # cycles ran (NaN compares false)
        for counted in (d[:, 1], d[:, 2]):  # no counter went back
            np.greater_equal(counted, 0, out=self._ok)
            np.logical_and(valid, self._ok, out=valid)
        self._ipc.fill(np.nan)
        self._misses.fill(np.nan)
        seconds = now - self._last_at
        np.divide(d[:, 1], d[:, 0], out=self._ipc, where=valid)
        if seconds > 0:
            np.divide(d[:, 2], seconds, out=self._misses, where=valid)
        np.copyto(self._last, self._counts)
        self._last_at = now

    def close(self) -> None:
        for group in self._groups.values():
            group.close()
        self._groups = {}
        self._lay_out({})


_unreadable = RateLimitedLog(log)
