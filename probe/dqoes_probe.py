"""dqoes-probe: a Python service's requests, timed into dqoes-cg's latency ring.

    import dqoes_probe

    probe = dqoes_probe.Probe.open()  # the ring at $DQOES_RING, else /run/dqoes/ring
    with probe.measure():             # or @probe.measure() on a function, async or not
        reply = model(request)
    probe.record(0.042)               # or a latency in seconds, measured elsewhere
    probe.progress(loss)              # a training job's evaluation value, after each epoch

The standard library only (mmap, struct, fcntl): no compiler, no dependency. It writes the
ring format version 1 of dqoes-cg (docs/ring-format.md): claim a slot by adding one to the
ring's counter, write the slot, publish it by its sequence word last. Python has no atomic
add on shared memory, so a record holds a lock while it claims and writes: one thread lock
for the whole process, and a record lock (`lockf`) on the counter's bytes across the
processes that share the ring through this module (a server's forked workers). A C
producer (dqoes_probe.h) or dqoes-cg's cffi probe adds to the counter without that lock:
beside one of them in the same ring, a record may, rarely, land in a slot the other
claimed too, and the reader drops what it cannot trust (docs/ring-format.md, "Reading");
it never makes a record up.

Without a valid ring at the path, recording does nothing and the probe says so once on
stderr (unless opened with `quiet=True` or with $DQOES_PROBE_QUIET set); about once a second
it looks at the path again and attaches to a ring that appears later, or that the daemon
re-created.
"""

from __future__ import annotations

import _thread
import fcntl
import math
import mmap
import os
import stat
import struct
import sys
import time

TYPE_CHECKING = False  # typing's, without importing typing (a third of this module's import)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType
    from typing import Any, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

__version__ = "0.2.0"

DEFAULT_PATH = "/run/dqoes/ring"
ENV_VAR = "DQOES_RING"
QUIET_ENV_VAR = "DQOES_PROBE_QUIET"

# The ring format, version 1 (csrc/dqoes_probe.h of dqoes-cg is the reference).
MAGIC = 0x474E5253454F5144
VERSION = 1
HEADER_SIZE = 256
SLOT_SIZE = 32
MIN_CAPACITY = 16
MAX_CAPACITY = 1 << 24
MAX_LATENCY_NS = 3_600_000_000_000  # one hour
COUNTER_OFFSET = 64
DROPPED_OFFSET = 128
PROGRESS_KIND = 8 << 60  # the top bits of a progress record's end word
TIME_MASK = (1 << 60) - 1
RECHECK_NS = 1_000_000_000  # how often a probe looks at its path again

_MASK64 = (1 << 64) - 1
_HEADER = struct.Struct("=QIIIIQ")  # magic, version, header_size, slot_size, reserved, capacity
_WORD = struct.Struct("=Q")
_BODY = struct.Struct("=QQQ")  # a slot's end word, payload and check; its seq comes first
_DOUBLE = struct.Struct("=d")

# One lock for every record of the process, whatever the probe: the record lock (lockf) is
# the process's, so two probes on one ring would not keep each other's threads out.
_lock = _thread.allocate_lock()


def _new_lock() -> None:
    """In a child: another thread of the parent may have held the lock when it forked."""
    global _lock
    _lock = _thread.allocate_lock()


os.register_at_fork(after_in_child=_new_lock)


def check(seq: int, end: int, payload: int) -> int:
    """A slot's check word (docs/ring-format.md), in 64-bit wrapping arithmetic."""
    h = ((seq * 0x9E3779B97F4A7C15) & _MASK64) ^ end
    h = ((h * 0xBF58476D1CE4E5B9) & _MASK64) ^ payload
    h = (h * 0x94D049BB133111EB) & _MASK64
    return h ^ (h >> 31)


class _Ring:
    """One mapped ring file, validated before it was mapped; its capacity is our own copy
    (the mapped header may change under us)."""

    def __init__(self, fd: int, memory: mmap.mmap, capacity: int, identity: tuple[int, int]):
        self.fd, self.memory, self.mask, self.identity = fd, memory, capacity - 1, identity

    @classmethod
    def open(cls, path: str) -> _Ring | None:
        """The ring at `path` if it is a valid one, else None."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            head = os.pread(fd, _HEADER.size, 0)
            if stat.S_ISREG(st.st_mode) and len(head) == _HEADER.size:
                magic, version, header_size, slot_size, _, capacity = _HEADER.unpack(head)
                if (magic == MAGIC and version == VERSION and header_size == HEADER_SIZE
                        and slot_size == SLOT_SIZE and MIN_CAPACITY <= capacity <= MAX_CAPACITY
                        and capacity & (capacity - 1) == 0
                        and st.st_size == HEADER_SIZE + capacity * SLOT_SIZE):
                    memory = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED,
                                       mmap.PROT_READ | mmap.PROT_WRITE)
                    return cls(fd, memory, capacity, (st.st_dev, st.st_ino))
        except (OSError, ValueError):
            pass
        os.close(fd)
        return None

    def write(self, end: int, payload: int) -> None:
        """Claims the next slot and publishes the record in it. The caller holds the thread
        lock; the record lock covers the other processes."""
        memory = self.memory
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 8, COUNTER_OFFSET)
        try:
            (pos,) = _WORD.unpack_from(memory, COUNTER_OFFSET)
            seq = (pos + 1) & _MASK64
            _WORD.pack_into(memory, COUNTER_OFFSET, seq)
            slot = HEADER_SIZE + (pos & self.mask) * SLOT_SIZE
            _BODY.pack_into(memory, slot + 8, end, payload, check(seq, end, payload))
            _WORD.pack_into(memory, slot, seq)  # last: publishes the slot
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, COUNTER_OFFSET)

    def drop(self) -> None:
        """Counts a record refused (an invalid value) in the ring's `dropped`."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 8, COUNTER_OFFSET)
        try:
            (dropped,) = _WORD.unpack_from(self.memory, DROPPED_OFFSET)
            _WORD.pack_into(self.memory, DROPPED_OFFSET, (dropped + 1) & _MASK64)
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, COUNTER_OFFSET)

    def close(self) -> None:
        self.memory.close()
        os.close(self.fd)


class Probe:
    """A handle on the container's ring. Use `Probe.open`, not the constructor."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._ring = _Ring.open(path)
        self._next_check_ns = time.monotonic_ns() + RECHECK_NS

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *, quiet: bool = False) -> Probe:
        """A probe on the ring at `path` (default: $DQOES_RING, else DEFAULT_PATH). Without a
        ring there, says so once on stderr unless `quiet` or $DQOES_PROBE_QUIET."""
        probe = cls(os.fsdecode(path or os.environ.get(ENV_VAR) or DEFAULT_PATH))
        if probe._ring is None and not (quiet or os.environ.get(QUIET_ENV_VAR)):
            print(f"dqoes-probe: no ring at {probe.path}: latencies are not recorded until one "
                  f"appears (quiet: {QUIET_ENV_VAR}=1)", file=sys.stderr)
        return probe

    @property
    def attached(self) -> bool:
        """Whether records currently go into a ring."""
        return self._ring is not None

    def record(self, seconds: float) -> None:
        """One request's latency in seconds; outside (0 s, 1 h], or NaN, it only counts as
        dropped in the ring."""
        ns = seconds * 1e9 + 0.5
        self.record_ns(int(ns) if 1.0 <= ns <= MAX_LATENCY_NS else 0)

    def record_ns(self, nanoseconds: int) -> None:
        """One request's latency in integer nanoseconds (see `record`)."""
        self._put(time.monotonic_ns(), nanoseconds, 0 < nanoseconds <= MAX_LATENCY_NS)

    def progress(self, value: float) -> None:
        """A training job's evaluation value (loss, accuracy...) as of now; NaN or infinite,
        it only counts as dropped in the ring."""
        now = time.monotonic_ns()
        bits = _WORD.unpack(_DOUBLE.pack(value))[0]
        self._put(PROGRESS_KIND | now, bits, math.isfinite(value) and now <= TIME_MASK)

    def _put(self, end: int, payload: int, valid: bool) -> None:
        """Writes the record (its end word and payload) if it is valid, else counts it as
        dropped; without a ring, nothing."""
        with _lock:
            ring = self._current(end & TIME_MASK)
            if ring is None:
                return
            if valid:
                ring.write(end, payload)
            else:
                ring.drop()

    def _current(self, now_ns: int) -> _Ring | None:
        """The ring to write into, after looking at the path again if that is due (about
        once a second: one stat)."""
        if now_ns >= self._next_check_ns:
            self._next_check_ns = now_ns + RECHECK_NS
            try:
                st = os.stat(self.path)
            except OSError:
                return self._ring
            if self._ring is None or self._ring.identity != (st.st_dev, st.st_ino):
                fresh = _Ring.open(self.path)
                if fresh is not None:
                    if self._ring is not None:
                        self._ring.close()
                    self._ring = fresh
        return self._ring

    def measure(self) -> Measure:
        """Times a `with` block, or every call of a function it decorates, and records it
        (also when it raises: a failed request was still waited for)."""
        return Measure(self)

    def close(self) -> None:
        """Detaches; later records do nothing."""
        with _lock:
            if self._ring is not None:
                self._ring.close()
            self._ring = None
            self._next_check_ns = 1 << 64  # never again

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Measure:
    """What `Probe.measure` returns. As a decorator, each call is timed separately."""

    def __init__(self, probe: Probe) -> None:
        self._probe = probe
        self._start = 0

    def __enter__(self) -> Measure:
        self._start = time.perf_counter_ns()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._probe.record_ns(time.perf_counter_ns() - self._start)

    def __call__(self, func: F) -> F:
        # Imported here, not with the module: they are most of its import time, and only a
        # decorator needs them.
        import functools
        import inspect

        probe = self._probe
        if inspect.iscoroutinefunction(func):
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                with Measure(probe):
                    return await func(*args, **kwargs)

            return functools.wraps(func)(timed_async)  # type: ignore[return-value]

        def timed(*args: Any, **kwargs: Any) -> Any:
            with Measure(probe):
                return func(*args, **kwargs)

        return functools.wraps(func)(timed)  # type: ignore[return-value]
