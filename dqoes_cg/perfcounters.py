"""Hardware counters (cycles, instructions, last-level-cache misses) per container, through
perf_event_open, where the host exposes them; the instructions per cycle and LLC misses per
second over each decision window follow.

Many hosts do not (a VM without a virtual PMU, a TCG guest): `probe` finds that out once at
start, `HardwareCounters.start` says so in one log line, and interference is then judged
from pressure and throttling alone.

The system call goes through ctypes, not the cffi extension: it is made only when a
container joins (each reading is a plain read(2) of its group's descriptors), so it needs
no C of its own, and a host without counters pays nothing but the probe.

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
import os
import platform
import struct
import time
from pathlib import Path

import numpy as np

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
GROUP_BYTES = 8 * (3 + len(EVENTS))  # nr, time enabled, time running, a value per event
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


def parse_group(data: bytes) -> np.ndarray:
    """A group's reading (PERF_FORMAT_GROUP with both times) as counts per EVENTS, scaled
    up by enabled / running where the counters were multiplexed (zeros if never run).
    ValueError if it is not such a reading."""
    if len(data) != GROUP_BYTES:
        raise ValueError(f"a group reading of {len(data)} bytes, not {GROUP_BYTES}")
    nr, enabled, running, *values = struct.unpack(f"={3 + len(EVENTS)}Q", data)
    if nr != len(EVENTS):
        raise ValueError(f"a group of {nr} counters, not {len(EVENTS)}")
    counts = np.array(values, np.float64)
    return counts * (enabled / running) if running else np.zeros(len(EVENTS))


def window_rates(previous: np.ndarray, current: np.ndarray,
                 seconds: float) -> tuple[float, float]:
    """(instructions per cycle, LLC misses per second) between two readings of EVENTS
    counts `seconds` apart; NaN where nothing ran (or a counter went back)."""
    cycles, instructions, misses = np.asarray(current, float) - np.asarray(previous, float)
    if cycles <= 0 or instructions < 0 or misses < 0 or seconds <= 0:
        return float("nan"), float("nan")
    return float(instructions / cycles), float(misses / seconds)


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

    def read(self) -> np.ndarray:
        """The counts per EVENTS, summed over the CPUs. OSError, ValueError."""
        total = np.zeros(len(EVENTS))
        for leader in self.leaders:
            total += parse_group(os.read(leader, GROUP_BYTES))
        return total

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds, self.leaders = [], []


class HardwareCounters:
    """Each managed container's instructions per cycle and LLC misses per second over the
    last window (`ipc`, `llc_misses_per_s`, by name), or the node's alone (under the name
    NODE) where the kernel refuses to count a cgroup."""

    NODE = ""

    def __init__(self, cpus: int) -> None:
        self.cpus = cpus
        self.per_node = False
        self.ipc: dict[str, float] = {}
        self.llc_misses_per_s: dict[str, float] = {}
        self._groups: dict[str, CounterGroups] = {}
        self._last: dict[str, tuple[np.ndarray, float]] = {}

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

    def follow(self, cgroups: dict[str, Path]) -> None:
        """Counts the containers of `cgroups` (name: cgroup directory) from now on, and no
        others; at the first refusal of a cgroup, the node instead."""
        if self.per_node:
            return
        for name in set(self._groups) - set(cgroups):
            self._groups.pop(name).close()
            self._last.pop(name, None)
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

    def _count_the_node(self, refusal: OSError) -> None:
        for group in self._groups.values():
            group.close()
        self._groups, self._last, self.per_node = {}, {}, True
        try:
            self._groups[self.NODE] = CounterGroups(None, self.cpus)
        except OSError as e:
            log.warning("hardware counters: cgroups refused (%s), the node too (%s); %s",
                        refusal.strerror, e.strerror, NO_COUNTERS)
            return
        log.warning("hardware counters: cgroups refused (%s): the node's are counted",
                    refusal.strerror)

    def sample(self, now: float | None = None) -> None:
        """Closes the window: the rates since the last sample of each group."""
        now = time.monotonic() if now is None else now
        for name, group in self._groups.items():
            try:
                counts = group.read()
            except (OSError, ValueError) as e:
                log.warning("hardware counters of %s unreadable: %s", name or "the node", e)
                continue
            last = self._last.get(name)
            self._last[name] = (counts, now)
            ipc, misses = (float("nan"),) * 2 if last is None else \
                window_rates(last[0], counts, now - last[1])
            self.ipc[name], self.llc_misses_per_s[name] = ipc, misses
        for gone in set(self.ipc) - set(self._groups):
            del self.ipc[gone], self.llc_misses_per_s[gone]

    def close(self) -> None:
        for group in self._groups.values():
            group.close()
        self._groups = {}
